"""Overlay images on every store, and copy-image between nodes, on the real engines.

Podman (containers-storage, which cannot take a partial load) builds the same image as the
Docker Engine through a complete archive streamed from its own export; copy-image puts the
image on the second node behind a real sshd, checked there by fingerprint on its own socket,
and sends nothing the second time.
"""

from __future__ import annotations

import json
import os
import shlex
from urllib.parse import urlsplit

import docker
import pytest

from testing import imageproject as ip
from testing.dockersdk import fingerprint_of
from testing.imageproject import RELEASE, SITE
from testing.progress import Said
from patchkit import cli
from patchkit.commands import copy_image
from patchkit.process import Piped
from patchkit.commands.build_image import Request
from patchkit.commands.build_image import Request
from patchkit.commands.build_image import run as build_image
from patchkit.errors import ImageError
from patchkit.formats import layer
from patchkit.engines import facts
from patchkit.engines.docker import Engine
from patchkit.timeouts import DEFAULT_TIMEOUT
from patchkit.imageref import Platform

pytestmark = [pytest.mark.docker, pytest.mark.real_vllm, pytest.mark.timeout(1800)]

REGISTRY = ip.REGISTRY
COPY_TAG = f"{REGISTRY}/pk-test/engines-copy:1"
NAME = "pk-stores"
PROBE = f"""
import importlib.machinery, platform
site = {SITE!r}
code = importlib.machinery.SourceFileLoader("m", site + "/" + {ip.SPEC!r}).get_code("m")
print(platform.machine(), {ip.MARK_SPEC!r} in code.co_names)
"""


def run_python(client, image: str, script: str) -> str:
    out = client.containers.run(image, ["-c", script], entrypoint=["/usr/bin/python3"],
                                remove=True, platform="linux/arm64", network_disabled=True,
                                stdout=True, stderr=True)
    return out.decode().strip()


def forget(client, ref: str) -> None:
    """Drop ``ref`` and the image it names from an engine (the tests' own tags only)."""
    try:
        image = client.images.get(ref)
    except docker.errors.NotFound:
        return
    client.images.remove(image.id, force=True)


@pytest.fixture(scope="module")
def project(tmp_path_factory, bases, registry):
    root = tmp_path_factory.mktemp("stores")
    # A name of its own: the other image tests clear the engines of pk-e2e images as they start.
    return ip.applied_project(root, base=bases[RELEASE]["tag"],
                              tag=f"{registry}/pk-test/engines-e2e:{{ref}}", name=NAME)


@pytest.fixture(scope="module")
def classic(project, docker_client):
    m, workdir = project
    summary = build_image(m, Request(workdir=workdir, apply=False)).to_dict()
    assert summary["ok"], summary
    docker_client.api.tag(summary["image_id"], *COPY_TAG.rsplit(":", 1))
    return summary


# --- Podman: containers-storage --------------------------------------------------------------

def test_podman_builds_the_same_image_through_a_complete_archive(project, classic, bases,
                                                                 podman_client, docker_client):
    m, workdir = project
    host = os.environ["PK_PODMAN_HOST"]
    tag = f"{REGISTRY}/pk-test/engines-podman:v{RELEASE}"
    # the base as the registry has it now, and no image of an earlier run to reuse
    podman_client.images.pull(*bases[RELEASE]["tag"].rsplit(":", 1), platform="linux/arm64")
    for img in podman_client.images.list(filters={"label": f"io.patchkit.patchset.name={NAME}"}):
        podman_client.images.remove(img.id, force=True)

    engine = Engine.connect(host, timeout=DEFAULT_TIMEOUT)
    assert engine.store().kind == "containers-storage"
    said = Said()
    got = build_image(m, Request(workdir=workdir, apply=False, tag=tag, engine=engine),
                      progress=said).to_dict()
    assert got["ok"] and got["load"] == "complete" and not got["reused"]
    assert (f"loading a complete archive: the engine at {host} keeps images in "
            "containers-storage, which cannot take a partial load") in said.lines
    # the same config, so the same config digest, and the same layer as the Docker Engine's
    assert got["image_id"] == classic["image_id"]
    layers = docker_client.api.inspect_image(classic["image_id"])["RootFS"]["Layers"]
    assert podman_client.api.inspect_image(tag)["RootFS"]["Layers"] == layers
    assert got["layer"]["diff_id"] == layers[-1]
    assert fingerprint_of(podman_client, tag) == facts.fingerprint(engine.content(tag)) \
        == fingerprint_of(docker_client, classic["image_id"])
    assert run_python(podman_client, tag, PROBE) == "aarch64 True"

    # the partial archive the classic store takes is what Podman refuses
    base = engine.resolve_base(bases[RELEASE]["tag"], Platform.parse("linux/arm64"))
    made = layer.layer_tar([layer.LayerEntry("opt/pk-refused", "file", b"x\n")], 1)
    config = layer.image_config(base, made, labels={"io.patchkit.test": "refused"}, created=1,
                                created_by="refused")
    with pytest.raises(ImageError) as exc:
        engine.load(layer.load_archive(config, made, len(base.diff_ids)), layer.image_id_of(config))
    assert str(exc.value).startswith(f"loading the image into the engine at {host}: ")
    assert "\n" not in str(exc.value)
    assert engine.inspect(layer.image_id_of(config)) is None


# --- the second node behind ssh --------------------------------------------------------------

def test_copy_to_the_node_behind_ssh_then_nothing_is_sent(classic, node2, docker_client):
    forget(node2.direct, COPY_TAG)
    try:
        node2.direct.images.remove(classic["image_id"], force=True)
    except docker.errors.NotFound:
        pass
    want = fingerprint_of(docker_client, COPY_TAG)

    first = copy_image.run(COPY_TAG, [node2.url])
    assert first.ok and first.fingerprint == want
    (t,) = first.targets
    assert (t.engine, t.status, t.fingerprint) == (node2.url, "copied", want)
    base_and_layer = docker_client.api.inspect_image(COPY_TAG)["RootFS"]["Layers"]
    # the layers the node held already (the base, when another test left it there) stay behind
    assert t.sent.layers + t.sent.layers_skipped == len(base_and_layer)
    assert t.sent.layer_bytes + t.sent.skipped_bytes > 100 * 2**20
    # identical content on the far engine, read on its own socket, not through ssh
    assert fingerprint_of(node2.direct, COPY_TAG) == want
    assert node2.direct.images.get(COPY_TAG).id == classic["image_id"]
    assert run_python(node2.direct, COPY_TAG, PROBE) == "aarch64 True"

    second = copy_image.run(COPY_TAG, [node2.url])
    (t,) = second.targets
    assert (t.status, t.fingerprint, t.sent.bytes, t.sent.layer_bytes) == ("present", want, 0, 0)


def test_other_content_under_the_tag_on_the_node_is_replaced(classic, node2, bases,
                                                             docker_client, capsys):
    # the node holds the base under the tag the copy names
    other = f"{REGISTRY}/pk-test/engines-copy:replaced"
    docker_client.api.tag(classic["image_id"], *other.rsplit(":", 1))
    node2.direct.images.pull(*bases[RELEASE]["tag"].rsplit(":", 1), platform="linux/arm64")
    node2.direct.api.tag(bases[RELEASE]["tag"], *other.rsplit(":", 1))
    before = fingerprint_of(node2.direct, other)
    before_id = node2.direct.images.get(other).id
    code = cli.main(["copy-image", other, "--to", node2.url, "--format", "json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    want = fingerprint_of(docker_client, other)
    assert before != want
    assert [(t["status"], t["fingerprint"]) for t in out["targets"]] == [("replaced", want)]
    assert fingerprint_of(node2.direct, other) == want
    # what the tag named before is still there, under its own name
    assert node2.direct.images.get(bases[RELEASE]["tag"]).id == before_id


def test_an_unreachable_node_is_one_line(classic, node2, capfd):
    # a port where nothing listens: ssh itself says so, once
    code = cli.main(["copy-image", COPY_TAG, "--to", "ssh://pk-node2:1"])
    out, err = capfd.readouterr()
    assert code == 1
    assert out.splitlines() == [
        "failed    ssh://pk-node2:1: no Docker Engine answers at ssh://pk-node2:1: "
        "ssh: connect to host 127.0.0.1 port 1: Connection refused"]
    assert err == ""


def test_a_broken_stream_leaves_nothing_on_the_node(classic, node2, podman_client, docker_client,
                                                    monkeypatch):
    # The target is real (Podman, and the node behind ssh); the source's export breaks off
    # after 64 MiB, as a dying engine's would.
    tag = f"{REGISTRY}/pk-test/engines-copy:broken"
    for client in (node2.direct, podman_client):
        forget(client, tag)
    docker_client.api.tag(classic["image_id"], *tag.rsplit(":", 1))
    for client in (node2.direct, podman_client):  # no copy of the content to tag instead
        try:
            client.images.remove(classic["image_id"], force=True)
        except docker.errors.NotFound:
            pass
    real_export = Engine.export

    def breaking(self, ref):
        sent = 0
        for chunk in real_export(self, ref):
            sent += len(chunk)
            if sent > 64 * 2**20:
                raise ImageError(f"exporting {ref} from the engine at {self.host}: the engine "
                                 "went away")
            yield chunk

    def breaking_piped(self, ref):
        # the docker CLI's export, cut off after 64 MiB by a dying engine
        return Piped(["sh", "-c", f"{shlex.join([*self.cli, 'save', ref])} | head -c "
                      f"{64 * 2**20}; echo 'Error response from daemon: the engine went away' "
                      ">&2; exit 1"], feed=False)

    monkeypatch.setattr(Engine, "export", breaking)
    monkeypatch.setattr(Engine, "export_piped", breaking_piped)
    podman = os.environ["PK_PODMAN_HOST"]
    report = copy_image.run(tag, [node2.url, podman])
    assert [t.status for t in report.targets] == ["failed", "failed"] and not report.ok
    for t in report.targets:
        assert "the engine went away" in t.error and "\n" not in t.error
    for client in (node2.direct, podman_client):
        with pytest.raises(docker.errors.NotFound):
            client.images.get(tag)


def test_build_image_copy_to_the_node(project, classic, node2, capsys):
    m, workdir = project
    tag = f"{REGISTRY}/pk-test/engines-copy:built"
    forget(node2.direct, tag)
    code = cli.main(["build-image", "--no-apply", "--workdir", str(workdir), "--manifest",
                     str(m.path), "--tag", tag, "--copy-to", node2.url, "--format", "json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["ok"] is True
    (t,) = out["copy"]["targets"]
    # the node already holds this content (an earlier test copied it): only the tag moves
    assert t["engine"] == node2.url and t["status"] == "copied"
    assert t["fingerprint"] == fingerprint_of(node2.direct, tag) == out["copy"]["fingerprint"]
    assert node2.direct.images.get(tag).id == out["image_id"]


def test_an_ssh_url_without_a_port_takes_the_port_of_the_ssh_config(node2):
    # pk-node2's Host block in the suite's ssh config names its sshd's port; the SDK alone
    # would have passed port 22 to ssh
    url = urlsplit(node2.url)
    engine = Engine.connect(f"ssh://{url.hostname}", timeout=DEFAULT_TIMEOUT)
    assert engine.host == f"ssh://{url.hostname}"
    assert engine.info()["ID"] == node2.direct.info()["ID"]
    assert engine.store().kind == "classic"
