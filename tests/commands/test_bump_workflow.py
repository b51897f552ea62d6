"""The scheduled bump workflow's own steps, read from .github/workflows/bump.yml and run with
bash as the runner would, in a clone of a fixture project whose `origin` is a bare repository on
disk.  GitHub's `gh` is the one outside part that cannot run here: a stand-in on PATH records
each call (and the body file it is given) and answers `pr view` from what it was told before."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys

import pytest
import yaml
from testing import REPO_ROOT, cli_env
from testing.project import make_fates
from testing.upstream import sh

WORKFLOW = REPO_ROOT / ".github" / "workflows" / "bump.yml"
STEPS = ("Bump every package", "Open or update the pull requests")

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


def steps() -> dict[str, str]:
    job = yaml.safe_load(WORKFLOW.read_text())["jobs"]["bump"]
    return {s["name"]: s["run"] for s in job["steps"] if s.get("name") in STEPS}


@pytest.fixture
def runner(tmp_path):
    """A clone of the fixture project with a bare `origin`, a bin folder with `patchkit` (this
    checkout's) and the `gh` stand-in, and the runner's step files."""
    proj = make_fates(tmp_path)
    bare = tmp_path / "origin.git"
    sh("git", "clone", "-q", "--bare", str(proj), str(bare))
    work = tmp_path / "runner"
    sh("git", "clone", "-q", str(bare), str(work))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("patchkit", f"#!/bin/sh\nexec {sys.executable} -m patchkit \"$@\"\n"),
                       ("gh", GH)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(stat.S_IRWXU)
    env = cli_env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
                  GH_LOG=str(tmp_path / "gh.log"), GITHUB_OUTPUT=str(tmp_path / "output"),
                  GITHUB_STEP_SUMMARY=str(tmp_path / "summary.md"), RUNNER_TEMP=str(tmp_path))
    return {"work": work, "bare": bare, "env": env, "tmp": tmp_path,
            "upstream": tmp_path / "upstream"}


def run_steps(runner) -> list[subprocess.CompletedProcess]:
    done = []
    for name in STEPS:
        done.append(subprocess.run(["bash", "-e", "-c", steps()[name]], cwd=runner["work"],
                                   env=runner["env"], text=True, capture_output=True,
                                   timeout=600))
        assert done[-1].returncode == 0, (name, done[-1].stdout, done[-1].stderr)
    return done


def gh_calls(runner) -> list[dict]:
    log = runner["tmp"] / "gh.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_the_workflow_opens_then_updates_one_pull_request_per_release(runner):
    # the upstream's newest release is v1.1.0, to which the series ports
    for tag in ("v1.2.0", "nightly", "v1.3.0", "v1.4.0rc1"):
        sh("git", "tag", "-d", tag, cwd=runner["upstream"])
    run_steps(runner)
    branch = "patchkit/bump-vllm-1.1.0"
    tip = sh("git", "rev-parse", branch, cwd=runner["bare"])
    main = sh("git", "rev-parse", "main", cwd=runner["bare"])
    assert sh("git", "rev-parse", f"{tip}~1", cwd=runner["bare"]) == main
    assert "ref: v1.1.0" in sh("git", "show", f"{tip}:patchset.yaml", cwd=runner["bare"])
    [create] = [c for c in gh_calls(runner) if c["args"][:2] == ["pr", "create"]]
    assert create["args"][2:6] == ["--head", branch, "--title",
                                   "Bump vLLM from v1.0.0 to v1.1.0"]
    assert create["body"].startswith("## Bump vLLM from v1.0.0 to v1.1.0")
    assert f"Branch `{branch}`, one commit, pushed to `origin`." in create["body"]
    assert "| `already-in` | applied | — | upstream: dropped" in create["body"]
    assert (runner["tmp"] / "output").read_text() == "code=0\n"

    # the next scheduled run with nothing new pushes nothing and edits nothing
    calls = len(gh_calls(runner))
    bump, _ = run_steps(runner)
    assert "nothing new" in bump.stderr.splitlines()[-1]
    assert sh("git", "rev-parse", branch, cwd=runner["bare"]) == tip
    assert len(gh_calls(runner)) == calls

    # once main moves, the next run pushes the branch again and edits the same pull request
    work = runner["work"]
    (work / "README").write_text("more\n")
    sh("git", "add", "README", cwd=work)
    sh("git", "commit", "-qm", "a later change on main", cwd=work)
    sh("git", "push", "-q", "origin", "main", cwd=work)
    run_steps(runner)
    verbs = [c["args"][:2] for c in gh_calls(runner) if c["args"][0] == "pr"]
    assert verbs.count(["pr", "create"]) == 1 and verbs[-1] == ["pr", "edit"]
    assert sh("git", "rev-list", "--count", f"main..{branch}", cwd=runner["bare"]) == "1"
    assert sh("git", "rev-parse", branch, cwd=runner["bare"]) != tip


def test_a_port_that_needs_a_hand_opens_an_issue_and_pushes_nothing(runner):
    before = sh("git", "for-each-ref", cwd=runner["bare"])
    bump, _ = run_steps(runner)
    assert (runner["tmp"] / "output").read_text() == "code=4\n"
    assert sh("git", "for-each-ref", cwd=runner["bare"]) == before
    [issue] = [c for c in gh_calls(runner) if c["args"][:2] == ["issue", "create"]]
    assert issue["args"][3] == "Bump vLLM from v1.0.0 to v1.3.0: needs a hand"
    assert "**Needs a hand**: `fast-mode` could not be ported to vLLM v1.3.0" in issue["body"]
    assert not [c for c in gh_calls(runner) if c["args"][0] == "pr"]
    assert "needs a hand: vLLM v1.3.0" in bump.stderr
    # the next run (a fresh runner: the port left for a person is not there) updates that
    # issue instead of opening another
    shutil.rmtree(runner["work"] / ".patchkit")
    sh("git", "worktree", "prune", cwd=runner["work"])
    run_steps(runner)
    assert [c["args"][:3] for c in gh_calls(runner)
            if c["args"][:2] in (["issue", "create"], ["issue", "edit"])] == [
        ["issue", "create", "--title"], ["issue", "edit", "7"]]


def test_nothing_new_is_one_line(runner):
    text = (runner["work"] / "patchset.yaml").read_text().replace("ref: v1.0.0", "ref: v1.3.0")
    (runner["work"] / "patchset.yaml").write_text(text)
    sh("git", "commit", "-qam", "pin the newest", cwd=runner["work"])
    bump, _ = run_steps(runner)
    assert bump.stderr.strip().splitlines()[-1] == (
        "vLLM: pinned at v1.3.0, the newest release; nothing to bump")
    assert gh_calls(runner) == []
