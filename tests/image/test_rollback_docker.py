"""images, rollback and images --prune on the real engines: the one DOCKER_HOST names and the
second and third nodes behind sshd, the third reached through a relay that counts and cuts
(testing.link).

The builds are small images of this run's own (testing.smallimage) labelled as build-image
labels them: a base of one layer and two builds of one more layer each, tagged as build-image
tags them (the moving tag and ``<moving>-<12 hex of the inputs key>``) and copied to node 2
with copy-image, which carries the immutable tag along.  Node 3 gets the newer build alone:
the node that lacks the older one.
"""

from __future__ import annotations

import json
import os
import secrets

import docker
import pytest

from testing import smallimage
from testing.dockersdk import fingerprint_of
from testing.link import Link
from testing.smallimage import MiB, filler
from patchkit import cli
from patchkit.commands import copy_image

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]

REGISTRY = os.environ.get("PK_REGISTRY", "")
RUN = secrets.token_hex(4)
PATCHSET = f"pk-rollback-{RUN}"
BASE = f"{REGISTRY}/pk-test/rollback-base:{RUN}"
MOVING = f"{REGISTRY}/pk-test/rollback:{RUN}"
LAYER = MiB // 2


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def build_labels(key: str, patchset: str = PATCHSET) -> dict[str, str]:
    return {"io.patchkit.patchset.name": patchset, "io.patchkit.inputs": key,
            "io.patchkit.vllm.version": "0.27.1",
            "io.patchkit.patches": json.dumps([{"id": "draft-guard", "status": "applied"}]),
            "io.patchkit.packages": json.dumps({"flashinfer": {"version": "0.6.15"}})}


def make_build(client, n: int, patchset: str = PATCHSET, moving: str = MOVING) -> dict:
    """A build on ``client``'s engine, tagged as build-image tags one; its id, tags and
    fingerprint."""
    key = "sha256:" + secrets.token_hex(32)
    fixed = f"{moving}-{key[7:19]}"
    image_id = smallimage.build(client, fixed, [{f"opt/build{n}": filler(LAYER)}], parent=BASE,
                                labels=build_labels(key, patchset))
    client.api.tag(image_id, *moving.rsplit(":", 1))
    return {"id": image_id, "fixed": fixed, "fingerprint": fingerprint_of(client, fixed)}


def moving_on(client, tag: str = MOVING) -> str:
    return client.api.inspect_image(tag)["Id"]


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("rollback")
    (root / "patchset.yaml").write_text(
        f"name: {PATCHSET}\nvllm: {{repo: pypi, ref: v0.27.1}}\n"
        f"image:\n  tag: {MOVING}\npatches: []\n")
    return root / "patchset.yaml"


@pytest.fixture(scope="module")
def builds(registry, docker_client, node2, node3):
    """Two builds on DOCKER_HOST's engine and on node 2 (each copied there as it was made),
    the newer one alone on node 3; the base everywhere."""
    smallimage.build(docker_client, BASE, [{"opt/base": filler(MiB)}])
    smallimage.push(docker_client, BASE)
    old = make_build(docker_client, 1)
    assert copy_image.run(MOVING, [node2.url]).ok
    new = make_build(docker_client, 2)
    assert copy_image.run(MOVING, [node2.url]).ok
    node3.direct.images.pull(*BASE.rsplit(":", 1), platform="linux/arm64")
    assert copy_image.run(MOVING, [node3.url]).ok
    yield {"old": old, "new": new}
    for client in (node2.direct, node3.direct, docker_client):
        for c in client.api.containers(all=True, filters={"label": f"pk-run={RUN}"}):
            client.api.remove_container(c["Id"], force=True)
        for image in client.images.list():
            for tag in image.tags:
                if RUN in tag:
                    client.images.remove(tag)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(autouse=True)
def _one_cache(cache, monkeypatch):
    """The module's runs share one cache, as a user's do: the history of when each node got
    each build."""
    monkeypatch.setenv("PATCHKIT_CACHE_DIR", str(cache))


def main(*args: str) -> int:
    return cli.main(list(args))


def test_copy_image_carries_the_immutable_tag(builds, node2, node3):
    assert moving_on(node2.direct) == builds["new"]["id"]
    assert node2.direct.api.inspect_image(builds["old"]["fixed"])["Id"] == builds["old"]["id"]
    assert node3.direct.api.inspect_image(builds["new"]["fixed"])["Id"] == builds["new"]["id"]


def test_listing_on_both_nodes(builds, project, node2, capsys):
    code = main("images", "--manifest", str(project), "--node", node2.url, "--format", "json")
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out
    assert len(out["nodes"]) == 2 and out["drift"] == []
    for node in out["nodes"]:
        got = [(i["id"], i["current"]) for i in node["images"]]
        assert got == [(builds["new"]["id"], True), (builds["old"]["id"], False)], node
        newest = node["images"][0]
        assert set(newest["tags"]) == {MOVING, builds["new"]["fixed"]}
        assert newest["moving_tags"] == [MOVING] and newest["vllm"] == "0.27.1"
        assert newest["patches"] == ["draft-guard"]
        assert newest["packages"] == {"flashinfer": "0.6.15"}


def test_rollback_and_forward_move_no_bytes_and_keep_the_order(builds, project, docker_client,
                                                                node2, capsys):
    with Link(port_of(node2.url)) as link:
        url = link.url("pk-node2")
        code = main("rollback", "--manifest", str(project), "--node", url, "--format", "json")
        out = json.loads(capsys.readouterr().out)
        assert code == 0, out
        assert out["to"] == builds["old"]["fixed"]
        assert [n["status"] for n in out["nodes"]] == ["moved", "moved"]
        assert link.up < 64 * 1024, link.up
        for client in (docker_client, node2.direct):
            assert moving_on(client) == builds["old"]["id"]
            assert client.api.inspect_image(builds["new"]["fixed"])   # the newer one stays
        # the order is when the nodes got the builds: the rollback does not change it
        main("images", "--manifest", str(project), "--node", url, "--format", "json")
        listed = json.loads(capsys.readouterr().out)
        for node in listed["nodes"]:
            assert [(i["id"], i["current"]) for i in node["images"]] == [
                (builds["new"]["id"], False), (builds["old"]["id"], True)]
        link.reset()
        code = main("rollback", "--manifest", str(project), "--node", url,
                    "--to", builds["new"]["fixed"])
        text = capsys.readouterr().out
        assert code == 0 and text.count("held there, nothing sent") == 2, text
        assert link.up < 64 * 1024, link.up
    for client in (docker_client, node2.direct):
        assert moving_on(client) == builds["new"]["id"]


def test_a_node_missing_the_build_gets_its_layer_then_its_tag(builds, project, node3, capsys):
    with pytest.raises(docker.errors.ImageNotFound):
        node3.direct.images.get(builds["old"]["fixed"])
    # a dry run says what would move, and moves nothing
    code = main("rollback", "--manifest", str(project), "--node", node3.url,
                "--to", builds["old"]["fixed"], "--dry-run")
    why, *said = capsys.readouterr().out.splitlines()
    assert why == (f"would roll {MOVING} back to {builds['old']['fixed']}: --to: forced, "
                   "whatever its evidence")
    assert code == 0 and [line.split()[:2] for line in said] == [
        ["would-be", "moved"], ["would-be", "copied"]], said
    with pytest.raises(docker.errors.ImageNotFound):
        node3.direct.images.get(builds["old"]["fixed"])
    assert moving_on(node3.direct) == builds["new"]["id"]
    code = main("rollback", "--manifest", str(project), "--node", node3.url,
                "--to", builds["old"]["fixed"], "--format", "json")
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out
    local, third = out["nodes"]
    assert (local["status"], third["status"]) == ("moved", "copied")
    # only the build's own layer went: the base's is held there
    assert (third["sent"]["layers"], third["sent"]["layers_skipped"]) == (1, 1)
    assert LAYER < third["sent"]["layer_bytes"] < LAYER + 64 * 1024
    assert fingerprint_of(node3.direct, MOVING) == builds["old"]["fingerprint"]
    assert main("rollback", "--manifest", str(project), "--node", node3.url,
                "--to", builds["new"]["fixed"]) == 0
    capsys.readouterr()


def test_an_unreachable_node_fails_alone_and_a_rerun_completes(builds, project, docker_client,
                                                               node2, node3, capfd):
    with Link(port_of(node3.url)) as link:
        url = link.url("pk-node3")
        link.cut_after(0)
        code = main("rollback", "--manifest", str(project), "--node", node2.url, "--node", url)
        out, err = capfd.readouterr()
        assert code == 1
        failed = [line for line in out.splitlines() if line.startswith("failed")]
        assert len(failed) == 1 and url in failed[0], out
        assert moving_on(docker_client) == moving_on(node2.direct) == builds["old"]["id"]
        assert moving_on(node3.direct) == builds["new"]["id"]
        # listed while it is unreachable: the others are listed, and exit 1
        code = main("images", "--manifest", str(project), "--node", url, "--format", "json")
        listed = json.loads(capfd.readouterr().out)
        assert code == 1 and [n["ok"] for n in listed["nodes"]] == [True, False], listed
        assert listed["nodes"][0]["images"] and url in listed["nodes"][1]["error"]
        # the listing names the node that runs another build
        assert main("images", "--manifest", str(project), "--node", node2.url, "--node",
                    node3.url) == 0
        listed, _ = capfd.readouterr()
        drift = listed.splitlines()[-1]
        assert drift.startswith(f"drift: {MOVING} names "), listed
        assert f"{builds['new']['fixed']} on {node3.url}" in drift, drift
        assert f"{builds['old']['fixed']} on {node2.url}" in drift, drift
        link.mend()
        # the same command again: node 3 catches up, the others stay where they are
        code = main("rollback", "--manifest", str(project), "--node", node2.url, "--node", url)
        out, _ = capfd.readouterr()
        assert code == 0, out
        why, *said = out.splitlines()
        assert why.startswith(f"rolling {MOVING} back to {builds['old']['fixed']}: completing ")
        assert [line.split()[0] for line in said] == ["already", "already", "moved"]
    for client in (docker_client, node2.direct, node3.direct):
        assert moving_on(client) == builds["old"]["id"]
    assert main("rollback", "--manifest", str(project), "--node", node2.url, "--node",
                node3.url, "--to", builds["new"]["fixed"]) == 0
    capfd.readouterr()


def test_bad_inputs_change_no_node(builds, project, docker_client, node2, registry, capfd):
    other = f"{REGISTRY}/pk-test/rollback-other:{RUN}"
    foreign = make_build(docker_client, 9, patchset=f"pk-other-{RUN}", moving=other)
    lone = f"{MOVING}-lone"
    make_build(docker_client, 8, moving=lone)
    before = (moving_on(docker_client), moving_on(node2.direct))
    for args in (["--to", f"{MOVING}-0123456789ab"], ["--to", foreign["fixed"]],
                 ["--tag", lone], ["--to", MOVING]):
        code = main("rollback", "--manifest", str(project), "--node", node2.url, *args)
        out, err = capfd.readouterr()
        assert code == 2, (args, out, err)
        assert len(err.strip().splitlines()) == 1 and not out.strip(), (args, err)
        assert (moving_on(docker_client), moving_on(node2.direct)) == before
    assert "nothing to roll back to" in main_err(["rollback", "--manifest", str(project),
                                                  "--tag", lone], capfd)
    assert main("images", "--manifest", str(project), "--prune", "--keep", "0") == 2


def main_err(args, capfd) -> str:
    main(*args)
    return capfd.readouterr().err


def test_prune_keeps_the_current_a_containers_and_a_users_build(builds, project, node2, capsys):
    client = node2.direct
    # on node 2, three builds made after the two: one a stopped container uses, one with a
    # tag of the user's, and the newest; the moving tag of each has moved on
    used = make_build(client, 3, moving=f"{MOVING}-used")
    client.api.create_container(used["id"], command=["/x"], labels={"pk-run": RUN})
    mine = make_build(client, 4, moving=f"{MOVING}-mine")
    client.api.tag(mine["id"], f"{REGISTRY}/pk-test/mine", RUN)
    plain = make_build(client, 5, moving=f"{MOVING}-plain")
    for b in (used, mine, plain):
        client.api.remove_image(b["fixed"].rsplit("-", 1)[0])
    # keep 1: only the newest (build 5, made last) is kept as such; the current build and
    # the one a container uses and the one with a user's tag are kept anyway
    code = main("images", "--manifest", str(project), "--node", node2.url, "--prune",
                "--keep", "1", "--format", "json")
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out
    local, second = out["nodes"]
    removed = {r["id"] for r in second["removed"]}
    assert removed == {builds["old"]["id"]}, second
    assert second["bytes_freed"] >= LAYER
    kept = {k["id"]: k["why"] for k in second["kept"]}
    assert "current" in kept[builds["new"]["id"]]
    assert "container" in kept[used["id"]] and "patchkit did not make" in kept[mine["id"]]
    with pytest.raises(docker.errors.ImageNotFound):
        client.images.get(builds["old"]["id"])
    assert client.images.get(plain["id"]) and client.images.get(MOVING)
