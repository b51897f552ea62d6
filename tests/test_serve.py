"""build/serve.sh: the command line the image runs on each node, and the settings it refuses."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess

import pytest
from testing import REPO_ROOT

SERVE = REPO_ROOT / "build" / "serve.sh"
DOCS = REPO_ROOT / "docs" / "dspark.md"
BASH = shutil.which("bash") or "/bin/bash"


def serve(*args: str, env: dict[str, str] | None = None, path: str | None = None):
    clean = {"PATH": path or os.environ["PATH"], "LC_ALL": "C"}
    clean.update(env or {})
    return subprocess.run([BASH, str(SERVE), *args], env=clean, capture_output=True,
                          text=True, timeout=60)


def printed(env: dict[str, str] | None = None) -> list[str]:
    out = serve("--print", env=env)
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""
    return shlex.split(out.stdout)


def documented() -> list[str]:
    """The rank-0 command in docs/dspark.md, as words."""
    text = DOCS.read_text()
    match = re.search(r"<!-- serve-command: rank 0 -->\n```sh\n(.*?)```", text, re.S)
    assert match, "docs/dspark.md has no rank-0 serve command block"
    return shlex.split(match.group(1).replace("\\\n", " "))


def test_script_parses():
    subprocess.run(["bash", "-n", str(SERVE)], check=True)


def test_shellcheck_is_clean():
    out = subprocess.run(["shellcheck", "--shell=bash", str(SERVE)], capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stdout


def test_rank0_command_is_the_documented_one():
    assert printed() == documented()


def test_rank1_runs_the_same_command_headless():
    rank0 = printed()
    rank1 = printed({"DSPARK_NODE_RANK": "1"})
    at = rank0.index("--node-rank") + 1
    expected = rank0[:at] + ["1"] + rank0[at + 1:] + ["--headless"]
    assert rank1 == expected
    assert printed({"DSPARK_NODE_RANK": "1", "DSPARK_HEADLESS": "1"}) == expected


def _option(words: list[str], name: str) -> str:
    assert words.count(name) == 1, name
    return words[words.index(name) + 1]


def test_recipe_settings():
    words = printed()
    assert words[:3] == ["vllm", "serve", "/models/DeepSeek-V4-Flash-NVFP4"]
    assert _option(words, "--tensor-parallel-size") == "2"
    assert _option(words, "--nnodes") == "2"
    assert _option(words, "--kv-cache-dtype") == "nvfp4_ds_mla"
    assert _option(words, "--moe-backend") == "flashinfer_b12x"
    assert _option(words, "--max-model-len") == "524288"
    assert _option(words, "--block-size") == "256"
    assert json.loads(_option(words, "--speculative-config")) == {
        "method": "dspark", "num_speculative_tokens": 5, "moe_backend": "b12x"}
    assert "--enable-prefix-caching" in words and "--headless" not in words


def test_settings_come_from_the_environment():
    words = printed({"DSPARK_MASTER_ADDR": "10.0.0.1", "DSPARK_MASTER_PORT": "30000",
                     "DSPARK_PORT": "8080", "DSPARK_HOST": "127.0.0.1",
                     "DSPARK_MODEL": "/data/it's", "DSPARK_SERVED_NAME": "dsv4",
                     "DSPARK_DRAFT_MOE_BACKEND": "auto"})
    assert words[2] == "/data/it's"
    assert _option(words, "--master-addr") == "10.0.0.1"
    assert _option(words, "--master-port") == "30000"
    assert _option(words, "--port") == "8080"
    assert _option(words, "--host") == "127.0.0.1"
    assert _option(words, "--served-model-name") == "dsv4"
    assert json.loads(_option(words, "--speculative-config"))["moe_backend"] == "auto"


BAD = [
    ({"DSPARK_NODE_RANK": "2"}, "DSPARK_NODE_RANK"),
    ({"DSPARK_NODE_RANK": ""}, "DSPARK_NODE_RANK"),
    ({"DSPARK_NODE_RANK": "01"}, "DSPARK_NODE_RANK"),
    ({"DSPARK_MASTER_ADDR": ""}, "DSPARK_MASTER_ADDR"),
    ({"DSPARK_MASTER_ADDR": "10.0.0.1 --evil"}, "DSPARK_MASTER_ADDR"),
    ({"DSPARK_MASTER_ADDR": "-host"}, "DSPARK_MASTER_ADDR"),
    ({"DSPARK_MASTER_PORT": "0"}, "DSPARK_MASTER_PORT"),
    ({"DSPARK_MASTER_PORT": "65536"}, "DSPARK_MASTER_PORT"),
    ({"DSPARK_MASTER_PORT": "29501x"}, "DSPARK_MASTER_PORT"),
    ({"DSPARK_PORT": ""}, "DSPARK_PORT"),
    ({"DSPARK_PORT": "http"}, "DSPARK_PORT"),
    ({"DSPARK_HOST": "0.0.0.0:80"}, "DSPARK_HOST"),
    ({"DSPARK_HEADLESS": "yes"}, "DSPARK_HEADLESS"),
    ({"DSPARK_HEADLESS": ""}, "DSPARK_HEADLESS"),
    ({"DSPARK_HEADLESS": "1"}, "DSPARK_HEADLESS"),
    ({"DSPARK_NODE_RANK": "1", "DSPARK_HEADLESS": "0"}, "DSPARK_HEADLESS"),
    ({"DSPARK_MODEL": ""}, "DSPARK_MODEL"),
    ({"DSPARK_MODEL": "/models/a b"}, "DSPARK_MODEL"),
    ({"DSPARK_SERVED_NAME": ""}, "DSPARK_SERVED_NAME"),
    ({"DSPARK_SERVED_NAME": "my model"}, "DSPARK_SERVED_NAME"),
    ({"DSPARK_DRAFT_MOE_BACKEND": "b12x,marlin"}, "DSPARK_DRAFT_MOE_BACKEND"),
    ({"DSPARK_DRAFT_MOE_BACKEND": ""}, "DSPARK_DRAFT_MOE_BACKEND"),
    ({"DSPARK_PORT": "29501"}, "DSPARK_MASTER_PORT"),
]


@pytest.mark.parametrize("env, named", BAD, ids=[f"{k}={v!r}" for e, _ in BAD
                                                 for k, v in list(e.items())[-1:]])
def test_bad_settings_are_refused_by_name(env, named):
    out = serve("--print", env=env)
    assert out.returncode == 2
    assert out.stdout == ""
    assert named in out.stderr and out.stderr.startswith("serve.sh: ")
    assert len(out.stderr.splitlines()) == 1


def test_unknown_arguments_are_refused():
    for args in (["--prnt"], ["--print", "extra"]):
        out = serve(*args)
        assert out.returncode == 2 and out.stdout == "", args
        assert out.stderr.startswith("serve.sh: ")


@pytest.fixture
def fake_vllm(tmp_path):
    """A `vllm` on PATH that records the words it was started with."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "argv.json"
    script = bin_dir / "vllm"
    script.write_text("#!/usr/bin/env python3\nimport json, sys\n"
                      f"json.dump(sys.argv[1:], open({str(record)!r}, 'w'))\n")
    script.chmod(0o755)
    return f"{bin_dir}:{os.environ['PATH']}", record


def test_run_execs_the_printed_command(tmp_path, fake_vllm):
    path, record = fake_vllm
    model = tmp_path / "model"
    model.mkdir()
    env = {"DSPARK_MODEL": str(model), "DSPARK_NODE_RANK": "1"}
    out = serve(env=env, path=path)
    assert out.returncode == 0, out.stderr
    words = printed(env)
    assert json.loads(record.read_text()) == words[1:]


def test_run_refuses_a_missing_model_or_vllm(tmp_path, fake_vllm):
    path, record = fake_vllm
    out = serve(env={"DSPARK_MODEL": str(tmp_path / "absent")}, path=path)
    assert out.returncode == 2 and "DSPARK_MODEL" in out.stderr
    model = tmp_path / "model"
    model.mkdir()
    out = serve(env={"DSPARK_MODEL": str(model)}, path="/nonexistent")
    assert out.returncode == 2 and "vllm" in out.stderr
    assert not record.exists()
