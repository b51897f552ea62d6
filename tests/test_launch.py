"""build/launch.sh rendered without an engine: the two docker run commands it prints, what
each carries (the link's interfaces and RDMA device, the checkpoint, the JIT cache place), the
settings it refuses, and docs/dspark.md showing the same commands.  tests/image/
test_launch_docker.py starts it for real on two engines behind ssh."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess

import pytest
from testing import REPO_ROOT

LAUNCH = REPO_ROOT / "build" / "launch.sh"
DOCS = REPO_ROOT / "docs" / "dspark.md"
BASH = shutil.which("bash") or "/bin/bash"
WORKSPACE = "/root/.cache/patchkit-jit/4f2a9c01d7e3"
CUBINS = "/root/.cache/flashinfer/cubins"
DSPARK = REPO_ROOT / "build" / "dspark.launch"
SETTINGS = {"LAUNCH_SETTINGS": str(DSPARK),
            "LAUNCH_IMAGE": "dsv4-flash-dspark:v0.34.0", "NCCL_SOCKET_IFNAME": "enp1s0f0np0",
            "NCCL_IB_HCA": "rocep1s0f0", "LAUNCH_JIT_WORKSPACE": WORKSPACE,
            "LAUNCH_CUBINS": CUBINS}


def launch(*args: str, env: dict[str, str] | None = None, base: dict[str, str] = SETTINGS):
    clean = {"PATH": os.environ["PATH"], "LC_ALL": "C", **base, **(env or {})}
    return subprocess.run([BASH, str(LAUNCH), *args], env=clean, capture_output=True, text=True,
                          timeout=60)


def printed(env: dict[str, str] | None = None) -> list[list[str]]:
    out = launch("print", env=env)
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""
    return [shlex.split(line) for line in out.stdout.splitlines()]


def values(words: list[str], flag: str) -> list[str]:
    return [words[i + 1] for i, w in enumerate(words) if w == flag]


def test_script_parses_and_shellcheck_is_clean():
    subprocess.run(["bash", "-n", str(LAUNCH)], check=True)
    out = subprocess.run(["shellcheck", "--shell=bash", str(LAUNCH)], capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stdout


def test_rank1_first_then_rank0_each_on_its_engine():
    rank1, rank0 = printed()
    assert rank1[:3] == ["DOCKER_HOST=ssh://spark-2", "docker", "run"]
    assert rank0[:3] == ["DOCKER_HOST=ssh://spark-1", "docker", "run"]
    assert values(rank1, "--name") == ["dsv4-rank1"] and values(rank0, "--name") == ["dsv4-rank0"]
    assert "DSPARK_NODE_RANK=1" in values(rank1, "--env")
    assert "DSPARK_NODE_RANK=0" in values(rank0, "--env")
    assert rank0[-1] == rank1[-1] == "dsv4-flash-dspark:v0.34.0"
    # the rest is the same on both nodes
    assert [w for w in rank1[1:] if "rank" not in w.lower()] == \
        [w for w in rank0[1:] if "rank" not in w.lower()]


def test_each_node_gets_the_link_the_checkpoint_and_the_jit_cache_place():
    for words in printed():
        env = values(words, "--env")
        assert {"NCCL_SOCKET_IFNAME=enp1s0f0np0", "GLOO_SOCKET_IFNAME=enp1s0f0np0",
                "NCCL_IB_HCA=rocep1s0f0", "DSPARK_MASTER_ADDR=192.168.100.10",
                "DSPARK_MODEL=/models/DeepSeek-V4-Flash-NVFP4",
                "DSPARK_SERVED_NAME=deepseek-v4-flash", "DSPARK_PORT=8000"} <= set(env)
        assert values(words, "--device") == ["/dev/infiniband"]
        assert values(words, "--ulimit") == ["memlock=-1", "stack=67108864"]
        assert values(words, "--gpus") == ["all"]
        assert words.count("--network") == 1 and values(words, "--network") == ["host"]
        assert values(words, "--volume") == [
            "/models:/models:ro", f"/var/cache/patchkit-jit/4f2a9c01d7e3:{WORKSPACE}",
            f"/var/cache/patchkit-jit/cubins:{CUBINS}"]


def test_settings_pass_on_and_an_image_without_a_jit_place_mounts_none():
    rank1, rank0 = printed({"GLOO_SOCKET_IFNAME": "enp1s0f1np1", "LAUNCH_MODELS": "/data/ckpt",
                            "LAUNCH_PORT": "8100", "VLLM_LOGGING_LEVEL": "DEBUG",
                            "LAUNCH_JIT_WORKSPACE": "none", "LAUNCH_CUBINS": "none",
                            "LAUNCH_DEVICES": "none"})
    for words in (rank1, rank0):
        assert "GLOO_SOCKET_IFNAME=enp1s0f1np1" in values(words, "--env")
        assert {"DSPARK_PORT=8100", "VLLM_LOGGING_LEVEL=DEBUG"} <= set(values(words, "--env"))
        assert values(words, "--volume") == ["/data/ckpt:/models:ro"]
        assert "--device" not in words


@pytest.mark.parametrize("env,needle", [
    ({"NCCL_SOCKET_IFNAME": ""}, "NCCL_SOCKET_IFNAME is not set: the node-to-node link's "
                                 "interface"),
    ({"NCCL_IB_HCA": ""}, "NCCL_IB_HCA is not set: the link's RDMA device"),
    ({"LAUNCH_IMAGE": ""}, "LAUNCH_IMAGE is not set"),
    ({"NCCL_SOCKET_IFNAME": "en p1"}, "NCCL_SOCKET_IFNAME='en p1' is not a network interface"),
    ({"LAUNCH_RANK1_ENGINE": "ssh://spark-1"}, "LAUNCH_RANK0_ENGINE and LAUNCH_RANK1_ENGINE are "
                                               "both ssh://spark-1"),
    ({"LAUNCH_RANK0_ENGINE": "spark-1"}, "LAUNCH_RANK0_ENGINE='spark-1' is not a Docker engine"),
    ({"LAUNCH_MODELS": "models"}, "LAUNCH_MODELS='models' is not an absolute folder"),
    ({"LAUNCH_MODEL": "/data/x"}, "LAUNCH_MODEL='/data/x' is not a folder under /models"),
    ({"LAUNCH_SETTINGS": "/nonexistent"}, "LAUNCH_SETTINGS='/nonexistent' is not a file"),
    ({"LAUNCH_SERVED_NAME": "my model"}, "LAUNCH_SERVED_NAME='my model' is not a model name"),
    ({"LAUNCH_DEADLINE": "soon"}, "LAUNCH_DEADLINE='soon' is not a number of seconds"),
    ({"LAUNCH_JIT_WORKSPACE": "cache"}, "the JIT cache place 'cache'"),
])
def test_a_bad_setting_is_one_line_exit_2_before_anything_runs(env, needle):
    out = launch("print", env=env)
    assert out.returncode == 2, out.stdout
    assert out.stdout == "" and len(out.stderr.splitlines()) == 1
    assert out.stderr.startswith("launch.sh: " + needle), out.stderr


def test_no_verb_or_an_unknown_one_is_refused_and_help_says_every_setting():
    assert launch().returncode == 2 and launch("start").returncode == 2
    text = launch("--help").stdout
    for name in ("LAUNCH_IMAGE", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_HCA",
                 "LAUNCH_MODELS", "LAUNCH_JIT_CACHE", "io.patchkit.jit.workspace",
                 "LAUNCH_DEADLINE", "down"):
        assert name in text, name


def documented() -> list[list[str]]:
    """The docker run pair docs/dspark.md shows under its launch-command marker."""
    text = DOCS.read_text()
    match = re.search(r"<!-- launch-command -->\n```sh\n(.*?)```", text, re.S)
    assert match, "docs/dspark.md has no launch-command block"
    lines = match.group(1).replace("\\\n", " ").splitlines()
    return [shlex.split(line) for line in lines if line.strip() and not line.startswith("#")]


def test_the_docs_show_the_commands_it_prints():
    assert documented() == printed()


def test_without_a_settings_file_nothing_of_dspark_is_assumed():
    base = {k: v for k, v in SETTINGS.items() if k != "LAUNCH_SETTINGS"}
    out = launch("print", base=base)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith("launch.sh: LAUNCH_MASTER_ADDR is not set")
    out = launch("print", base={**base, "LAUNCH_MASTER_ADDR": "10.0.0.1"})
    assert out.stderr.startswith("launch.sh: LAUNCH_MODEL is not set: the checkpoint folder")
    assert "build/dspark.launch is DSpark's" in out.stderr and len(out.stderr.splitlines()) == 1


def test_a_users_own_settings_file_names_the_model_and_the_containers(tmp_path):
    mine = tmp_path / "qwen.launch"
    mine.write_text("# my model\n\nLAUNCH_NAME=qwen\nLAUNCH_MODEL='/models/Qwen3-8B'\n"
                    "LAUNCH_SERVED_NAME=qwen3-8b\nLAUNCH_MASTER_ADDR=10.0.0.1\n"
                    "LAUNCH_PASS=\"VLLM_LOGGING_LEVEL HF_HUB_OFFLINE\"\nHF_HUB_OFFLINE=1\n"
                    "VLLM_LOGGING_LEVEL=INFO\n")
    rank1, rank0 = printed({"LAUNCH_SETTINGS": str(mine), "VLLM_LOGGING_LEVEL": "DEBUG"})
    assert values(rank1, "--name") == ["qwen-rank1"] and values(rank0, "--name") == ["qwen-rank0"]
    env = set(values(rank0, "--env"))
    assert {"PATCHKIT_NODE_RANK=0", "PATCHKIT_MASTER_ADDR=10.0.0.1",
            "PATCHKIT_MODEL=/models/Qwen3-8B", "PATCHKIT_SERVED_NAME=qwen3-8b",
            "PATCHKIT_PORT=8000", "HF_HUB_OFFLINE=1"} <= env
    # the environment wins over the file
    assert "VLLM_LOGGING_LEVEL=DEBUG" in env and "VLLM_LOGGING_LEVEL=INFO" not in env
    assert not any(w.startswith("DSPARK") or "dsv4" in w or "DeepSeek" in w
                   for w in rank0[:-1] + rank1[:-1])   # the image aside


@pytest.mark.parametrize("text, needle", [
    ("LAUNCH_MODEL /models/x\n", ":1: not NAME=VALUE"),
    ("LAUNCH_MODEL=/models/x\nPATH=/tmp/evil\n", ":2: PATH is neither a launch setting nor in "
                                                  "LAUNCH_PASS"),
    ("LAUNCH_SETTINGS=/etc/other\n", ":1: LAUNCH_SETTINGS cannot name another file"),
])
def test_a_bad_settings_file_is_one_line_naming_its_line(tmp_path, text, needle):
    bad = tmp_path / "bad.launch"
    bad.write_text(text)
    out = launch("print", env={"LAUNCH_SETTINGS": str(bad)})
    assert out.returncode == 2 and out.stdout == "" and len(out.stderr.splitlines()) == 1
    assert out.stderr.startswith(f"launch.sh: {bad}{needle}"), out.stderr

