"""copy-image through a link we can count and cut: the TCP relay of testing.link sits between
ssh and the nodes' sshd, so what crosses it is what a real link would carry.

The nodes are the second and third Docker Engines of .ci/services.sh, each behind its own sshd;
the tests look at them on their own sockets (never through the link) to judge the outcome.  A
target that runs out of space is a Docker Engine of this module's own on a small tmpfs
(testing.smalldisk).

The images are small ones of this run's own (testing.smallimage): a base of three layers,
pushed to the registry so that a node can hold it as a cluster's nodes do, and an overlay of one
more layer.  Their bytes are new on every run, so no engine holds any of them from before.
"""

from __future__ import annotations

import io
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tarfile
import tempfile

import docker
import pytest

from testing import smallimage
from testing.dockersdk import fingerprint_of, forget
from testing.link import Link
from testing.onesession import Unavailable as OneSessionUnavailable
from testing.onesession import one_session_sshd
from testing.smalldisk import Unavailable, small_disk_engine
from testing.smallimage import MiB, filler
from patchkit import cli
from patchkit.commands import copy_image
from patchkit.nodes.transfer import How

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]

REGISTRY = os.environ.get("PK_REGISTRY", "")
RUN = secrets.token_hex(4)   # this run's tags: another checkout's run uses others
BASE = f"{REGISTRY}/pk-test/copy-base:{RUN}"
TAG = f"{REGISTRY}/pk-test/copy-overlay:{RUN}"
BASE_LAYERS = (3 * MiB // 2,) * 3   # the base's layers' file bytes
LAYER = MiB                          # the overlay's own layer's


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


@pytest.fixture(scope="module")
def overlay(registry, docker_client, node2, node3):
    """The overlay image on the source engine: the base (three layers, in the registry) plus
    one layer.  Afterwards every engine forgets both."""
    smallimage.build(docker_client, BASE, [{f"opt/pk-base/{n}": filler(size)}
                                           for n, size in enumerate(BASE_LAYERS)])
    smallimage.push(docker_client, BASE)
    image_id = smallimage.build(docker_client, TAG, [{"opt/pk-overlay": filler(LAYER)}],
                                parent=BASE)
    attrs = docker_client.api.inspect_image(TAG)
    yield {"id": image_id, "layers": attrs["RootFS"]["Layers"],
           "fingerprint": fingerprint_of(docker_client, TAG), "base": BASE}
    for client in (node2.direct, node3.direct, docker_client):
        smallimage.forget_tagged(client, RUN)


@pytest.fixture(scope="module")
def other(overlay, node3):
    """Other content (one small file) on node 3, for tests to put under the tag first (the
    overlay fixture forgets it)."""
    return a_small_other_image(node3.direct, f"{REGISTRY}/pk-test/copy-other:{RUN}")


def holding_other(node, other: str) -> None:
    """The node holds the other content under the tag."""
    node.direct.api.tag(other, *TAG.rsplit(":", 1))


def holding_base(node, overlay) -> None:
    """The node holds the overlay's base, and neither the overlay image nor its tag."""
    forget(node.direct, TAG, overlay["id"])
    node.direct.images.pull(*overlay["base"].rsplit(":", 1), platform="linux/arm64")


def a_small_other_image(client, tag: str) -> str:
    """Another image (one file, from scratch) under ``tag`` on the engine; its id.  The file
    names the tag, so that the image is this tag's alone: the builder's cache would otherwise
    give another run's image, and its cleanup would take this one."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        info = tarfile.TarInfo("old")
        body = f"the old content, {tag}\n".encode()
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
    image, _ = client.images.build(fileobj=ctx, custom_context=True, tag=tag, rm=True)
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
        assert t.sent.skipped_bytes > sum(BASE_LAYERS) > t.sent.bytes
        assert LAYER < t.sent.layer_bytes < LAYER + 64 * 1024
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
    assert LAYER < t["plan"]["missing_bytes"] < LAYER + 64 * 1024
    assert "holds" in t["plan"]["why"]
    with pytest.raises(docker.errors.NotFound):
        node3.direct.images.get(TAG)
    # only the inspection crossed the link: far less than the layer it would send
    assert dry_up < LAYER // 4, dry_up


def test_two_nodes_at_once_from_one_export_end_identical(overlay, node2, node3, docker_client):
    # both nodes hold the overlay; the image to copy is one new layer on top of it
    assert copy_image.run(TAG, [node2.url, node3.url]).ok
    on_top = f"{REGISTRY}/pk-test/copy-on-top:{RUN}"
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


def test_a_cut_link_leaves_the_tag_as_it_was_and_a_rerun_completes(overlay, other, node3,
                                                                   capfd):
    # node 3 holds none of the image's layers (a whole image to send) and other content
    # under the tag
    forget(node3.direct, TAG, overlay["id"], overlay["base"])
    holding_other(node3, other)
    with Link(port_of(node3.url)) as link:
        url = link.url("pk-node3")
        link.cut_after(sum(BASE_LAYERS) // 2)
        code = cli.main(["copy-image", TAG, "--to", url])
        out, err = capfd.readouterr()
        assert link.was_cut
        assert code == 1
        # one line in all: the target, what broke, and that its tag is as it was
        assert not err.strip(), err
        (line,) = out.splitlines()
        assert line.startswith(f"failed    {url}: the link broke after "), line
        assert line.endswith("; its tag is as it was"), line
        assert node3.direct.images.get(TAG).id == other
        link.mend()
        code = cli.main(["copy-image", TAG, "--to", url, "--format", "json"])
        out, err = capfd.readouterr()
    assert code == 0, out
    # off a terminal, the copy's progress is one plain line when it ends
    assert re.search(rf"^sent {re.escape(TAG)} to {re.escape(url)}: [\d.]+ [KMG]?B in [\d.]+ s ",
                     err, re.M), err
    assert fingerprint_of(node3.direct, TAG) == overlay["fingerprint"]


@pytest.fixture(scope="module")
def one_session_node3(tmp_path_factory):
    """Node 3's engine behind an sshd of this module's own that opens one session per
    connection: the port of that sshd."""
    try:
        with one_session_sshd(3, tmp_path_factory.mktemp("sshd")) as port:
            yield port
    except OneSessionUnavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(str(exc))
        pytest.skip(str(exc))


def test_a_target_that_closes_the_load_before_it_starts_is_one_line(overlay, other, node3,
                                                                   one_session_node3, capfd):
    # the node answers what it holds (the first connection, and its session), then drops the
    # load's own session as it opens: its sshd refuses a second session on that connection,
    # and the link closes the connection ssh then opens for it; -v gives the rest
    forget(node3.direct, TAG, overlay["id"], overlay["base"])
    holding_other(node3, other)
    for verbose in ([], ["-v"]):
        with Link(one_session_node3) as link:
            url = link.url("pk-node3")
            link.refuse_after(1)
            code = cli.main(["copy-image", TAG, "--to", url, *verbose])
            out, err = capfd.readouterr()
            assert link.refused >= 1
        assert code == 1
        (line,) = out.splitlines()
        assert line.startswith(f"failed    {url}: the link broke "), line
        assert "(ssh: " in line and line.endswith("; its tag is as it was"), line
        assert bool(err.strip()) == bool(verbose), err
        assert node3.direct.images.get(TAG).id == other
    if verbose:
        assert "holds none of the" in err and "streaming" in err, err


def test_a_node_with_one_session_a_connection_still_gets_the_copy(overlay, node3,
                                                                 one_session_node3):
    # the load's session, refused on the API's connection, opens a connection of its own
    forget(node3.direct, TAG, overlay["id"], overlay["base"])
    with Link(one_session_node3) as link:
        (t,) = copy_image.run(TAG, [link.url("pk-node3")]).targets
        assert link.connections == 2
    assert t.status == "copied", t
    assert fingerprint_of(node3.direct, TAG) == overlay["fingerprint"]


def test_a_full_copy_opens_one_connection_and_leaves_nothing_running(overlay, node3):
    # the API's session and the load's share one ssh connection: one key exchange, as the
    # pipe makes; its master and the folder of its socket end with the run
    forget(node3.direct, TAG, overlay["id"], overlay["base"])
    before = _ssh_folders()
    with Link(port_of(node3.url)) as link:
        (t,) = copy_image.run(TAG, [link.url("pk-node3")]).targets
        assert (t.status, t.sent.layers_skipped) == ("copied", 0), t
        assert link.connections == 1
        assert not _children_of_the_link(link.port, TAG)
    assert _ssh_folders() <= before
    assert fingerprint_of(node3.direct, TAG) == overlay["fingerprint"]


def _ssh_folders() -> set[str]:
    """The folders of ssh masters' sockets in the temporary folder."""
    return {p for p in os.listdir(tempfile.gettempdir()) if p.startswith("pk-ssh-")}


def test_a_store_without_partial_loads_gets_the_export_spliced_whole(overlay, podman_client):
    # Podman holds the base, but its store takes no partial load: the whole export goes, as
    # the engine wrote it (nothing parsed on the way), through the docker CLI's load there
    podman = os.environ["PK_PODMAN_HOST"]
    forget(podman_client, TAG, overlay["id"])
    podman_client.images.pull(*overlay["base"].rsplit(":", 1), platform="linux/arm64")
    said: list[str] = []
    try:
        (t,) = copy_image.run(TAG, [podman], log=said.append).targets
        assert t.status == "copied", t
        assert any("cannot take a partial load" in line for line in said), said
        assert (t.sent.layers, t.sent.layers_skipped) == (len(overlay["layers"]), 0)
        assert t.sent.bytes > sum(BASE_LAYERS) + LAYER
        attrs = podman_client.api.inspect_image(TAG)
        assert attrs["RootFS"]["Layers"] == overlay["layers"]
        assert t.fingerprint == overlay["fingerprint"]
    finally:
        forget(podman_client, TAG, overlay["base"])


def test_zstd_without_its_library_is_one_line(capfd):
    try:
        import zstandard
        pytest.skip(f"zstandard {zstandard.__version__} is installed")
    except ImportError:
        pass
    code = cli.main(["copy-image", TAG, "--to", "ssh://pk-node2:1", "--compress", "zstd"])
    out, err = capfd.readouterr()
    assert code == 2 and len(err.strip().splitlines()) == 1 and "zstandard" in err


def test_gzip_goes_through_the_load(overlay, node3):
    forget(node3.direct, TAG, overlay["id"])
    node3.direct.images.pull(*overlay["base"].rsplit(":", 1), platform="linux/arm64")
    (t,) = copy_image.run(TAG, [node3.url], how=How(compress="gzip")).targets
    assert (t.status, t.sent.compress) == ("copied", "gzip"), t
    assert fingerprint_of(node3.direct, TAG) == overlay["fingerprint"]


@pytest.mark.parametrize("signum, rate", [(signal.SIGTERM, 256 * 1024), (signal.SIGINT, 0)],
                         ids=["TERM-slowed", "INT-stalled"])
def test_a_signal_mid_copy_is_128_plus_it_and_leaves_the_tag(overlay, other, node3, signum,
                                                           rate, tmp_path):
    # a whole image to send, and the link slowed (the stream flows) or stalled (the load is
    # stuck writing) after a part of it: the signal comes mid-copy
    forget(node3.direct, TAG, overlay["id"], overlay["base"])
    holding_other(node3, other)
    # stderr to a file: ssh, a child of the run, keeps it open while the link holds it
    with Link(port_of(node3.url)) as link, open(tmp_path / "err", "w") as err:
        link.slow_after(sum(BASE_LAYERS) // 4, rate)
        proc = subprocess.Popen([sys.executable, "-m", "patchkit", "copy-image", TAG, "--to",
                                 link.url("pk-node3")], stdout=subprocess.DEVNULL, stderr=err)
        link.changed.wait(120)
        assert link.changed.is_set() and proc.poll() is None, (tmp_path / "err").read_text()
        proc.send_signal(signum)
        try:
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        port = link.port
    said = (tmp_path / "err").read_text()
    assert proc.returncode == 128 + signum, said
    # no child of the run (its export, its load's ssh through the link) outlives it
    assert not _children_of_the_link(port, TAG)
    # (ssh may add its own line as the link closes under it)
    assert [line for line in said.splitlines() if line.startswith("patchkit")] == [
        f"patchkit: interrupted by {signum.name}; nothing was changed"], said
    assert node3.direct.images.get(TAG).id == other


def _children_of_the_link(port: int, tag: str) -> list[str]:
    """The command lines of the processes still running ssh to ``port`` or ``docker save``
    of ``tag``."""
    found = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                argv = fh.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if (os.path.basename(argv[0]) == "ssh" and str(port) in argv) or (argv[:1] == ["docker"] and "save" in argv
                                                        and tag in argv):
            found.append(" ".join(argv))
    return found


@pytest.fixture(scope="module")
def small_disk(tmp_path_factory):
    """A target of this module's own whose store is a 64 MB tmpfs."""
    try:
        with small_disk_engine(tmp_path_factory.mktemp("disk"), 64 * MiB) as disk:
            yield disk
    except Unavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(str(exc))
        pytest.skip(str(exc))


def test_a_target_out_of_space_keeps_its_tag_and_a_rerun_completes(overlay, small_disk, capfd):
    engine = small_disk.client
    old = a_small_other_image(engine, TAG)
    # room for a part of the image only (the store is vfs: the layers take more than sent)
    small_disk.fill(leave=sum(BASE_LAYERS) // 2)
    code = cli.main(["copy-image", TAG, "--to", small_disk.url])
    out, err = capfd.readouterr()
    assert code == 1
    assert not err.strip(), err
    (line,) = out.splitlines()
    assert line.startswith(f"failed    {small_disk.url}: "), line
    assert "no space left on device" in line and line.endswith("; its tag is as it was"), line
    assert engine.images.get(TAG).id == old
    small_disk.free()
    code = cli.main(["copy-image", TAG, "--to", small_disk.url, "--format", "json"])
    out, _ = capfd.readouterr()
    assert code == 0, out
    (t,) = json.loads(out)["targets"]
    assert t["status"] == "replaced"
    assert fingerprint_of(engine, TAG) == overlay["fingerprint"]
