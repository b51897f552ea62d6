"""Every git query and mutation patchkit makes, in one place."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

from patchkit.util import run

# Commits patchkit makes are reproducible: the same manifest on the same vLLM commit gives the
# same commit ids on every machine.
IDENTITY = {
    "GIT_AUTHOR_NAME": "patchkit",
    "GIT_AUTHOR_EMAIL": "patchkit@localhost",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+0000",
    "GIT_COMMITTER_NAME": "patchkit",
    "GIT_COMMITTER_EMAIL": "patchkit@localhost",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000",
}
# Never prompt for credentials, never read the user's hooks or templates.
QUIET = {"GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "", "SSH_ASKPASS": "",
         "GIT_CONFIG_NOSYSTEM": "1", "LC_ALL": "C"}
BASE_ARGS = ("-c", "core.hooksPath=/dev/null", "-c", "commit.gpgsign=false",
             "-c", "tag.gpgsign=false", "-c", "core.autocrlf=false", "-c", "advice.detachedHead=false",
             "-c", "init.defaultBranch=main", "-c", "core.quotePath=false")

SHA_RE = re.compile(r"^[0-9a-f]{7,40}$")


def git(*args: str, cwd: str | os.PathLike[str] | None = None, check: bool = True,
        env: dict[str, str] | None = None, input: str | None = None):
    full = dict(QUIET)
    if env:
        full.update(env)
    return run(("git", *BASE_ARGS, *args), cwd=cwd, env=full, check=check, input=input)


def out(*args: str, cwd: str | os.PathLike[str] | None = None, **kw) -> str:
    return git(*args, cwd=cwd, **kw).stdout.strip()


def resolve_commit(repo: Path, ref: str) -> str | None:
    """The commit ``ref`` names in ``repo`` (tag, branch, remote branch or sha), or None."""
    candidates = [f"refs/tags/{ref}", f"refs/heads/{ref}", f"refs/remotes/origin/{ref}", ref]
    for cand in candidates:
        proc = git("rev-parse", "--verify", "--quiet", f"{cand}^{{commit}}", cwd=repo, check=False)
        if proc.returncode == 0 and proc.stdout.strip():
            return proc.stdout.strip()
    return None


def is_branch(repo: Path, ref: str) -> bool:
    return git("show-ref", "--verify", "--quiet", f"refs/heads/{ref}", cwd=repo,
               check=False).returncode == 0


def tags(repo: Path) -> list[str]:
    text = out("tag", "--list", cwd=repo)
    return [t for t in text.splitlines() if t]


def tags_at(repo: Path, commit: str) -> list[str]:
    text = out("tag", "--points-at", commit, cwd=repo)
    return [t for t in text.splitlines() if t]


def nearest_tag(repo: Path, commit: str) -> str | None:
    proc = git("describe", "--tags", "--abbrev=0", commit, cwd=repo, check=False)
    return proc.stdout.strip() or None if proc.returncode == 0 else None


def show(repo: Path, spec: str) -> str | None:
    proc = git("show", spec, cwd=repo, check=False)
    return proc.stdout if proc.returncode == 0 else None


def blob_id(repo: Path, commit: str, path: str) -> str | None:
    proc = git("rev-parse", "--verify", "--quiet", f"{commit}:{path}", cwd=repo, check=False)
    return proc.stdout.strip() or None if proc.returncode == 0 else None


def hash_file(path: Path) -> str:
    return out("hash-object", "--no-filters", str(path))


def clone_shared(source: Path, dest: Path, commit: str) -> None:
    """A checkout of ``commit`` at ``dest`` borrowing ``source``'s objects (no copy)."""
    git("clone", "--quiet", "--shared", "--no-checkout", str(source), str(dest))
    git("checkout", "--quiet", "-B", "patchkit", commit, cwd=dest)


def commit_all(repo: Path, message: str, paths: Iterable[str] | None = None) -> str | None:
    """Stage ``paths`` (everything when None) and commit; None when nothing changed."""
    if paths is None:
        git("add", "-A", cwd=repo)
    else:
        plist = list(paths)
        if plist:
            git("add", "-A", "--", *plist, cwd=repo)
    if git("diff", "--cached", "--quiet", cwd=repo, check=False).returncode == 0:
        return None
    git("commit", "--quiet", "--no-verify", "-m", message, cwd=repo, env=IDENTITY)
    return out("rev-parse", "HEAD", cwd=repo)


def tag(repo: Path, name: str, commit: str) -> None:
    git("tag", "-f", name, commit, cwd=repo)
