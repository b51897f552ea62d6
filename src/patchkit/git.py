"""Every git query and mutation patchkit makes, in one place."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
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


def is_repository(path: Path) -> bool:
    """True when ``path`` is a git directory git can open (a bare repo or a ``.git``)."""
    return git(f"--git-dir={path}", "rev-parse", "--is-bare-repository", check=False).returncode == 0


def missing_alternates(work_tree: Path) -> list[str]:
    """The object stores a checkout borrows from (``git clone --shared``) that no longer exist."""
    info = work_tree / ".git" / "objects" / "info" / "alternates"
    try:
        lines = info.read_text().splitlines()
    except OSError:
        return []
    base = work_tree / ".git" / "objects"
    return [line for line in (x.strip() for x in lines)
            if line and not line.startswith("#") and not (base / line).is_dir()]


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


def clone_shared(source: Path, dest: Path, commit: str, paths: Sequence[str] | None = None
                 ) -> None:
    """A checkout of ``commit`` at ``dest`` borrowing ``source``'s objects (no copy); with
    ``paths``, sparse: only those files are written out."""
    git("clone", "--quiet", "--shared", "--no-checkout", str(source), str(dest))
    if paths is not None:
        git("config", "core.sparseCheckout", "true", cwd=dest)
        info = dest / ".git" / "info"
        info.mkdir(exist_ok=True)
        (info / "sparse-checkout").write_text("".join(_sparse_pattern(p) + "\n" for p in paths))
    git("checkout", "--quiet", "-B", "patchkit", commit, cwd=dest)


def _sparse_pattern(path: str) -> str:
    return "/" + re.sub(r"([\\*?\[\]!# ])", r"\\\1", path)


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


def dirty_paths(repo: Path) -> list[str]:
    """Every path of the work tree that differs from HEAD, staged or not, untracked included."""
    text = git("status", "--porcelain=v1", "-z", "--untracked-files=all", "--no-renames",
               cwd=repo).stdout
    return [entry[3:] for entry in text.split("\0") if len(entry) > 3]


def tag(repo: Path, name: str, commit: str) -> None:
    git("tag", "-f", name, commit, cwd=repo)


def changed_files(repo: Path, old: str, new: str) -> list[tuple[str, str, str, str, str]]:
    """``(status, path, old_mode, new_mode, new_blob)`` for each file that differs between two
    commits, renames split into a deletion and an addition; status is A, M, D or T."""
    text = out("diff", "--raw", "-z", "--no-renames", "--no-abbrev", old, new, cwd=repo)
    fields = text.split("\0")
    result = []
    for i in range(0, len(fields) - 1, 2):
        meta, path = fields[i], fields[i + 1]
        old_mode, new_mode, _old_blob, new_blob, status = meta.lstrip(":").split()
        result.append((status[0], path, old_mode, new_mode, new_blob))
    return result


def read_blobs(repo: Path, specs: Iterable[str]) -> dict[str, bytes | None]:
    """The exact bytes of each object spec (``commit:path`` or a blob id), None when missing.

    One ``git cat-file --batch`` for all of them; bytes, not text, so that content compares
    byte for byte.
    """
    import subprocess

    wanted = list(dict.fromkeys(specs))
    if not wanted:
        return {}
    env = dict(os.environ, **QUIET)
    proc = subprocess.run(["git", *BASE_ARGS, "cat-file", "--batch"], cwd=repo, env=env,
                          input=("\n".join(wanted) + "\n").encode(), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, check=False)
    if proc.returncode:
        from patchkit.errors import CommandError

        raise CommandError(["git", "cat-file", "--batch"], proc.returncode, proc.stderr.decode())
    data, pos, result = proc.stdout, 0, {}
    for spec in wanted:
        end = data.index(b"\n", pos)
        header = data[pos:end].decode()
        pos = end + 1
        if header.endswith(" missing") or header.endswith(" ambiguous"):
            result[spec] = None
            continue
        size = int(header.rsplit(" ", 1)[1])
        result[spec] = data[pos:pos + size]
        pos += size + 1
    return result
