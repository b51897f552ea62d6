"""The pin from the base and the base as the source, on the real engine and the real bases.

* The dev-build base (vLLM 0.31.0's files reporting ``0.31.1.dev7+g<sha of v0.31.0>``) pinned
  from its own version: ``apply --vllm-ref base`` checks out that commit from a git source,
  ranges are judged on the installed dev version, and the overlay lands on the base by commit.
* The vendor base (0.31.0 with NVIDIA's edits, ``0.31.0+nv25.11``) patched as it is through
  ``--vllm-repo image``: the vendor's changes stay, and a patch whose context the vendor changed
  fails with its true reason.
* Each bad input is one line, with the right exit code and nothing tagged.

Every image is run in the arm64 container to compare its files with the patched tree.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest

from testing import imageproject as ip
from testing.baseimage import DEV_RELEASE
from testing.dockersdk import absent
from testing.imageproject import SITE
from testing.progress import Said
from patchkit import cli, manifest
from patchkit.commands import apply as apply_command
from patchkit.commands.build_image import Request
from patchkit.commands.build_image import run as build_image
from patchkit.engines.docker import Engine
from patchkit.timeouts import DEFAULT_TIMEOUT
from patchkit.run import Asked
from patchkit.source import image as image_source
from patchkit.source import pypi
from testing import release_cache
from testing.upstream import unified

pytestmark = [pytest.mark.docker, pytest.mark.real_vllm, pytest.mark.timeout(2400)]

ATTN = "vllm/models/deepseek_v4/attention.py"
CUDA = "vllm/platforms/cuda.py"
ENVS = "vllm/envs.py"
MARK_ATTN = "PK_PATCH_ATTENTION_MARKER"


@contextmanager
def cache_env():
    """The shared real cache for what module fixtures run (before the per-test isolation)."""
    old = os.environ.get("PATCHKIT_CACHE_DIR")
    os.environ["PATCHKIT_CACHE_DIR"] = str(release_cache())
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("PATCHKIT_CACHE_DIR", None)
        else:
            os.environ["PATCHKIT_CACHE_DIR"] = old


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# Hashes of files inside the image, computed by the image's own arm64 python.
HASHES = """
import hashlib, json, platform, sys
site = sys.argv[1]
out = {"machine": platform.machine()}
for rel in sys.argv[2:]:
    try:
        out[rel] = hashlib.sha256(open(site + "/" + rel, "rb").read()).hexdigest()
    except FileNotFoundError:
        out[rel] = None
print(json.dumps(out))
"""

# Every file of the installed package, as the image's python walks it.
LISTING = """
import json, os, sys
top = sys.argv[1]
names = []
for folder, dirs, files in os.walk(top):
    dirs[:] = [d for d in dirs if d != "__pycache__"]
    for f in files:
        path = os.path.join(folder, f)
        with open(path, "rb") as fh:
            head = fh.read(4)
        if f.endswith((".pyc", ".so")) or ".so." in f or head == b"\\x7fELF":
            continue
        names.append(os.path.relpath(path, os.path.dirname(top)))
print(json.dumps(sorted(names)))
"""


def run_python(client, image: str, program: str, *args: str) -> str:
    out = client.containers.run(image, ["-c", program, *args], entrypoint=["/usr/bin/python3"],
                                remove=True, platform="linux/arm64", network_disabled=True,
                                stdout=True, stderr=True)
    return out.decode().strip().splitlines()[-1]


def hashes_in(client, image: str, rels: list[str]) -> dict:
    return json.loads(run_python(client, image, HASHES, SITE, *rels))


def fingerprint_by_hand(attrs: dict) -> str:
    """The config digest (the image id on this engine's classic store) and the diff_ids."""
    doc = json.dumps({"config": attrs["Id"], "layers": attrs["RootFS"]["Layers"]},
                     sort_keys=True, separators=(",", ":"))
    return "sha256:" + sha256(doc.encode())


def ls_files(workdir: Path) -> list[str]:
    return subprocess.run(["git", "-C", str(workdir), "ls-files"], check=True,
                          capture_output=True, text=True).stdout.split()


def drop_images(client, name: str) -> None:
    for img in client.images.list(filters={"label": f"io.patchkit.patchset.name={name}"}):
        client.images.remove(img.id, force=True)


# ------------------------------------------------------------------ the dev build, pinned from it

DEV_NAME = "pk-dev-e2e"


def dev_manifest(root: Path, dev_base: dict, registry: str) -> Path:
    """The image tests' series on 0.31.0, its source the git path of patchkit's PyPI repository
    (where the dev version's commit lives), pinned by ``ref: base``; the new module only for
    what comes after 0.31.0, which the dev build is and the release is not."""
    path = ip.make_project(root, base=dev_base["tag"], tag=f"{registry}/pk-test/dev-e2e:{{ref}}",
                           version=DEV_RELEASE)
    text = path.read_text().replace("name: pk-e2e", f"name: {DEV_NAME}")
    text = text.replace("  repo: pypi\n", f"  repo: {pypi.repo_path(release_cache())}\n")
    text = text.replace(f"  ref: v{DEV_RELEASE}\n", "  ref: base\n")
    text = text.replace("    diff: patches/draft-guard.diff\n",
                        "    diff: patches/draft-guard.diff\n    vllm: \">0.31.0\"\n")
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def dev_applied(tmp_path_factory, dev_base, registry, docker_client):
    root = tmp_path_factory.mktemp("dev")
    m = manifest.load(dev_manifest(root, dev_base, registry))
    workdir = root / ".patchkit" / "vllm"
    log = Said()
    with cache_env():
        report = apply_command.run(m, Asked(workdir=workdir), progress=log)
    assert report.ok, report.to_json()
    return m, workdir, report, log


@pytest.fixture(scope="module")
def dev_built(dev_applied, docker_client):
    m, workdir, _, _ = dev_applied
    drop_images(docker_client, DEV_NAME)
    with cache_env():
        report = build_image(m, Request(workdir=workdir, apply=False))
    assert report.ok, report.to_dict()
    return report.to_dict()


def test_dev_base_pins_the_commit_its_version_names(dev_applied, dev_base):
    _, _, report, log = dev_applied
    commit = dev_base["commit"]
    assert report.vllm.commit == commit
    assert report.vllm.ref == commit[:9]
    assert report.vllm.version == dev_base["version"] == f"0.31.1.dev7+g{commit[:9]}"
    assert any(f"pinning commit {commit[:9]}" in line for line in log.lines), log.lines


def test_ranges_are_judged_on_the_installed_dev_version(dev_applied):
    _, workdir, report, _ = dev_applied
    # draft-guard is for >0.31.0: the dev build 0.31.1.dev7 is, release 0.31.0 would not be
    assert [(p.id, p.status) for p in report.patches] == [
        ("draft-quant-config", "applied"), ("nvfp4-ds-mla-dtype", "applied"),
        ("draft-guard", "applied")]
    assert (workdir / ip.NEW).is_file()


def test_dev_build_summary_says_what_the_image_holds(dev_built, dev_base, docker_client):
    commit = dev_base["commit"]
    assert dev_built["mode"] == "overlay"
    attrs = docker_client.api.inspect_image(dev_built["tag"])
    base_attrs = docker_client.api.inspect_image(dev_base["tag"])
    assert {k: v for k, v in dev_built["holds"].items() if k != "created"} == {
        "installed": dev_base["version"], "commit": commit[:9], "source": "git",
        "fingerprint": fingerprint_by_hand(attrs), "patchset_commit": None}
    assert dev_built["base"]["fingerprint"] == fingerprint_by_hand(base_attrs)
    assert attrs["RootFS"]["Layers"] == base_attrs["RootFS"]["Layers"] + [
        dev_built["layer"]["diff_id"]]
    labels = attrs["Config"]["Labels"]
    assert labels["io.patchkit.vllm.installed"] == dev_base["version"]
    assert labels["io.patchkit.vllm.installed.commit"] == commit[:9]
    assert labels["io.patchkit.vllm.source"] == "git"
    from patchkit.imageref import Platform

    base = Engine.connect(timeout=DEFAULT_TIMEOUT).resolve_base(dev_base["tag"],
                                                                Platform.parse("linux/arm64"))
    assert labels["io.patchkit.base.identity"] == base.identity
    assert labels["io.patchkit.vllm.commit"] == commit


def test_dev_build_image_holds_the_patched_tree_in_arm64(dev_built, dev_applied, docker_client):
    _, workdir, _, _ = dev_applied
    rels = [ip.SPEC, ip.DTYPES, ip.NEW, "vllm/config/__pycache__/speculative.cpython-311.pyc"]
    got = hashes_in(docker_client, dev_built["tag"], rels)
    assert got.pop("machine") == "aarch64"
    for rel in (ip.SPEC, ip.DTYPES, ip.NEW):
        assert got[rel] == sha256((workdir / rel).read_bytes()), rel
    # the base's unchecked-hash cache of a patched module would shadow it: it is gone
    assert got["vllm/config/__pycache__/speculative.cpython-311.pyc"] is None


def test_verify_image_says_what_the_dev_build_holds(dev_built, dev_applied, dev_base, capsys):
    m, _, _, _ = dev_applied
    code = cli.main(["verify", "--image", dev_built["tag"], "--manifest", str(m.path),
                     "--format", "json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["ok"] is True
    assert out["holds"] == dev_built["holds"]
    code = cli.main(["verify", "--image", dev_built["tag"], "--manifest", str(m.path)])
    text = capsys.readouterr().out
    assert code == 0
    assert (f"{dev_built['tag']} holds vLLM {dev_base['version']} (commit "
            f"{dev_base['commit'][:9]}), source git, fingerprint "
            f"{dev_built['holds']['fingerprint']}") in text


def test_verify_judges_ranges_on_the_base_given(dev_applied, bases, capsys):
    # the tree's own version (the dev build) is >0.31.0, so all three patches count; judged on
    # a 0.27.1 base, draft-guard (>0.31.0) is out and its assertion with it
    m, workdir, _, _ = dev_applied
    code = cli.main(["verify", "--tree", str(workdir), "--manifest", str(m.path),
                     "--format", "json"])
    assert code == 0 and len(json.loads(capsys.readouterr().out)["verify"]) == 3
    code = cli.main(["verify", "--tree", str(workdir), "--base", bases[ip.RELEASE]["tag"],
                     "--manifest", str(m.path), "--format", "json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and [a["patch"] for a in out["verify"]] == ["draft-quant-config",
                                                                 "nvfp4-ds-mla-dtype"]


def test_dev_build_rebuilt_with_nothing_changed_is_the_same_image(dev_built, dev_applied):
    m, workdir, _, _ = dev_applied
    with cache_env():
        again = build_image(m, Request(workdir=workdir, apply=False)).to_dict()
    assert again["reused"] is True
    assert again["image_id"] == dev_built["image_id"]
    assert again["holds"] == dev_built["holds"]


def test_a_release_pin_on_the_dev_build_of_its_commit_is_accepted(dev_applied, dev_built,
                                                                   dev_base, registry,
                                                                   tmp_path, docker_client):
    # pinned by hand to v0.31.0 from PyPI: the dev build reports 0.31.1.dev7, yet was built from
    # exactly that commit, so the overlay lands on it
    m, _, _, _ = dev_applied
    workdir = tmp_path / "vllm"
    tag = f"{registry}/pk-test/dev-e2e:release-pin"
    with cache_env():
        report = build_image(m, Request(workdir=workdir, ref=f"v{DEV_RELEASE}", repos=["pypi"],
                                        tag=tag))
    assert report.ok, report.to_dict()
    summary = report.to_dict()
    assert summary["vllm"]["version"] == DEV_RELEASE
    assert summary["vllm"]["commit"] == dev_base["commit"]
    assert summary["holds"]["installed"] == dev_base["version"]
    assert summary["holds"]["source"] == "pypi"
    # ranges on this tree were judged on the release: draft-guard (>0.31.0) was skipped
    assert [p["status"] for p in summary["patches"]] == ["applied", "applied", "skipped"]
    got = hashes_in(docker_client, tag, [ip.SPEC])
    assert got[ip.SPEC] == sha256((workdir / ip.SPEC).read_bytes())
    # laid on the same base as the image pinned from it: the same base identity
    labels = docker_client.api.inspect_image(tag)["Config"]["Labels"]
    dev_labels = docker_client.api.inspect_image(dev_built["tag"])["Config"]["Labels"]
    assert labels["io.patchkit.base.identity"] == dev_labels["io.patchkit.base.identity"]


# ------------------------------------------------------------------ the vendor build, as it is

VENDOR_NAME = "pk-vendor-e2e"


def vendor_project(root: Path, vendor_base: dict, registry: str, *, conflict: bool = False) -> Path:
    """Diffs written against upstream 0.31.0: one on the spec config, which the vendor left
    alone; one at the top of the DeepSeek-V4 attention module, whose end the vendor changed;
    with ``conflict`` one more right after cuda.py's logger line, where the vendor added its own."""
    (root / "patches").mkdir(parents=True, exist_ok=True)
    spec = ip.wheel_text(DEV_RELEASE, ip.SPEC)
    attn = ip.wheel_text(DEV_RELEASE, ATTN)
    cuda = ip.wheel_text(DEV_RELEASE, CUDA)
    first_line = attn.splitlines(keepends=True)[0]
    diffs = {
        "draft-quant-config": (ip.SPEC, spec, spec + f'\n\n{ip.MARK_SPEC} = "draft quant"\n'),
        "attention-mark": (ATTN, attn, attn.replace(first_line,
                                                    first_line + f"{MARK_ATTN} = True\n", 1)),
    }
    if conflict:
        line = "logger = init_logger(__name__)\n"
        diffs["cuda-after-logger"] = (CUDA, cuda, cuda.replace(line, line + "PK_CUDA = 1\n", 1))
    entries = []
    for pid, (rel, before, after) in diffs.items():
        (root / "patches" / f"{pid}.diff").write_text(unified(rel, before, after))
        entries.append(f"  - id: {pid}\n    summary: {pid}\n    diff: patches/{pid}.diff\n")
    path = root / "patchset.yaml"
    path.write_text(f"name: {VENDOR_NAME}\nvllm:\n  repo: pypi\n  ref: v{DEV_RELEASE}\nimage:\n"
                    f"  base: {vendor_base['tag']}\n  platform: linux/arm64\n"
                    f"  tag: {registry}/pk-test/vendor-e2e:{{version}}\npatches:\n"
                    + "".join(entries))
    return path


@pytest.fixture(scope="module")
def vendor_applied(tmp_path_factory, vendor_base, registry):
    root = tmp_path_factory.mktemp("vendor")
    m = manifest.load(vendor_project(root, vendor_base, registry))
    workdir = root / ".patchkit" / "vllm"
    with cache_env():
        report = apply_command.run(m, Asked(repos=("image",), workdir=workdir),
                                   progress=Said())
    assert report.ok, report.to_json()
    return m, workdir, report


@pytest.fixture(scope="module")
def vendor_built(vendor_applied, docker_client):
    m, workdir, _ = vendor_applied
    drop_images(docker_client, VENDOR_NAME)
    with cache_env():
        report = build_image(m, Request(workdir=workdir, apply=False))
    assert report.ok, report.to_dict()
    return report.to_dict()


def test_the_pristine_tree_is_every_file_of_the_vendor_package(vendor_applied, vendor_base,
                                                                docker_client):
    _, workdir, report = vendor_applied
    assert report.vllm.source == "image"
    assert report.vllm.version == vendor_base["version"] == "0.31.0+nv25.11"
    listed = json.loads(run_python(docker_client, vendor_base["tag"], LISTING, f"{SITE}/vllm"))
    assert ls_files(workdir) == listed
    assert len(listed) > 1000 and all(p.startswith("vllm/") for p in listed)
    # the commit is in the cache under the base's digest, made once
    digest = vendor_base["repo_digest"].split("@", 1)[1]
    ref = f"refs/patchkit/bases/{digest.replace(':', '-')}/linux-arm64"
    repo = image_source.repo_path(release_cache())
    held = subprocess.run(["git", "--git-dir", str(repo), "rev-parse", ref], check=True,
                          capture_output=True, text=True).stdout.strip()
    assert held == report.vllm.commit


def test_vendor_edits_stay_and_the_patches_land_on_top(vendor_applied, vendor_base):
    _, workdir, report = vendor_applied
    assert [(p.id, p.status) for p in report.patches] == [("draft-quant-config", "applied"),
                                                          ("attention-mark", "applied")]
    for edit in vendor_base["edits"]:
        assert edit["marker"] in (workdir / edit["file"]).read_text(), edit["file"]
    attn = (workdir / ATTN).read_text()
    assert MARK_ATTN in attn and "PK_VENDOR_EDIT attention" in attn


def test_vendor_image_holds_its_edits_and_the_patches_in_arm64(vendor_built, vendor_applied,
                                                                vendor_base, docker_client):
    _, workdir, _ = vendor_applied
    assert vendor_built["mode"] == "overlay"
    assert vendor_built["tag"].endswith(":0.31.0-nv25.11")
    attrs = docker_client.api.inspect_image(vendor_built["tag"])
    assert {k: v for k, v in vendor_built["holds"].items() if k != "created"} == {
        "installed": "0.31.0+nv25.11", "commit": None, "source": "image",
        "fingerprint": fingerprint_by_hand(attrs), "patchset_commit": None}
    labels = attrs["Config"]["Labels"]
    assert labels["io.patchkit.vllm.source"] == "image"
    assert labels["io.patchkit.vllm.installed"] == "0.31.0+nv25.11"
    assert labels["io.patchkit.vllm.installed.commit"] == ""
    rels = [ip.SPEC, ATTN, CUDA, ENVS]
    got = hashes_in(docker_client, vendor_built["tag"], rels)
    assert got.pop("machine") == "aarch64"
    assert got == {rel: sha256((workdir / rel).read_bytes()) for rel in rels}
    # the files the series left alone are the vendor's own, byte for byte
    base = hashes_in(docker_client, vendor_base["tag"], [CUDA, ENVS])
    assert (base[CUDA], base[ENVS]) == (got[CUDA], got[ENVS])


def test_rebase_check_takes_the_vendor_base_as_a_target(vendor_applied, vendor_base, capsys,
                                                        monkeypatch):
    m, _, report = vendor_applied
    monkeypatch.setenv("PATCHKIT_CACHE_DIR", str(release_cache()))
    code = cli.main(["rebase-check", "--vllm-repo", "image", "--to", "base", "--manifest",
                     str(m.path), "--format", "json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["ok"] is True
    (target,) = out["targets"]
    assert target["vllm"] == {"ref": "base", "commit": report.vllm.commit,
                              "version": "0.31.0+nv25.11", "repo": "image"}
    assert [p["status"] for p in target["patches"]] == ["applied", "applied"]


def test_a_patch_whose_context_the_vendor_changed_fails_with_its_true_reason(
        tmp_path, vendor_base, registry, docker_client, capsys, monkeypatch):
    monkeypatch.setenv("PATCHKIT_CACHE_DIR", str(release_cache()))
    path = vendor_project(tmp_path, vendor_base, registry, conflict=True)
    workdir = tmp_path / "w"
    code = cli.main(["apply", "--vllm-repo", "image", "--workdir", str(workdir), "--manifest",
                     str(path), "--format", "json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 1 and out["ok"] is False
    by_id = {p["id"]: p for p in out["patches"]}
    # the hunk's leading context is still there, its trailing context is the vendor's line:
    # only fuzz would take it, and the message says which line stands in the way
    failed = by_id["cuda-after-logger"]
    assert (failed["status"], failed["reason"]) == ("failed", "fuzz")
    assert failed["message"].startswith(f"hunk 1 of {CUDA}: ")
    assert '"# NVIDIA 25.11: GB10 (sm_121) is validated' in failed["message"]
    assert by_id["attention-mark"]["status"] == "applied"
    assert not workdir.exists()
    tag = f"{registry}/pk-test/vendor-e2e:conflict"
    code = cli.main(["build-image", "--vllm-repo", "image", "--workdir", str(workdir),
                     "--manifest", str(path), "--tag", tag])
    assert code == 1 and absent(docker_client, tag) and not workdir.exists()


# ------------------------------------------------------------------ bad input

def error_lines(err: str) -> list[str]:
    assert "Traceback" not in err
    return [line for line in err.splitlines() if line.startswith("patchkit")]


def test_a_version_naming_no_commit_is_one_line_and_nothing_is_made(
        tmp_path, vendor_base, registry, docker_client, capsys, monkeypatch):
    monkeypatch.setenv("PATCHKIT_CACHE_DIR", str(release_cache()))
    path = vendor_project(tmp_path, vendor_base, registry)
    workdir = tmp_path / "w"
    tag = f"{registry}/pk-test/x:nocommit"
    for verb, extra in (("apply", []), ("build-image", ["--tag", tag])):
        code = cli.main([verb, "--vllm-ref", "base", "--workdir", str(workdir), "--manifest",
                         str(path), *extra])
        (line,) = error_lines(capsys.readouterr().err)
        assert code == 2, line
        assert line == (f"patchkit {verb}: error: base {vendor_base['tag']} holds vLLM 0.31.0+nv25.11, "
                        "which names no commit (+g<sha>) and no release; patch it as it is "
                        "with --vllm-repo image")
        assert not workdir.exists()
    assert absent(docker_client, tag)


def test_the_image_source_with_no_base_is_one_line(tmp_path, capsys, monkeypatch, registry,
                                                   docker_client):
    monkeypatch.setenv("PATCHKIT_CACHE_DIR", str(release_cache()))
    path = tmp_path / "patchset.yaml"
    path.write_text("name: nobase\nvllm:\n  repo: image\n  ref: v0.31.0\n")
    tag = f"{registry}/pk-test/x:nobase"
    for verb, extra in (("apply", []), ("build-image", ["--tag", tag]),
                        ("rebase-check", ["--to", "base"])):
        code = cli.main([verb, "--manifest", str(path), *extra]
                        + (["--workdir", str(tmp_path / "w")] if verb != "rebase-check" else []))
        (line,) = error_lines(capsys.readouterr().err)
        assert code == 2, line
        assert line == (f"patchkit {verb}: error: the vLLM source 'image' is the vllm package of a base "
                        "image: give --base IMAGE or set image.base in patchset.yaml")
    assert not (tmp_path / "w").exists() and absent(docker_client, tag)


@pytest.fixture(scope="module")
def no_vllm_base(docker_client, tmp_path_factory) -> str:
    ctx = tmp_path_factory.mktemp("novllm")
    (ctx / "hello.txt").write_text("no python here\n")
    (ctx / "Dockerfile").write_text("FROM scratch\nCOPY hello.txt /srv/hello.txt\n")
    tag = "pk-test/no-vllm:1"
    docker_client.images.build(path=str(ctx), tag=tag, platform="linux/arm64")
    return tag


def test_a_base_with_no_vllm_is_one_line(tmp_path, no_vllm_base, vendor_base, registry,
                                         docker_client, capsys, monkeypatch):
    monkeypatch.setenv("PATCHKIT_CACHE_DIR", str(release_cache()))
    path = vendor_project(tmp_path, vendor_base, registry)
    tag = f"{registry}/pk-test/x:novllm"
    for verb, extra in (("apply", ["--vllm-repo", "image"]), ("apply", ["--vllm-ref", "base"]),
                        ("build-image", ["--vllm-repo", "image", "--tag", tag])):
        code = cli.main([verb, "--base", no_vllm_base, "--workdir", str(tmp_path / "w"),
                         "--manifest", str(path), *extra])
        (line,) = error_lines(capsys.readouterr().err)
        assert code == 1, line
        assert line.startswith(f"patchkit {verb}: error: {no_vllm_base} has no installed vllm package")
    assert not (tmp_path / "w").exists() and absent(docker_client, tag)


def test_an_engine_that_cannot_be_reached_is_one_line(tmp_path, vendor_base, registry,
                                                      docker_client, capsys, monkeypatch):
    monkeypatch.setenv("PATCHKIT_CACHE_DIR", str(release_cache()))
    path = vendor_project(tmp_path, vendor_base, registry)
    nowhere = f"unix://{tmp_path}/no-engine.sock"
    monkeypatch.setenv("DOCKER_HOST", nowhere)
    tag = f"{registry}/pk-test/x:noengine"
    for verb, extra in (("apply", ["--vllm-repo", "image"]), ("apply", ["--vllm-ref", "base"]),
                        ("build-image", ["--vllm-repo", "image", "--tag", tag])):
        code = cli.main([verb, "--workdir", str(tmp_path / "w"), "--manifest", str(path), *extra])
        (line,) = error_lines(capsys.readouterr().err)
        assert code == 1, line
        assert line.startswith(f"patchkit {verb}: error: no Docker Engine answers at {nowhere}")
    assert not (tmp_path / "w").exists() and absent(docker_client, tag)


def test_the_image_source_alone_pins_base_without_vllm_ref(tmp_path, vendor_base, registry,
                                                           capsys, monkeypatch):
    """The manifest pins another release: ``--vllm-repo image`` still means what the base
    holds, with no ``--vllm-ref base`` beside it."""
    monkeypatch.setenv("PATCHKIT_CACHE_DIR", str(release_cache()))
    path = vendor_project(tmp_path, vendor_base, registry)
    path.write_text(path.read_text().replace(f"  ref: v{DEV_RELEASE}\n", "  ref: v0.27.1\n"))
    workdir = tmp_path / "w"
    code = cli.main(["apply", "--vllm-repo", "image", "--base", vendor_base["tag"],
                     "--workdir", str(workdir), "--manifest", str(path), "--format", "json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out
    assert (out["vllm"]["ref"], out["vllm"]["repo"]) == ("base", "image")
    assert [p["status"] for p in out["patches"]] == ["applied", "applied"]
