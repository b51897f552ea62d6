"""The two-node launch check, as build/serve.sh --help and docs/dspark.md show it: the same steps in
the same order, and each patchkit command one that patchkit's own parser accepts."""

from __future__ import annotations

import re
import shlex
import subprocess

import click

from patchkit import cli
from testing import REPO_ROOT


def serve_help() -> list[list[str]]:
    out = subprocess.run(["bash", str(REPO_ROOT / "build" / "serve.sh"), "--help"],
                         capture_output=True, text=True, check=True).stdout
    text = out[out.index("The two-node launch check"):]
    return _commands("\n".join(line.lstrip("#") for line in text.splitlines()))


def readme_steps() -> list[list[str]]:
    readme = (REPO_ROOT / "docs" / "dspark.md").read_text()
    section = readme[readme.index("## The two-node launch check"):]
    return _commands(re.search(r"```sh\n(.*?)```", section, re.S).group(1))


def _commands(text: str) -> list[list[str]]:
    """Each docker, patchkit or build/launch.sh command line, as words (the NAME=VALUE
    settings before it left out)."""
    out = []
    for line in text.replace("\\\n", " ").splitlines():
        line = re.sub(r"^\s*(\d\.\s+)?(rank \d first:|then rank \d:)?\s*", "", line)
        if re.match(r"([A-Z_0-9]+=\S+ )*(docker|patchkit|build/launch\.sh)( |$)", line):
            out.append([w for w in shlex.split(line) if not re.match(r"[A-Z_0-9]+=", w)])
    return out


def test_serve_help_and_readme_show_the_same_steps():
    assert serve_help() == readme_steps()


def test_launch_then_smoke_then_verify_each_node_then_down():
    steps = readme_steps()
    assert [s[0] for s in steps] == ["build/launch.sh", "build/launch.sh", "patchkit",
                                     "patchkit", "patchkit", "build/launch.sh"]
    assert [s[1] for s in steps] == ["print", "up", "smoke", "verify", "verify", "down"]
    checks = [s for s in steps if s[0] == "patchkit"]
    # smoke first: its traffic puts the spec-decode metrics lines in the log verify judges
    assert [s[s.index("--container") + 1] for s in checks[1:]] == ["dsv4-rank1", "dsv4-rank0"]
    assert all("--image" in s for s in checks[1:])
    # smoke runs on this machine and asks rank 0's API, on the port serve.sh gives it
    assert checks[0][2] == "http://spark-1:8000" and "--min-acceptance" in checks[0]
    assert "--long" in checks[0]
    assert "port=${DSPARK_PORT-8000}" in (REPO_ROOT / "build" / "serve.sh").read_text()
    assert "host=${DSPARK_HOST-0.0.0.0}" in (REPO_ROOT / "build" / "serve.sh").read_text()
    # the containers verify reads are those launch.sh names with DSpark's settings
    assert "LAUNCH_NAME=dsv4\n" in (REPO_ROOT / "build" / "dspark.launch").read_text()


def test_the_docs_never_run_smoke_on_a_node():
    text = (REPO_ROOT / "docs" / "dspark.md").read_text()
    assert "on spark-1: one chat" not in text and "(on spark-1)" not in text
    assert "`smoke` runs here, not on a node" in text


def test_each_patchkit_command_parses():
    for words in readme_steps():
        if words[0] != "patchkit":
            continue
        command = cli.cli.get_command(click.Context(cli.cli), words[1])
        assert command is not None, words
        ctx = command.make_context(words[1], list(words[2:]))
        assert ctx.params, words
