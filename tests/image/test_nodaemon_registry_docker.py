"""build-image --no-daemon --push against the real registry, with no engine in the build.

The series is applied to the real vLLM 0.27.1 (its PyPI layout) and built straight in the
registry onto the arm64 base, which the registry holds under a repository of its own.  All
traffic of this module goes through a byte-counting relay in front of the registry
(testing/regproxy.py), so a test can see what a run uploaded.  dockerd is used only to put the base
in the registry, to pull and run the result, and for the engine path it is compared with.
"""

from __future__ import annotations

import io
import json
import secrets
import shutil
import socket
import subprocess
import tarfile
import time
import urllib.request
from pathlib import Path

import pytest

from testing import imageproject as ip
from testing.imageproject import RELEASE
from patchkit import cli
from patchkit.commands.build_image import Request
from patchkit.commands.build_image import run as build_image
from patchkit.errors import ImageError
from testing.regproxy import RegistryProxy

pytestmark = [pytest.mark.docker, pytest.mark.real_vllm, pytest.mark.timeout(1800)]

SITE = "/usr/local/lib/python3.11/dist-packages"


def skopeo(*args: str) -> bytes:
    return subprocess.run(["skopeo", *args], check=True, stdout=subprocess.PIPE).stdout


def raw(ref: str, *extra: str) -> bytes:
    return skopeo("inspect", "--tls-verify=false", "--raw", *extra, f"docker://{ref}")


def digest_of(ref: str) -> str | None:
    proc = subprocess.run(["skopeo", "inspect", "--tls-verify=false", "--raw", f"docker://{ref}"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if proc.returncode:
        assert b"manifest unknown" in proc.stderr, proc.stderr
        return None
    import hashlib

    return "sha256:" + hashlib.sha256(proc.stdout).hexdigest()


def forget(ref: str) -> None:
    """Removes what ``ref`` names from the registry (earlier runs left it there)."""
    subprocess.run(["skopeo", "delete", "--tls-verify=false", f"docker://{ref}"],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def relay(registry):
    with RegistryProxy(registry) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def nd_base(bases, docker_client, relay) -> dict:
    """The 0.27.1 base in a repository of this module's, pushed by dockerd through the relay."""
    repo = f"{relay.addr}/pk-test/nd-base"
    docker_client.api.tag(bases[RELEASE]["id"], repo, RELEASE)
    for line in docker_client.api.push(repo, tag=RELEASE, stream=True, decode=True):
        assert "error" not in line, line
    ref = f"{repo}:{RELEASE}"
    yield {"ref": ref, "id": bases[RELEASE]["id"], "digest": digest_of(ref)}
    docker_client.api.remove_image(ref, noprune=True)


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """One patchkit cache for the module: the base's blobs are read into it once."""
    return tmp_path_factory.mktemp("nd-cache")


@pytest.fixture
def use_cache(cache, monkeypatch) -> Path:
    monkeypatch.setenv("PATCHKIT_CACHE_DIR", str(cache))
    return cache


@pytest.fixture(scope="module")
def image_repo(relay):
    """A repository of this run alone, so that the first push finds none of its blobs there."""
    repo = f"{relay.addr}/pk-test/nd-{secrets.token_hex(4)}"
    made: list[str] = []
    yield repo, made
    for ref in made:
        forget(ref)


@pytest.fixture(scope="module")
def project(tmp_path_factory, nd_base, image_repo):
    root = tmp_path_factory.mktemp("nd-proj")
    return ip.applied_project(root, base=nd_base["ref"], tag=f"{image_repo[0]}:{{ref}}",
                              remove=True)


TAG = f"v{RELEASE}"


@pytest.fixture(scope="module")
def built(project, relay, cache, image_repo):
    m, workdir = project
    tag = f"{image_repo[0]}:{TAG}"
    image_repo[1].append(tag)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATCHKIT_CACHE_DIR", str(cache))
        relay.reset()
        report = build_image(m, Request(workdir=workdir, apply=False, push=True, no_daemon=True))
        traffic = relay.reset()
    assert report.ok
    return {"summary": report.to_dict(), "traffic": traffic, "tag": tag}


def test_the_image_lands_on_the_base_layers_plus_one(built, nd_base):
    summary, tag = built["summary"], built["tag"]
    assert summary["tag"] == tag and summary["pushed"] is True and summary["reused"] is False
    base_manifest = json.loads(raw(nd_base["ref"]))
    got_raw = raw(tag)
    got = json.loads(got_raw)
    assert summary["digest"] == digest_of(tag)
    # the base's layer descriptors byte for byte, then exactly one new layer
    assert got["mediaType"] == base_manifest["mediaType"]
    assert got["layers"][:-1] == base_manifest["layers"]
    assert len(got["layers"]) == len(base_manifest["layers"]) + 1
    assert got["layers"][-1] == {"mediaType": "application/vnd.docker.image.rootfs.diff.tar",
                                 "size": summary["layer"]["bytes"],
                                 "digest": summary["layer"]["diff_id"]}
    config = json.loads(raw(tag, "--config"))
    base_config = json.loads(raw(nd_base["ref"], "--config"))
    assert got["config"]["digest"] == summary["image_id"]
    assert config["rootfs"]["diff_ids"] == base_config["rootfs"]["diff_ids"] + [
        summary["layer"]["diff_id"]]
    assert (config["architecture"], config["os"]) == ("arm64", "linux")
    assert summary["base"]["digest"] == nd_base["digest"]
    assert summary["vllm"]["installed"] == RELEASE
    assert summary["vllm"]["dir"] == f"{SITE}/vllm"
    # three patched files and the serve script; whiteouts: the removed module, its cache and
    # the caches of the two replaced modules, all found in the registry's layers
    assert (summary["layer"]["files"], summary["layer"]["whiteouts"]) == (4, 4)
    labels = config["config"]["Labels"]
    assert labels["org.opencontainers.image.base.digest"] == nd_base["digest"]
    assert labels["io.patchkit.vllm.installed"] == RELEASE
    # the manifest carries the OCI annotations of the config's labels, for registries and
    # scanners that read a manifest alone
    assert got["annotations"] == {k: v for k, v in labels.items()
                                  if k.startswith("org.opencontainers.image.")}
    assert got["annotations"]["org.opencontainers.image.created"] == labels[
        "org.opencontainers.image.created"]


def test_the_push_sent_the_new_layer_and_mounted_the_base(built, nd_base):
    traffic, summary = built["traffic"], built["summary"]
    writes = traffic.writes()
    base_layers = json.loads(raw(nd_base["ref"]))["layers"]
    # no byte of the base's layers went up: each was mounted from the base's repository
    mounts = [r for r in writes if r.method == "POST" and "mount=" in r.path]
    assert {r.path.split("mount=")[1].split("&")[0].replace("%3A", ":") for r in mounts} >= {
        d["digest"] for d in base_layers}
    assert all("from=pk-test%2Fnd-base" in r.path for r in mounts
               if any(d["digest"].split(":")[1] in r.path for d in base_layers))
    manifest_bytes = len(raw(built["tag"]))
    config_bytes = len(raw(built["tag"], "--config"))
    layer_bytes = summary["layer"]["bytes"]
    assert layer_bytes <= traffic.body <= layer_bytes + config_bytes + manifest_bytes
    # the manifest is the last thing written, after every blob
    assert writes[-1].method == "PUT" and writes[-1].path.endswith(f"/manifests/{TAG}")


def test_it_pulls_and_runs_python_in_an_arm64_container(built, docker_client, project):
    _, workdir = project
    tag = built["tag"]
    for ref in (tag, built["summary"]["image_id"]):
        try:
            docker_client.images.remove(ref, force=True)
        except Exception:
            pass
    image = docker_client.images.pull(tag, platform="linux/arm64")
    assert image.id == built["summary"]["image_id"]  # the engine's id is the config's digest
    script = f"""
import importlib.machinery, os, platform
print(platform.machine())
site = {SITE!r}
print(os.path.exists(site + "/" + {ip.GONE!r}))
print(sorted(os.listdir(site + "/vllm/config/__pycache__")).count("speculative.cpython-311.pyc"))
for mod, rel, want in [("vllm.config.speculative", {ip.SPEC!r}, {ip.MARK_SPEC!r}),
                       ("vllm.patchkit_extra.draft_guard", {ip.NEW!r}, {ip.MARK_NEW!r}),
                       ("vllm.utils.torch_utils", {ip.DTYPES!r}, "nvfp4_ds_mla")]:
    code = importlib.machinery.SourceFileLoader(mod, site + "/" + rel).get_code(mod)
    print(mod, want in code.co_names or want in code.co_consts)
"""
    out = docker_client.containers.run(tag, ["-c", script], entrypoint=["/usr/bin/python3"],
                                       remove=True, platform="linux/arm64",
                                       network_disabled=True).decode().split()
    # the removed module and the stale byte-code are gone, the patched modules compile
    assert out == ["aarch64", "False", "0", "vllm.config.speculative", "True",
                   "vllm.patchkit_extra.draft_guard", "True", "vllm.utils.torch_utils", "True"]
    got = _files(docker_client, tag, [f"{SITE}/{rel}" for rel in (ip.SPEC, ip.DTYPES, ip.NEW)])
    for rel in (ip.SPEC, ip.DTYPES, ip.NEW):
        assert got[f"{SITE}/{rel}"] == (workdir / rel).read_bytes(), rel
    assert docker_client.containers.run(tag, remove=True, platform="linux/arm64",
                                        network_disabled=True).decode().strip() == \
        "patchkit-serve: vllm serve"


def _files(client, image: str, paths: list[str]) -> dict[str, bytes]:
    c = client.api.create_container(image, command=["/x"], entrypoint=[])
    try:
        out = {}
        for p in paths:
            stream, _ = client.api.get_archive(c["Id"], p)
            with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
                out[p] = tar.extractfile(tar.next()).read()
        return out
    finally:
        client.api.remove_container(c["Id"], force=True)


def test_a_second_run_uploads_nothing(built, project, relay, use_cache, nd_base):
    m, workdir = project
    layers = [d["digest"] for d in json.loads(raw(nd_base["ref"]))["layers"]]
    relay.reset()
    again = build_image(m, Request(workdir=workdir, apply=False, push=True,
                                   no_daemon=True)).to_dict()
    traffic = relay.reset()
    assert again["reused"] is True
    assert again["digest"] == built["summary"]["digest"]
    assert again["image_id"] == built["summary"]["image_id"]
    assert traffic.writes() == [] and traffic.body == 0
    # and no layer was read again: the proofs were made on the cached blobs
    assert not [r for r in traffic.requests if any(d in r.path for d in layers)]


def test_another_tag_of_the_same_image_mounts_everything(built, project, relay, use_cache,
                                                         image_repo):
    m, workdir = project
    tag = f"{image_repo[0]}-copy:{TAG}"
    image_repo[1].append(tag)
    relay.reset()
    other = build_image(m, Request(workdir=workdir, apply=False, push=True, no_daemon=True,
                                   tag=tag)).to_dict()
    traffic = relay.reset()
    assert other["digest"] == built["summary"]["digest"] and other["reused"] is False
    uploads = [r for r in traffic.writes() if r.method == "PATCH" or
               (r.method == "PUT" and "/blobs/" in r.path)]
    # the new layer too comes from the first repository; only the config (small) may go up
    assert sum(r.body for r in uploads) <= len(raw(tag, "--config"))


def test_the_engine_path_gives_the_same_layer_and_config(built, project, docker_client,
                                                         image_repo):
    m, workdir = project
    summary = built["summary"]
    try:
        docker_client.images.remove(summary["image_id"], force=True)
    except Exception:
        pass
    tag = f"{image_repo[0]}:engine"
    image_repo[1].append(tag)
    engine = build_image(m, Request(workdir=workdir, apply=False, push=True, tag=tag)).to_dict()
    assert engine["reused"] is False  # the engine made the image itself
    assert engine["layer"]["diff_id"] == summary["layer"]["diff_id"]
    assert engine["image_id"] == summary["image_id"]
    ours, theirs = raw(built["tag"], "--config"), raw(tag, "--config")
    assert ours == theirs
    assert json.loads(theirs)["rootfs"]["diff_ids"] == json.loads(ours)["rootfs"]["diff_ids"]
    docker_client.images.remove(engine["image_id"], force=True)  # names the relay's address


def test_cli_json_and_text(built, project, use_cache, capsys):
    m, workdir = project
    args = ["build-image", "--no-daemon", "--push", "--no-apply", "--workdir", str(workdir),
            "--manifest", str(m.path)]
    code = cli.main([*args, "--format", "json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["ok"] is True and out["reused"] is True
    assert out["digest"] == built["summary"]["digest"] and out["tag"] == built["tag"]
    code = cli.main(args)
    captured = capsys.readouterr()
    assert code == 0
    assert f"digest: {built['summary']['digest']}" in captured.out
    assert "straight in the registry" in captured.err


# --------------------------------------------------------------------------- bad input

def _one_line_exit(capsys, args: list[str]) -> tuple[int, str]:
    """The exit code and the error line of a CLI run (the log lines before it say progress)."""
    code = cli.main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert not [line for line in err if "Traceback" in line]
    assert [line for line in err if line.startswith("patchkit")] == err[-1:]
    return code, err[-1]


def test_no_daemon_without_push_is_a_usage_error(project, capsys):
    m, workdir = project
    code, line = _one_line_exit(capsys, ["build-image", "--no-daemon", "--no-apply", "--workdir",
                                         str(workdir), "--manifest", str(m.path)])
    assert code == 2
    assert line == ("patchkit build-image: error: --no-daemon builds the image in the registry, so it needs "
                    "--push")


def test_an_unreachable_registry_is_one_line(project, use_cache, capsys):
    m, workdir = project
    nowhere = f"127.0.0.1:{free_port()}"
    code, line = _one_line_exit(capsys, [
        "build-image", "--no-daemon", "--push", "--no-apply", "--workdir", str(workdir),
        "--manifest", str(m.path), "--tag", f"{nowhere}/pk-test/nd:1"])
    assert code == 1
    assert line == (f"patchkit build-image: error: asking the registry of {nowhere}/pk-test/nd:1 "
                    f"what it holds: cannot reach the registry {nowhere}: connection refused")
    code, line = _one_line_exit(capsys, [
        "build-image", "--no-daemon", "--push", "--no-apply", "--workdir", str(workdir),
        "--manifest", str(m.path), "--base", f"{nowhere}/pk-test/base:1"])
    assert code == 1
    assert line == (f"patchkit build-image: error: base image {nowhere}/pk-test/base:1: cannot reach "
                    f"the registry {nowhere}: connection refused")


def test_a_base_in_no_registry_is_one_line(project, use_cache, relay, image_repo):
    m, workdir = project
    # a name without a registry host means Docker Hub, which this machine cannot reach
    with pytest.raises(ImageError) as exc:
        build_image(m, Request(workdir=workdir, apply=False, push=True, no_daemon=True,
                               base="pk-test/only-in-an-engine:1", tag=f"{image_repo[0]}:x"))
    text = str(exc.value)
    assert text.startswith("base image pk-test/only-in-an-engine:1 (the name has no registry "
                           "host, so it means Docker Hub")
    assert "cannot reach the registry docker.io: " in text
    assert "\n" not in text
    with pytest.raises(ImageError) as exc:
        build_image(m, Request(workdir=workdir, apply=False, push=True, no_daemon=True,
                               base=f"{relay.addr}/pk-test/no-such-base:1",
                               tag=f"{image_repo[0]}:x"))
    assert str(exc.value) == (f"base image {relay.addr}/pk-test/no-such-base:1 not found in its "
                              f"registry: reading manifest 1 in {relay.addr}/pk-test/no-such-base: "
                              "manifest unknown: manifest unknown")
    assert digest_of(f"{image_repo[0]}:x") is None


def _start_registry(root: Path, port: int, readonly: bool) -> subprocess.Popen:
    maintenance = "  maintenance:\n    readonly:\n      enabled: true\n" if readonly else ""
    (root / "config.yml").write_text(
        f"version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: "
        f"{root / 'data'}\n{maintenance}http:\n  addr: 127.0.0.1:{port}\n")
    proc = subprocess.Popen(["docker-registry", "serve", str(root / "config.yml")],
                            stdout=subprocess.DEVNULL, stderr=(root / "log").open("ab"))
    for _ in range(120):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2).read()
            return proc
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.25)
    proc.terminate()
    raise AssertionError(f"docker-registry did not start: {(root / 'log').read_text()[-2000:]}")


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def readonly_registry(tmp_path_factory, nd_base):
    """A second registry on 127.0.0.1 that holds the base and an older image under a tag, then
    is restarted read-only: it serves everything and refuses every upload."""
    if shutil.which("docker-registry") is None:
        pytest.fail("docker-registry is not installed (.ci/services.sh installs it)")
    root = tmp_path_factory.mktemp("ro-registry")
    port = free_port()
    addr = f"127.0.0.1:{port}"
    proc = _start_registry(root, port, readonly=False)
    try:
        for dest in ("pk-test/base:1", "pk-test/target:1"):
            skopeo("copy", "--quiet", "--src-tls-verify=false", "--dest-tls-verify=false",
                   f"docker://{nd_base['ref']}", f"docker://{addr}/{dest}")
    finally:
        _stop(proc)
    proc = _start_registry(root, port, readonly=True)
    yield addr
    _stop(proc)


def test_a_registry_that_refuses_a_blob_leaves_the_tag_alone(project, readonly_registry,
                                                             use_cache, capsys):
    m, workdir = project
    tag = f"{readonly_registry}/pk-test/target:1"
    before = digest_of(tag)
    assert before is not None
    code, line = _one_line_exit(capsys, [
        "build-image", "--no-daemon", "--push", "--no-apply", "--workdir", str(workdir),
        "--manifest", str(m.path), "--base", f"{readonly_registry}/pk-test/base:1", "--tag", tag])
    assert code == 1
    assert line.startswith(f"patchkit build-image: error: push of {tag} refused, the tag is unchanged: "
                           "writing blob: ")
    assert "405" in line  # a read-only registry's answer to an upload
    assert digest_of(tag) == before
