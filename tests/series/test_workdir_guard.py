"""A workdir holding a person's work is never replaced without --discard, and with it the work
stays reachable in a bundle beside the workdir."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from testing import patchkit
from testing.project import make_project
from testing.upstream import sh

from patchkit import filelocks, manifest
from patchkit.errors import UsageError
from patchkit.run import run_spec
from patchkit.series import applier, checkout


def apply(proj: Path, wd: Path, **kw):
    m = manifest.load(proj / "patchset.yaml")
    run = run_spec(m, **{k: kw.pop(k) for k in ("ref", "repos", "variant", "cache") if k in kw})
    return applier.apply_series(m, run=run, workdir=wd, **kw)


def commit(wd: Path, name: str, text: str, message: str) -> str:
    (wd / name).write_text(text)
    sh("git", "add", name, cwd=wd)
    sh("git", "commit", "-qm", message, cwd=wd)
    return sh("git", "rev-parse", "HEAD", cwd=wd)


@pytest.fixture
def applied(tmp_path):
    proj = make_project(tmp_path)
    wd = proj / ".patchkit/vllm"
    assert apply(proj, wd).ok
    return proj, wd


# each way of leaving work in the checkout, the phrase that names it, and its own remedy
def _commits(wd):
    commit(wd, "pkg/mine.py", "MINE = 1\n", "my first")
    commit(wd, "pkg/mine.py", "MINE = 2\n", "my second")


def _edit(wd):
    (wd / "pkg/mod.py").write_text((wd / "pkg/mod.py").read_text() + "# mine\n")


def _untracked(wd):
    (wd / "notes.txt").write_text("mine\n")


def _reset(wd):
    sh("git", "reset", "-q", "--hard", "HEAD~1", cwd=wd)


def _detached(wd):
    sh("git", "checkout", "-q", "--detach", "patchkit/base", cwd=wd)
    commit(wd, "pkg/mine.py", "MINE = 3\n", "on the side")


WORK = {"commits": (_commits, "2 commits not yet exported: run 'patchkit export'"),
        "edit": (_edit, "1 changed file not committed: commit ('git -C "),
        "untracked": (_untracked, "1 untracked file: commit ('git -C "),
        "reset": (_reset, "HEAD moved to "),
        "detached": (_detached, "HEAD moved to ")}
# the remedies that must not be offered for a kind of work that is not there
WRONG = {"edit": "not yet exported", "untracked": "not yet exported",
         "reset": "'patchkit export'"}


def state(wd: Path) -> tuple[str, str, str]:
    return (sh("git", "rev-parse", "HEAD", cwd=wd), sh("git", "status", "--porcelain", cwd=wd),
            sh("git", "log", "-g", "--format=%H", "HEAD", cwd=wd))


@pytest.mark.parametrize("kind", list(WORK))
def test_apply_refuses_a_workdir_holding_work_and_leaves_it(applied, kind):
    proj, wd = applied
    make, phrase = WORK[kind]
    make(wd)
    before = state(wd)
    p = patchkit("apply", cwd=proj)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr
    assert "holds work: " in lines[0] and phrase in lines[0]
    assert "--discard" in lines[0]
    if kind in WRONG:
        assert WRONG[kind] not in lines[0]
    assert state(wd) == before  # commits, reflog, edits and files all still there


def test_the_line_names_every_kind_of_work_at_once(applied):
    proj, wd = applied
    _commits(wd)
    _edit(wd)
    (wd / "pkg/mine.py").write_text("MINE = 9\n")
    _untracked(wd)
    (wd / "more.txt").write_text("x")
    work = checkout.user_work(wd)
    assert work.describe() == ("2 commits after patchkit/applied, 2 changed files, "
                               "2 untracked files")


def test_ignored_files_are_not_work(applied):
    proj, wd = applied
    (wd / ".git/info").mkdir(exist_ok=True)
    (wd / ".git/info/exclude").write_text("*.log\n")
    (wd / "server.log").write_text("x")
    assert not checkout.user_work(wd)
    assert patchkit("apply", cwd=proj).returncode == 0


def test_a_workdir_as_patchkit_left_it_is_replaced_silently(applied):
    proj, wd = applied
    p = patchkit("apply", cwd=proj)
    assert p.returncode == 0 and "discard" not in p.stderr
    assert not list(wd.parent.glob("*.bundle"))


def test_a_branch_with_commits_away_from_head_is_work(applied):
    proj, wd = applied
    sh("git", "checkout", "-q", "-b", "feature", cwd=wd)
    commit(wd, "pkg/mine.py", "MINE = 1\n", "mine")
    sh("git", "checkout", "-q", "patchkit", cwd=wd)
    work = checkout.user_work(wd)
    assert work.commits == 1 and not work.moved_to
    with pytest.raises(UsageError, match="1 commit not yet exported"):
        apply(proj, wd)


def fetch_back(wd: Path, bundle: Path) -> None:
    sh("git", "fetch", "-q", str(bundle), "refs/heads/discarded/*:refs/heads/discarded/*", cwd=wd)


def test_discard_replaces_and_keeps_commits_edits_and_files_in_a_bundle(applied):
    proj, wd = applied
    mine = commit(wd, "pkg/mine.py", "MINE = 1\n", "mine")
    _edit(wd)
    _untracked(wd)
    sh("git", "checkout", "-q", "-b", "feature", "patchkit/applied", cwd=wd)
    side = commit(wd, "pkg/side.py", "SIDE = 1\n", "side")
    sh("git", "checkout", "-q", "patchkit", cwd=wd)
    p = patchkit("apply", "--discard", "--format", "json", cwd=proj)
    assert p.returncode == 0, p.stderr
    saved = json.loads(p.stdout)["discarded"]
    bundle = Path(saved["bundle"])
    assert bundle.parent == wd.parent and bundle.name.startswith("vllm.discarded-")
    assert saved["head"] == mine
    assert f"git -C {wd} fetch {bundle}" in p.stderr
    # the new checkout is the series alone
    assert sh("git", "rev-parse", "HEAD", cwd=wd) == sh("git", "rev-parse", "patchkit/applied", cwd=wd)
    assert sh("git", "status", "--porcelain", cwd=wd) == "" and not (wd / "notes.txt").exists()
    fetch_back(wd, bundle)
    assert sh("git", "rev-parse", "discarded/head", cwd=wd) == mine
    assert sh("git", "rev-parse", "discarded/branches/feature", cwd=wd) == side
    assert sh("git", "rev-parse", "discarded/changes~1", cwd=wd) == mine
    assert sh("git", "show", "discarded/changes:notes.txt", cwd=wd) == "mine"
    assert sh("git", "show", "discarded/changes:pkg/mod.py", cwd=wd).endswith("# mine")
    assert sh("git", "show", "discarded/head:pkg/mine.py", cwd=wd) == "MINE = 1"


def test_discard_of_a_detached_head_keeps_it(applied):
    proj, wd = applied
    _detached(wd)
    side = sh("git", "rev-parse", "HEAD", cwd=wd)
    report = apply(proj, wd, discard=True)
    assert report.ok and report.discarded["head"] == side
    fetch_back(wd, Path(report.discarded["bundle"]))
    assert sh("git", "show", "discarded/head:pkg/mine.py", cwd=wd) == "MINE = 3"


def test_discard_that_fails_leaves_the_work_and_saves_nothing(applied):
    proj, wd = applied
    _commits(wd)
    before = state(wd)
    report = apply(proj, wd, ref="v4", discard=True)  # fast-mode fails on v4
    assert not report.ok and report.discarded is None
    assert state(wd) == before and not list(wd.parent.glob("*.bundle"))


def test_work_made_while_the_series_ran_is_still_refused(applied, monkeypatch):
    proj, wd = applied
    real = applier.run_stack

    def meanwhile(*a, **kw):
        report = real(*a, **kw)
        _untracked(wd)  # the person wrote a file while the series ran
        return report

    monkeypatch.setattr(applier, "run_stack", meanwhile)
    with pytest.raises(UsageError, match="1 untracked file"):
        apply(proj, wd)
    assert (wd / "notes.txt").read_text() == "mine\n"


def test_build_image_refuses_before_any_engine_is_asked(applied):
    proj, wd = applied
    _commits(wd)
    before = state(wd)
    # nothing listens there: asking the engine would be an engine error, not exit 2
    env = dict(__import__("os").environ, DOCKER_HOST="tcp://127.0.0.1:9")
    p = patchkit("build-image", cwd=proj, env=env)
    assert p.returncode == 2, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    assert "holds work: 2 commits not yet exported" in p.stderr
    assert state(wd) == before
    p = patchkit("build-image", "--no-apply", "--discard", cwd=proj, env=env)
    assert p.returncode == 2 and "--discard" in p.stderr


def test_no_lock_file_is_left_beside_the_workdir(applied):
    proj, wd = applied
    assert patchkit("apply", cwd=proj).returncode == 0
    assert sorted(p.name for p in wd.parent.iterdir()) == ["vllm"]


def test_the_lock_excludes_a_second_holder(tmp_path):
    lock = tmp_path / ".wd.patchkit.lock"
    code = ("import sys; from patchkit import filelocks\n"
            "with filelocks.held(sys.argv[1], 'wd', vanish=True): print('in', flush=True)\n")
    with filelocks.held(lock, "wd", vanish=True):
        other = subprocess.Popen([__import__("sys").executable, "-c", code, str(lock)],
                                 stdout=subprocess.PIPE, text=True)
        with pytest.raises(subprocess.TimeoutExpired):
            other.communicate(timeout=1)  # waits while this one holds it
    out, _ = other.communicate(timeout=20)
    assert out == "in\n" and other.returncode == 0
    assert not lock.exists()


def test_a_checkout_whose_cache_is_gone_is_refused_then_moved_aside_whole(tmp_path):
    import shutil

    proj = make_project(tmp_path)
    wd = tmp_path / "wd"
    assert apply(proj, wd, cache=tmp_path / "c1").ok
    (wd / "notes.txt").write_text("mine\n")
    shutil.rmtree(tmp_path / "c1")  # the objects the checkout borrows
    with pytest.raises(UsageError, match=r"holds work: git cannot read it \(its objects "):
        apply(proj, wd, cache=tmp_path / "c2")
    report = apply(proj, wd, cache=tmp_path / "c2", discard=True)
    assert report.ok
    aside = Path(report.discarded["moved_to"])
    assert aside.parent == tmp_path and aside.name.startswith("wd.discarded-")
    assert (aside / "notes.txt").read_text() == "mine\n"
    assert not (wd / "notes.txt").exists()


def test_a_head_moved_to_an_upstream_commit_needs_no_bundle(applied):
    proj, wd = applied
    sh("git", "checkout", "-q", "--detach", "patchkit/base", cwd=wd)
    base = sh("git", "rev-parse", "HEAD", cwd=wd)
    with pytest.raises(UsageError, match=f"HEAD moved to {base[:12]}"):
        apply(proj, wd)
    report = apply(proj, wd, discard=True)
    assert report.ok and report.discarded["bundle"] is None and report.discarded["head"] == base
    assert not list(wd.parent.glob("*.bundle"))
