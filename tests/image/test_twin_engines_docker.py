"""Two real dockerds that report one engine ID (the twin is given the DOCKER_HOST engine's key
file, or its engine-id: testing.twinengine), reached as two nodes: ``images`` lists both,
``rollback`` moves both, and each says that the two share an ID and why they are two.

The builds are made as tests/image/test_rollback_docker.py makes them: small images labelled
and tagged as build-image does, copied to the twin with copy-image."""

from __future__ import annotations

import json
import os
import secrets

import pytest

from testing import smallimage
from testing.smalldisk import Unavailable
from testing.smallimage import MiB, filler
from testing.twinengine import twin_engine
from patchkit import cli
from patchkit.commands import copy_image

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]

from testing.imageproject import REGISTRY  # PK_REGISTRY, as .ci/services.sh wrote it
RUN = secrets.token_hex(4)
PATCHSET = f"pk-twin-{RUN}"
BASE = f"{REGISTRY}/pk-test/twin-base:{RUN}"
MOVING = f"{REGISTRY}/pk-test/twin:{RUN}"


def build_labels(key: str) -> dict[str, str]:
    return {"io.patchkit.patchset.name": PATCHSET, "io.patchkit.inputs": key,
            "io.patchkit.vllm.version": "0.27.1",
            "io.patchkit.patches": json.dumps([{"id": "draft-guard", "status": "applied"}])}


def make_build(client, n: int) -> dict:
    key = "sha256:" + secrets.token_hex(32)
    fixed = f"{MOVING}-{key[7:19]}"
    image_id = smallimage.build(client, fixed, [{f"opt/build{n}": filler(MiB // 4)}],
                                parent=BASE, labels=build_labels(key))
    client.api.tag(image_id, *MOVING.rsplit(":", 1))
    return {"id": image_id, "fixed": fixed}


@pytest.fixture(scope="module")
def twin(docker_client, tmp_path_factory):
    try:
        with twin_engine(tmp_path_factory.mktemp("twin"), docker_client) as got:
            yield got
    except Unavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(str(exc))
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def builds(docker_client, twin):
    smallimage.build(docker_client, BASE, [{"opt/base": filler(MiB // 2)}])
    old = make_build(docker_client, 1)
    assert copy_image.run(MOVING, [twin.url]).ok
    new = make_build(docker_client, 2)
    assert copy_image.run(MOVING, [twin.url]).ok
    yield {"old": old, "new": new}
    for image in docker_client.images.list():
        for tag in image.tags:
            if RUN in tag:
                docker_client.images.remove(tag)


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.setenv("PATCHKIT_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "patchset.yaml").write_text(
        f"name: {PATCHSET}\nvllm: {{repo: pypi, ref: v0.27.1}}\n"
        f"image:\n  tag: {MOVING}\npatches: []\n")
    return tmp_path / "patchset.yaml"


def test_two_engines_of_one_id_are_two_nodes(builds, twin, docker_client, project, capsys):
    assert docker_client.info()["ID"] == twin.client.info()["ID"]
    host = os.environ["DOCKER_HOST"]
    code = cli.main(["images", "--manifest", str(project), "--node", host, "--node", twin.url,
                     "--format", "json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out
    assert [n["node"] for n in out["nodes"]] == [host, twin.url]
    for node in out["nodes"]:
        assert [i["id"] for i in node["images"]] == [builds["new"]["id"], builds["old"]["id"]]
    [pair] = out["same_engine_id"]
    assert (pair["address"], pair["into"], pair["merged"]) == (twin.url, host, False)
    assert f"root directory {twin.root}" in pair["reason"]

    assert cli.main(["images", "--manifest", str(project), "--node", twin.url]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0].startswith(f"apart     {twin.url} and {host}: two engines")
    assert f"{twin.url}: 2 build(s)" in text


def test_rollback_moves_both_engines_of_one_id(builds, twin, docker_client, project, capsys):
    host = os.environ["DOCKER_HOST"]
    code = cli.main(["rollback", "--manifest", str(project), "--node", host, "--node", twin.url,
                     "--format", "json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out
    assert [(n["node"], n["status"]) for n in out["nodes"]] == [(host, "moved"),
                                                               (twin.url, "moved")]
    for client in (docker_client, twin.client):
        assert client.api.inspect_image(MOVING)["Id"] == builds["old"]["id"]
    # and forward again, on both
    assert cli.main(["rollback", "--manifest", str(project), "--node", twin.url,
                     "--to", builds["new"]["fixed"]]) == 0
    said = capsys.readouterr().out
    assert f"moved     {twin.url}" in said and f"apart     {twin.url}" in said
    for client in (docker_client, twin.client):
        assert client.api.inspect_image(MOVING)["Id"] == builds["new"]["id"]
