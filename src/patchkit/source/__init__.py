"""The pinned vLLM source: which sources there are, ref resolution, cheap checkouts.

A source is a git URL or local git path (``mirror``), or the word ``pypi`` (``pypi``).  Each
kind of source resolves a ref to a commit in a local repository and lists its tags; the first
source of the list that has the ref wins.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from patchkit import git as g
from patchkit.errors import SourceError
from patchkit.source import mirror, pypi
from patchkit.source.refs import ref_problem, source_problem
from patchkit.source.resolved import Log, Resolved, version_of

BASE_TAG = "patchkit/base"  # the pristine upstream commit of every checkout
T = TypeVar("T")

# The sources named by a word; anything else is a git URL or path.
SPECIAL = {pypi.WORD: pypi}

__all__ = ["BASE_TAG", "Resolved", "checkout", "has_history", "list_tags", "ref_problem",
           "resolve", "source_problem", "version_of"]


def _kind(source: str):
    return SPECIAL.get(source, mirror)


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
    return _kind(source).resolve(source, ref, cache, log)


def list_tags(sources: Sequence[str], cache: Path, log: Log = lambda m: None
              ) -> tuple[str, list[str]]:
    """Every tag the first source that answers has now (a git source is fetched first, so new
    releases show), and that source; ``pypi`` lists the releases on PyPI as ``vX.Y.Z``."""
    return _first_answer(sources, lambda s: _kind(s).tags(s, cache, log), log,
                         "no source could list vLLM releases")


def has_history(source: str) -> bool:
    """Does the source hold the commits between its releases (a git source does; ``pypi``,
    one commit per release, does not)?"""
    return getattr(_kind(source), "HISTORY", True)


def checkout(resolved: Resolved, dest: Path, paths: Sequence[str] | None = None) -> None:
    """Check ``resolved.commit`` out at ``dest`` (new), sharing the mirror's objects; only
    ``paths`` when given."""
    g.clone_shared(resolved.repo, dest, resolved.commit, paths)
    g.tag(dest, BASE_TAG, resolved.commit)
