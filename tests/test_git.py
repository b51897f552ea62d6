"""The git border: every failure of git is one GitError (a command error that says the command,
its exit code and its output), never one of GitPython's exceptions, and every git command has a
deadline past which it is killed.  Real git, real repositories; a command that hangs is made
by what a user's setup could make hang (an fsmonitor hook, an ssh that never answers)."""

from __future__ import annotations

import shutil
import stat
import time
from pathlib import Path

import pytest
from testing.upstream import make_upstream, sh, write_files

from patchkit import git as g
from patchkit import timeouts
from patchkit.errors import CommandError, GitError, PatchkitError, handle


def _hanging_script(path):
    """A script that ignores its arguments and sleeps, writing its pid first."""
    path.write_text(f"#!/bin/sh\necho $$ >> {path}.pids\nexec sleep 60\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _ended(pid_file) -> bool:
    """Every process the script ran as has ended (a zombie nobody reaped has ended too)."""
    for pid in pid_file.read_text().split():
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            continue
        if state not in ("Z", "X"):
            return False
    return True


def _gone(pid_file, within: float = 10) -> bool:
    """The script's processes end once killed: a signal is delivered, not waited for, so on a
    busy machine the kernel may take a moment; a process still alive after ``within`` seconds
    was not killed."""
    end = time.monotonic() + within
    while not _ended(pid_file):
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture
def repo(tmp_path):
    return make_upstream(tmp_path / "up", {"v1": {"pkg/mod.py": "A = 1\n"}})


def test_a_failed_command_is_a_git_error_naming_it(repo):
    with pytest.raises(GitError) as e:
        g.tree_of(repo, "no-such-rev")
    assert isinstance(e.value, CommandError) and isinstance(e.value, PatchkitError)
    assert e.value.cmd[:2] == ["git", "rev-parse"] and e.value.returncode == 128
    code, line, _ = handle(e.value, "x", "0", lambda: repo / "log", prog="patchkit apply")
    assert code == 1
    assert line.splitlines()[0] == ("patchkit apply: error: command failed (exit 128): "
                                    "git rev-parse no-such-rev^{tree}")


def test_reading_objects_of_a_folder_that_is_no_repository_is_a_git_error(tmp_path):
    (tmp_path / "plain").mkdir()
    with pytest.raises(GitError, match="not a git repository"):
        g.read_blobs(tmp_path / "plain", ["HEAD:pkg/mod.py"])
    with pytest.raises(GitError):
        g.package_folders(tmp_path / "plain", "HEAD")


def test_committing_in_a_folder_that_is_no_repository_is_a_git_error(tmp_path):
    (tmp_path / "plain").mkdir()
    with pytest.raises(GitError):
        g.Commits(tmp_path / "plain")
    with pytest.raises(GitError):
        g.commit_all(tmp_path / "plain", "m")


def test_a_missing_folder_is_no_repository_not_the_current_one(tmp_path, monkeypatch, repo):
    monkeypatch.chdir(repo)   # a repository that git would otherwise answer for
    with pytest.raises(GitError, match="no such folder"):
        g.head(tmp_path / "gone")
    assert g.resolve_commit(tmp_path / "gone", "v1") is None
    assert g.resolve_commit(repo, "v1") is not None


def test_a_local_command_past_its_deadline_is_killed(repo, tmp_path, monkeypatch):
    hook = _hanging_script(tmp_path / "fsmonitor")
    (repo / "pkg" / "mod.py").write_text("A = 2\n")
    g_config = repo / ".git" / "config"
    g_config.write_text(g_config.read_text() + f"[core]\n\tfsmonitor = {hook}\n")
    monkeypatch.setattr(timeouts, "GIT_LOCAL", 1.0)
    with pytest.raises(GitError) as e:
        g.is_dirty(repo)
    assert e.value.timeout == 1.0 and e.value.cmd[:2] == ["git", "status"]
    assert str(e.value).startswith("command killed after 1 s: git status")
    assert _gone(tmp_path / "fsmonitor.pids")   # the hook git started is killed with it


def test_a_remote_that_never_answers_is_given_up_at_the_callers_deadline(repo, tmp_path,
                                                                          monkeypatch):
    ssh = _hanging_script(tmp_path / "ssh")
    monkeypatch.setenv("GIT_SSH_COMMAND", str(ssh))
    with pytest.raises(GitError) as e:
        g.remote_branch(repo, "ssh://nowhere/repo.git", "main", timeout=1)
    assert e.value.timeout == 1 and e.value.cmd[:2] == ["git", "ls-remote"]
    assert _gone(tmp_path / "ssh.pids")


def test_a_mirror_clone_has_the_transfer_deadline(tmp_path, monkeypatch):
    ssh = _hanging_script(tmp_path / "ssh")
    monkeypatch.setenv("GIT_SSH_COMMAND", str(ssh))
    monkeypatch.setattr(timeouts, "GIT_TRANSFER", 1.0)
    with pytest.raises(GitError) as e:
        g.clone_mirror("ssh://nowhere/repo.git", tmp_path / "m.git")
    assert e.value.timeout == 1.0
    assert _gone(tmp_path / "ssh.pids")


def test_commits_made_in_process_are_the_commits_git_makes(tmp_path):
    """Commits gives each step the id `git add -A -- paths` + `git commit` gives it (new
    folders, an executable, a deletion that empties a folder, a mode change, nothing at all),
    and write() leaves the branch, a tag, HEAD and the index where git would."""
    ours = make_upstream(tmp_path / "ours", {"v1": {"pkg/mod.py": "A = 1\n", "top.txt": "t\n"}})
    theirs = tmp_path / "theirs"
    shutil.copytree(ours, theirs, symlinks=True)
    sh("git", "checkout", "-q", "-b", "series", cwd=ours)
    sh("git", "checkout", "-q", "-b", "series", cwd=theirs)

    def script(root):
        (root / "tool.sh").chmod(0o755)

    steps = [
        ("one: edit", {"pkg/mod.py": "A = 2\n"}, None),
        ("two: new folders\n\nwith a body  \n\n\n",
         {"a/b/c.py": "C = 1\n", "tool.sh": "#!/bin/sh\n"}, script),
        ("three: nothing", {"top.txt": "t\n"}, None),
        ("four: gone", {"pkg/mod.py": None}, lambda root: (root / "tool.sh").chmod(0o644)),
    ]
    made = []
    with g.Commits(ours) as commits:
        for message, files, more in steps:
            for root in (ours, theirs):
                write_files(root, files)
                if more:
                    more(root)
            names = [*files, *(["tool.sh"] if more else [])]
            made.append(commits.commit(message, names))
            assert made[-1] == g.commit_all(theirs, message, names)
        assert made[2] is None and None not in made[:2] + made[3:]
        assert sh("git", "rev-parse", "HEAD", cwd=ours) != made[-1]   # nothing written yet
        commits.write(tag="done")
    assert sh("git", "rev-parse", "HEAD", "series", "done", cwd=ours).split() == [made[-1]] * 3
    assert sh("git", "status", "--porcelain", "--untracked-files=all", cwd=ours) == ""
    assert sh("git", "ls-files", "-s", cwd=ours) == sh("git", "ls-files", "-s", cwd=theirs)
    assert sh("git", "ls-tree", "--name-only", "HEAD", cwd=ours).split() == ["a", "tool.sh",
                                                                             "top.txt"]


def test_commits_need_a_branch(repo):
    sh("git", "checkout", "-q", "--detach", cwd=repo)
    with pytest.raises(GitError, match="on no branch"):
        g.Commits(repo)
