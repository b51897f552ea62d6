"""build-image and verify --image through the real Docker Engine, registry and arm64 emulation.

The series is applied to the real vLLM 0.27.1 (its PyPI layout) and laid over an arm64 base
that holds the same release, byte-code caches included.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
import time

import pytest

from testing import imageproject as ip
from testing.dockersdk import absent, created_of, files_of
from testing.imageproject import RELEASE, SITE
import patchkit
from patchkit import cli
from patchkit.commands.build_image import Request
from patchkit.commands.build_image import run as build_image
from patchkit.commands.verify import verify_image
from patchkit.errors import ImageError
from patchkit.formats import layer
from testing import release_cache

pytestmark = [pytest.mark.docker, pytest.mark.real_vllm, pytest.mark.timeout(1800)]


def _summary(report):
    """``(exit code, --format json object)`` of a build-image run."""
    return (0 if report.ok else 1), report.to_dict()


def run_arm64(client, image: str, *args: str, entrypoint=None) -> str:
    out = client.containers.run(image, list(args) if args else None, entrypoint=entrypoint,
                                remove=True, platform="linux/arm64", network_disabled=True,
                                stdout=True, stderr=True)
    return out.decode()


@pytest.fixture(scope="module")
def project(tmp_path_factory, bases, registry):
    root = tmp_path_factory.mktemp("proj")
    return ip.applied_project(root, base=bases[RELEASE]["tag"],
                              tag=f"{registry}/pk-test/dspark-e2e:{{ref}}", remove=True)


@pytest.fixture(scope="module")
def built(project, docker_client):
    m, workdir = project
    # Images of earlier runs would be reused; this run must make its own.
    for img in docker_client.images.list(filters={"label": "io.patchkit.patchset.name=pk-e2e"}):
        docker_client.images.remove(img.id, force=True)
    code, summary = _summary(build_image(m, Request(workdir=workdir, apply=False)))
    assert summary["reused"] is False
    assert code == 0
    return summary


REGISTRY_TAG = f"{ip.REGISTRY}/pk-test/dspark-e2e"


def test_summary_names_tag_mode_base_and_layer(built, bases, docker_client):
    assert built["ok"] is True
    assert built["mode"] == "overlay"
    assert built["tag"] == f"{REGISTRY_TAG}:v{RELEASE}"
    assert built["platform"] == "linux/arm64"
    base_digest = bases[RELEASE]["repo_digest"].split("@", 1)[1]
    base = dict(built["base"])
    base_fp = base.pop("fingerprint")
    assert base == {"name": bases[RELEASE]["tag"], "digest": base_digest,
                    "pinned_by": "digest", "image_id": bases[RELEASE]["id"]}
    assert base_fp == layer.fingerprint_of(bases[RELEASE]["id"],
                                           docker_client.api.inspect_image(
                                               bases[RELEASE]["tag"])["RootFS"]["Layers"])
    assert built["holds"]["installed"] == RELEASE and built["holds"]["commit"] is None
    assert built["holds"]["source"] == "pypi"
    assert built["vllm"]["dir"] == f"{SITE}/vllm"
    assert built["vllm"]["installed"] == RELEASE
    assert [p["id"] for p in built["patches"]] == ["draft-quant-config", "nvfp4-ds-mla-dtype",
                                                   "draft-guard"]
    # three patched files and the serve script; whiteouts: the removed module, its cache and
    # the caches of the two replaced modules
    assert built["layer"]["files"] == 4
    assert built["layer"]["whiteouts"] == 4


def test_image_is_arm64_on_the_base_plus_one_layer(built, docker_client, bases):
    attrs = docker_client.api.inspect_image(built["tag"])
    base = docker_client.api.inspect_image(bases[RELEASE]["tag"])
    assert attrs["Id"] == built["image_id"]
    assert (attrs["Os"], attrs["Architecture"]) == ("linux", "arm64")
    assert attrs["RootFS"]["Layers"] == base["RootFS"]["Layers"] + [built["layer"]["diff_id"]]


def test_labels_say_what_the_image_is(built, docker_client, bases, project):
    m, workdir = project
    labels = docker_client.api.inspect_image(built["tag"])["Config"]["Labels"]
    commit = built["vllm"]["commit"]
    # the project is in no git repository: no commit nor repository of its own to name
    assert "org.opencontainers.image.revision" not in labels
    assert "org.opencontainers.image.source" not in labels
    assert labels["org.opencontainers.image.version"] == f"{RELEASE}+pk-e2e"
    assert labels["io.patchkit.vllm.repo"] == f"pypi:vllm=={RELEASE}"
    assert labels["io.patchkit.version"] == patchkit.__version__
    assert labels["org.opencontainers.image.created"].endswith("Z")
    assert labels["org.opencontainers.image.base.name"] == bases[RELEASE]["tag"]
    assert labels["org.opencontainers.image.base.digest"] == built["base"]["digest"]
    assert labels["io.patchkit.vllm.ref"] == f"v{RELEASE}"
    assert labels["io.patchkit.vllm.commit"] == commit
    assert labels["io.patchkit.patchset.digest"].startswith("sha256:")
    assert json.loads(labels["io.patchkit.patches"]) == [
        {"id": "draft-quant-config", "status": "applied"},
        {"id": "nvfp4-ds-mla-dtype", "status": "applied"},
        {"id": "draft-guard", "status": "applied"}]


def test_image_files_are_the_patched_tree(built, docker_client, project):
    _, workdir = project
    wanted = [ip.SPEC, ip.DTYPES, ip.NEW]
    stale = [f"{SITE}/vllm/config/__pycache__/speculative.cpython-311.pyc",
             f"{SITE}/vllm/utils/__pycache__/torch_utils.cpython-311.pyc",
             f"{SITE}/vllm/utils/__pycache__/print_utils.cpython-311.pyc"]
    got = files_of(docker_client, built["tag"], [f"{SITE}/{p}" for p in wanted]
                   + [f"{SITE}/{ip.GONE}"] + stale + [f"{SITE}/vllm/utils/__pycache__/"
                                                        "mem_constants.cpython-311.pyc"])
    for rel in wanted:
        assert got[f"{SITE}/{rel}"] == (workdir / rel).read_bytes(), rel
    assert got[f"{SITE}/{ip.GONE}"] is None
    for cache in stale:
        assert got[cache] is None, cache
    # caches of modules the series left alone are kept
    assert got[f"{SITE}/vllm/utils/__pycache__/mem_constants.cpython-311.pyc"] is not None


def test_patched_modules_compile_and_win_over_stale_caches_in_arm64(built, docker_client):
    script = f"""
import importlib.machinery, platform, sys
print(platform.machine())
site = {SITE!r}
for mod, rel, want in [("vllm.config.speculative", {ip.SPEC!r}, {ip.MARK_SPEC!r}),
                       ("vllm.patchkit_extra.draft_guard", {ip.NEW!r}, {ip.MARK_NEW!r}),
                       ("vllm.utils.torch_utils", {ip.DTYPES!r}, "nvfp4_ds_mla")]:
    code = importlib.machinery.SourceFileLoader(mod, site + "/" + rel).get_code(mod)
    print(mod, want in code.co_names or want in code.co_consts)
"""
    out = run_arm64(docker_client, built["tag"], "-c", script, entrypoint=["/usr/bin/python3"])
    lines = out.strip().splitlines()
    assert lines[0] == "aarch64"
    assert lines[1:] == ["vllm.config.speculative True", "vllm.patchkit_extra.draft_guard True",
                         "vllm.utils.torch_utils True"]


def test_stale_cache_would_have_shadowed_the_patch_in_the_base(bases, docker_client):
    # The base's cache of speculative.py is unchecked-hash: Python loads it whatever the source
    # says.  This is what the layer's whiteouts protect against.
    script = f"""
import importlib.util
print(open(importlib.util.cache_from_source({SITE!r} + "/vllm/config/speculative.py"), "rb").read(8)[4:8].hex())
"""
    out = run_arm64(docker_client, bases[RELEASE]["tag"], "-c", script,
                    entrypoint=["/usr/bin/python3"])
    assert out.strip() == "01000000"  # flags: hash-based, unchecked


def test_serve_recipe_is_the_default_command(built, docker_client):
    out = run_arm64(docker_client, built["tag"])
    assert out.strip() == "patchkit-serve: vllm serve"


def test_rebuild_with_nothing_changed_reuses_the_image(built, project, monkeypatch):
    m, workdir = project
    monkeypatch.setenv("PATCHKIT_CACHE_DIR", str(release_cache()))
    code, again = _summary(build_image(m, Request(workdir=workdir, apply=False)))
    assert code == 0
    assert again["reused"] is True
    assert again["image_id"] == built["image_id"]
    assert again["layer"]["files"] == built["layer"]["files"]


def test_same_inputs_give_the_same_layer_and_image(built, project, docker_client, tmp_path):
    # A second checkout of the same series, and the image from it removed first: the engine
    # gets the layer again and must arrive at the same ids.
    m, workdir = project
    other = tmp_path / "vllm"
    shutil.copytree(workdir, other, symlinks=True)
    docker_client.images.remove(built["image_id"], force=True)
    code, again = _summary(build_image(m, Request(workdir=other, apply=False,
                                                  tag=f"{REGISTRY_TAG}:again")))
    assert code == 0 and again["reused"] is False
    assert again["image_id"] == built["image_id"]
    assert again["layer"]["diff_id"] == built["layer"]["diff_id"]
    # the same inputs, the same immutable tag beside each moving tag
    labels = docker_client.api.inspect_image(again["image_id"])["Config"]["Labels"]
    hex12 = labels["io.patchkit.inputs"].split(":", 1)[1][:12]
    assert built["immutable_tag"] == f"{REGISTRY_TAG}:v{RELEASE}-{hex12}"
    assert again["immutable_tag"] == f"{REGISTRY_TAG}:again-{hex12}"
    tags = docker_client.api.inspect_image(again["image_id"])["RepoTags"]
    assert again["immutable_tag"] in tags
    docker_client.api.tag(again["image_id"], REGISTRY_TAG, f"v{RELEASE}")


def test_push_then_read_back_from_the_registry(built, project, registry):
    m, workdir = project
    code, pushed = _summary(build_image(m, Request(workdir=workdir, apply=False, push=True)))
    assert code == 0 and pushed["digest"].startswith("sha256:")
    ref = f"docker://{REGISTRY_TAG}:v{RELEASE}"
    raw = json.loads(subprocess.run(["skopeo", "inspect", "--tls-verify=false", ref], check=True,
                                    stdout=subprocess.PIPE, text=True).stdout)
    assert raw["Digest"] == pushed["digest"]
    assert raw["Architecture"] == "arm64"
    assert raw["Labels"]["io.patchkit.vllm.commit"] == built["vllm"]["commit"]
    config = json.loads(subprocess.run(["skopeo", "inspect", "--tls-verify=false", "--config", ref],
                                       check=True, stdout=subprocess.PIPE, text=True).stdout)
    assert config["rootfs"]["diff_ids"][-1] == built["layer"]["diff_id"]


def test_save_writes_an_archive_for_docker_load(built, project, tmp_path):
    m, workdir = project
    target = tmp_path / "image.tar"
    code, saved = _summary(build_image(m, Request(workdir=workdir, apply=False, save=target)))
    assert code == 0 and saved["saved"]["path"] == str(target)
    with tarfile.open(target) as tar:
        man = json.load(tar.extractfile("manifest.json"))
        assert man[0]["RepoTags"] == [f"{REGISTRY_TAG}:v{RELEASE}"]
        assert man[0]["Config"].split(".")[0].split("/")[-1] == built["image_id"].split(":")[1]
        assert len(man[0]["Layers"]) == 2


def test_base_holding_another_release_is_refused(project, vendor_base, docker_client):
    m, workdir = project
    tag = f"{REGISTRY_TAG}:refused-release"
    assert vendor_base["release"] != RELEASE
    with pytest.raises(ImageError) as exc:
        build_image(m, Request(workdir=workdir, apply=False, base=vendor_base["tag"], tag=tag))
    assert f"holds vLLM {vendor_base['version']}, not {RELEASE}" in str(exc.value)
    assert "\n" not in str(exc.value)
    assert absent(docker_client, tag)


def test_base_with_a_changed_file_is_refused(project, bases, docker_client, tmp_path):
    m, workdir = project
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "speculative.py").write_text(ip.wheel_text(RELEASE, ip.SPEC) + "\n# local edit\n")
    (ctx / "Dockerfile").write_text(f"FROM {bases[RELEASE]['tag']}\n"
                                    f"COPY speculative.py {SITE}/{ip.SPEC}\n")
    docker_client.images.build(path=str(ctx), tag="pk-test/vllm-base-edited:1",
                               platform="linux/arm64")
    tag = f"{REGISTRY_TAG}:refused-file"
    with pytest.raises(ImageError) as exc:
        build_image(m, Request(workdir=workdir, apply=False, base="pk-test/vllm-base-edited:1",
                               tag=tag))
    assert f"{ip.SPEC} is not the pristine file of vLLM v{RELEASE}" in str(exc.value)
    assert absent(docker_client, tag)


def test_base_of_another_architecture_is_refused(project, docker_client, tmp_path):
    m, workdir = project
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "f").write_text("x\n")
    (ctx / "Dockerfile").write_text("FROM scratch\nCOPY f /f\n")
    docker_client.images.build(path=str(ctx), tag="pk-test/amd64-base:1", platform="linux/amd64")
    tag = f"{REGISTRY_TAG}:refused-arch"
    with pytest.raises(ImageError, match=r"base image pk-test/amd64-base:1 is linux/amd64, "
                                         r"not linux/arm64"):
        build_image(m, Request(workdir=workdir, apply=False, base="pk-test/amd64-base:1", tag=tag))
    assert absent(docker_client, tag)


def test_missing_base_is_one_line(project, registry):
    m, workdir = project
    with pytest.raises(ImageError) as exc:
        build_image(m, Request(workdir=workdir, apply=False,
                               base=f"{registry}/pk-test/no-such-base:1",
                               tag=f"{REGISTRY_TAG}:nobase"))
    assert str(exc.value).startswith(f"base image {registry}/pk-test/no-such-base:1 not found")
    assert "\n" not in str(exc.value)


def test_refused_push_leaves_nothing_tagged(built, project, docker_client):
    m, workdir = project
    tag = "127.0.0.1:5999/pk-test/nowhere:1"  # no registry listens there
    with pytest.raises(ImageError) as exc:
        build_image(m, Request(workdir=workdir, apply=False, tag=tag, push=True))
    assert str(exc.value).startswith(f"push of {tag} refused") or "pushing" in str(exc.value)
    assert "\n" not in str(exc.value)
    assert absent(docker_client, tag)


def test_verify_image_runs_the_assertions_on_the_image_files(built, project, bases):
    m, _ = project
    results = verify_image(m, built["tag"])
    assert [r.ok for r in results] == [True, True, True]
    on_base = verify_image(m, bases[RELEASE]["tag"])
    assert [r.ok for r in on_base] == [False, False, False]
    assert "draft_guard.py" in on_base[2].file


def test_cli_build_image_json_and_verify_image(built, project, capsys):
    m, workdir = project
    code = cli.main(["build-image", "--no-apply", "--workdir", str(workdir), "--manifest",
                     str(m.path), "--format", "json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert {"ok", "tag", "image_id", "digest", "platform", "base", "vllm", "patches",
            "layer"} <= set(out)
    assert set(out["base"]) >= {"name", "digest"} and set(out["layer"]) >= {"files", "bytes"}
    assert out["image_id"] == built["image_id"]
    code = cli.main(["verify", "--image", built["tag"], "--manifest", str(m.path)])
    assert code == 0
    assert "3/3 assertions passed" in capsys.readouterr().out


def test_a_build_reads_its_base_through_one_container(built, project, docker_client, tmp_path,
                                                      bases):
    """The engine's own events count the containers a build creates to read its base: one,
    however many readers the base has (its distributions, the proofs, the overlay's plan)."""
    m, workdir = project
    other = tmp_path / "vllm"
    shutil.copytree(workdir, other, symlinks=True)
    docker_client.images.remove(built["image_id"], force=True)   # else it is reused
    time.sleep(1.1)   # the events' clock counts seconds: none of an earlier test's
    since = time.time()
    code, again = _summary(build_image(m, Request(workdir=other, apply=False,
                                                  tag=f"{REGISTRY_TAG}:once")))
    until = time.time()
    assert code == 0 and again["reused"] is False
    base = bases[RELEASE]["tag"]
    created = created_of(docker_client, {base, docker_client.images.get(base).id}, since, until)
    assert len(created) == 1, created


def test_provenance_of_a_committed_and_a_dirty_patchset(built, project, docker_client, capsys):
    """The patchset's commit and repository in the labels; the same commit gives the same image
    again, a change not committed a -dirty one, a new commit a new one; images and verify
    --image name the commit, and a time that is not real is no date."""
    from testing.upstream import sh

    m, workdir = project
    root = m.root
    tag = f"{REGISTRY_TAG}:prov"
    (root / ".gitignore").write_text("/.patchkit/\n")
    sh("git", "init", "-q", "-b", "main", cwd=root)
    sh("git", "remote", "add", "origin", "https://me:tok@example.invalid/me/patchset.git",
       cwd=root)
    try:
        sh("git", "add", "-A", cwd=root)
        sh("git", "commit", "-q", "-m", "the patchset", cwd=root)
        head = sh("git", "rev-parse", "HEAD", cwd=root)
        code, first = _summary(build_image(m, Request(workdir=workdir, apply=False, tag=tag)))
        assert code == 0
        labels = docker_client.api.inspect_image(first["image_id"])["Config"]["Labels"]
        assert labels["org.opencontainers.image.revision"] == head
        assert labels["io.patchkit.patchset.commit"] == head
        assert labels["org.opencontainers.image.source"] == (
            "https://example.invalid/me/patchset.git")
        # the same commit and inputs: the same image
        code, again = _summary(build_image(m, Request(workdir=workdir, apply=False, tag=tag)))
        assert code == 0 and again["image_id"] == first["image_id"] and again["reused"]
        assert first["holds"]["patchset_commit"] == head

        (root / "NOTES.md").write_text("not committed\n")
        code, dirty = _summary(build_image(m, Request(workdir=workdir, apply=False, tag=tag)))
        assert code == 0 and dirty["image_id"] != first["image_id"]
        labels = docker_client.api.inspect_image(dirty["image_id"])["Config"]["Labels"]
        assert labels["org.opencontainers.image.revision"] == f"{head}-dirty"

        assert cli.main(["verify", "--manifest", str(m.path), "--image", tag]) == 0
        out = capsys.readouterr().out
        assert f"patchset commit {head[:12]}-dirty" in out
        created = labels["org.opencontainers.image.created"]
        assert ("created reproducible (no build time)" in out) == (created <= "2000-01-01T00:00:00Z")

        assert cli.main(["images", "--manifest", str(m.path)]) == 0
        out = capsys.readouterr().out
        assert f"patchset commit {head[:12]}-dirty" in out
        assert f"patchset commit {head[:12]};" in out
        assert "created 2000-01-01" not in out and "created 1970" not in out
    finally:
        shutil.rmtree(root / ".git")
        (root / ".gitignore").unlink()
        (root / "NOTES.md").unlink(missing_ok=True)



def test_image_serve_runs_a_command_of_the_patchsets_own(built, project, docker_client):
    """A minimal serve command for another model, with its environment, run in a container
    of the built image as its default command."""
    from dataclasses import replace

    from patchkit.manifest.model import Serve

    m, workdir = project
    serve = Serve(("python3", "-c", "import os, importlib.util as u; print('serving', "
                   "os.environ['MY_MODEL'], 'with vllm', u.find_spec('vllm').origin)"),
                  (("MY_MODEL", "/models/Qwen3-8B"),))
    mine = replace(m, image=replace(m.image, serve=serve))
    code, summary = _summary(build_image(mine, Request(workdir=workdir, apply=False,
                                                       tag=f"{REGISTRY_TAG}:serve")))
    assert code == 0 and summary["serves"]["from"] == "image.serve"
    config = docker_client.api.inspect_image(summary["image_id"])["Config"]
    assert config["Cmd"] == list(serve.command) and not config.get("Entrypoint")
    out = run_arm64(docker_client, summary["image_id"])
    assert out.startswith("serving /models/Qwen3-8B with vllm "), out
    assert "/vllm/__init__.py" in out
