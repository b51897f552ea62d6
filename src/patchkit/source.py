"""The pinned vLLM source: cached bare mirrors, ref resolution, cheap checkouts.

A source is a git URL, a local git path, or the word ``pypi``.  Git sources are mirrored once
into ``<cache>/repos/`` and fetched again only when the ref is not already there or names a
branch (branches move; tags and commits do not).  Every mirror is guarded by a file lock, so
concurrent runs share it safely; a first clone lands in place by rename, so an interrupted run
never leaves a broken mirror.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from filelock import FileLock
from packaging.version import InvalidVersion, Version

from patchkit import git as g
from patchkit import pypi
from patchkit.errors import CommandError, SourceError
from patchkit.util import cache_subdir, discard

Log = Callable[[str], None]
BASE_TAG = "patchkit/base"  # the pristine upstream commit of every checkout
T = TypeVar("T")

# A source that stops answering (a dropped route, a stalled proxy) fails within a minute, so the
# next source in the list gets its turn instead of the run hanging.
NETWORK = ("-c", "http.lowSpeedLimit=1000", "-c", "http.lowSpeedTime=60")


@dataclass(frozen=True)
class Resolved:
    """A ref pinned to a commit in a local repository we may borrow objects from."""

    source: str      # what the user named (URL, path or "pypi")
    repo: Path       # the local mirror
    ref: str
    commit: str
    version: str | None


def _slug(url: str) -> str:
    tail = re.sub(r"[^A-Za-z0-9._-]+", "-", url.rstrip("/").rsplit("/", 1)[-1])[:40] or "repo"
    return f"{tail}-{hashlib.sha256(url.encode()).hexdigest()[:12]}"


def _is_local(source: str) -> bool:
    return source.startswith(("/", "./", "../", "~", "file://")) or Path(source).exists()


# What git's ref names may not hold (git check-ref-format), and what makes a revision expression.
_REF_SPACE = re.compile(r"[\x00-\x20\x7f]")
_REF_EXPRESSION = re.compile(r"[~^:?*\[\\]|\.\.|@\{")


def ref_problem(ref: str) -> str | None:
    """Why ``ref`` cannot name a tag, branch or commit, or None.

    Lexical only, so that the manifest loader can say it before anything is fetched.  A revision
    expression (``HEAD~1``, ``v1^``, ``main@{1}``) is refused: it names no fixed commit, and a
    mirror never refetches what it does not know to be a branch.
    """
    if not ref:
        return "the ref is empty"
    if ref.startswith("-"):
        return f"{ref!r} starts with '-'"
    if _REF_SPACE.search(ref):
        return f"{ref!r} holds whitespace or a control character"
    if _REF_EXPRESSION.search(ref) or ref == "@":
        return f"{ref!r} is a revision expression; give a tag, branch or commit"
    if ref == "HEAD":
        return "'HEAD' is whatever the mirror's default branch was when it was made; name the branch"
    if (ref.startswith("/") or ref.endswith(("/", ".", ".lock")) or "//" in ref
            or any(part.startswith(".") for part in ref.split("/"))):
        return f"{ref!r} is not a valid git ref name"
    return None


def source_problem(source: str) -> str | None:
    """Why ``source`` cannot be a vLLM source, or None."""
    if not source.strip():
        return "the repository is empty"
    if source.startswith("-"):
        return f"{source!r} starts with '-'"
    return None


def resolve(sources: Sequence[str], ref: str, cache: Path, log: Log = lambda m: None) -> Resolved:
    """Try each source in order; the first that has ``ref`` wins.  Each attempt is logged."""
    problem = ref_problem(ref)
    if problem:
        raise SourceError(f"bad vLLM ref: {problem}")
    if not sources:
        raise SourceError("no vLLM repository to take the ref from")
    for source in sources:
        problem = source_problem(source)
        if problem:
            raise SourceError(f"bad vLLM repository: {problem}")
    source, resolved = _first_answer(sources, lambda s: _resolve_one(s, ref, cache, log), log,
                                     f"no source has vLLM {ref!r}")
    log(f"vLLM {ref} = {resolved.commit[:12]} from {source}")
    return resolved


def _first_answer(sources: Sequence[str], attempt: Callable[[str], T], log: Log,
                  none_answered: str) -> tuple[str, T]:
    """The first source ``attempt`` succeeds on, and its answer; a lone source's error as is."""
    failures: list[str] = []
    for source in sources:
        try:
            return source, attempt(source)
        except SourceError as exc:
            if len(sources) == 1:
                raise
            log(f"source {source}: {exc}; trying the next")
            failures.append(f"{source}: {exc}")
    raise SourceError(f"{none_answered}: " + "; ".join(failures))


def _resolve_one(source: str, ref: str, cache: Path, log: Log) -> Resolved:
    if source == pypi.WORD:
        repo, tag = pypi.ensure_release(cache, ref, log)
        commit = g.resolve_commit(repo, tag)
        assert commit
        return Resolved(source, repo, ref, commit, version_of(repo, commit))
    url, repo = _mirror_of(source, cache)
    with FileLock(str(repo) + ".lock"):
        fresh = _open_mirror(url, repo, log)
        # Branches move, so a branch ref is always refetched; tags and shas are immutable.
        commit = None if (not fresh and g.is_branch(repo, ref)) else g.resolve_commit(repo, ref)
        if commit is None and not fresh:
            log(f"fetching {source}")
            _fetch(repo, url)
            commit = g.resolve_commit(repo, ref)
        if commit is None:
            raise SourceError(f"unknown vLLM ref {ref!r} in {source}{_did_you_mean(repo, ref)}")
        return Resolved(source, repo, ref, commit, version_of(repo, commit))


def list_tags(sources: Sequence[str], cache: Path, log: Log = lambda m: None
              ) -> tuple[str, list[str]]:
    """Every tag the first source that answers has now (a git source is fetched first, so new
    releases show), and that source; ``pypi`` lists the releases on PyPI as ``vX.Y.Z``."""
    return _first_answer(sources, lambda s: _tags_of(s, cache, log), log,
                         "no source could list vLLM releases")


def _tags_of(source: str, cache: Path, log: Log) -> list[str]:
    if source == pypi.WORD:
        return [f"v{v}" for v in pypi.release_versions(pre=True)]
    url, repo = _mirror_of(source, cache)
    with FileLock(str(repo) + ".lock"):
        if not _open_mirror(url, repo, log):
            log(f"fetching tags of {source}")
            _fetch(repo, url)
        return g.tags(repo)


def _mirror_of(source: str, cache: Path) -> tuple[str, Path]:
    """What git is given for ``source``, and where its mirror lives in ``cache``."""
    url = _url_of(source)
    return url, cache_subdir(cache, "repos") / f"{_slug(url)}.git"


def _url_of(source: str) -> str:
    """What git is given for ``source``: a local path made absolute and checked first."""
    if not _is_local(source) or source.startswith("file://"):
        return source
    local = Path(source).expanduser().absolute()
    if not local.exists():
        raise SourceError(f"no such repository: {source}")
    if local.is_dir() and not _looks_like_git(local):
        raise SourceError(f"{source} is not a git repository")
    return str(local)


def _open_mirror(url: str, repo: Path, log: Log) -> bool:
    """Make sure the mirror at ``repo`` is there (the caller holds its lock); True when it was
    just cloned, so it needs no fetch."""
    if os.path.lexists(repo) and not g.is_repository(repo):
        # The cache is disposable: a mirror broken by outside hands is made again.
        log(f"the cached mirror {repo} is broken; mirroring again")
        discard(repo)
    if (repo / "HEAD").exists():
        return False
    _clone_mirror(url, repo, log)
    return True


def _looks_like_git(path: Path) -> bool:
    """A work tree (``.git`` folder or file) or a bare repository."""
    return (path / ".git").exists() or ((path / "HEAD").is_file() and (path / "objects").is_dir())


def _clone_mirror(url: str, repo: Path, log: Log) -> None:
    log(f"mirroring {url} (once; cached in {repo.parent})")
    tmp = Path(tempfile.mkdtemp(prefix=repo.name + ".", dir=repo.parent))
    try:
        try:
            g.git(*NETWORK, "clone", "--quiet", "--mirror", "--", url, str(tmp / "m"))
        except CommandError as exc:
            raise SourceError(f"cannot clone {url}: {_first_error(exc.output)}") from None
        (tmp / "m").rename(repo)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _fetch(repo: Path, url: str) -> None:
    try:
        g.git(*NETWORK, "fetch", "--quiet", "--prune", "--tags", "--", url,
              "+refs/heads/*:refs/heads/*", cwd=repo)
    except CommandError as exc:
        raise SourceError(f"cannot fetch {url}: {_first_error(exc.output)}") from None


def _first_error(output: str) -> str:
    for line in output.splitlines():
        line = line.strip()
        if line.startswith(("fatal:", "error:")):
            return line.split(":", 1)[1].strip()
    helper = re.search(r"'remote-([^']+)' is not a git command", output)
    if helper:
        return f"git has no transport for {helper.group(1)}:// URLs"
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return lines[0] if lines else "failed"


def _did_you_mean(repo: Path, ref: str) -> str:
    close = difflib.get_close_matches(ref, g.tags(repo), n=3)
    return f" (did you mean {', '.join(close)}?)" if close else ""


def version_of(repo: Path, commit: str) -> str | None:
    """The vLLM release at ``commit``: its release tag, else vllm/_version.py, else the
    nearest release tag below it with the commit as a local version segment."""
    for tag in g.tags_at(repo, commit):
        v = _tag_version(tag)
        if v:
            return v
    text = g.show(repo, f"{commit}:vllm/_version.py")
    if text:
        m = re.search(r"""__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", text)
        if m and _tag_version(m.group(1)):
            return m.group(1)
    near = g.nearest_tag(repo, commit)
    v = _tag_version(near) if near else None
    return f"{v}+g{commit[:9]}" if v else None


def _tag_version(tag: str) -> str | None:
    text = tag.removeprefix("v")
    if not re.match(r"^[0-9]", text):
        return None
    try:
        return str(Version(text))
    except InvalidVersion:
        return None


def checkout(resolved: Resolved, dest: Path, paths: Sequence[str] | None = None) -> None:
    """Check ``resolved.commit`` out at ``dest`` (new), sharing the mirror's objects; only
    ``paths`` when given."""
    g.clone_shared(resolved.repo, dest, resolved.commit, paths)
    g.tag(dest, BASE_TAG, resolved.commit)
