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
    """Each docker or patchkit command line, as words (DOCKER_HOST=... left out)."""
    out = []
    for line in text.replace("\\\n", " ").splitlines():
        line = re.sub(r"^\s*(\d\.\s+)?(rank \d first:|then rank \d:)?\s*", "", line)
        if re.match(r"(DOCKER_HOST=\S+ )?(docker|patchkit) ", line):
            out.append([w for w in shlex.split(line) if not w.startswith("DOCKER_HOST=")])
    return out


def test_serve_help_and_readme_show_the_same_steps():
    assert serve_help() == readme_steps()


def test_rank1_starts_first_then_rank0_and_each_is_verified():
    steps = readme_steps()
    starts = [s for s in steps if s[:2] == ["docker", "run"]]
    assert [s[s.index("--name") + 1] for s in starts] == ["dsv4-rank1", "dsv4-rank0"]
    assert [s[s.index("-e") + 1] for s in starts] == ["DSPARK_NODE_RANK=1", "DSPARK_NODE_RANK=0"]
    checks = [s for s in steps if s[0] == "patchkit"]
    # smoke first: its traffic puts the spec-decode metrics lines in the log verify judges
    assert [s[1] for s in checks] == ["smoke", "verify", "verify"]
    assert [s[s.index("--container") + 1] for s in checks[1:]] == ["dsv4-rank1", "dsv4-rank0"]
    assert all("--image" in s for s in checks[1:])
    # smoke asks rank 0's API, on the port build/serve.sh gives it by default
    assert checks[0][2] == "http://127.0.0.1:8000" and "--min-acceptance" in checks[0]
    assert "--long" in checks[0]
    assert "port=${DSPARK_PORT-8000}" in (REPO_ROOT / "build" / "serve.sh").read_text()


def test_each_patchkit_command_parses():
    for words in readme_steps():
        if words[0] != "patchkit":
            continue
        command = cli.cli.get_command(click.Context(cli.cli), words[1])
        assert command is not None, words
        ctx = command.make_context(words[1], list(words[2:]))
        assert ctx.params, words
