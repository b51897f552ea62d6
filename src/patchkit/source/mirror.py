"""Git sources: bare mirrors cached in ``<cache>/repos/``, one per URL or local path.

A mirror is cloned once and fetched again only when the ref is not already there or names a
branch (branches move; tags and commits do not).  Every mirror is guarded by a file lock, so
concurrent runs share it safely; a first clone lands in place by rename, so an interrupted run
never leaves a broken mirror.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

from patchkit import git
from patchkit import filelocks
from patchkit.cache import kept_json
from patchkit.errors import CommandError, SourceError
from patchkit.packageid import VLLM, PackageId
from patchkit.source.refs import is_commit_id
from patchkit.source.resolved import Log, Resolved, version_of
from patchkit.cache import cache_subdir
from patchkit.files import discard


class Mirror:
    """A git URL or local git path: every source that is not a word."""

    name = "git"
    holds_commits = True   # any commit of the repository can be pinned
    reads_base = False     # the ref `base` is turned into a commit or tag before it gets here
    holds_build_sources = True  # the repository: csrc, CMakeLists, setup.py
    has_history = True
    no_history_why = None

    def resolve(self, text: str, ref: str, cache: Path, log: Log, *,
                package: PackageId = VLLM, base=None) -> Resolved:
        return resolve(text, ref, cache, log, package=package)

    def tags(self, text: str, cache: Path, log: Log, *, package: PackageId = VLLM) -> list[str]:
        return tags(text, cache, log)

    def label(self, text: str, version: str, package: PackageId = VLLM) -> str:
        return text


SOURCE = Mirror()


def resolve(source: str, ref: str, cache: Path, log: Log, *, package: PackageId = VLLM,
            base=None) -> Resolved:
    """``ref`` in the mirror of the git source ``source``, cloned or fetched as needed."""
    url, repo = _mirror_of(source, cache)
    with filelocks.held(str(repo) + ".lock", f"the mirror of {source}", log):
        fresh = _open_mirror(url, repo, log)
        # Branches move, so a branch ref is always refetched; tags and shas are immutable.
        commit = None if (not fresh and git.is_branch(repo, ref)) else git.resolve_commit(repo, ref)
        if commit is None and not fresh:
            log(f"fetching {source}")
            _fetch(repo, url)
            commit = git.resolve_commit(repo, ref)
        if commit is None:
            if is_commit_id(ref):
                # the source answered (it was fetched or cloned just now): it lacks the commit
                raise MissingError(f"{package.label} commit {ref} is missing from {source} (it "
                                   "answered: fetched just now, the commit is not there)",
                                   source=source)
            raise SourceError(f"unknown {package.label} ref {ref!r} in {source}"
                              f"{_did_you_mean(repo, ref)}", source=source)
        return Resolved(source, repo, ref, commit, version_of(repo, commit, package.top))


def tags(source: str, cache: Path, log: Log) -> list[str]:
    """Every tag the source has now (fetched first, so new releases show)."""
    url, repo = _mirror_of(source, cache)
    with filelocks.held(str(repo) + ".lock", f"the mirror of {source}", log):
        if not _open_mirror(url, repo, log):
            log(f"fetching tags of {source}")
            _fetch(repo, url)
        return git.tags(repo)


def _slug(url: str) -> str:
    tail = re.sub(r"[^A-Za-z0-9._-]+", "-", url.rstrip("/").rsplit("/", 1)[-1])[:40] or "repo"
    return f"{tail}-{hashlib.sha256(url.encode()).hexdigest()[:12]}"


def _is_local(source: str) -> bool:
    # os.path.exists, not Path.exists: a name too long for the system is no local path either
    return source.startswith(("/", "./", "../", "~", "file://")) or os.path.exists(source)


def _mirror_of(source: str, cache: Path) -> tuple[str, Path]:
    """What git is given for ``source``, and where its mirror lives in ``cache``."""
    url = _url_of(source)
    return url, cache_subdir(cache, "repos") / f"{_slug(url)}.git"


def _url_of(source: str) -> str:
    """What git is given for ``source``: a local path made absolute and checked first."""
    if not _is_local(source) or source.startswith("file://"):
        return source
    local = Path(source).expanduser().absolute()
    if not os.path.exists(local):
        raise SourceError(f"no such repository: {source}", source=source)
    if local.is_dir() and not _looks_like_git(local):
        raise SourceError(f"{source} is not a git repository", source=source)
    return str(local)


# A source that did not answer is not asked again for this long: every target of a run, and
# the runs that follow, get the same one line at once instead of another wait.  Only a source
# that does not answer at all is remembered: one that answers and lacks a commit, or refuses a
# fetch, is said as such and asked again by the next run.
UNREACHABLE_FOR = 15 * 60


UNREACHABLE = ".unreachable"   # <mirror>.git.unreachable: {"url", "why", "until"}


class MissingError(SourceError):
    """A source that answered lacks the commit asked for: nothing is remembered."""


class UnreachableError(SourceError):
    """A git source that did not answer, in one short line (the URL and until when it is not
    asked again); ``more`` holds why and where that is remembered, for ``-v``."""

    def __init__(self, url: str, until: float, why: str, marker: Path | None) -> None:
        shown = time.strftime("%H:%M UTC", time.gmtime(until))
        super().__init__(f"{url} is unreachable; not asked again until {shown}", source=url)
        self.more = (f"{url}: {why}" + (f"; remembered in {marker} until "
                                        f"{time.strftime('%H:%M:%S UTC', time.gmtime(until))}"
                                        "; delete it to try now" if marker else ""))


def _marker(repo: Path) -> Path:
    return repo.with_name(repo.name + UNREACHABLE)


def _remembered(url: str, repo: Path) -> UnreachableError | None:
    """The error saying ``url`` did not answer lately, while that is remembered."""
    marker = _marker(repo)
    kept = kept_json(marker, lambda data: (float(data["until"]), str(data["why"])))
    if kept is None:
        return None
    until, why = kept
    if time.time() >= until:
        marker.unlink(missing_ok=True)
        return None
    return UnreachableError(url, until, why, marker)


def _failed(url: str, repo: Path, why: str, *, cloning: bool) -> SourceError:
    """The error of a clone (``cloning``) or fetch of ``url`` that failed: a source that
    answers (it lists its branches) refused this one thing, and nothing is remembered; one
    that does not answer is remembered for ``UNREACHABLE_FOR``."""
    if git.answers(url):
        done = "made" if cloning else "updated"
        return SourceError(f"{url} answered, but the mirror could not be {done} ({why})",
                           source=url)
    return _unreachable(url, repo, why)


def _unreachable(url: str, repo: Path, why: str) -> UnreachableError:
    """``url`` did not answer: remembered for ``UNREACHABLE_FOR``."""
    until = time.time() + UNREACHABLE_FOR
    try:
        _marker(repo).write_text(json.dumps({"url": url, "why": why, "until": until}))
    except OSError:
        return UnreachableError(url, until, why, None)
    return _remembered(url, repo) or UnreachableError(url, until, why, None)


def _open_mirror(url: str, repo: Path, log: Log) -> bool:
    """Make sure the mirror at ``repo`` is there (the caller holds its lock); True when it was
    just cloned, so it needs no fetch."""
    if os.path.lexists(repo) and not git.is_repository(repo):
        # The cache is disposable: a mirror broken by outside hands is made again.
        log(f"the cached mirror {repo} is broken; mirroring again")
        discard(repo)
    if (repo / "HEAD").exists():
        return False
    said = _remembered(url, repo)
    if said:
        raise said
    _clone_mirror(url, repo, log)
    return True


def _looks_like_git(path: Path) -> bool:
    """A work tree (``.git`` folder or file) or a bare repository."""
    return (path / ".git").exists() or ((path / "HEAD").is_file() and (path / "objects").is_dir())


def _clone_mirror(url: str, repo: Path, log: Log) -> None:
    # Asked first, so that a source out of reach is one line (the unreachable one), never a
    # "mirroring" line for a copy that is not going to be made.
    silent = git.silence(url)
    if silent is not None:
        raise _unreachable(url, repo, f"cannot clone: {_first_error(silent)}")
    log(f"mirroring {url} (a first clone)")
    tmp = Path(tempfile.mkdtemp(prefix=repo.name + ".", dir=repo.parent))
    try:
        try:
            git.clone_mirror(url, tmp / "m")
        except CommandError as exc:
            raise _failed(url, repo, f"cannot clone: {_first_error(exc.output)}",
                          cloning=True) from None
        (tmp / "m").rename(repo)
        _marker(repo).unlink(missing_ok=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _fetch(repo: Path, url: str) -> None:
    said = _remembered(url, repo)
    if said:
        raise said
    try:
        git.fetch_mirror(repo, url)
    except CommandError as exc:
        raise _failed(url, repo, f"cannot fetch: {_first_error(exc.output)}",
                      cloning=False) from None


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
    close = difflib.get_close_matches(ref, git.tags(repo), n=3)
    return f" (did you mean {', '.join(close)}?)" if close else ""
