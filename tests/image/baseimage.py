"""Builds arm64 stand-ins for the vllm-openai base image, without the internet.

The root filesystem is Debian's arm64 python3.11 (packages fetched with ``apt-get download``)
plus a real vLLM release's Python sources, laid out as an installed package in
``usr/local/lib/python3.11/dist-packages`` with its ``dist-info`` and byte-code caches.  The
native extensions (``*.so`` and other ELF files) are left out: nothing here runs CUDA.

Byte-code: the whole package is compiled the way pip does it (timestamp pycs), and the parts
that the image tests patch are compiled again as *unchecked-hash* pycs, which Python never
checks against the source.  Such a pyc left beside a patched module would be loaded instead of
it, so the end-to-end test proves that ``build-image`` leaves none behind.

Everything expensive is cached and keyed by content: the .debs under the cache folder, and the
image itself, which carries its key in a label and is rebuilt only when the key changes.

Run as a script to (re)build the bases by hand:
``python tests/image/baseimage.py 0.27.1 0.33.0``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

import docker

DEBS = ("python3.11-minimal", "libpython3.11-minimal", "libpython3.11-stdlib", "libffi8",
        "libbz2-1.0", "liblzma5", "libc6", "libexpat1", "zlib1g", "libssl3", "busybox-static")
SITE = "usr/local/lib/python3.11/dist-packages"
# Compiled as unchecked-hash pycs: the modules the image tests patch live here.
STALE_DIRS = ("vllm/config", "vllm/utils")
KEY_LABEL = "io.patchkit.test.base-key"
BUILDER_VERSION = "3"  # bump when the layout below changes


def cache_root() -> Path:
    """The persistent cache the real-vLLM tests share (wheels, .debs), never a test's own."""
    return Path(os.environ.get("PATCHKIT_REAL_CACHE") or Path.home() / ".cache" / "patchkit")


def _run(cmd: list[str], **kw) -> str:
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}")
    return proc.stdout


def fetch_debs(dest: Path) -> list[Path]:
    """The arm64 .debs, downloaded once into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    have = {p.name.split("_")[0]: p for p in dest.glob("*_arm64.deb")}
    have.update({p.name.split("_")[0]: p for p in dest.glob("*_all.deb")})
    missing = [d for d in DEBS if d not in have]
    if missing:
        lists = dest / "lists"
        (lists / "partial").mkdir(parents=True, exist_ok=True)
        opts = ["-oAPT::Architecture=arm64", "-oAPT::Architectures=arm64",
                f"-oDir::State::Lists={lists}", "-oDir::Cache=" + str(dest / "apt-cache")]
        _run(["apt-get", *opts, "-qq", "update"])
        _run(["apt-get", *opts, "-qq", "download", *missing], cwd=dest)
        have = {p.name.split("_")[0]: p for p in dest.glob("*.deb")}
    return [have[d] for d in DEBS]


def find_wheel(version: str) -> Path:
    """The cached wheel of vLLM ``version``, downloaded from PyPI when missing."""
    wheels = cache_root() / "pypi" / "wheels"
    found = sorted(wheels.glob(f"vllm-{version}-*.whl"))
    if found:
        return found[0]
    wheels.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "pip", "download", f"vllm=={version}", "--no-deps",
          "--only-binary", ":all:", "--platform", "manylinux_2_28_x86_64", "-d", str(wheels),
          "-q"])
    return sorted(wheels.glob(f"vllm-{version}-*.whl"))[0]


def _is_native(name: str, head: bytes) -> bool:
    return name.endswith(".so") or ".so." in name.rsplit("/", 1)[-1] or head[:4] == b"\x7fELF"


def install_wheel(wheel: Path, site: Path) -> int:
    """Lays the wheel's sources out under ``site``; returns how many files were written."""
    count = 0
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            name = info.filename
            if name.endswith("/") or name.endswith("dist-info/RECORD"):
                continue
            with zf.open(info) as src:
                head = src.read(4)
                if _is_native(name, head):
                    continue
                target = site / name
                target.parent.mkdir(parents=True, exist_ok=True)
                with open(target, "wb") as out:
                    out.write(head)
                    shutil.copyfileobj(src, out)
            # The wheel's own timestamps, as pip keeps them.
            stamp = time.mktime(info.date_time + (0, 0, -1))
            os.utime(target, (stamp, stamp))
            count += 1
    return count


def compile_caches(site: Path) -> None:
    if sys.version_info[:2] != (3, 11):
        raise RuntimeError("the base images need byte-code for Python 3.11; run under 3.11")
    _run([sys.executable, "-m", "compileall", "-q", "-j", "0", str(site / "vllm")])
    for part in STALE_DIRS:
        _run([sys.executable, "-m", "compileall", "-q", "-f", "--invalidation-mode",
              "unchecked-hash", "-d", "/" + SITE + "/" + part, str(site / part)])


def make_rootfs(version: str, debs: list[Path], wheel: Path, out_tar: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="pk-rootfs-") as tmp:
        root = Path(tmp)
        for deb in debs:
            _run(["dpkg", "-x", str(deb), str(root)])
        (root / "bin").mkdir(exist_ok=True)
        if not (root / "bin" / "sh").exists():
            os.symlink("busybox", root / "bin" / "sh")
        py = root / "usr" / "bin" / "python3"
        if not py.exists():
            os.symlink("python3.11", py)
        for d in ("tmp", "root", "etc"):
            (root / d).mkdir(exist_ok=True)
        site = root / SITE
        site.mkdir(parents=True)
        install_wheel(wheel, site)
        compile_caches(site)
        with tarfile.open(out_tar, "w", format=tarfile.PAX_FORMAT) as tar:
            def owner(ti: tarfile.TarInfo) -> tarfile.TarInfo:
                ti.uid = ti.gid = 0
                ti.uname = ti.gname = "root"
                return ti
            for entry in sorted(root.iterdir()):
                tar.add(entry, arcname=entry.name, filter=owner)


DOCKERFILE = """\
FROM scratch
ADD rootfs.tar /
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
LABEL {key_label}={key} org.opencontainers.image.title="pk-test vllm base {version}"
ENTRYPOINT ["/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server"]
"""


def base_key(version: str, debs: list[Path], wheel: Path) -> str:
    h = hashlib.sha256(BUILDER_VERSION.encode())
    h.update(Path(__file__).read_bytes())
    for p in [*debs, wheel]:
        h.update(p.name.encode())
        h.update(str(p.stat().st_size).encode())
    h.update(version.encode())
    return h.hexdigest()[:24]


def ensure_base(client: docker.DockerClient, version: str, tag: str, *, push: bool = True,
                log=print) -> dict:
    """The arm64 base holding vLLM ``version``, tagged ``tag``; built only when missing or stale.

    Returns ``{"tag", "id", "repo_digest", "built", "seconds"}``.
    """
    debs = fetch_debs(cache_root() / "test-image" / "debs")
    wheel = find_wheel(version)
    key = base_key(version, debs, wheel)
    started = time.monotonic()
    built = False
    try:
        image = client.images.get(tag)
        if (image.labels or {}).get(KEY_LABEL) != key:
            raise docker.errors.ImageNotFound("stale")
    except docker.errors.ImageNotFound:
        log(f"building the arm64 base {tag} (vLLM {version})")
        with tempfile.TemporaryDirectory(prefix="pk-base-") as ctx:
            ctxp = Path(ctx)
            make_rootfs(version, debs, wheel, ctxp / "rootfs.tar")
            (ctxp / "Dockerfile").write_text(DOCKERFILE.format(key_label=KEY_LABEL, key=key,
                                                               version=version))
            image, _ = client.images.build(path=ctx, tag=tag, platform="linux/arm64", rm=True,
                                           forcerm=True)
        built = True
    repo_digest = None
    if push:
        repo = tag.rsplit(":", 1)[0]
        digests = [d for d in (image.attrs.get("RepoDigests") or []) if d.startswith(repo + "@")]
        if built or not digests:
            for line in client.api.push(tag, stream=True, decode=True):
                if "error" in line:
                    raise RuntimeError(f"push of {tag} failed: {line['error']}")
            image.reload()
            digests = [d for d in image.attrs.get("RepoDigests") or [] if d.startswith(repo + "@")]
        repo_digest = digests[0] if digests else None
    return {"tag": tag, "id": image.id, "repo_digest": repo_digest, "built": built,
            "seconds": round(time.monotonic() - started, 1)}


def main(argv: list[str]) -> int:
    registry = os.environ.get("PK_REGISTRY", "127.0.0.1:5055")
    client = docker.from_env(timeout=600)
    for version in argv or ["0.27.1", "0.33.0"]:
        info = ensure_base(client, version, f"{registry}/pk-test/vllm-base:{version}")
        print(info)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
