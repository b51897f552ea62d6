"""`patchkit bump`: the port to a newer release as one commit on a branch, with a pull request
body; a port that needs a person says so with its own exit code and writes no branch.

The fixture upstream (testing.project.make_fates) gives every fate: at v1.1.0 the series ports
(an offset refreshed, a patch upstream), at v1.3.0, its newest release, a transform's anchor is
gone.  The remote is a bare repository on disk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from testing import one_error, patchkit
from testing.flashinfer import FI_TILE_ENTRY, FI_TILE_PATCH, ensure_releases, make_stack
from testing.project import OTHER_RESOLVED, make_fates
from testing.upstream import commit, sh

from patchkit.commands.bump import EXIT_NEEDS_A_HAND

BRANCH = "patchkit/bump-vllm-1.1.0"


def files(proj: Path) -> dict[str, bytes]:
    """The project's files (not .git, not patchkit's own folder)."""
    return {str(p.relative_to(proj)): p.read_bytes() for p in sorted(proj.rglob("*"))
            if p.is_file() and not {".git", ".patchkit"} & set(p.relative_to(proj).parts)}


def refs(repo: Path) -> str:
    return sh("git", "for-each-ref", "--format=%(refname) %(objectname)", cwd=repo)


def worktrees(proj: Path) -> list[str]:
    return [ln for ln in sh("git", "worktree", "list", "--porcelain", cwd=proj).splitlines()
            if ln.startswith("worktree ")]


@pytest.fixture
def proj(tmp_path) -> Path:
    return make_fates(tmp_path)


@pytest.fixture
def remote(tmp_path, proj) -> Path:
    bare = tmp_path / "remote.git"
    sh("git", "init", "-q", "--bare", str(bare))
    sh("git", "remote", "add", "origin", str(bare), cwd=proj)
    sh("git", "push", "-q", "origin", "main", cwd=proj)
    return bare


def test_bump_writes_one_commit_on_its_branch_and_pushes_it(proj, remote):
    before_files, head = files(proj), sh("git", "rev-parse", "HEAD", cwd=proj)
    out = patchkit("bump", "--package", "vllm", "--to", "v1.1.0", "--push", "origin", cwd=proj)
    assert out.returncode == 0, out.stderr
    # the user's checkout is as it was: files, branch, HEAD
    assert files(proj) == before_files
    assert sh("git", "rev-parse", "HEAD", cwd=proj) == head
    assert sh("git", "symbolic-ref", "--short", "HEAD", cwd=proj) == "main"
    assert len(worktrees(proj)) == 1
    # one commit on top of HEAD, here and at the remote
    tip = sh("git", "rev-parse", BRANCH, cwd=proj)
    assert sh("git", "rev-parse", BRANCH, cwd=remote) == tip
    assert sh("git", "rev-list", f"{head}..{tip}", cwd=proj).split() == [tip]
    message = sh("git", "log", "-1", "--format=%B", tip, cwd=proj)
    assert message.startswith("Bump vLLM from v1.0.0 to v1.1.0")
    assert "Patchkit-Bump: vllm 1.1.0" in message
    # the new pin, the refreshed diff, the upstream patch dropped with a comment naming why
    bumped = sh("git", "show", f"{tip}:patchset.yaml", cwd=proj)
    data = yaml.safe_load(bumped)
    assert data["vllm"]["ref"] == "v1.1.0" and data["image"]["base"] == "example/vllm:v1.1.0"
    assert "already-in" not in [p["id"] for p in data["patches"]]
    assert "# already-in: dropped, upstream in vLLM v1.1.0" in bumped
    assert "# The fixture series.  This comment" in bumped
    changed = sh("git", "diff", "--name-status", head, tip, cwd=proj).splitlines()
    assert changed == ["M\tpatches/table.diff", "D\tpatches/util2.diff", "M\tpatchset.yaml"]
    # the body: every patch's fate and the proof
    body = out.stdout
    assert body.startswith("## Bump vLLM from v1.0.0 to v1.1.0\n")
    # each patch at the old pin, at the new release, and what the port did
    for pid, fate in [("table-nvfp4", "applied | applied | refreshed; hunk headers moved"),
                      ("fast-mode", "applied | applied | carried as it is"),
                      ("legacy", "skipped | skipped |"),
                      ("already-in", "applied | — | upstream: dropped")]:
        assert f"| `{pid}` | {fate}" in body
    assert "[vllm#4242](https://github.com/vllm-project/vllm/pull/4242)" in body
    assert "**No longer applied**" in body and "- `already-in`: upstream in vLLM v1.1.0" in body
    assert "**Newly applied**" not in body
    assert "applies exactly (no offset, no fuzz) to v1.1.0" in body
    # the assertions that ran, as apply counts them: table-nvfp4, fast-mode, conf-overlay
    assert "3 `verify:` assertions ran and hold" in body
    assert "not proven: no server was started and no GPU was used" in body
    assert "- already-in: applied -> absent (dropped)" in message
    assert "No longer applied: already-in (upstream)" in message
    assert out.stderr.splitlines()[-1].startswith(f"ok: vLLM v1.0.0 -> v1.1.0 on {BRANCH}")
    # the remote by its name, never its path on this machine
    assert f"Branch `{BRANCH}`, one commit, pushed to `origin`." in body
    assert str(remote) not in body and str(proj) not in body + message


def test_a_remote_given_by_its_path_is_named_by_its_name(proj, remote, tmp_path):
    out = patchkit("bump", "--package", "vllm", "--to", "v1.1.0", "--push", str(remote),
                   "--format", "json", cwd=proj)
    assert out.returncode == 0, out.stderr
    [bump] = json.loads(out.stdout)["bumps"]
    assert bump["pushed"] == "origin" and str(tmp_path) not in bump["body"]
    # a remote no name is configured for: its last part
    other = tmp_path / "elsewhere.git"
    sh("git", "init", "-q", "--bare", str(other))
    out = patchkit("bump", "--package", "vllm", "--to", "v1.1.0", "--push", str(other), cwd=proj)
    assert out.returncode == 0, out.stderr
    assert "pushed to `elsewhere.git`." in out.stdout and str(tmp_path) not in out.stdout


def test_a_second_bump_to_the_same_release_replaces_its_own_commit(proj, remote):
    assert patchkit("bump", "--package", "vllm", "--to", "v1.1.0", "--push", "origin",
                    cwd=proj).returncode == 0
    commit(proj, "a later change on main", {"README": "more\n"})
    again = patchkit("bump", "--package", "vllm", "--to", "v1.1.0", "--push", "origin", cwd=proj)
    assert again.returncode == 0, again.stderr
    tip = sh("git", "rev-parse", BRANCH, cwd=proj)
    assert sh("git", "rev-parse", f"{tip}~1", cwd=proj) == sh("git", "rev-parse", "main", cwd=proj)
    assert sh("git", "rev-parse", BRANCH, cwd=remote) == tip


def test_a_bump_with_nothing_new_writes_and_pushes_nothing(proj, remote, tmp_path):
    first = patchkit("bump", "--package", "vllm", "--to", "v1.1.0", "--push", "origin", cwd=proj)
    assert first.returncode == 0, first.stderr
    here, there = refs(proj), refs(remote)
    reflog = sh("git", "reflog", "show", "--format=%H", BRANCH, cwd=proj)
    again = patchkit("bump", "--package", "vllm", "--to", "v1.1.0", "--push", "origin", cwd=proj)
    assert again.returncode == 0, again.stderr
    assert again.stdout == ""
    tip = sh("git", "rev-parse", BRANCH, cwd=proj)
    assert again.stderr.splitlines()[-1] == (
        f"nothing new: {BRANCH} holds vLLM v1.0.0 -> v1.1.0 already ({tip[:12]}); "
        "nothing written")
    assert refs(proj) == here and refs(remote) == there
    assert sh("git", "reflog", "show", "--format=%H", BRANCH, cwd=proj) == reflog
    # the commit follows from its inputs: another clone bumping the same series writes it too
    other = tmp_path / "other"
    sh("git", "clone", "-q", str(remote), str(other))
    made = patchkit("bump", "--package", "vllm", "--to", "v1.1.0", cwd=other)
    assert made.returncode == 0, made.stderr
    assert sh("git", "rev-parse", BRANCH, cwd=other) == tip


def reviewer_pushes(remote: Path, tmp_path: Path, amend: bool = False) -> str:
    """A second clone takes the bump branch, commits on it (or rewrites the bump commit) and
    pushes; the commit it pushed."""
    rev = tmp_path / "reviewer"
    sh("git", "clone", "-q", "-b", BRANCH, str(remote), str(rev))
    sh("git", "config", "user.name", "A Reviewer", cwd=rev)
    sh("git", "config", "user.email", "reviewer@example.com", cwd=rev)
    (rev / "NOTES").write_text("a reviewer's fix\n")
    sh("git", "add", "NOTES", cwd=rev)
    sh("git", "commit", "-q", *(["--amend", "--no-edit"] if amend else ["-m", "review fix"]),
       cwd=rev)
    sh("git", "push", "-q", "--force", "origin", BRANCH, cwd=rev)
    return sh("git", "rev-parse", "HEAD", cwd=rev)


@pytest.mark.parametrize("case", ["no-fetch", "fetched", "amended", "local"])
def test_a_reviewers_commit_is_never_overwritten(proj, remote, tmp_path, case):
    assert patchkit("bump", "--package", "vllm", "--to", "v1.1.0", "--push", "origin",
                    cwd=proj).returncode == 0
    theirs = reviewer_pushes(remote, tmp_path, amend=case == "amended")
    commit(proj, "a later change on main", {"README": "more\n"})   # the bump has news
    args = ["bump", "--package", "vllm", "--to", "v1.1.0"]
    if case in ("fetched", "amended"):
        sh("git", "fetch", "-q", "origin", cwd=proj)   # the reviewer's commit is known here
    if case == "local":   # pulled into the local branch; the bump is not pushing
        sh("git", "fetch", "-q", "origin", f"{BRANCH}:{BRANCH}", "--force", cwd=proj)
    else:
        args += ["--push", "origin"]
    before_here, before_there = refs(proj), refs(remote)
    out = patchkit(*args, cwd=proj)
    assert out.returncode == 2, out.stderr
    line = one_error(out)
    where = "here" if case == "local" else f"at origin ({remote})"
    assert f"the branch {BRANCH} {where} has 1 commit this bump did not write" in line
    assert theirs[:12] in line
    assert refs(proj) == before_here and refs(remote) == before_there
    assert sh("git", "rev-parse", BRANCH, cwd=remote) == theirs
    assert len(worktrees(proj)) == 1 and not (proj / ".patchkit" / "bump").exists()


def test_a_fix_that_stops_applying_needs_a_successor_or_a_hand(proj):
    """other-fix took effect at v1.0.0; ranged below v1.1.0 with nothing in its place, the
    bump stops; a patch that says `supersedes: [other-fix]` and takes effect at v1.1.0 lets
    it through, and the body names both."""
    text = (proj / "patchset.yaml").read_text()
    ranged = text.replace("    diff: patches/other.diff\n",
                          '    diff: patches/other.diff\n    vllm: "<1.1"\n')
    (proj / "patchset.yaml").write_text(ranged)
    commit(proj, "other-fix ends before 1.1")
    before = refs(proj)
    lost = patchkit("bump", "--package", "vllm", "--to", "v1.1.0", cwd=proj)
    assert lost.returncode == EXIT_NEEDS_A_HAND, lost.stderr
    assert "**Needs a hand**: `other-fix` took effect at v1.0.0 and not at v1.1.0 (skipped)" \
        in lost.stdout
    assert "| `other-fix` | applied | **skipped: lost** |" in lost.stdout
    assert "- `other-fix`: **lost**" in lost.stdout
    assert refs(proj) == before
    # rebase-check judges the same tree alike: the release fails, naming the patch
    check = patchkit("rebase-check", "--to", "v1.1.0", cwd=proj)
    assert check.returncode == 1
    assert "  other-fix @ v1.1.0: other-fix took effect at v1.0.0 and not at v1.1.0 (skipped)" \
        in check.stdout
    sh("git", "worktree", "remove", "--force", str(proj / ".patchkit/bump/vllm-1.1.0"), cwd=proj)

    (proj / "patches" / "other-v11.diff").write_text((proj / "patches/other.diff").read_text())
    (proj / "patchset.yaml").write_text(ranged + (
        "  - id: other-fix-v11\n    summary: add one, from 1.1 on\n"
        "    diff: patches/other-v11.diff\n    vllm: \">=1.1\"\n"
        "    supersedes: [other-fix, already-in]\n"))
    commit(proj, "its successor")
    out = patchkit("bump", "--package", "vllm", "--to", "v1.1.0", cwd=proj)
    assert out.returncode == 0, out.stderr
    assert "| `other-fix` | applied | skipped | superseded by `other-fix-v11`" in out.stdout
    assert "| `other-fix-v11` | skipped | applied | carried as it is" in out.stdout
    assert "**Newly applied** (take effect for the first time at v1.1.0):\n\n- `other-fix-v11`" \
        in out.stdout
    assert "- `other-fix`: superseded by `other-fix-v11`" in out.stdout
    # an upstream patch a supersedes: names keeps its entry, with a range, for that reference
    assert "| `already-in` | applied | skipped | upstream: range marked; superseded by " \
           "`other-fix-v11`; already in the tree; kept for other-fix-v11, which supersedes it" \
           in out.stdout
    bumped = yaml.safe_load(sh("git", "show", f"{BRANCH}:patchset.yaml", cwd=proj))
    assert {p["id"]: p.get("vllm") for p in bumped["patches"]}["already-in"] == "<1.1.0"
    message = sh("git", "log", "-1", "--format=%B", BRANCH, cwd=proj)
    assert "Newly applied: other-fix-v11" in message
    # proven upstream comes first: the release has already-in's change (series.fates)
    assert "No longer applied: other-fix (superseded by other-fix-v11), already-in (upstream)" \
        in message


def test_a_port_that_needs_a_hand_says_which_patch_and_writes_no_branch(proj):
    before_files, before_refs = files(proj), refs(proj)
    out = patchkit("bump", cwd=proj)   # every package: vLLM's newest release is v1.3.0
    assert out.returncode == EXIT_NEEDS_A_HAND, out.stderr
    assert refs(proj) == before_refs and files(proj) == before_files
    body = out.stdout
    assert "**Needs a hand**: `fast-mode` could not be ported to vLLM v1.3.0" in body
    assert "| `fast-mode` | applied | not proven | **needs a hand**; " in body
    assert "anchor" in body
    assert "| `other-fix` | applied | not proven | not tried yet; after `fast-mode`" in body
    assert "### What needs a hand" in body
    # the port is left for a person, with the rebase stopped in it
    left = proj / ".patchkit" / "bump" / "vllm-1.3.0"
    assert (left / ".patchkit" / "rebase" / "state.json").is_file()
    # named by its path in the project: the body names nothing of this machine
    assert "The port is left in `.patchkit/bump/vllm-1.3.0` for a person" in body
    assert str(proj) not in body
    assert out.stderr.splitlines()[-1].startswith("needs a hand: vLLM v1.3.0: `fast-mode`")
    # a second try says where the first one is, and what it waits for
    again = patchkit("bump", cwd=proj)
    assert again.returncode == 2 and f"in {left} still needs a hand" in one_error(again)


def test_a_port_finished_by_hand_becomes_the_branch(proj):
    """v1.2.0 stops at other-fix's conflict; a person resolves it in the port left for them,
    and the next bump takes the port from there."""
    out = patchkit("bump", "--package", "vllm", "--to", "v1.2.0", cwd=proj)
    assert out.returncode == EXIT_NEEDS_A_HAND, out.stderr
    left = proj / ".patchkit" / "bump" / "vllm-1.2.0"
    (left / ".patchkit" / "rebase" / "tree" / "pkg" / "other.py").write_text(OTHER_RESOLVED)
    resolved = patchkit("rebase", "--continue", cwd=left)
    assert resolved.returncode == 0, resolved.stderr
    assert sh("git", "branch", "--list", "patchkit/bump-vllm-1.2.0", cwd=proj) == ""

    done = patchkit("bump", "--package", "vllm", "--to", "v1.2.0", cwd=proj)
    assert done.returncode == 0, done.stderr
    branch = "patchkit/bump-vllm-1.2.0"
    assert "a * b + 1" in sh("git", "show", f"{branch}:patches/other.diff", cwd=proj)
    assert "ref: v1.2.0" in sh("git", "show", f"{branch}:patchset.yaml", cwd=proj)
    assert "the port was finished by hand in .patchkit/bump/vllm-1.2.0" in done.stdout
    assert str(proj) not in done.stdout
    assert not left.exists() and len(worktrees(proj)) == 1
    # described as an automatic port is, and what the person did besides
    body = done.stdout
    assert "| `other-fix` | applied | applied | resolved by hand" in body
    assert "| `fast-mode` | applied | applied | carried as it is" in body
    assert "### Finished by hand" in body and "`patches/other.diff`" in body
    assert "<details><summary>The diff against the automatic attempt</summary>" in body
    assert "+-    return a * b\n++    return a * b + 1" in body or "a * b + 1" in \
        body.split("```diff", 1)[1]
    message = sh("git", "log", "-1", "--format=%B", branch, cwd=proj)
    assert "- other-fix: applied -> applied (resolved)" in message
    assert "Finished by hand: patches/other.diff" in message


def test_a_port_finished_after_head_moved_lands_on_the_new_head(proj):
    """The port stopped at A; the user committed B on main (a setting moved); the port finished
    by hand lands on B with B's change kept, and the body names the commit it sits on."""
    assert patchkit("bump", "--package", "vllm", "--to", "v1.2.0", cwd=proj).returncode == \
        EXIT_NEEDS_A_HAND
    began = sh("git", "rev-parse", "HEAD", cwd=proj)
    left = proj / ".patchkit" / "bump" / "vllm-1.2.0"
    text = (proj / "patchset.yaml").read_text()
    (proj / "patchset.yaml").write_text(text.replace("summary: make the mode fast\n",
                                                     "summary: make the mode faster\n"))
    moved = commit(proj, "fast-mode says faster")
    (left / ".patchkit" / "rebase" / "tree" / "pkg" / "other.py").write_text(OTHER_RESOLVED)
    assert patchkit("rebase", "--continue", cwd=left).returncode == 0
    done = patchkit("bump", "--package", "vllm", "--to", "v1.2.0", cwd=proj)
    assert done.returncode == 0, done.stderr
    branch = "patchkit/bump-vllm-1.2.0"
    tip = sh("git", "rev-parse", branch, cwd=proj)
    assert sh("git", "rev-parse", f"{tip}~1", cwd=proj) == moved
    # the branch changes only what the port changed: B's setting is not undone
    diff = sh("git", "diff", "main", branch, "--", "patchset.yaml", cwd=proj).splitlines()
    assert not [ln for ln in diff if ln.startswith(("-", "+")) and "make the mode" in ln]
    assert "make the mode faster" in sh("git", "show", f"{branch}:patchset.yaml", cwd=proj)
    assert "ref: v1.2.0" in sh("git", "show", f"{branch}:patchset.yaml", cwd=proj)
    assert "a * b + 1" in sh("git", "show", f"{branch}:patches/other.diff", cwd=proj)
    body = done.stdout
    assert f"On `{moved[:12]}` (fast-mode says faster), the project's HEAD when the bump ran." \
        in body
    assert (f"HEAD moved from {began[:12]} to {moved[:12]} while the port waited: the port's "
            f"own changes were replayed on {moved[:12]}") in body
    # the hand work is the person's alone, not what HEAD brought
    assert "### Finished by hand" in body
    assert "Finished by hand: patches/other.diff" in sh(
        "git", "log", "-1", "--format=%B", branch, cwd=proj)


def test_a_head_that_conflicts_with_the_port_needs_a_hand_naming_the_files(proj):
    assert patchkit("bump", "--package", "vllm", "--to", "v1.2.0", cwd=proj).returncode == \
        EXIT_NEEDS_A_HAND
    left = proj / ".patchkit" / "bump" / "vllm-1.2.0"
    (left / ".patchkit" / "rebase" / "tree" / "pkg" / "other.py").write_text(OTHER_RESOLVED)
    assert patchkit("rebase", "--continue", cwd=left).returncode == 0
    # meanwhile main rewrites the very patch the person resolved
    diff = (proj / "patches" / "other.diff").read_text()
    moved = commit(proj, "other-fix adds two", {"patches/other.diff": diff.replace(
        "a + b + 1", "a + b + 2")})
    before = refs(proj)
    out = patchkit("bump", "--package", "vllm", "--to", "v1.2.0", cwd=proj)
    assert out.returncode == EXIT_NEEDS_A_HAND, out.stderr
    assert (f"the port's own changes conflict with it in patches/other.diff") in out.stdout
    assert f"to {moved[:12]} since the port began" in out.stdout
    assert refs(proj) == before
    # the person's work is kept where it was
    assert "a * b + 1" in (left / "patches" / "other.diff").read_text()


def test_an_error_never_takes_a_port_finished_by_hand(proj):
    """The person's work in the port left for them survives a bump that fails on it."""
    assert patchkit("bump", "--package", "vllm", "--to", "v1.2.0", cwd=proj).returncode == \
        EXIT_NEEDS_A_HAND
    left = proj / ".patchkit" / "bump" / "vllm-1.2.0"
    (left / ".patchkit" / "rebase" / "tree" / "pkg" / "other.py").write_text(OTHER_RESOLVED)
    assert patchkit("rebase", "--continue", cwd=left).returncode == 0
    (left / ".patchkit" / "bump-attempt.json").unlink()   # what the bump reads is gone
    done = patchkit("bump", "--package", "vllm", "--to", "v1.2.0", cwd=proj)
    assert done.returncode == 2 and "holds no record of the automatic port" in one_error(done)
    assert "a * b + 1" in (left / "patches" / "other.diff").read_text()
    assert len(worktrees(proj)) == 2


def test_dry_run_writes_nothing_and_prints_the_body(proj):
    before_files, before_refs = files(proj), refs(proj)
    out = patchkit("bump", "--package", "vllm", "--to", "v1.1.0", "--dry-run", "--format",
                   "json", cwd=proj)
    assert out.returncode == 0, out.stderr
    assert refs(proj) == before_refs and files(proj) == before_files
    assert len(worktrees(proj)) == 1 and not (proj / ".patchkit" / "bump").exists()
    report = json.loads(out.stdout)
    [bump] = report["bumps"]
    assert report["ok"] and bump["status"] == "dry-run" and bump["branch"] is None
    assert bump["to_ref"] == "v1.1.0" and not bump["needs_a_hand"]
    fates = {f["id"]: f for f in bump["fates"]}
    assert fates["already-in"]["port"] == "dropped" and fates["already-in"]["before"] == "applied"
    assert fates["fast-mode"]["after"] == "applied"
    assert bump["no_longer_applied"] == ["already-in"] and bump["newly_applied"] == []
    assert bump["assertions"] == 3
    assert bump["body"].startswith("## Bump vLLM from v1.0.0 to v1.1.0")


def test_probes_run_in_the_bumped_tree_and_their_files_join_the_change(proj):
    text = (proj / "patchset.yaml").read_text()
    (proj / "patchset.yaml").write_text(text + (
        "bump:\n  probes:\n"
        "    - echo \"$PATCHKIT_BUMP_PACKAGE $PATCHKIT_BUMP_FROM $PATCHKIT_BUMP_REF\" > probed.txt\n"
        "    - \"grep -q 'ref: v1.1.0' patchset.yaml\"\n"))
    commit(proj, "probes")
    out = patchkit("bump", "--package", "vllm", "--to", "v1.1.0", cwd=proj)
    assert out.returncode == 0, out.stderr
    assert sh("git", "show", f"{BRANCH}:probed.txt", cwd=proj) == "vllm v1.0.0 v1.1.0"
    assert not (proj / "probed.txt").exists()
    assert "probe `grep -q 'ref: v1.1.0' patchset.yaml`: passed" in out.stdout
    assert "- `probed.txt`" in out.stdout


def test_a_failing_probe_needs_a_hand(proj):
    text = (proj / "patchset.yaml").read_text()
    (proj / "patchset.yaml").write_text(text + (
        "bump:\n  timeout: 30\n  probes:\n    - echo behaviour changed at $PATCHKIT_BUMP_REF; exit 3\n"))
    commit(proj, "probes")
    before = refs(proj)
    out = patchkit("bump", "--package", "vllm", "--to", "v1.1.0", cwd=proj)
    assert out.returncode == EXIT_NEEDS_A_HAND, out.stderr
    assert refs(proj) == before
    assert "**Needs a hand**: the probe `echo behaviour changed" in out.stdout
    assert "FAILED (exit 3)" in out.stdout and "behaviour changed at v1.1.0" in out.stdout


def test_nothing_newer_is_one_line_and_exit_0(proj):
    text = (proj / "patchset.yaml").read_text().replace("ref: v1.0.0", "ref: v1.3.0")
    (proj / "patchset.yaml").write_text(text)
    commit(proj, "pin the newest")
    before = refs(proj)
    out = patchkit("bump", "--package", "vllm", cwd=proj)
    assert out.returncode == 0 and out.stdout == ""
    assert out.stderr.splitlines()[-1] == ("vLLM: pinned at v1.3.0, the newest release; "
                                           "nothing to bump")
    assert refs(proj) == before


def test_dry_run_works_on_a_tree_with_changes(proj):
    (proj / "NOTES").write_text("an untracked note\n")
    (proj / "patchset.yaml").write_text((proj / "patchset.yaml").read_text() + "# mine\n")
    before_files, before_refs = files(proj), refs(proj)
    out = patchkit("bump", "--package", "vllm", "--to", "v1.1.0", "--dry-run", cwd=proj)
    assert out.returncode == 0, out.stderr
    assert files(proj) == before_files and refs(proj) == before_refs
    # a real bump carries none of them, and refuses only the tracked file's change
    real = patchkit("bump", "--package", "vllm", "--to", "v1.1.0", cwd=proj)
    assert real.returncode == 2 and "has changes to tracked files (patchset.yaml)" in \
        one_error(real)
    (proj / "patchset.yaml").write_text(sh("git", "show", "HEAD:patchset.yaml", cwd=proj) + "\n")
    done = patchkit("bump", "--package", "vllm", "--to", "v1.1.0", cwd=proj)
    assert done.returncode == 0, done.stderr
    assert "NOTES" not in sh("git", "show", "--name-only", "--format=", BRANCH, cwd=proj)


@pytest.mark.parametrize("case", ["dirty", "foreign-branch", "unreachable", "no-release",
                                  "older", "to-without-package", "no-pin"])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(proj, tmp_path, case):
    args = ["bump", "--package", "vllm", "--to", "v1.1.0"]
    if case == "dirty":
        with (proj / ".gitignore").open("a") as fh:   # a tracked file
            fh.write("*.orig\n")
    elif case == "foreign-branch":
        sh("git", "checkout", "-q", "-b", BRANCH, cwd=proj)
        commit(proj, "a person's fix", {"NOTES": "mine\n"})
        sh("git", "checkout", "-q", "main", cwd=proj)
    elif case == "unreachable":
        args += ["--push", str(tmp_path / "no-such-remote.git")]
    elif case == "no-release":
        args[-1] = "v9.9.9"
    elif case == "older":
        args[-1] = "v0.9.0"
    elif case == "no-pin":   # a release the source never had
        text = (proj / "patchset.yaml").read_text().replace("ref: v1.0.0", "ref: v1.0.5")
        (proj / "patchset.yaml").write_text(text)
        commit(proj, "a pin that does not exist")
    else:
        args = ["bump", "--to", "v1.1.0"]
    before_files, before_refs = files(proj), refs(proj)
    out = patchkit(*args, cwd=proj)
    assert out.returncode == 2, out.stderr
    line = one_error(out)
    missing = tmp_path / "no-such-remote.git"
    expected = {"dirty": "has changes to tracked files (.gitignore)",
                "foreign-branch": "has 1 commit this bump did not write",
                "unreachable": (f"cannot reach the remote '{missing}' ({missing}): '{missing}' "
                                "does not appear to be a git repository; Could not read from "
                                "remote repository."),
                "no-release": "v9.9.9",
                "older": "not newer than the pin", "to-without-package": "--package",
                "no-pin": "the pin vLLM v1.0.5 (patchset.yaml:5) is not on its sources"}[case]
    assert expected in line
    assert files(proj) == before_files and refs(proj) == before_refs
    assert len(worktrees(proj)) == 1 and not (proj / ".patchkit" / "bump").exists()


@pytest.mark.real_vllm
def test_a_flashinfer_bump_on_real_releases(tmp_path, real_vllm):
    """FlashInfer's pin moves alone, on its real PyPI releases: 0.6.17 ports (an offset
    refreshed), 0.6.18 rewrote the line a guard holds on, which needs a hand."""
    ensure_releases(real_vllm, ("v0.6.16", "v0.6.17", "v0.6.18"))
    guard = FI_TILE_ENTRY.replace('    flashinfer: "<0.6.18"\n', "")
    proj = make_stack(tmp_path, guard)
    (proj / "patches" / "flashinfer" / "fi-nvfp4-only.diff").write_text(FI_TILE_PATCH)
    text = (proj / "patchset.yaml").read_text().replace("    ref: v0.6.15\n", "    ref: v0.6.16\n")
    (proj / "patchset.yaml").write_text(text)
    (proj / ".gitignore").write_text("/.patchkit/\n")
    sh("git", "init", "-q", "-b", "main", str(proj))
    commit(proj, "vLLM and FlashInfer")

    out = patchkit("bump", "--package", "flashinfer", "--to", "v0.6.17", cwd=proj)
    assert out.returncode == 0, out.stderr
    branch = "patchkit/bump-flashinfer-0.6.17"
    bumped = yaml.safe_load(sh("git", "show", f"{branch}:patchset.yaml", cwd=proj))
    assert bumped["packages"]["flashinfer"]["ref"] == "v0.6.17"
    assert bumped["vllm"]["ref"] == "v1"   # the other pin stays
    assert "| `fi-nvfp4-only` | applied | applied | refreshed" in out.stdout
    assert "| `fast-mode` |" not in out.stdout   # vLLM's patches are not this bump's
    assert "every patch of flashinfer applies exactly" in out.stdout

    hand = patchkit("bump", "--package", "flashinfer", "--to", "v0.6.18", "--dry-run", cwd=proj)
    assert hand.returncode == EXIT_NEEDS_A_HAND, hand.stderr
    assert "**Needs a hand**: `fi-nvfp4-only` could not be ported to flashinfer v0.6.18" \
        in hand.stdout
    assert "hunk 1 of flashinfer/fused_moe/cute_dsl/blackwell_sm12x/moe_micro_kernel.py" \
        in hand.stdout
    assert sh("git", "branch", "--list", "patchkit/bump-flashinfer-0.6.18", cwd=proj) == ""

    # a FlashInfer fix ranged below the release, with no successor, stops the bump too
    entry = "    diff: patches/flashinfer/fi-nvfp4-only.diff\n"
    text = (proj / "patchset.yaml").read_text().replace(
        entry, entry + '    flashinfer: "<0.6.18"\n')
    (proj / "patchset.yaml").write_text(text)
    commit(proj, "the guard ends before 0.6.18")
    lost = patchkit("bump", "--package", "flashinfer", "--to", "v0.6.18", "--dry-run", cwd=proj)
    assert lost.returncode == EXIT_NEEDS_A_HAND, lost.stderr
    assert "**Needs a hand**: `fi-nvfp4-only` took effect at v0.6.16 and not at v0.6.18" \
        in lost.stdout


def test_a_reviewer_reads_upstreams_changes_from_the_body():
    """A GitHub source gives the compare view and the release page, in any URL form; PyPI its
    release page; a local path nothing."""
    from patchkit.commands.bump import Links, _links
    from patchkit.run import Pin
    from patchkit.packageid import VLLM

    pin = Pin(VLLM, "v0.33.0", ())
    for url in ("https://github.com/vllm-project/vllm.git", "git@github.com:vllm-project/vllm",
                "https://github.com/vllm-project/vllm/"):
        assert _links((url, "pypi"), pin, "v0.34.0", "0.34.0") == Links(
            "https://github.com/vllm-project/vllm/compare/v0.33.0...v0.34.0",
            "https://github.com/vllm-project/vllm/releases/tag/v0.34.0")
    assert _links(("pypi",), pin, "v0.34.0", "0.34.0") == Links(
        None, "https://pypi.org/project/vllm/0.34.0/")
    assert _links(("/srv/vllm",), pin, "v0.34.0", "0.34.0") == Links()


# ------------------------------------------------------------------------------ the base

def push_base(tmp: Path, ref: str, labels: dict[str, str]) -> None:
    """A tiny image (one small layer, a config with ``labels``, linux/arm64) pushed to
    ``ref`` with skopeo, from an OCI layout made here."""
    import gzip
    import hashlib
    import io
    import tarfile

    layout = tmp / f"layout-{abs(hash(ref))}"
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def blob(data: bytes) -> dict:
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        return {"digest": f"sha256:{digest}", "size": len(data)}

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        info = tarfile.TarInfo("etc/base-of")
        info.size = len(ref.encode())
        tar.addfile(info, io.BytesIO(ref.encode()))
    layer = gzip.compress(raw.getvalue(), mtime=0)
    config = json.dumps({"architecture": "arm64", "os": "linux",
                         "config": {"Labels": labels, "Env": ["PATH=/usr/bin"]},
                         "rootfs": {"type": "layers", "diff_ids": [
                             "sha256:" + hashlib.sha256(raw.getvalue()).hexdigest()]}}).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **blob(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    **blob(layer)}]}).encode()
    index = {"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", **blob(manifest),
        "annotations": {"org.opencontainers.image.ref.name": "base"}}]}
    (layout / "index.json").write_text(json.dumps(index))
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    sh("skopeo", "copy", "--quiet", "--dest-tls-verify=false", f"oci:{layout}:base",
       f"docker://{ref}")


@pytest.fixture
def registry_repo():
    """A fresh repository name in the test registry (PK_REGISTRY, as .ci/services.sh wrote it)."""
    import os
    import uuid

    host = os.environ.get("PK_REGISTRY")
    if not host:
        pytest.fail("no test registry: PK_REGISTRY is not set (make test sources what .ci/services.sh wrote)") if os.environ.get("CI") == "true" else pytest.skip("no test registry: PK_REGISTRY is not set")
    return f"{host}/bump-base-{uuid.uuid4().hex[:10]}"


def with_base(proj: Path, base: str) -> None:
    text = (proj / "patchset.yaml").read_text()
    (proj / "patchset.yaml").write_text(text.replace("  base: example/vllm:v1.0.0\n",
                                                     f"  base: {base}\n"))
    commit(proj, "the base")


def test_the_base_follows_the_release_and_is_proven_in_its_registry(proj, tmp_path,
                                                                     registry_repo):
    """A literal tag holding the old version without its `v` moves to the new one; the
    registry has it, and its label says the release."""
    with_base(proj, f"{registry_repo}:1.0.0-cu130")
    push_base(tmp_path, f"{registry_repo}:1.1.0-cu130", {"io.patchkit.vllm.installed": "1.1.0"})
    out = patchkit("bump", "--package", "vllm", "--to", "v1.1.0", cwd=proj)
    assert out.returncode == 0, out.stderr
    bumped = yaml.safe_load(sh("git", "show", f"{BRANCH}:patchset.yaml", cwd=proj))
    assert bumped["image"]["base"] == f"{registry_repo}:1.1.0-cu130"
    host = registry_repo.split("/")[0]
    assert (f"- image.base moved `{registry_repo}:1.0.0-cu130` -> `{registry_repo}:1.1.0-cu130`: "
            f"proven: the registry {host} has it (sha256:") in out.stdout
    assert "and its label io.patchkit.vllm.installed says vLLM 1.1.0" in out.stdout
    # only that line of the manifest changed besides the pin
    diff = sh("git", "diff", "HEAD", BRANCH, "--", "patchset.yaml", cwd=proj)
    assert f"-  base: {registry_repo}:1.0.0-cu130\n+  base: {registry_repo}:1.1.0-cu130" in diff


@pytest.mark.parametrize("case", ["missing", "other-vllm", "undeclared", "template"])
def test_a_base_the_registry_lacks_needs_a_hand(proj, tmp_path, registry_repo, case):
    old, new = f"{registry_repo}:v1.0.0", f"{registry_repo}:v1.1.0"
    if case == "template":
        with_base(proj, f"{registry_repo}:{{ref}}")
    else:
        with_base(proj, old)
    if case == "other-vllm":
        push_base(tmp_path, new, {"org.opencontainers.image.version": "1.0.0"})
    elif case in ("undeclared", "template"):
        push_base(tmp_path, new, {})
    before = refs(proj)
    out = patchkit("bump", "--package", "vllm", "--to", "v1.1.0", cwd=proj)
    host = registry_repo.split("/")[0]
    if case == "missing":
        assert out.returncode == EXIT_NEEDS_A_HAND, out.stderr
        assert (f"**Needs a hand**: image.base {new} is not in the registry {host} (no tag "
                "v1.1.0 there)") in out.stdout
        assert refs(proj) == before
    elif case == "other-vllm":
        assert out.returncode == EXIT_NEEDS_A_HAND, out.stderr
        assert (f"**Needs a hand**: image.base {new} holds vLLM 1.0.0 (label "
                "org.opencontainers.image.version), not 1.1.0") in out.stdout
        assert refs(proj) == before
    else:
        assert out.returncode == 0, out.stderr
        assert f"the registry {host} has it (sha256:" in out.stdout
        assert "which vLLM it holds its config does not say" in out.stdout
        if case == "template":
            assert f"- image.base names the release itself: `{new}`:" in out.stdout
            bumped = yaml.safe_load(sh("git", "show", f"{BRANCH}:patchset.yaml", cwd=proj))
            assert bumped["image"]["base"] == f"{registry_repo}:{{ref}}"


def test_a_base_that_names_no_release_is_left_alone(proj):
    with_base(proj, "example/vllm:latest")
    out = patchkit("bump", "--package", "vllm", "--to", "v1.1.0", "--dry-run", cwd=proj)
    assert out.returncode == 0, out.stderr
    assert ("- image.base `example/vllm:latest` names no release of v1.0.0: left alone, not "
            "checked") in out.stdout


def test_a_registry_that_does_not_answer_is_one_line_of_the_body(proj):
    out = patchkit("bump", "--package", "vllm", "--to", "v1.1.0", "--dry-run", cwd=proj)
    assert out.returncode == 0, out.stderr
    [line] = [ln for ln in out.stdout.splitlines() if ln.startswith("- image.base")]
    assert line.startswith("- image.base moved `example/vllm:v1.0.0` -> `example/vllm:v1.1.0`: "
                           "not checked: the registry docker.io did not answer (")


def test_a_registry_that_refuses_the_base_is_one_line_and_writes_nothing(proj, tmp_path):
    """A registry that answers 403 to everything: bad input, one line naming the registry."""
    import http.server
    import threading

    class Refuse(http.server.BaseHTTPRequestHandler):
        def do_GET(self):   # noqa: N802 (http.server's name)
            self.send_response(403)
            self.send_header("Content-Type", "application/json")
            body = b'{"errors":[{"code":"DENIED","message":"requested access is denied"}]}'
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_HEAD = do_GET

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        host = f"127.0.0.1:{server.server_address[1]}"
        with_base(proj, f"{host}/vllm-base:v1.0.0")
        before_files, before_refs = files(proj), refs(proj)
        out = patchkit("bump", "--package", "vllm", "--to", "v1.1.0", cwd=proj)
    finally:
        server.shutdown()
    assert out.returncode == 2, out.stderr
    line = one_error(out)
    assert f"image.base {host}/vllm-base:v1.1.0: the registry {host} refused it" in line
    assert files(proj) == before_files and refs(proj) == before_refs
    assert len(worktrees(proj)) == 1 and not (proj / ".patchkit" / "bump").exists()


def test_a_retired_fix_is_proven_in_the_body_and_a_false_one_needs_a_hand(proj):
    """v1.2.0 rewrote the line other-fix changes: retired from v1.2.0, the bump goes through and
    the body lists it with the proof; retired from v1.1.0, where the line is still there, the
    bump needs a hand in one line naming what still exists."""
    text = (proj / "patchset.yaml").read_text()
    (proj / "patchset.yaml").write_text(text.replace(
        "    diff: patches/other.diff\n",
        "    diff: patches/other.diff\n    retired: {from: v1.2.0, why: compute() multiplies}\n"))
    commit(proj, "other-fix retired")
    out = patchkit("bump", "--package", "vllm", "--to", "v1.2.0", "--dry-run", cwd=proj)
    assert out.returncode == 0, out.stdout + out.stderr
    proof = ("retired from v1.2.0 (compute() multiplies); proven at v1.2.0: pkg/other.py: the "
             "line hunk 1 changes is gone (`total = a + b`)")
    assert f"- `other-fix`: {proof}" in out.stdout
    assert "| `other-fix` | applied | skipped: retired |" in out.stdout
    data = json.loads(patchkit("bump", "--package", "vllm", "--to", "v1.2.0", "--dry-run",
                               "--format", "json", cwd=proj).stdout)
    fate = next(f for f in data["bumps"][0]["fates"] if f["id"] == "other-fix")
    assert (fate["change"], fate["why"]) == ("retired", proof)

    (proj / "patchset.yaml").write_text((proj / "patchset.yaml").read_text().replace(
        "from: v1.2.0", "from: v1.1.0"))
    commit(proj, "retired too early")
    before = refs(proj)
    out = patchkit("bump", "--package", "vllm", "--to", "v1.1.0", cwd=proj)
    assert out.returncode == 2, out.stdout + out.stderr
    assert one_error(out) == ("patchkit bump: error: other-fix is retired from v1.1.0, but v1.1.0 "
                              "still has its code: pkg/other.py still has `total = a + b` (hunk 1)")
    assert refs(proj) == before


def test_a_hand_resolution_to_no_change_is_dropped_by_hand_and_lost(proj):
    """v1.2.0 stops at other-fix; a person takes upstream's side (no change): the manifest's
    comment says it was dropped by hand at that release, never upstream, and the bump judges
    the fix lost, as rebase-check would."""
    assert patchkit("bump", "--package", "vllm", "--to", "v1.2.0", cwd=proj).returncode == \
        EXIT_NEEDS_A_HAND
    left = proj / ".patchkit" / "bump" / "vllm-1.2.0"
    sh("git", "checkout", "--", ".", cwd=left / ".patchkit" / "rebase" / "tree")
    resolved = patchkit("rebase", "--continue", cwd=left)
    assert resolved.returncode == 0, resolved.stderr
    ported = (left / "patchset.yaml").read_text()
    assert "# other-fix: dropped by hand at vLLM v1.2.0 (resolved to no change)" in ported
    assert "other-fix: dropped, upstream" not in ported
    again = patchkit("bump", "--package", "vllm", "--to", "v1.2.0", cwd=proj)
    assert again.returncode == EXIT_NEEDS_A_HAND, again.stderr
    assert "**Needs a hand**: `other-fix` took effect at v1.0.0 and not at v1.2.0 (removed)" \
        in again.stdout
    assert "- `other-fix`: **lost**" in again.stdout
    assert "upstream in vLLM v1.2.0" not in again.stdout.split("**No longer applied**")[1] \
        .split("`other-fix`", 1)[1].splitlines()[0]
    assert sh("git", "branch", "--list", "patchkit/bump-vllm-1.2.0", cwd=proj) == ""
