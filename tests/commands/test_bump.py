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
    for pid, fate in [("table-nvfp4", "carried, refreshed"), ("fast-mode", "carried as it is"),
                      ("already-in", "upstream: dropped")]:
        assert f"| `{pid}` | {fate} |" in body
    assert "applies exactly (no offset, no fuzz) to v1.1.0" in body
    assert "3 `verify:` assertions hold" in body   # table-nvfp4, fast-mode, conf-overlay
    assert out.stderr.splitlines()[-1].startswith(f"ok: vLLM v1.0.0 -> v1.1.0 on {BRANCH}")


def test_a_second_bump_to_the_same_release_replaces_its_own_commit(proj, remote):
    assert patchkit("bump", "--package", "vllm", "--to", "v1.1.0", "--push", "origin",
                    cwd=proj).returncode == 0
    commit(proj, "a later change on main", {"README": "more\n"})
    again = patchkit("bump", "--package", "vllm", "--to", "v1.1.0", "--push", "origin", cwd=proj)
    assert again.returncode == 0, again.stderr
    tip = sh("git", "rev-parse", BRANCH, cwd=proj)
    assert sh("git", "rev-parse", f"{tip}~1", cwd=proj) == sh("git", "rev-parse", "main", cwd=proj)
    assert sh("git", "rev-parse", BRANCH, cwd=remote) == tip


def test_a_port_that_needs_a_hand_says_which_patch_and_writes_no_branch(proj):
    before_files, before_refs = files(proj), refs(proj)
    out = patchkit("bump", cwd=proj)   # every package: vLLM's newest release is v1.3.0
    assert out.returncode == EXIT_NEEDS_A_HAND, out.stderr
    assert refs(proj) == before_refs and files(proj) == before_files
    body = out.stdout
    assert "**Needs a hand**: `fast-mode` could not be ported to vLLM v1.3.0" in body
    assert "| `fast-mode` | **needs a hand** |" in body and "anchor" in body
    assert "### What needs a hand" in body
    # the port is left for a person, with the rebase stopped in it
    left = proj / ".patchkit" / "bump" / "vllm-1.3.0"
    assert (left / ".patchkit" / "rebase" / "state.json").is_file()
    assert f"`{left}`" in body
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
    assert f"the port was finished by hand in {left}" in done.stdout
    assert not left.exists() and len(worktrees(proj)) == 1


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
    assert {s["id"]: s["action"] for s in bump["steps"]}["already-in"] == "dropped"
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


@pytest.mark.parametrize("case", ["dirty", "foreign-branch", "unreachable", "no-release",
                                  "older", "to-without-package"])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(proj, tmp_path, case):
    args = ["bump", "--package", "vllm", "--to", "v1.1.0"]
    if case == "dirty":
        (proj / "NOTES").write_text("an untracked note\n")
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
    else:
        args = ["bump", "--to", "v1.1.0"]
    before_files, before_refs = files(proj), refs(proj)
    out = patchkit(*args, cwd=proj)
    assert out.returncode == 2, out.stderr
    line = one_error(out)
    expected = {"dirty": "has changes (NOTES)", "foreign-branch": "not this bump's",
                "unreachable": "cannot reach the remote", "no-release": "v9.9.9",
                "older": "not newer than the pin", "to-without-package": "--package"}[case]
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
    assert "| `fi-nvfp4-only` | carried, refreshed |" in out.stdout
    assert "| `fast-mode` |" not in out.stdout   # vLLM's patches are not this bump's
    assert "every patch of flashinfer applies exactly" in out.stdout

    hand = patchkit("bump", "--package", "flashinfer", "--to", "v0.6.18", "--dry-run", cwd=proj)
    assert hand.returncode == EXIT_NEEDS_A_HAND, hand.stderr
    assert "**Needs a hand**: `fi-nvfp4-only` could not be ported to flashinfer v0.6.18" \
        in hand.stdout
    assert "hunk 1 of flashinfer/fused_moe/cute_dsl/blackwell_sm12x/moe_micro_kernel.py" \
        in hand.stdout
    assert sh("git", "branch", "--list", "patchkit/bump-flashinfer-0.6.18", cwd=proj) == ""
