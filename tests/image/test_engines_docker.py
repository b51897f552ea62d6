"""The engines and bases the image tests stand on are the real thing.

Podman answers through its Docker-compatible API and runs arm64 containers; the second node is
another Docker Engine reached through a real sshd; the dev and vendor bases report what their
builds report and hold what they claim.  Under CI=true a missing service fails these tests.
"""

from __future__ import annotations

import json
import subprocess
from urllib.parse import urlparse

import pytest
import yaml
from packaging.specifiers import SpecifierSet
from unidiff import PatchSet

from testing import baseimage
from testing import REPO_ROOT
from testing.dockersdk import files_of
from testing.imageproject import SITE

pytestmark = [pytest.mark.docker, pytest.mark.timeout(1800)]

# What a base's python says about the vLLM it holds.  The bases hold no torch, so `import
# vllm` stops at vllm.env_override; the version is then read as pip and patchkit would read
# it: from the dist-info, and from vllm/_version.py loaded by path.
VERSION_PROBE = f"""
import glob, importlib.metadata, importlib.util, json
site = {SITE!r}
try:
    import vllm
    imported = vllm.__version__
except ImportError as exc:
    imported = "ImportError: " + str(exc)
spec = importlib.util.spec_from_file_location("pk_probe_version", site + "/vllm/_version.py")
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
print(json.dumps({{
    "import": imported,
    "metadata": importlib.metadata.version("vllm"),
    "version_py": mod.__version__,
    "version_tuple": list(mod.__version_tuple__),
    "commit_id": mod.commit_id,
    "dist_info": sorted(p.rsplit("/", 1)[1] for p in glob.glob(site + "/vllm-*.dist-info")),
}}))
"""


def run_arm64(client, image: str, program: str, *args: str) -> str:
    # The program as the entrypoint: Podman takes an empty entrypoint for none given, and
    # the bases' own entrypoint is the API server.
    out = client.containers.run(image, list(args), entrypoint=[program], remove=True,
                                platform="linux/arm64", network_disabled=True,
                                stdout=True, stderr=True)
    return out.decode()


def probe(client, image: str) -> dict:
    out = run_arm64(client, image, "python3", "-c", VERSION_PROBE)
    return json.loads(out.strip().splitlines()[-1])


def texts_of(client, image: str, rels: list[str]) -> dict[str, str]:
    """The text of each of ``rels`` (relative to the site folder) in ``image``."""
    got = files_of(client, image, [f"{SITE}/{rel}" for rel in rels])
    return {rel: got[f"{SITE}/{rel}"].decode() for rel in rels}


def pristine(rev: str, path: str) -> str:
    """``path`` at ``rev`` in patchkit's PyPI source, the repository the pins resolve in."""
    from patchkit.source import pypi

    repo = pypi.repo_path(baseimage.cache_root())
    return subprocess.run(["git", "-C", str(repo), "show", f"{rev}:{path}"], check=True,
                          capture_output=True, text=True).stdout


def pulled(client, tag: str) -> str:
    repo, _, name = tag.rpartition(":")
    client.images.pull(repo, tag=name, platform="linux/arm64")
    return tag


# --- Podman ------------------------------------------------------------------------------------

def test_podman_answers_through_its_docker_api(podman_client, docker_client):
    version = podman_client.version()
    names = [c.get("Name") for c in version.get("Components") or []]
    assert "Podman Engine" in names, version
    # Its own store, not dockerd's: nothing the Docker Engine holds is seen there.
    assert podman_client.info().get("DockerRootDir") != docker_client.info()["DockerRootDir"]


@pytest.mark.real_vllm
def test_podman_runs_an_arm64_python(podman_client, dev_base):
    tag = pulled(podman_client, dev_base["tag"])
    out = run_arm64(podman_client, tag, "python3", "-c",
                    "import platform, resource; "
                    "print(platform.machine(), *resource.getrlimit(resource.RLIMIT_NOFILE))")
    # aarch64 through qemu; the nofile limit of Podman's own containers.conf
    assert out.split() == ["aarch64", "20000", "20000"]


# --- the second node behind ssh ----------------------------------------------------------------

def test_node2_is_another_engine_reached_through_ssh(node2, docker_client):
    url = urlparse(node2.url)
    assert url.scheme == "ssh" and url.port, node2.url
    far, here = node2.client.info(), docker_client.info()
    assert far["ID"] != here["ID"]
    assert far["DockerRootDir"] != here["DockerRootDir"]
    # and the engine behind ssh is the one on the node's own socket
    assert node2.direct.info()["ID"] == far["ID"]


def test_node2_ssh_sessions_talk_to_its_engine(node2):
    url = urlparse(node2.url)
    out = subprocess.run(["ssh", "-p", str(url.port), url.hostname, "printenv", "DOCKER_HOST"],
                         capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == node2.socket


@pytest.mark.real_vllm
def test_node2_pulls_from_the_registry_and_runs_arm64(node2, dev_base):
    tag = pulled(node2.client, dev_base["tag"])
    out = run_arm64(node2.client, tag, "python3", "-c",
                    "import platform; print(platform.machine())")
    assert out.strip() == "aarch64"
    assert node2.direct.images.get(tag).id == node2.client.images.get(tag).id


# --- the dev and vendor bases ------------------------------------------------------------------

@pytest.mark.real_vllm
def test_dev_base_reports_a_dev_version_naming_the_release_commit(dev_base, docker_client):
    commit = baseimage.release_commit(baseimage.DEV_RELEASE)
    assert dev_base["commit"] == commit
    version = f"0.31.1.dev7+g{commit[:9]}"
    assert dev_base["version"] == version
    got = probe(docker_client, dev_base["tag"])
    assert got["metadata"] == got["version_py"] == version, got
    assert got["version_tuple"] == [0, 31, 1, "dev7", f"g{commit[:9]}"]
    assert got["commit_id"] == f"g{commit[:9]}"
    assert got["dist_info"] == [f"vllm-{version}.dist-info"]
    assert got["import"].startswith("ImportError"), got  # no torch here: see VERSION_PROBE
    # The sources are the commit's own, found by the short id the version names.
    path = "vllm/config/speculative.py"
    assert texts_of(docker_client, dev_base["tag"], [path])[path] == pristine(commit[:9], path)


def patchset_files() -> dict[str, list]:
    """Every file the DSpark patchset names, with the hunks of its diffs that apply to 0.31.0."""
    doc = yaml.safe_load((REPO_ROOT / "patchset.yaml").read_text())
    out: dict[str, list] = {}
    for patch in doc["patches"]:
        for check in patch.get("verify") or []:
            out.setdefault(check["file"], [])
        if "diff" in patch:
            applies = SpecifierSet(patch.get("vllm") or "").contains(baseimage.DEV_RELEASE)
            for pf in PatchSet((REPO_ROOT / patch["diff"]).read_text()):
                out.setdefault(pf.path, []).extend(pf if applies else [])
    return out


@pytest.mark.real_vllm
def test_vendor_base_reports_its_version_and_holds_its_edits(vendor_base, docker_client):
    version = "0.31.0+nv25.11"
    assert vendor_base["version"] == version
    got = probe(docker_client, vendor_base["tag"])
    assert got["metadata"] == got["version_py"] == version, got
    assert got["dist_info"] == [f"vllm-{version}.dist-info"]

    edits = [baseimage.Edit(**e) for e in vendor_base["edits"]]
    untouched = "vllm/config/speculative.py"
    texts = texts_of(docker_client, vendor_base["tag"], [e.file for e in edits] + [untouched])
    tag = f"v{vendor_base['release']}"
    for edit in edits:
        before = pristine(tag, edit.file)
        assert edit.marker not in before and edit.marker in edit.added
        assert texts[edit.file] == baseimage.edited_text(before, edit)
    assert texts[untouched] == pristine(tag, untouched)

    # Two files the patchset leaves alone, one it patches; there the vendor's lines lie out of
    # reach of every hunk (a hunk's old range already holds its context lines).
    named = patchset_files()
    assert [e.file in named for e in edits] == [e.touched_by_patchset for e in edits]
    assert sum(not e.touched_by_patchset for e in edits) == 2
    touched = [e for e in edits if e.touched_by_patchset]
    assert len(touched) == 1
    edit = touched[0]
    hunks = named[edit.file]
    assert hunks, f"no diff of the patchset changes {edit.file} at {tag}"
    before = pristine(tag, edit.file).splitlines()
    first = len(before) + 1 if edit.after is None else before.index(edit.after) + 2
    last = first + edit.added.count("\n") - 1
    for h in hunks:
        assert last < h.source_start - 1 or first > h.source_start + h.source_length, h
