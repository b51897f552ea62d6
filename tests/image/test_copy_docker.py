"""copy-image through a link we can count and cut: the TCP relay of testing.link sits between
ssh and the nodes' sshd, so what crosses it is what a real link would carry.

The nodes are the second and third Docker Engines of .ci/services.sh, each behind its own sshd;
the tests look at them on their own sockets (never through the link) to judge the outcome.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time

import docker
import pytest

from testing import imageproject as ip
from testing.imageproject import RELEASE
from testing.link import Link
from patchkit import cli, manifest
from patchkit.commands import copy_image
from patchkit.commands.build_image import run as build_image
from patchkit.image import layer
from patchkit.series.applier import apply_series
from testing import real_cache

pytestmark = [pytest.mark.docker, pytest.mark.real_vllm, pytest.mark.timeout(1800)]

REGISTRY = os.environ.get("PK_REGISTRY", "127.0.0.1:5055")
TAG = f"{REGISTRY}/pk-test/copy-overlay:1"
NAME = "pk-copy"


def fingerprint_of(client, ref: str) -> str | None:
    try:
        attrs = client.api.inspect_image(ref)
    except docker.errors.NotFound:
        return None
    return layer.fingerprint({"ConfigDigest": attrs["Id"], "RootFS": attrs["RootFS"]})


def forget(client, *refs: str) -> None:
    """Drop these refs (the tests' own tags and image ids only) from an engine."""
    for ref in refs:
        try:
            client.images.remove(ref, force=True)
        except docker.errors.NotFound:
            pass


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


@pytest.fixture(scope="module")
def overlay(tmp_path_factory, bases, registry, docker_client):
    """The test patchset's overlay image on the source engine: the 0.27.1 base plus one layer."""
    root = tmp_path_factory.mktemp("copy")
    path = ip.make_project(root, base=bases[RELEASE]["tag"],
                           tag=f"{registry}/pk-test/copy:{{ref}}", name=NAME)
    m = manifest.load(path)
    workdir = root / ".patchkit" / "vllm"
    assert apply_series(m, workdir=workdir, cache=real_cache()).ok
    summary = build_image(m, workdir=workdir, apply=False).to_dict()
    assert summary["ok"], summary
    docker_client.api.tag(summary["image_id"], *TAG.rsplit(":", 1))
    attrs = docker_client.api.inspect_image(TAG)
    return {"id": summary["image_id"], "layers": attrs["RootFS"]["Layers"],
            "fingerprint": fingerprint_of(docker_client, TAG), "base": bases[RELEASE]["tag"]}


def holding_base(node, overlay) -> None:
    """The node holds the overlay's base, and neither the overlay image nor its tag."""
    forget(node.direct, TAG, overlay["id"])
    node.direct.images.pull(*overlay["base"].rsplit(":", 1), platform="linux/arm64")


def a_small_other_image(node, tag: str) -> str:
    """Another image (one file, from scratch) under ``tag`` on the node; its id."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        info = tarfile.TarInfo("old")
        body = b"the old content\n"
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
    ctx = io.BytesIO()
    with tarfile.open(fileobj=ctx, mode="w") as tar:
        for name, body in (("Dockerfile", b"FROM scratch\nADD old.tar /\n"),
                           ("old.tar", data.getvalue())):
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    ctx.seek(0)
    image, _ = node.direct.images.build(fileobj=ctx, custom_context=True, tag=tag, rm=True)
    return image.id


def test_an_overlay_to_a_node_holding_its_base_sends_its_own_size(overlay, node3):
    holding_base(node3, overlay)
    with Link(port_of(node3.url)) as link:
        url = link.url("pk-node3")
        first = copy_image.run(TAG, [url])
        (t,) = first.targets
        first_up, load_up = link.up, link.busiest
        assert (t.status, t.fingerprint) == ("copied", overlay["fingerprint"]), t
        # the base's layers stay behind (node 3 is this module's alone: nothing else there
        # has the new layer)
        assert (t.sent.layers, t.sent.layers_skipped) == (1, len(overlay["layers"]) - 1)
        assert t.sent.skipped_bytes > 100 * 2**20 > t.sent.bytes
        assert fingerprint_of(node3.direct, TAG) == overlay["fingerprint"]
        # what the same run costs when nothing is sent: connections and inspections
        link.reset()
        (again,) = copy_image.run(TAG, [url]).targets
        assert (again.status, again.sent.bytes) == ("present", 0)
        talk = link.up
    # the load's connection carried the archive (the new layer, the config, the manifest and
    # the small files of the legacy layout) within 5 %; asking (each request of the SDK is an
    # ssh connection of its own, some 4 KB) came to a few KB more
    assert load_up <= 1.05 * t.sent.bytes, (load_up, t.sent)
    assert first_up - talk < t.sent.bytes + 64 * 1024, (first_up, talk, t.sent)


def test_dry_run_says_what_would_be_sent_and_sends_nothing(overlay, node3, capsys):
    holding_base(node3, overlay)
    with Link(port_of(node3.url)) as link:
        url = link.url("pk-node3")
        code = cli.main(["copy-image", TAG, "--to", url, "--dry-run", "--format", "json"])
        dry_up = link.up
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["dry_run"]
    (t,) = out["targets"]
    n = len(overlay["layers"])
    assert t["status"] == "copied" and t["sent"]["bytes"] == 0
    assert (t["plan"]["layers_present"], t["plan"]["layers_to_send"]) == (n - 1, 1)
    assert 0 < t["plan"]["missing_bytes"] < 50 * 2**20
    assert "holds" in t["plan"]["why"]
    with pytest.raises(docker.errors.NotFound):
        node3.direct.images.get(TAG)
    # only the inspection crossed the link: far less than the layer it would send
    assert dry_up < 256 * 1024, dry_up


def test_two_nodes_at_once_from_one_export_end_identical(overlay, node2, node3, docker_client):
    # both nodes hold the overlay; the image to copy is one new layer on top of it
    assert copy_image.run(TAG, [node2.url, node3.url]).ok
    on_top = f"{REGISTRY}/pk-test/copy-on-top:1"
    ctx = io.BytesIO()
    with tarfile.open(fileobj=ctx, mode="w") as tar:
        for name, body in (("Dockerfile", f"FROM {TAG}\nCOPY new /opt/new\n".encode()),
                           ("new", os.urandom(256 * 1024))):
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    ctx.seek(0)
    docker_client.images.build(fileobj=ctx, custom_context=True, tag=on_top, rm=True)
    said: list[str] = []
    report = copy_image.run(on_top, [node2.url, node3.url], log=said.append)
    assert report.ok, report.to_dict()
    assert [t.status for t in report.targets] == ["copied", "copied"]
    assert any("one export for 2 targets" in line for line in said), said
    want = fingerprint_of(docker_client, on_top)
    assert fingerprint_of(node2.direct, on_top) == fingerprint_of(node3.direct, on_top) == want
    for t in report.targets:
        assert (t.sent.layers, t.sent.layers_skipped) == (1, len(overlay["layers"]))
        assert 256 * 1024 < t.sent.layer_bytes < 300 * 1024
    for client in (node2.direct, node3.direct, docker_client):
        forget(client, on_top)


def test_a_cut_link_leaves_the_tag_as_it_was_and_a_rerun_completes(overlay, node3, capfd):
    # node 3 holds none of the image's layers (a whole image to send) and other content
    # under the tag
    forget(node3.direct, TAG, overlay["id"], overlay["base"])
    old = a_small_other_image(node3, TAG)
    with Link(port_of(node3.url)) as link:
        url = link.url("pk-node3")
        link.cut_after(40 * 2**20)
        code = cli.main(["copy-image", TAG, "--to", url])
        out, err = capfd.readouterr()
        assert link.was_cut
        assert code == 1
        (line,) = out.splitlines()
        assert line.startswith(f"failed    {url}: "), line
        assert node3.direct.images.get(TAG).id == old
        link.mend()
        code = cli.main(["copy-image", TAG, "--to", url, "--format", "json"])
        out, _ = capfd.readouterr()
    assert code == 0, out
    assert fingerprint_of(node3.direct, TAG) == overlay["fingerprint"]
    forget(node3.direct, old)


def test_zstd_without_its_library_is_one_line(capfd):
    try:
        import zstandard
        pytest.skip(f"zstandard {zstandard.__version__} is installed")
    except ImportError:
        pass
    code = cli.main(["copy-image", TAG, "--to", "ssh://pk-node2:2222", "--compress", "zstd"])
    out, err = capfd.readouterr()
    assert code == 2 and len(err.strip().splitlines()) == 1 and "zstandard" in err


def test_gzip_goes_through_the_load(overlay, node3):
    forget(node3.direct, TAG, overlay["id"])
    node3.direct.images.pull(*overlay["base"].rsplit(":", 1), platform="linux/arm64")
    (t,) = copy_image.run(TAG, [node3.url], compress="gzip").targets
    assert (t.status, t.sent.compress) == ("copied", "gzip"), t
    assert fingerprint_of(node3.direct, TAG) == overlay["fingerprint"]


def test_sigterm_mid_copy_is_143_and_leaves_the_tag(overlay, node3):
    # a whole image to send, so the signal comes while the stream flows
    forget(node3.direct, TAG, overlay["id"], overlay["base"])
    old = a_small_other_image(node3, TAG)
    with Link(port_of(node3.url)) as link:
        proc = subprocess.Popen([sys.executable, "-m", "patchkit", "copy-image", TAG, "--to",
                                 link.url("pk-node3")], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while link.up < 20 * 2**20 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert node3.direct.images.get(TAG).id == old
    forget(node3.direct, old)
