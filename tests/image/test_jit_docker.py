"""Compiled code through the real Docker Engine: the arm64 stack base with a
``flashinfer_jit_cache`` dist installed as pip installs it (RECORD), whose ``fused_moe_120.so``
is a real aarch64 shared object; a patch of our own to the CUTLASS MoE header that module is
built from.  The prebuilt module is refused, left out with ``rebuild: jit``, or replaced by an
artifact; the image's JIT cache gets a place of its own; ``verify --image`` proves it."""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from contextlib import ExitStack
from pathlib import Path

import docker
import pytest

from testing import flashinfer as fi
from testing import imageproject as ip
from testing import jitcache, release_cache, stackbase
from testing.imageproject import RELEASE, SITE, write_manifest
from testing.progress import Said
from testing.stackbase import flashinfer_wheel
from patchkit import manifest
from patchkit.commands import build_image, verify
from patchkit.errors import ImageError
from patchkit.engines.docker import Engine
from patchkit.series.applier import apply_series
from patchkit.run import run_spec

pytestmark = [pytest.mark.docker, pytest.mark.real_vllm, pytest.mark.timeout(1800)]

MODULE = "flashinfer_jit_cache/jit_cache/fused_moe_120/fused_moe_120.so"
NORM = "flashinfer_jit_cache/jit_cache/norm/norm.so"


def aarch64_so(tmp: Path, body: str) -> bytes:
    src = tmp / "m.c"
    src.write_text(f"int entry(int x) {{ return {body}; }}\n")
    subprocess.run(["aarch64-linux-gnu-gcc", "-shared", "-fPIC", "-o", str(tmp / "m.so"),
                    str(src)], check=True)
    return (tmp / "m.so").read_bytes()


@pytest.fixture(scope="module")
def objects(tmp_path_factory) -> dict[str, bytes]:
    tmp = tmp_path_factory.mktemp("so")
    return {"prebuilt": aarch64_so(tmp, "x"), "norm": aarch64_so(tmp, "x + 1"),
            "rebuilt": aarch64_so(tmp, "2 * x")}


@pytest.fixture(scope="module")
def jit_base(docker_client, bases, registry, objects) -> str:
    """The stack base plus flashinfer-jit-cache 0.6.15 (a prebuilt fused_moe_120 and norm)."""
    stack = stackbase.ensure_stack_base(docker_client, bases[RELEASE],
                                        f"{registry}/pk-test/vllm-stack:{RELEASE}-t2.11.0",
                                        log=lambda m: print(m, file=sys.stderr))
    files = stackbase.dist_only("flashinfer-jit-cache", "0.6.15",
                                {MODULE: objects["prebuilt"], NORM: objects["norm"],
                                 "flashinfer_jit_cache/__init__.py": b""})
    key = hashlib.sha256(b"".join([stack["id"].encode(), *sorted(files.values())])).hexdigest()
    return _layered(docker_client, stack["tag"], files,
                    f"{registry}/pk-test/vllm-stack-jit:{RELEASE}-k{key[:12]}")


def _layered(docker_client, base: str, files: dict[str, bytes], tag: str) -> str:
    """``base`` with ``files`` added in one layer, built once as ``tag`` and pushed."""
    try:
        docker_client.images.get(tag)
    except docker.errors.ImageNotFound:
        with tempfile.TemporaryDirectory(prefix="pk-jit-") as ctx:
            stackbase._tar(files, Path(ctx) / "files.tar")
            (Path(ctx) / "Dockerfile").write_text(f"FROM {base}\nADD files.tar /\n")
            docker_client.images.build(path=ctx, tag=tag, platform="linux/arm64", rm=True,
                                       forcerm=True)
    for line in docker_client.api.push(tag, stream=True, decode=True):
        assert "error" not in line, line
    return tag


def _project(root: Path, base: str, registry: str, extra: str) -> tuple[Path, manifest.Manifest]:
    ip.make_project(root, base="x", tag=f"{registry}/pk-test/stack-jit:{{ref}}")
    header = fi.moe_header(release_cache())
    diff = "".join(difflib.unified_diff(
        header.splitlines(True), fi.restore_low_latency(header).splitlines(True),
        f"a/{fi.MOE_HEADER}", f"b/{fi.MOE_HEADER}"))
    (root / "patches" / "flashinfer").mkdir()
    (root / "patches" / "flashinfer" / "fi-low-latency.diff").write_text(diff)
    entry = ("  - id: fi-low-latency\n"
             "    summary: restore the low-latency descriptor builder in place of a throw\n"
             "    package: flashinfer\n"
             "    diff: patches/flashinfer/fi-low-latency.diff\n" + extra)
    m = write_manifest(root, base, name=f"pk-jit-{secrets.token_hex(4)}")
    (root / "patchset.yaml").write_text((root / "patchset.yaml").read_text() + entry)
    m = manifest.load(root / "patchset.yaml")
    assert apply_series(m, run=run_spec(m, cache=release_cache()),
                        workdir=root / ".patchkit" / "vllm").ok
    return root, m


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine.connect(timeout=600)


def test_a_prebuilt_module_of_the_patched_header_is_refused(tmp_path, jit_base, registry,
                                                            engine):
    root, m = _project(tmp_path, jit_base, registry, "")
    with pytest.raises(ImageError) as err:
        build_image.run(m, build_image.Request(workdir=root / ".patchkit" / "vllm", apply=False,
                                               engine=engine,
                                               tag=f"{registry}/pk-test/stack-jit:refused"),
                                               progress=Said())
    assert str(err.value) == (
        f"base {jit_base} ships the prebuilt JIT module fused_moe_120 (flashinfer-jit-cache "
        f"0.6.15, {SITE}/flashinfer_jit_cache/jit_cache/fused_moe_120), which flashinfer loads "
        f"instead of compiling the patched {fi.MOE_HEADER}; say `rebuild: jit` on the patch to "
        "leave it out of the image, or ship the rebuilt module as an artifact")
    with pytest.raises(docker.errors.ImageNotFound):
        docker.from_env().images.get(f"{registry}/pk-test/stack-jit:refused")


def test_rebuild_jit_leaves_it_out_and_gives_the_cache_its_own_place(tmp_path, jit_base,
                                                                    registry, engine):
    root, m = _project(tmp_path, jit_base, registry, "    rebuild: jit\n")
    tag = f"{registry}/pk-test/stack-jit:rebuild-{secrets.token_hex(3)}"
    log = Said()
    report = build_image.run(m, build_image.Request(workdir=root / ".patchkit" / "vllm",
                                                    apply=False, engine=engine, tag=tag),
                                                    progress=log)
    assert report.ok, report.to_dict()
    image = engine.inspect(tag)
    place = image.env["FLASHINFER_WORKSPACE_BASE"]
    assert place.startswith("/root/.cache/patchkit-jit/")
    labels = image.labels
    assert labels["io.patchkit.jit.workspace"] == place
    assert json.loads(labels["io.patchkit.jit.modules"]) == {"flashinfer": {fi.MOE_HEADER:
                                                                         fi.MOE_MODULES}}
    with engine.files(image.id, tag) as files:
        assert files.read(f"{SITE}/{MODULE}") is None          # the prebuilt is gone
        assert files.read(f"{SITE}/{NORM}") is not None        # the one no patch feeds stays
        header = files.read(f"{SITE}/{fi.MOE_HEADER}").decode()
    assert header == fi.restore_low_latency(fi.moe_header(release_cache()))
    checked = verify.run(m, verify.Request(root / ".patchkit" / "vllm", image=tag, engine=engine))
    assert checked.ok, checked


def test_an_artifact_ships_the_rebuilt_module_and_verify_proves_it(tmp_path, jit_base, registry,
                                                                  engine, objects):
    (tmp_path / "wheels").mkdir()
    whl = tmp_path / "wheels" / ("flashinfer_jit_cache-0.6.15+cu130-cp39-abi3-"
                                 "manylinux_2_28_aarch64.whl")
    with zipfile.ZipFile(whl, "w") as zf:
        zf.writestr(MODULE, objects["rebuilt"])
    artifact = (
        "  - id: fi-moe-120-minlat\n"
        "    summary: the fused MoE module for sm120, rebuilt from the patched header\n"
        "    package: flashinfer\n"
        "    artifact:\n"
        f"      wheel: wheels/{whl.name}\n"
        f"      sha256: {hashlib.sha256(whl.read_bytes()).hexdigest()}\n"
        f"      member: {MODULE}\n"
        f"      member_sha256: {hashlib.sha256(objects['rebuilt']).hexdigest()}\n"
        "      dist: flashinfer-jit-cache\n")
    root, m = _project(tmp_path, jit_base, registry, artifact)   # an entry after the diff's
    tag = f"{registry}/pk-test/stack-jit:artifact-{secrets.token_hex(3)}"
    report = build_image.run(m, build_image.Request(workdir=root / ".patchkit" / "vllm",
                                                    apply=False, engine=engine, tag=tag),
                                                    progress=Said())
    assert report.ok, report.to_dict()
    image = engine.inspect(tag)
    with engine.files(image.id, tag) as files:
        assert files.read(f"{SITE}/{MODULE}") == objects["rebuilt"]
    assert json.loads(image.labels["io.patchkit.artifacts"])[0]["member"] == MODULE
    checked = verify.run(m, verify.Request(root / ".patchkit" / "vllm", image=tag, engine=engine))
    assert checked.ok, checked


# ------------------------------------------------------------------ FlashInfer 0.7: providers

NORM_HEADER = "flashinfer/data/include/flashinfer/norm.cuh"
GB10_NORM = "flashinfer_jit_cache/providers/sm121a/jit_cache/norm"
HOPPER_NORM = "flashinfer_jit_cache/providers/sm90a/jit_cache/norm"
NORM_SOURCES = ("flashinfer/data/csrc/norm.cu", "flashinfer/data/csrc/flashinfer_norm_binding.cu")


def _kept_07(name: str) -> bool:
    """What the 0.7.4 test base holds of the release: its JIT definitions, the headers, and
    the sources of ``norm`` (the CUDA sources of every other module are 390 MB)."""
    return (name.endswith(".py") and name.count("/") == 1 or name.startswith("flashinfer/jit/")
            or name.startswith("flashinfer/data/include/") or name in NORM_SOURCES
            or name.startswith("flashinfer/data/csrc/") and name.count("/") == 3
            and name.endswith(".h"))


@pytest.fixture(scope="module")
def jit07_base(docker_client, bases, registry, objects) -> str:
    """vLLM's base plus the real flashinfer-python 0.7.4 (the part above, its dist-info whole),
    the flashinfer-jit-cache shim, and two providers with a prebuilt ``norm``: one for GB10
    (sm121a) and one for Hopper (sm90a)."""
    files = jitcache.flashinfer_subset(flashinfer_wheel("0.7.4"), _kept_07)
    files.update(jitcache.shim("0.7.4+cu130"))
    files.update(jitcache.provider("sm121a", {"norm": objects["prebuilt"],
                                              "sampling": objects["norm"]}, "0.7.4+cu130"))
    files.update(jitcache.provider("sm90a", {"norm": objects["prebuilt"]}, "0.7.4+cu130"))
    key = hashlib.sha256(bases[RELEASE]["id"].encode() + b"".join(
        k.encode() + hashlib.sha256(v).digest() for k, v in sorted(files.items()))).hexdigest()
    return _layered(docker_client, bases[RELEASE]["tag"], files,
                    f"{registry}/pk-test/vllm-jit07:{RELEASE}-k{key[:12]}")


def _norm_diff(header: str) -> str:
    lines = header.splitlines(True)
    at = next(i for i, line in enumerate(lines) if line.startswith("namespace flashinfer {"))
    new = lines[:at + 1] + ["// patched: RMSNorm scaled by the patch\n"] + lines[at + 1:]
    return "".join(difflib.unified_diff(lines, new, f"a/{NORM_HEADER}", f"b/{NORM_HEADER}"))


def _scaled_norm_diff(header: str) -> str:
    """RMSNorm's output scaled by 2 in the CUDA kernel: a change a GPU shows in the numbers."""
    lines = header.splitlines(True)
    at = next(i for i, line in enumerate(lines) if "* rms_rcp * (weight_bias" in line)
    new = lines[:at] + [lines[at].replace("rms_rcp * (", "rms_rcp * 2.f * (")] + lines[at + 1:]
    return "".join(difflib.unified_diff(lines, new, f"a/{NORM_HEADER}", f"b/{NORM_HEADER}"))


def _project07(root: Path, base: str, registry: str, engine, extra: str, *,
               diff=_norm_diff, cuda_arch: str | None = None) -> tuple[Path, manifest.Manifest]:
    """A project whose FlashInfer is the one the base holds (``repo: image``), with a patch to
    ``norm.cuh`` (``diff`` of the release's header), applied; ``cuda_arch`` the target."""
    from patchkit.image import basevllm

    ip.make_project(root, base="x", tag=f"{registry}/pk-test/jit07:{{ref}}")
    with zipfile.ZipFile(flashinfer_wheel("0.7.4")) as zf:
        header = zf.read(NORM_HEADER).decode()
    (root / "patches" / "flashinfer").mkdir()
    (root / "patches" / "flashinfer" / "fi-norm.diff").write_text(diff(header))
    write_manifest(root, base, requires="{}", name=f"pk-jit07-{secrets.token_hex(4)}")
    text = (root / "patchset.yaml").read_text().replace("    repo: pypi\n    ref: v0.6.15\n",
                                                        "    repo: image\n", 1)
    if cuda_arch:
        text = text.replace("image:\n", f"image:\n  cuda_arch: \"{cuda_arch}\"\n", 1)
    (root / "patchset.yaml").write_text(
        text + "  - id: fi-norm\n    summary: scale RMSNorm in the CUDA kernel\n"
        "    package: flashinfer\n    diff: patches/flashinfer/fi-norm.diff\n" + extra)
    m = manifest.load(root / "patchset.yaml")
    spec = run_spec(m, engine=engine, cache=release_cache())
    with ExitStack() as hold:
        report = apply_series(m, run=spec, workdir=root / ".patchkit" / "vllm",
                              bases=basevllm.for_packages(spec, basevllm.held(spec, hold)))
    assert report.ok, report.to_json()
    assert report.jit_modules == {"flashinfer": {NORM_HEADER: ["norm"]}}
    return root, m


def test_07_a_gb10_provider_is_refused_and_rebuild_whites_out_its_norm_alone(
        tmp_path, jit07_base, registry, engine):
    root, m = _project07(tmp_path / "refused", jit07_base, registry, engine, "")
    with pytest.raises(ImageError) as err:
        build_image.run(m, build_image.Request(workdir=root / ".patchkit" / "vllm", apply=False,
                                               engine=engine, tag=f"{registry}/pk-test/jit07:no"),
                        progress=Said())
    assert str(err.value) == (
        f"base {jit07_base} ships the prebuilt JIT module norm (provider sm121a of "
        f"flashinfer-jit-cache-sm121a 0.7.4+cu130 for sm121a, {SITE}/{GB10_NORM}), which "
        f"flashinfer loads instead of compiling the patched {NORM_HEADER}; say `rebuild: jit` "
        "on the patch to leave it out of the image, or ship the rebuilt module as an artifact")

    root, m = _project07(tmp_path / "rebuilt", jit07_base, registry, engine,
                         "    rebuild: jit\n    runtime:\n      - jit_built: norm\n")
    tag = f"{registry}/pk-test/jit07:rebuild-{secrets.token_hex(3)}"
    report = build_image.run(m, build_image.Request(workdir=root / ".patchkit" / "vllm",
                                                    apply=False, engine=engine, tag=tag),
                             progress=Said())
    assert report.ok, report.to_dict()
    image = engine.inspect(tag)
    assert image.env["FLASHINFER_CUBIN_DIR"] == "/root/.cache/flashinfer/cubins"
    assert image.labels["io.patchkit.jit.cubins"] == "/root/.cache/flashinfer/cubins"
    assert image.labels["io.patchkit.jit.workspace"] == image.env["FLASHINFER_WORKSPACE_BASE"]
    with engine.files(image.id, tag) as files:
        assert not files.exists(f"{SITE}/{GB10_NORM}")                  # left out
        assert files.read(f"{SITE}/{HOPPER_NORM}/norm.so") is not None  # not GB10's: stays
        assert files.read(f"{SITE}/flashinfer_jit_cache/providers/sm121a/jit_cache/sampling/"
                          "sampling.so") is not None                    # fed by no patch
    checked = verify.run(m, verify.Request(root / ".patchkit" / "vllm", image=tag, engine=engine))
    assert checked.ok, checked.to_dict()
    ours = [a for a in checked.verify if a.file == NORM_HEADER]
    assert [(a.patch, a.ok) for a in ours] == [("fi-norm", True)]
    assert checked.to_dict()["jit"]["flashinfer"]["cubins"] == "/root/.cache/flashinfer/cubins"


def test_07_a_hopper_target_whites_out_the_hopper_providers_norm(tmp_path, jit07_base,
                                                                  registry, engine,
                                                                  docker_client):
    """With image.cuda_arch 90a the Hopper provider's norm would load and GB10's would not:
    the layer whites out exactly the Hopper one.  With PK_PROOF_OUT set, the image's overlay
    layer and its environment are written there, for the GPU proof of docs/compiled-code.md."""
    root, m = _project07(tmp_path, jit07_base, registry, engine, "    rebuild: jit\n",
                         diff=_scaled_norm_diff, cuda_arch="90a")
    tag = f"{registry}/pk-test/jit07:hopper-{secrets.token_hex(3)}"
    report = build_image.run(m, build_image.Request(workdir=root / ".patchkit" / "vllm",
                                                    apply=False, engine=engine, tag=tag),
                             progress=Said())
    assert report.ok, report.to_dict()
    image = engine.inspect(tag)
    with engine.files(image.id, tag) as files:
        assert not files.exists(f"{SITE}/{HOPPER_NORM}")                 # left out
        assert files.read(f"{SITE}/{GB10_NORM}/norm.so") is not None     # never loaded on 90a
        assert b"rms_rcp * 2.f * (" in files.read(f"{SITE}/{NORM_HEADER}")
    out = os.environ.get("PK_PROOF_OUT")
    if out:
        _write_proof(docker_client, tag, Path(out))


def _write_proof(docker_client, tag: str, out: Path) -> None:
    """The image's last layer (patchkit's overlay: the patched files and the whiteouts) and
    its environment and labels, as files."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pk-proof-") as tmp:
        saved = Path(tmp) / "image.tar"
        with saved.open("wb") as fh:
            for chunk in docker_client.images.get(tag).save():
                fh.write(chunk)
        with tarfile.open(saved) as tar:
            [entry] = json.load(tar.extractfile("manifest.json"))
            config = json.load(tar.extractfile(entry["Config"]))
            (out / "layer.tar").write_bytes(tar.extractfile(entry["Layers"][-1]).read())
    (out / "image.json").write_text(json.dumps({"tag": tag, "site": SITE,
                                                "env": config["config"]["Env"],
                                                "labels": config["config"]["Labels"]}, indent=2))


def test_07_a_hand_made_image_fails_verify_naming_module_and_provider(
        tmp_path, jit07_base, registry, engine, docker_client):
    root, m = _project07(tmp_path, jit07_base, registry, engine, "")
    tag = f"{registry}/pk-test/jit07:hand-{secrets.token_hex(3)}"
    with tempfile.TemporaryDirectory(prefix="pk-hand-") as ctx:
        (Path(ctx) / "norm.cuh").write_bytes(
            (root / ".patchkit" / "flashinfer" / NORM_HEADER).read_bytes())
        (Path(ctx) / "Dockerfile").write_text(
            f"FROM {jit07_base}\nCOPY norm.cuh {SITE}/{NORM_HEADER}\n")
        docker_client.images.build(path=ctx, tag=tag, platform="linux/arm64", rm=True,
                                   forcerm=True)
    # no checkout beside the workdir, no labels: the modules are read from the image itself
    shutil.rmtree(root / ".patchkit")
    checked = verify.run(m, verify.Request(root / ".patchkit" / "vllm", image=tag, engine=engine))
    assert not checked.ok
    failed = [a for a in checked.verify if not a.ok and a.patch.startswith("fi-")]
    assert [(a.patch, a.file) for a in failed] == [("fi-norm", NORM_HEADER)]
    assert failed[0].message == (
        f"the patched {NORM_HEADER} feeds JIT module norm, and image {tag} still holds it "
        f"prebuilt (provider sm121a of flashinfer-jit-cache-sm121a 0.7.4+cu130 for sm121a, "
        f"{SITE}/{GB10_NORM}), which flashinfer loads instead of compiling the patched source")
