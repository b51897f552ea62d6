"""The pinned vLLM source: which sources there are, ref resolution, cheap checkouts.

A source is a git URL or local git path (``mirror``), the word ``pypi`` (``pypi``), or the word
``image``, the package installed in a base image (``image``).  Each kind of source resolves a
ref to a commit in a local repository and lists its tags; the first source of the list that
has the ref wins.

The ref ``base`` means what the base image holds: the image source takes it as it is; for the
others it becomes the commit the base's installed version names, or its release tag
(:func:`patchkit.versions.base_pin`), and ranges are judged on the installed version.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from patchkit import git as g
from patchkit import versions
from patchkit.errors import SourceError, UsageError
from patchkit.source import image, mirror, pypi
from patchkit.source.image import Base
from patchkit.source.refs import BASE_REF, ref_problem, source_problem
from patchkit.source.resolved import Log, Resolved, version_of

BASE_TAG = "patchkit/base"  # the pristine upstream commit of every checkout
T = TypeVar("T")

# The sources named by a word; anything else is a git URL or path.
SPECIAL = {pypi.WORD: pypi, image.WORD: image}

__all__ = ["BASE_REF", "BASE_TAG", "Base", "Resolved", "checkout", "has_history", "kind_name",
           "list_tags", "reads_base", "ref_problem", "resolve", "source_problem", "version_of"]


def _kind(source: str):
    return SPECIAL.get(source, mirror)


def kind_name(source: str | None) -> str | None:
    """``git``, ``pypi`` or ``image``: the kind of source ``source`` is (None for None)."""
    return _kind(source).NAME if source else None


def reads_base(source: str) -> bool:
    """Whether ``source`` takes its tree from the base image itself."""
    return _kind(source).READS_BASE


def resolve(sources: Sequence[str], ref: str, cache: Path, log: Log = lambda m: None,
            base: Base | None = None) -> Resolved:
    """Try each source in order; the first that has ``ref`` wins.  Each attempt is logged.

    ``base`` is the base image a ref ``base`` and the source ``image`` read from."""
    problem = ref_problem(ref)
    if problem:
        raise SourceError(f"bad vLLM ref: {problem}")
    if not sources:
        raise SourceError("no vLLM repository to take the ref from")
    for source in sources:
        problem = source_problem(source)
        if problem:
            raise SourceError(f"bad vLLM repository: {problem}")
    if ref == BASE_REF and not any(reads_base(s) for s in sources):
        _pin_of(base)  # a base that pins nothing is one error, not one per source
    source, resolved = _first_answer(sources, lambda s: _resolve_one(s, ref, cache, log, base),
                                     log, f"no source has vLLM {ref!r}")
    log(f"vLLM {resolved.ref} = {resolved.commit[:12]} from {source}")
    return resolved


def _pin_of(base: Base | None) -> versions.Pin:
    """What ``--vllm-ref base`` pins in a git source, or why it pins nothing."""
    if base is None:
        raise UsageError("--vllm-ref base reads the pin from a base image: give --base IMAGE or "
                         "set image.base in patchset.yaml")
    if base.version is None:
        raise SourceError(f"base {base.name}: cannot tell which vLLM it holds (its "
                          f"{base.package_dir} has no version); patch it as it is with "
                          "--vllm-repo image")
    pin = versions.base_pin(base.version)
    if pin is None:
        raise SourceError(f"base {base.name} holds vLLM {base.version}, which names no commit "
                          "(+g<sha>) and no release; patch it as it is with --vllm-repo image")
    return pin


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


def _resolve_one(source: str, ref: str, cache: Path, log: Log, base: Base | None) -> Resolved:
    kind = _kind(source)
    if ref != BASE_REF or kind.READS_BASE:
        return kind.resolve(source, ref, cache, log, base=base)
    pin = _pin_of(base)
    assert base is not None
    if pin.commit and not kind.HOLDS_COMMITS:
        raise SourceError(f"base {base.name} holds vLLM {base.version}, built from commit "
                          f"{pin.ref}, and the source {source} holds releases only; name a git "
                          "source with --vllm-repo, or patch the base as it is with "
                          "--vllm-repo image")
    log(f"base {base.name} holds vLLM {base.version}: pinning "
        + (f"commit {pin.ref}" if pin.commit else pin.ref))
    found = kind.resolve(source, pin.ref, cache, log, base=base)
    # ranges are judged on what the base holds (a dev build 0.31.1.dev7 is >=0.31)
    return replace(found, version=base.version)


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
