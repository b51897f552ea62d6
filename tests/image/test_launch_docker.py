"""build/launch.sh for real: two Docker Engines behind ssh stand in for spark-1 and spark-2,
and a small image (testing/launchimage.py) for the DSpark image, with the real build/serve.sh
as its command.  up starts rank 1, waits for its headless line, starts rank 0 and waits for
its /health; the link settings reach what serve.sh starts; the checkpoint and the image's JIT
cache place are mounted; down saves the logs and removes both containers; an up whose rank
dies says why and leaves nothing running."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest
from testing import REPO_ROOT, launchimage

pytestmark = pytest.mark.docker

LAUNCH = REPO_ROOT / "build" / "launch.sh"
IMAGE = "pk-test/launch:1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def nodes(node2, node3, tmp_path_factory):
    """(rank 0's engine, rank 1's): the image built on both."""
    launchimage.build(tmp_path_factory.mktemp("launch-image"), [node2.socket, node3.socket],
                      IMAGE)
    return node2, node3


@pytest.fixture
def settings(nodes, tmp_path) -> dict[str, str]:
    (tmp_path / "models" / "DeepSeek-V4-Flash-NVFP4").mkdir(parents=True)
    return {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"),
            "LAUNCH_SETTINGS": str(REPO_ROOT / "build" / "dspark.launch"),
            "LAUNCH_IMAGE": IMAGE, "LAUNCH_RANK0_ENGINE": nodes[0].url,
            "LAUNCH_RANK1_ENGINE": nodes[1].url, "LAUNCH_NAME": f"pk-launch-{os.getpid()}",
            # no GPU, no RDMA device, no raised ulimits on the test engines
            "LAUNCH_GPUS": "none", "LAUNCH_DEVICES": "none", "LAUNCH_ULIMITS": "none",
            "NCCL_SOCKET_IFNAME": "lo", "NCCL_IB_HCA": "mlx5_0",
            "LAUNCH_MODELS": str(tmp_path / "models"), "LAUNCH_JIT_CACHE": str(tmp_path / "jit"),
            "LAUNCH_LOGS": str(tmp_path / "logs"), "LAUNCH_DEADLINE": "120",
            "LAUNCH_PORT": str(free_port()), "DSPARK_MASTER_PORT": str(free_port())}


def launch(verb: str, env: dict[str, str]):
    return subprocess.run(["bash", str(LAUNCH), verb], env=env, capture_output=True, text=True,
                          timeout=600)


def containers(node, name: str) -> list[str]:
    return [c.name for c in node.direct.containers.list(all=True, filters={"name": name})]


def test_up_waits_for_each_rank_mounts_what_it_needs_and_down_cleans_up(nodes, settings,
                                                                        tmp_path):
    rank0, rank1 = nodes
    name = settings["LAUNCH_NAME"]
    try:
        up = launch("up", settings)
        assert up.returncode == 0, up.stdout + up.stderr
        lines = up.stdout.splitlines()
        assert lines[0] == f"rank 1: {name}-rank1 started on {rank1.url}"
        assert lines[1].startswith("rank 1 up (headless executor launched) after ")
        assert lines[2] == f"rank 0: {name}-rank0 started on {rank0.url}"
        assert lines[3].startswith(f"API answering /health on port {settings['LAUNCH_PORT']} "
                                   "of rank 0 after ")
        status = launch("status", settings)
        assert f"{name}-rank1 on {rank1.url}: running" in status.stdout
        assert "API: /health answers 200" in status.stdout
        # the checkpoint read-only at /models, the JIT cache place from the image's label
        mounts = {m["Destination"]: m for m in
                  rank1.direct.containers.get(f"{name}-rank1").attrs["Mounts"]}
        assert mounts["/models"]["Source"] == settings["LAUNCH_MODELS"]
        assert mounts["/models"]["RW"] is False
        assert mounts[launchimage.WORKSPACE]["Source"] == str(tmp_path / "jit" / "0f1e2d3c4b5a")
        assert (tmp_path / "jit" / "0f1e2d3c4b5a").is_dir()
        again = launch("up", settings)
        assert again.returncode == 2 and "is already there" in again.stderr
    finally:
        down = launch("down", settings)
    assert down.returncode == 0, down.stderr
    assert not containers(rank0, name) and not containers(rank1, name)
    logs = tmp_path / "logs"
    rank1_log = (logs / f"{name}-rank1.log").read_text()
    # the link's settings reached what serve.sh started, on both ranks
    assert "NCCL_SOCKET_IFNAME=lo GLOO_SOCKET_IFNAME=lo NCCL_IB_HCA=mlx5_0" in rank1_log
    assert "headless multiproc executor" in rank1_log
    assert "Application startup complete" in (logs / f"{name}-rank0.log").read_text()


def test_an_up_whose_rank_dies_says_why_and_leaves_nothing_running(nodes, settings, tmp_path):
    rank0, rank1 = nodes
    name = settings["LAUNCH_NAME"]
    settings["LAUNCH_MODEL"] = "/models/Not-There"
    try:
        up = launch("up", settings)
    finally:
        launch("down", settings)
    assert up.returncode == 1, up.stdout
    assert f"{name}-rank1 stopped on {rank1.url}; its last lines:" in up.stderr
    assert "serve.sh: DSPARK_MODEL='/models/Not-There' is not a directory" in up.stderr
    assert not containers(rank0, name) and not containers(rank1, name)
    assert "is not a directory" in (tmp_path / "logs" / f"{name}-rank1.log").read_text()


def test_print_reads_the_jit_place_from_the_image_on_rank0s_engine(nodes, settings):
    out = launch("print", settings)
    assert out.returncode == 0, out.stderr
    expected = f"{settings['LAUNCH_JIT_CACHE']}/0f1e2d3c4b5a:{launchimage.WORKSPACE}"
    assert all(f"--volume {expected}" in line for line in out.stdout.splitlines())
    missing = launch("print", {**settings, "LAUNCH_IMAGE": "pk-test/launch:absent"})
    assert missing.returncode == 1
    assert missing.stderr.startswith(f"launch.sh: cannot read pk-test/launch:absent on "
                                     f"{nodes[0].url}: ")
    assert missing.stderr.count("\n") == 1
