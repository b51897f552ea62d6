"""An arm64 base holding a whole stack as pip installs it: vLLM and FlashInfer with their
dist-info (METADATA, RECORD with real sha256 hashes, INSTALLER), plus dist-info alone for torch
and nvidia-cutlass-dsl (the distributions a series depends on and does not patch).

Built from a vLLM base of :mod:`testing.baseimage` by one more layer: ``FROM <base>`` and
``ADD stack.tar /``, the tar holding FlashInfer 0.6.15's wheel unpacked as pip unpacks it
(``pip download flashinfer-python==0.6.15 --no-deps``), vLLM's RECORD, and the two
dist-info-only distributions.  The image carries its key in a label and is rebuilt only when
the key (this file, the base, the wheel, the versions) changes.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

import docker

from testing.baseimage import KEY_LABEL, SITE, cache_root, find_wheel

FLASHINFER = "0.6.15"
BUILDER_VERSION = "1"
DOCKERFILE = """\
FROM {base}
ADD stack.tar /
LABEL {key_label}={key}
"""


def flashinfer_wheel(version: str = FLASHINFER) -> Path:
    """The cached FlashInfer wheel (pure Python, py3-none-any), downloaded once from PyPI."""
    wheels = cache_root() / "pypi" / "wheels"
    found = sorted(wheels.glob(f"flashinfer_python-{version}-*.whl"))
    if not found:
        wheels.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", f"flashinfer-python=={version}",
                        "--no-deps", "--only-binary", ":all:", "-d", str(wheels), "-q"],
                       check=True)
        found = sorted(wheels.glob(f"flashinfer_python-{version}-*.whl"))
    return found[0]


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _record(rows: list[tuple[str, str, str]]) -> bytes:
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue().encode()


def _installed_wheel(wheel: Path, skip_files: bool) -> dict[str, bytes]:
    """What pip leaves of ``wheel`` (paths relative to the site): its files, and its dist-info
    with INSTALLER added to RECORD.  ``skip_files``: the dist-info alone (the base already
    holds the files)."""
    out: dict[str, bytes] = {}
    with zipfile.ZipFile(wheel) as zf:
        info = next(n.split("/")[0] for n in zf.namelist() if n.endswith(".dist-info/RECORD"))
        record = zf.read(f"{info}/RECORD")
        for name in zf.namelist():
            if name.endswith("/") or name == f"{info}/RECORD":
                continue
            if not skip_files or name.startswith(info + "/"):
                out[name] = zf.read(name)
    rows = [r for r in csv.reader(io.StringIO(record.decode())) if r and r[0] != f"{info}/RECORD"]
    out[f"{info}/INSTALLER"] = b"pip\n"
    rows += [(f"{info}/INSTALLER", record_hash(b"pip\n"), "4"), (f"{info}/RECORD", "", "")]
    out[f"{info}/RECORD"] = _record([tuple(r) for r in rows])  # type: ignore[misc]
    return out


def dist_only(name: str, version: str, files: dict[str, bytes]) -> dict[str, bytes]:
    """A dist-info for ``name`` with a METADATA and a RECORD of ``files`` (also laid out)."""
    info = f"{name.replace('-', '_')}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    out = {**files, f"{info}/METADATA": meta, f"{info}/INSTALLER": b"pip\n"}
    rows = [(p, record_hash(d), str(len(d))) for p, d in sorted(out.items())]
    out[f"{info}/RECORD"] = _record([*rows, (f"{info}/RECORD", "", "")])
    return out


def stack_files(vllm_version: str, torch: str) -> dict[str, bytes]:
    files = _installed_wheel(flashinfer_wheel(), skip_files=False)
    vllm = _installed_wheel(find_wheel(vllm_version), skip_files=True)
    # the base laid vLLM's files out without RECORD; its METADATA and the rest are there
    files.update({k: v for k, v in vllm.items() if k.endswith(("/RECORD", "/INSTALLER"))})
    files.update(dist_only("torch", torch, {"torch/version.py": f"__version__ = '{torch}'\n"
                                           .encode()}))
    files.update(dist_only("nvidia-cutlass-dsl", "4.5.0", {}))
    return files


def _tar(files: dict[str, bytes], out: Path) -> None:
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        dirs: set[str] = set()
        for rel in sorted(files):
            parts = f"{SITE}/{rel}".split("/")
            for i in range(1, len(parts)):
                d = "/".join(parts[:i])
                if d not in dirs:
                    dirs.add(d)
                    ti = tarfile.TarInfo(d)
                    ti.type, ti.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(ti)
            ti = tarfile.TarInfo(f"{SITE}/{rel}")
            ti.size, ti.mode, ti.mtime = len(files[rel]), 0o644, 1_700_000_000
            tar.addfile(ti, io.BytesIO(files[rel]))


def ensure_stack_base(client: docker.DockerClient, base: dict, tag: str, *,
                      torch: str = "2.11.0", log=print) -> dict:
    """The stack base on top of ``base`` (an ``ensure_base`` info), tagged ``tag`` and pushed;
    returns ``{"tag", "id", "repo_digest", "flashinfer", "torch"}``."""
    h = hashlib.sha256(BUILDER_VERSION.encode() + Path(__file__).read_bytes())
    for part in (base["id"], flashinfer_wheel().name, torch):
        h.update(part.encode())
    key = h.hexdigest()[:24]
    tag = f"{tag}-k{key[:12]}"
    try:
        image = client.images.get(tag)
        if (image.labels or {}).get(KEY_LABEL) != key:
            raise docker.errors.ImageNotFound("stale")
    except docker.errors.ImageNotFound:
        log(f"building the stack base {tag} (FlashInfer {FLASHINFER}, torch {torch})")
        with tempfile.TemporaryDirectory(prefix="pk-stack-") as ctx:
            _tar(stack_files(base["version"], torch), Path(ctx) / "stack.tar")
            (Path(ctx) / "Dockerfile").write_text(DOCKERFILE.format(
                base=base["tag"], key_label=KEY_LABEL, key=key))
            image, _ = client.images.build(path=ctx, tag=tag, platform="linux/arm64", rm=True,
                                           forcerm=True)
    repo = tag.rsplit(":", 1)[0]
    digests = [d for d in (image.attrs.get("RepoDigests") or []) if d.startswith(repo + "@")]
    if not digests:
        for line in client.api.push(tag, stream=True, decode=True):
            if "error" in line:
                raise RuntimeError(f"push of {tag} failed: {line['error']}")
        image.reload()
        digests = [d for d in image.attrs.get("RepoDigests") or [] if d.startswith(repo + "@")]
    return {"tag": tag, "id": image.id, "repo_digest": digests[0] if digests else None,
            "flashinfer": FLASHINFER, "torch": torch}
