"""copy-image --via and build-image --copy-to --via, on the real engines and registry.

The source is the Docker Engine DOCKER_HOST names; the targets are the second node behind a
real sshd (checked on its own socket) and Podman.  The registry is the one .ci/services.sh
starts; a byte-counting relay in front of it (testing/regproxy.py) plays a registry that
refuses blob uploads.  Podman's registries.conf marks only 127.0.0.1:PORT (PK_REGISTRY) plain-http,
so through ``localhost:PORT`` it is a target that cannot reach the registry the others use.

The base is a small one of this run's own (testing.smallimage): two layers of new bytes and one
holding the few files of the real vLLM 0.27.1 that build-image reads, pushed to the registry;
the test patchset's overlay image is built on it.
"""

from __future__ import annotations

import io
import json
import os
import secrets
import tarfile

import pytest

from testing import imageproject as ip
from testing import smallimage
from testing.dockersdk import absent, fingerprint_of, forget
from testing.imageproject import DTYPES, RELEASE, SPEC
from testing.regproxy import RegistryProxy
from testing.smallimage import MiB, filler
from patchkit import cli
from patchkit.commands import copy_image
from patchkit.commands.build_image import Request
from patchkit.commands.build_image import run as build_image
from patchkit.nodes.transfer import How

pytestmark = [pytest.mark.docker, pytest.mark.real_vllm, pytest.mark.timeout(1800)]

NAME = "pk-via"
REPO = "pk-via/copy"   # no registry host: --via decides where it goes
RUN = secrets.token_hex(4)   # this run's tags: another checkout's run uses others


def run_tag(name: str) -> str:
    return f"{REPO}:{name}-{RUN}"


def fresh_layer(client, parent: str, tag: str) -> None:
    """``tag``: ``parent`` and a layer of new random bytes (a blob the registry lacks)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in (("Dockerfile", f"FROM {parent}\nCOPY fresh /opt/pk-via-fresh\n"),
                           ("fresh", secrets.token_hex(64))):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data.encode()))
    buf.seek(0)
    client.images.build(fileobj=buf, custom_context=True, tag=tag, platform="linux/arm64",
                        rm=True, forcerm=True)


@pytest.fixture(scope="module")
def base(docker_client, registry, node2):
    """The small vLLM base, in the registry; afterwards every engine forgets it and what this
    module made (the run's tags)."""
    name = f"{registry}/pk-test/via-base:{RUN}"
    smallimage.build(
        docker_client, name, [{"opt/pk-base/a": filler(3 * MiB // 2)},
                              {"opt/pk-base/b": filler(3 * MiB // 2)},
                              smallimage.vllm_files(RELEASE, [SPEC, DTYPES])],
        env={"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"})
    smallimage.push(docker_client, name)
    yield name
    for client in (node2.direct, docker_client):
        smallimage.forget_tagged(client, RUN)


@pytest.fixture(scope="module")
def project(tmp_path_factory, base):
    root = tmp_path_factory.mktemp("via")
    return ip.applied_project(root, base=base, tag=f"{REPO}:{{ref}}-{RUN}", name=NAME)


@pytest.fixture(scope="module")
def image(project, base, docker_client, node2):
    """The overlay image on the source, and the node holding its base as pulled from the
    registry (the cluster's case), but not the image."""
    m, workdir = project
    summary = build_image(m, Request(workdir=workdir, apply=False)).to_dict()
    assert summary["ok"], summary
    node2.direct.images.pull(*base.rsplit(":", 1), platform="linux/arm64")
    return summary


def test_via_pushes_what_the_registry_lacks_and_the_node_pulls_what_it_lacks(
        image, node2, docker_client, registry):
    tag = run_tag("1")
    fresh_layer(docker_client, image["image_id"], tag)  # a layer no registry or node holds
    fresh_id = docker_client.images.get(tag).id
    forget(node2.direct, tag)
    want = fingerprint_of(docker_client, tag)
    layers = len(docker_client.api.inspect_image(tag)["RootFS"]["Layers"])

    report = copy_image.run(tag, [node2.url], how=How(via=registry))
    (t,) = report.targets
    assert (t.status, t.fingerprint, t.error) == ("copied", want, None)
    assert fingerprint_of(node2.direct, tag) == want
    assert node2.direct.images.get(tag).id == fresh_id
    # the registry and the node held the base: the fresh layer moves each way, the overlay's
    # own at most (the node may hold it from another image), never the base
    pushed = report.via
    assert pushed.ref == f"{registry}/{tag}" and pushed.digest.startswith("sha256:")
    assert 1 <= pushed.transfer.moved <= 2
    assert pushed.transfer.moved + pushed.transfer.present == layers
    assert 1 <= t.pulled.moved <= 2 and t.pulled.moved + t.pulled.present == layers
    assert t.pulled.bytes <= image["layer"]["bytes"] + 2**16
    assert t.sent.bytes == 0   # nothing crossed the link to the node
    # the source keeps its names; the node got the image's own name only
    assert absent(docker_client, pushed.ref)
    assert node2.direct.images.get(tag).tags == [tag]

    again = copy_image.run(tag, [node2.url], how=How(via=registry))
    (t,) = again.targets
    assert (t.status, t.fingerprint, again.via) == ("present", want, None)
    forget(node2.direct, tag)
    forget(docker_client, tag)


def test_a_registry_that_refuses_blobs_leaves_the_node_as_it_was(image, node2, base,
                                                                  docker_client, capfd):
    tag = run_tag("refused")
    fresh_layer(docker_client, image["image_id"], tag)  # a blob no registry holds
    node2.direct.api.tag(base, *tag.rsplit(":", 1))  # other content under the tag
    before = node2.direct.images.get(tag).id

    def uploads(method: str, path: str) -> int | None:
        return 403 if method in ("POST", "PATCH", "PUT") and "/blobs/" in path else None

    with RegistryProxy(ip.REGISTRY, refuse=uploads) as proxy:
        code = cli.main(["copy-image", tag, "--to", node2.url, "--via", proxy.addr])
        refused = [r for r in proxy.traffic.writes() if "/blobs/uploads" in r.path]
    out, _ = capfd.readouterr()
    assert code == 1 and refused
    (line,) = out.splitlines()
    assert line.startswith(f"failed    {node2.url}: push of {proxy.addr}/{tag} refused: ")
    assert "denied" in line and line.endswith("; nothing was pulled by any target")
    assert node2.direct.images.get(tag).id == before
    assert absent(docker_client, f"{proxy.addr}/{tag}")
    forget(docker_client, tag)  # the fresh layer is of this run alone


def test_a_target_that_cannot_reach_the_registry_fails_alone(image, node2, podman_client,
                                                             docker_client):
    tag = run_tag("2")
    docker_client.api.tag(image["image_id"], *tag.rsplit(":", 1))
    forget(node2.direct, tag)
    forget(podman_client, tag)
    podman = os.environ["PK_PODMAN_HOST"]
    via = "localhost:" + ip.REGISTRY.rsplit(":", 1)[1]   # the registry, by another name
    report = copy_image.run(tag, [node2.url, podman], how=How(via=via))
    node, pm = report.targets
    assert (node.status, node.fingerprint) == ("copied", fingerprint_of(docker_client, tag))
    assert fingerprint_of(node2.direct, tag) == node.fingerprint
    assert pm.status == "failed" and not report.ok
    assert pm.error.startswith(f"the engine at {podman} could not pull {via}/{REPO}@")
    assert "HTTP response to HTTPS client" in pm.error and "\n" not in pm.error
    assert absent(podman_client, tag)


def test_build_image_copy_to_via(project, image, node2, registry, capsys):
    m, workdir = project
    tag = run_tag("built")
    forget(node2.direct, tag)
    code = cli.main(["build-image", "--no-apply", "--workdir", str(workdir), "--manifest",
                     str(m.path), "--tag", tag, "--copy-to", node2.url, "--via", registry,
                     "--format", "json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["ok"] is True, out
    (t,) = out["copy"]["targets"]
    assert out["copy"]["via"]["ref"] == f"{registry}/{tag}"
    assert t["status"] == "copied" and "pulled" in t
    assert t["fingerprint"] == fingerprint_of(node2.direct, tag) == out["copy"]["fingerprint"]
    assert node2.direct.images.get(tag).id == out["image_id"]
