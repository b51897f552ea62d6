"""Builds arm64 stand-ins for the vllm-openai base image, without the internet.

The root filesystem is Debian's arm64 python3.11 (packages fetched with ``apt-get download``)
plus a real vLLM release's Python sources, laid out as an installed package in
``usr/local/lib/python3.11/dist-packages`` with its ``dist-info`` and byte-code caches.  The
native extensions (``*.so`` and other ELF files) are left out: nothing here runs CUDA.

Byte-code: the whole package is compiled the way pip does it (timestamp pycs), and the parts
that the image tests patch are compiled again as *unchecked-hash* pycs, which Python never
checks against the source.  Such a pyc left beside a patched module would be loaded instead of
it, so the end-to-end test proves that ``build-image`` leaves none behind.

Besides bases holding a release as PyPI ships it, a ``Flavour`` gives the builds users really
have: a dev build (a release's sources reporting ``0.31.1.dev7+g<sha>``, the shape of version
a build from a commit of main reports) and a vendor build (a release's sources with the
vendor's own edits, reporting ``0.31.0+nv25.11``).

Everything expensive is cached and keyed by content: the .debs under the cache folder, and the
image itself, which carries its key in a label and is rebuilt only when the key changes.

Run as a script to (re)build the bases by hand:
``python tests/image/baseimage.py 0.27.1 0.33.0 dev vendor``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import docker
from packaging.version import Version

DEBS = ("python3.11-minimal", "libpython3.11-minimal", "libpython3.11-stdlib", "libffi8",
        "libbz2-1.0", "liblzma5", "libc6", "libexpat1", "zlib1g", "libssl3", "busybox-static")
SITE = "usr/local/lib/python3.11/dist-packages"
# Compiled as unchecked-hash pycs: the modules the image tests patch live here.
STALE_DIRS = ("vllm/config", "vllm/utils")
KEY_LABEL = "io.patchkit.test.base-key"
BUILDER_VERSION = "3"  # bump when the layout below changes


def cache_root() -> Path:
    """The persistent cache the real-vLLM tests share (wheels, .debs), never a test's own."""
    from testing import real_cache

    return real_cache()


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


@dataclass(frozen=True)
class Edit:
    """One change a vendor made to a release's file: ``added`` goes right after the one line
    equal to ``after``, or at the end of the file when ``after`` is None.  ``marker`` is a
    string found only in ``added``, for tests to look for."""

    file: str
    added: str
    marker: str
    after: str | None = None
    touched_by_patchset: bool = False  # whether the DSpark patchset changes this file too


@dataclass(frozen=True)
class Flavour:
    """What a base holds beyond a release's wheel: the version it reports and its edits."""

    release: str                  # the release whose sources the base holds
    version: str                  # the version its _version.py and dist-info report
    commit_id: str | None = None  # _version.py's commit_id; None keeps the wheel's
    edits: tuple[Edit, ...] = field(default=())

    def to_json(self) -> dict:
        return asdict(self)


DEV_RELEASE = "0.31.0"


def dev_flavour(commit: str) -> Flavour:
    """A build of ``commit``, release 0.31.0's commit, with a version of the shape setuptools-scm
    gives a build seven commits past v0.31.0 (``0.31.1.dev7+g<short sha>``): the base holds
    exactly the pinned commit's files, whatever its version string says."""
    short = commit[:9]
    return Flavour(release=DEV_RELEASE, version=f"0.31.1.dev7+g{short}", commit_id=f"g{short}")


# Two files the DSpark patchset leaves alone, and one it patches (by diff) where the vendor's
# addition lies far from the patch's hunks: a vendor's changes must survive patching.
VENDOR_EDITS = (
    Edit(file="vllm/envs.py",
         added='\n\n# NVIDIA 25.11: the build id the container\'s support tooling reads.\n'
               'NV_VLLM_BUILD = "nv25.11"  # PK_VENDOR_EDIT envs\n',
         marker="PK_VENDOR_EDIT envs"),
    Edit(file="vllm/platforms/cuda.py",
         after="logger = init_logger(__name__)",
         added='\n# NVIDIA 25.11: GB10 (sm_121) is validated with this build\'s kernels.\n'
               'NV_VALIDATED_CAPABILITIES = ((12, 1),)  # PK_VENDOR_EDIT cuda\n',
         marker="PK_VENDOR_EDIT cuda"),
    Edit(file="vllm/models/deepseek_v4/attention.py",
         added='\n\n# NVIDIA 25.11: DeepSeek-V4 attention as tuned for GB10.\n'
               'NV_DSV4_ATTENTION_TUNED = True  # PK_VENDOR_EDIT attention\n',
         marker="PK_VENDOR_EDIT attention", touched_by_patchset=True),
)

VENDOR = Flavour(release=DEV_RELEASE, version="0.31.0+nv25.11", edits=VENDOR_EDITS)


def edited_text(text: str, edit: Edit) -> str:
    """``text`` with ``edit`` made; the anchor line must occur exactly once."""
    if edit.after is None:
        return text + edit.added
    lines = text.splitlines(keepends=True)
    hits = [i for i, line in enumerate(lines) if line.rstrip("\n") == edit.after]
    if len(hits) != 1:
        raise RuntimeError(f"{edit.file}: the line {edit.after!r} occurs {len(hits)} times, "
                           "not once")
    i = hits[0] + 1
    return "".join(lines[:i]) + edit.added + "".join(lines[i:])


def _rewrite(path: Path, change) -> None:
    """Rewrites ``path`` through ``change`` keeping its timestamps, as a vendor's build would
    have them (the byte-code is compiled afterwards, from the changed text)."""
    st = path.stat()
    path.write_text(change(path.read_text(encoding="utf-8")), encoding="utf-8")
    os.utime(path, (st.st_atime, st.st_mtime))


def _replace_once(text: str, old: str, new: str, where: str) -> str:
    if text.count(old) != 1:
        raise RuntimeError(f"{where}: {old!r} occurs {text.count(old)} times, not once")
    return text.replace(old, new)


def version_tuple(version: str) -> tuple:
    """The tuple setuptools-scm writes beside ``version``: (0, 31, 1, 'dev7', 'g1234abcd')."""
    v = Version(version)
    parts: list = list(v.release)
    if v.pre:
        parts.append(f"{v.pre[0]}{v.pre[1]}")
    if v.dev is not None:
        parts.append(f"dev{v.dev}")
    if v.local:
        parts.append(v.local)
    return tuple(parts)


def apply_flavour(site: Path, flavour: Flavour) -> None:
    """Makes the release laid out under ``site`` into ``flavour``."""
    for edit in flavour.edits:
        _rewrite(site / edit.file, lambda text, e=edit: edited_text(text, e))
    if flavour.version == flavour.release and flavour.commit_id is None:
        return
    rel = flavour.release

    def version_py(text: str) -> str:
        text = _replace_once(text, f"__version__ = version = {rel!r}\n",
                             f"__version__ = version = {flavour.version!r}\n", "vllm/_version.py")
        prefix = "__version_tuple__ = version_tuple = "
        text = _replace_once(text, f"{prefix}{version_tuple(rel)!r}\n",
                             f"{prefix}{version_tuple(flavour.version)!r}\n", "vllm/_version.py")
        if flavour.commit_id is not None:
            lines = [line for line in text.splitlines() if line.startswith("__commit_id__ = ")]
            if len(lines) != 1:
                raise RuntimeError("vllm/_version.py: no single __commit_id__ line")
            text = text.replace(lines[0], f"__commit_id__ = commit_id = {flavour.commit_id!r}")
        return text

    _rewrite(site / "vllm" / "_version.py", version_py)
    old_info = site / f"vllm-{rel}.dist-info"
    new_info = site / f"vllm-{flavour.version}.dist-info"
    _rewrite(old_info / "METADATA",
             lambda text: _replace_once(text, f"\nVersion: {rel}\n",
                                        f"\nVersion: {flavour.version}\n", "METADATA"))
    old_info.rename(new_info)


def compile_caches(site: Path) -> None:
    if sys.version_info[:2] != (3, 11):
        raise RuntimeError("the base images need byte-code for Python 3.11; run under 3.11")
    _run([sys.executable, "-m", "compileall", "-q", "-j", "0", str(site / "vllm")])
    for part in STALE_DIRS:
        _run([sys.executable, "-m", "compileall", "-q", "-f", "--invalidation-mode",
              "unchecked-hash", "-d", "/" + SITE + "/" + part, str(site / part)])


def make_rootfs(version: str, debs: list[Path], wheel: Path, out_tar: Path,
                flavour: Flavour | None = None) -> None:
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
        if flavour is not None:
            apply_flavour(site, flavour)
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


def base_key(version: str, debs: list[Path], wheel: Path, flavour: Flavour | None = None) -> str:
    h = hashlib.sha256(BUILDER_VERSION.encode())
    h.update(Path(__file__).read_bytes())
    for p in [*debs, wheel]:
        h.update(p.name.encode())
        h.update(str(p.stat().st_size).encode())
    h.update(version.encode())
    if flavour is not None:
        h.update(json.dumps(flavour.to_json(), sort_keys=True).encode())
    return h.hexdigest()[:24]


def tag_of(version: str) -> str:
    """A version as an image tag, which cannot hold ``+``: 0.31.0+nv25.11 -> 0.31.0-nv25.11."""
    return version.replace("+", "-")


def keyed_tag(tag: str, key: str) -> str:
    """``tag`` with the base's key in it: repo:0.27.1 -> repo:0.27.1-k<key>."""
    repo, sep, name = tag.rpartition(":")
    if not sep or "/" in name:  # no tag part: the colon was the registry's port
        repo, name = tag, "latest"
    return f"{repo}:{name}-k{key[:12]}"


def ensure_base(client: docker.DockerClient, version: str, tag: str, *, push: bool = True,
                log=print, flavour: Flavour | None = None) -> dict:
    """The arm64 base holding vLLM ``version``, tagged ``tag`` plus its key (``keyed_tag``);
    built only when missing.  With ``flavour`` (whose release must be ``version``) it holds
    that build instead.

    The key in the tag lets checkouts whose builders differ share one engine and registry:
    each finds its own base instead of rebuilding the other's under a shared tag (and pulling
    it from under the other's running tests).

    Returns ``{"tag", "id", "repo_digest", "built", "seconds", "version"}``; ``tag`` is the
    keyed tag, ``version`` what the base reports.
    """
    if flavour is not None and flavour.release != version:
        raise ValueError(f"the flavour is of {flavour.release}, not {version}")
    debs = fetch_debs(cache_root() / "test-image" / "debs")
    wheel = find_wheel(version)
    key = base_key(version, debs, wheel, flavour)
    tag = keyed_tag(tag, key)
    reported = flavour.version if flavour is not None else version
    started = time.monotonic()
    built = False
    try:
        image = client.images.get(tag)
        if (image.labels or {}).get(KEY_LABEL) != key:
            raise docker.errors.ImageNotFound("stale")
    except docker.errors.ImageNotFound:
        log(f"building the arm64 base {tag} (vLLM {reported})")
        with tempfile.TemporaryDirectory(prefix="pk-base-") as ctx:
            ctxp = Path(ctx)
            make_rootfs(version, debs, wheel, ctxp / "rootfs.tar", flavour)
            (ctxp / "Dockerfile").write_text(DOCKERFILE.format(key_label=KEY_LABEL, key=key,
                                                               version=reported))
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
            "seconds": round(time.monotonic() - started, 1), "version": reported}


def release_commit(release: str) -> str:
    """The commit of ``release`` in patchkit's PyPI source (the cached repository with one
    tagged commit per release, whose ids depend on the release alone)."""
    from patchkit.source import pypi

    repo, tag = pypi.ensure_release(cache_root(), f"v{release}")
    return _run(["git", "-C", str(repo), "rev-parse", "--verify",
                 f"refs/tags/{tag}^{{commit}}"]).strip()


def ensure_dev_base(client: docker.DockerClient, registry: str, *, log=print) -> dict:
    """The dev-build base: 0.31.0's sources reporting ``0.31.1.dev7+g<its commit>``.

    Adds ``release``, ``ref``, ``commit`` (the full id the version names) to ensure_base's info.
    """
    commit = release_commit(DEV_RELEASE)
    flavour = dev_flavour(commit)
    info = ensure_base(client, flavour.release,
                       f"{registry}/pk-test/vllm-base:{tag_of(flavour.version)}",
                       flavour=flavour, log=log)
    return {**info, "release": flavour.release, "ref": f"v{flavour.release}", "commit": commit}


def ensure_vendor_base(client: docker.DockerClient, registry: str, *, log=print) -> dict:
    """The vendor base: 0.31.0's sources with VENDOR_EDITS, reporting ``0.31.0+nv25.11``.

    Adds ``release``, ``ref`` and ``edits`` (each Edit as a dict) to ensure_base's info.
    """
    info = ensure_base(client, VENDOR.release,
                       f"{registry}/pk-test/vllm-base:{tag_of(VENDOR.version)}",
                       flavour=VENDOR, log=log)
    return {**info, "release": VENDOR.release, "ref": f"v{VENDOR.release}",
            "edits": [asdict(e) for e in VENDOR.edits]}


def main(argv: list[str]) -> int:
    registry = os.environ["PK_REGISTRY"]
    client = docker.from_env(timeout=600)
    for what in argv or ["0.27.1", "0.33.0", "dev", "vendor"]:
        if what == "dev":
            info = ensure_dev_base(client, registry)
        elif what == "vendor":
            info = ensure_vendor_base(client, registry)
        else:
            info = ensure_base(client, what, f"{registry}/pk-test/vllm-base:{what}")
        print(info)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
