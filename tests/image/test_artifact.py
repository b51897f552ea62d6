"""`artifact:`: a compiled module from a pinned wheel, checked (both sha256s, the member once,
an ELF shared object of the image's machine) and placed where the base installed its dist.
The shared objects are real: built with Debian's aarch64 cross compiler and the host's gcc."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import textwrap
import warnings
import zipfile
from pathlib import Path

import pytest

from patchkit.image import artifact, build, distinfo, prebuilt
from patchkit.errors import ImageError
from patchkit.image.artifact import ArtifactError
from patchkit.manifest.model import Artifact
from testing import one_error, patchkit
from testing.checkout import applied
from testing.flashinfer import MOE_HEADER as HEADER, MOE_MODULES as MODULES
from testing.imagetree import FI, SITE, TreeFiles, dist
from testing.project import make_project

MEMBER = "flashinfer_jit_cache/jit_cache/fused_moe_120/fused_moe_120.so"
CROSS = "aarch64-linux-gnu-gcc"


def _compile(tmp: Path, cc: str, *flags: str) -> bytes:
    if shutil.which(cc) is None:
        # CI installs it (apt-get install -y gcc-aarch64-linux-gnu); without it this is a setup
        # error, not a pass
        pytest.fail(f"{cc} is not installed: apt-get install -y gcc-aarch64-linux-gnu")
    src = tmp / "m.c"
    src.write_text("int fused_moe_120_min_latency(int x) { return 2 * x; }\n")
    out = tmp / f"m-{cc}.out"
    subprocess.run([cc, *flags, "-o", str(out), str(src)], check=True)
    return out.read_bytes()


@pytest.fixture(scope="module")
def sos(tmp_path_factory) -> dict[str, bytes]:
    tmp = tmp_path_factory.mktemp("so")
    return {"aarch64": _compile(tmp, CROSS, "-shared", "-fPIC"),
            "object": _compile(tmp, CROSS, "-c"),
            "x86_64": _compile(tmp, "gcc", "-shared", "-fPIC")}


def wheel(tmp: Path, members: list[tuple[str, bytes]]) -> tuple[Path, str]:
    path = tmp / "flashinfer_jit_cache-0.6.15+cu130-cp39-abi3-manylinux_2_28_aarch64.whl"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # a duplicated name is what one test is about
        with zipfile.ZipFile(path, "w") as zf:
            for name, data in members:
                zf.writestr(name, data)
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def pins(path: Path, sha: str, data: bytes, member: str = MEMBER) -> Artifact:
    return Artifact(path.name, sha, member, hashlib.sha256(data).hexdigest(),
                    "flashinfer-jit-cache")


def test_a_real_aarch64_module_passes_for_arm64(tmp_path, sos):
    path, sha = wheel(tmp_path, [(MEMBER, sos["aarch64"])])
    data = artifact.checked(pins(path, sha, sos["aarch64"]), tmp_path, "arm64", "linux/arm64",
                            None, 5)
    assert data == sos["aarch64"]


@pytest.mark.parametrize("case, expected", [
    ("x86-for-arm", "artifact W: " + MEMBER + " is built for x86-64 (ELF machine 62); the image "
                    "is linux/arm64 (ELF machine 183)"),
    ("object-file", "artifact W: " + MEMBER + " is not a shared object (ELF type 1)"),
    ("not-elf", "artifact W: " + MEMBER + " is not an ELF file"),
    ("wheel-sha", "artifact W: sha256 {got}, the manifest pins " + "0" * 64),
    ("member-sha", "artifact W: " + MEMBER + " has sha256 {member}, the manifest pins "
                   + "1" * 64),
    ("absent", "artifact W: no member flashinfer_jit_cache/jit_cache/x/x.so"),
    ("twice", "artifact W: " + MEMBER + " is in it 2 times; which one would be placed is not "
              "defined"),
])
def test_each_misfit_is_one_line(tmp_path, sos, case, expected):
    data = {"x86-for-arm": sos["x86_64"], "object-file": sos["object"],
            "not-elf": b"#!/bin/sh\n"}.get(case, sos["aarch64"])
    members = [(MEMBER, data)] * (2 if case == "twice" else 1)
    path, sha = wheel(tmp_path, members)
    a = pins(path, sha, data)
    if case == "wheel-sha":
        a = Artifact(a.wheel, "0" * 64, a.member, a.member_sha256, a.dist)
    if case == "member-sha":
        a = Artifact(a.wheel, a.sha256, a.member, "1" * 64, a.dist)
    if case == "absent":
        a = Artifact(a.wheel, a.sha256, "flashinfer_jit_cache/jit_cache/x/x.so",
                     a.member_sha256, a.dist)
    with pytest.raises(ArtifactError) as err:
        artifact.checked(a, tmp_path, "arm64", "linux/arm64", None, 5)
    assert err.value.exit_code == 2
    assert str(err.value) == expected.replace("W", path.name).format(
        got=sha, member=hashlib.sha256(data).hexdigest())


def test_the_member_is_placed_where_the_base_installed_its_dist(sos):
    cache = {"flashinfer_jit_cache/__init__.py": b""}
    files = TreeFiles({**dist("flashinfer-python", "0.6.15", FI),
                       **dist("flashinfer-jit-cache", "0.6.15+cu130", cache)})
    installed = distinfo.installed(files, {})
    entries: list = []
    placed = build.PlacedArtifact("fi-moe-120", "flashinfer-jit-cache", MEMBER, sos["aarch64"])
    build._place_artifacts(installed, files, "base:arm64", [placed], entries, set(), print)
    site = SITE.lstrip("/")
    assert [(e.path, e.kind) for e in entries] == [
        (f"{site}/flashinfer_jit_cache/jit_cache", "dir"),
        (f"{site}/flashinfer_jit_cache/jit_cache/fused_moe_120", "dir"),
        (f"{site}/{MEMBER}", "file")]
    assert entries[-1].data == sos["aarch64"] and entries[-1].mode == 0o755
    # the module it ships counts as rebuilt: no refusal, no whiteout
    shadowing = TreeFiles({**dist("flashinfer-python", "0.6.15", FI),
                           **dist("flashinfer-jit-cache", "0.6.15+cu130", {MEMBER: b"old"})})
    tree = build.PackageTree("flashinfer", "flashinfer-python", applied({HEADER: MODULES}), (),
                             SITE)
    assert prebuilt.leave_out(shadowing, distinfo.installed(shadowing, {}), {}, [tree], "b",
                              print, {("flashinfer-jit-cache", MEMBER)}) == []
    with pytest.raises(ImageError):   # without the artifact, the module would shadow the header
        prebuilt.leave_out(shadowing, distinfo.installed(shadowing, {}), {}, [tree], "b")


def test_an_artifact_for_a_dist_the_base_lacks_is_one_line(sos):
    files = TreeFiles(dist("flashinfer-python", "0.6.15", FI))
    placed = build.PlacedArtifact("fi-moe-120", "flashinfer-jit-cache", MEMBER, sos["aarch64"])
    with pytest.raises(ArtifactError) as err:
        build._place_artifacts(distinfo.installed(files, {}), files, "base:arm64", [placed], [],
                               set(), print)
    assert str(err.value).startswith("patch fi-moe-120: artifact for flashinfer-jit-cache, "
                                     "which base base:arm64 does not have installed")


def _project(tmp_path: Path, data: bytes, member_sha: str | None = None) -> Path:
    proj = make_project(tmp_path)
    (proj / "wheels").mkdir()
    path, sha = wheel(proj / "wheels", [(MEMBER, data)])
    entry = textwrap.dedent(f"""\
          - id: fi-moe-120-minlat
            summary: the min-latency fused MoE module for sm120, rebuilt
            artifact:
              wheel: wheels/{path.name}
              sha256: {sha}
              member: {MEMBER}
              member_sha256: {member_sha or hashlib.sha256(data).hexdigest()}
              dist: flashinfer-jit-cache
        """)
    text = (proj / "patchset.yaml").read_text() + textwrap.indent(entry, "  ")
    (proj / "patchset.yaml").write_text(text)
    return proj


def test_validate_and_apply_take_an_artifact(tmp_path, sos):
    proj = _project(tmp_path, sos["aarch64"])
    p = patchkit("validate", cwd=proj)
    assert p.returncode == 0, p.stderr
    p = patchkit("apply", "--format", "json", cwd=proj)
    assert p.returncode == 0, p.stderr
    import json
    [mine] = [x for x in json.loads(p.stdout)["patches"] if x["id"] == "fi-moe-120-minlat"]
    assert (mine["kind"], mine["status"], mine["commit"], mine["files"]) == (
        "artifact", "applied", None, [])


def test_validate_refuses_a_wrong_machine_in_one_line(tmp_path, sos):
    proj = _project(tmp_path, sos["x86_64"])
    p = patchkit("validate", cwd=proj)
    assert p.returncode == 2, p.stderr
    line = one_error(p)
    assert line.endswith(f"(id=fi-moe-120-minlat): artifact flashinfer_jit_cache-0.6.15+cu130-"
                         f"cp39-abi3-manylinux_2_28_aarch64.whl: {MEMBER} is built for x86-64 "
                         "(ELF machine 62); the image is linux/arm64 (ELF machine 183)")


def test_verify_image_proves_the_members_bytes(sos):
    from patchkit.commands.verify import _artifact_proofs
    from patchkit.manifest.model import Patch

    good = hashlib.sha256(sos["aarch64"]).hexdigest()

    def patch(member_sha: str, dist_name: str = "flashinfer-jit-cache") -> Patch:
        return Patch(id="fi-moe-120", summary="s", kind="artifact", path="w.whl",
                     artifact=Artifact("w.whl", "0" * 64, MEMBER, member_sha, dist_name))

    files = TreeFiles({**dist("flashinfer-jit-cache", "0.6.15+cu130", {MEMBER: sos["aarch64"]})})
    [ok] = _artifact_proofs([patch(good)], files, {}, "img")
    assert ok.ok and ok.message == f"{SITE}/{MEMBER} has the pinned sha256 {good[:12]}"
    [bad] = _artifact_proofs([patch("f" * 64)], files, {}, "img")
    assert not bad.ok and bad.message.endswith(f", the artifact pins {'f' * 12}")
    [gone] = _artifact_proofs([patch(good, "other-dist")], files, {}, "img")
    assert not gone.ok and gone.message == "image img has no other-dist installed"


def test_the_lock_records_each_artifact(tmp_path):
    from patchkit.image import lockfile

    lock = lockfile.Lock("base", "sha256:" + "0" * 64, {}, {"flashinfer-jit-cache": "0.6.15"},
                      {"fi-moe-120": {"dist": "flashinfer-jit-cache", "member": MEMBER,
                                      "member_sha256": "a" * 64, "wheel_sha256": "b" * 64}})
    text = lock.render().decode()
    assert f'[artifacts."fi-moe-120"]\ndist = "flashinfer-jit-cache"\nmember = "{MEMBER}"' in text
    (tmp_path / "patchset.lock").write_text(text)
    assert lockfile.Lock.read(tmp_path / "patchset.lock") == lock
