"""A package's sources (vLLM's by default): which kinds there are, ref resolution, checkouts.

A source is a git URL or local git path (``mirror``), the word ``pypi`` (``pypi``), or the word
``image``, the package installed in a base image (``image``).  Each kind is a
:class:`~patchkit.source.protocol.Source`, found by :func:`kind_of`; it resolves a ref to a commit
in a local repository and lists its tags; the first source of the list that has the ref wins.
Callers ask the kind what it can do (``kind_of(text).has_history``), never which one it is.

The ref ``base`` means what the base image holds: the image source takes it as it is; for the
others it becomes the commit the base's installed version names, or its release tag
(:func:`patchkit.versions.base_pin`), and ranges are judged on the installed version.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from patchkit import git
from patchkit import progress, versions
from patchkit.errors import SourceError, UsageError, clipped
from patchkit.source import image, mirror, pypi
from patchkit.packageid import VLLM, PackageId
from patchkit.source.protocol import Source
from patchkit.source.protocol import Base
from patchkit.source.refs import BASE_REF, ref_problem, source_problem
from patchkit.source.resolved import Log, Resolved, version_of

BASE_TAG = "patchkit/base"  # the pristine upstream commit of every checkout
T = TypeVar("T")

# The kinds of source named by a word; any other text is a git URL or path.  A new kind is
# one module under source/ and one line here.
WORDS: dict[str, Source] = {pypi.WORD: pypi.SOURCE, image.WORD: image.SOURCE}
GIT: Source = mirror.SOURCE

__all__ = ["BASE_REF", "BASE_TAG", "GIT", "VLLM", "WORDS", "Base", "PackageId", "Resolved",
           "Source", "checkout", "kind_of", "list_tags", "ref_problem", "resolve",
           "source_problem", "version_of", "word_problem"]


def kind_of(text: str) -> Source:
    """The kind of source ``text`` names: a word of :data:`WORDS`, else a git URL or path."""
    return WORDS.get(text, GIT)


def word_problem(text: str, here: Path | None = None) -> str | None:
    """Why ``text`` names no source, or None: it is a word of :data:`WORDS`, a URL (``://``, or
    git's ``host:path``), or a path (it holds ``/``, starts with ``.`` or ``~``, or is there in
    ``here``, default the current folder).  Anything else is a typo, said with its nearest
    word, before a mirror is asked (or remembered as unreachable)."""
    text = text.strip()
    if text in WORDS or ":" in text or "/" in text or text.startswith((".", "~")):
        return None
    if os.path.exists((here or Path.cwd()) / text):   # False for a name too long, too
        return None
    words = ", ".join(WORDS)
    near = difflib.get_close_matches(text.lower(), WORDS, n=1, cutoff=0.5)
    hint = f": did you mean {near[0]!r}?" if near else ""
    shown = clipped(text)
    return (f"{shown!r} is neither a URL, a path nor a source word ({words}){hint}"
            + ("" if near else f" (a local folder is written ./{shown})"))


def _check_words(sources: Sequence[str], package: PackageId) -> None:
    for text in sources:
        problem = word_problem(text)
        if problem:
            raise UsageError(f"{package.label} repository {problem}")


def resolve(sources: Sequence[str], ref: str, cache: Path, log: Log = lambda m: None,
            base: Base | None = None, package: PackageId = VLLM) -> Resolved:
    """Try each source of ``package`` in order; the first that has ``ref`` wins.  Each attempt
    is logged.  ``base`` is the base image a ref ``base`` and the source ``image`` read from."""
    problem = ref_problem(ref)
    if problem:
        raise SourceError(f"bad {package.label} ref: {problem}")
    if not sources:
        raise SourceError(f"no {package.label} repository to take the ref from")
    for source in sources:
        problem = source_problem(source)
        if problem:
            raise SourceError(f"bad {package.label} repository: {problem}")
    _check_words(sources, package)
    if ref == BASE_REF and not any(kind_of(s).reads_base for s in sources):
        _pin_of(base, package)  # a base that pins nothing is one error, not one per source
    source, resolved = _first_answer(
        sources, lambda s: _resolve_one(s, ref, cache, log, base, package), log,
        f"no source has {package.label} {ref!r}")
    log(f"{package.label} {resolved.ref} = {resolved.commit[:12]} from {source}")
    return resolved


def _pin_of(base: Base | None, package: PackageId = VLLM) -> versions.Pin:
    """What the ref ``base`` of ``package`` pins in a git source, or why it pins nothing."""
    if base is None:
        raise UsageError(f"{package.option('ref', BASE_REF)} reads the pin from a base image: "
                         "give --base IMAGE or set image.base in patchset.yaml")
    if base.version is None:
        raise SourceError(f"base {base.name}: cannot tell which {package.label} it holds (its "
                          f"{base.package_dir} has no version); patch it as it is with "
                          f"{_as_is(package)}")
    pin = versions.base_pin(base.version)
    if pin is None:
        raise SourceError(f"base {base.name} holds {package.label} {base.version}, which names "
                          "no commit (+g<sha>) and no release; patch it as it is with "
                          f"{_as_is(package)}")
    return pin


def _as_is(package: PackageId) -> str:
    """How a base's package is patched as it is: vLLM's flag, another's manifest key."""
    return package.option("repo", "image")


def _first_answer(sources: Sequence[str], attempt: Callable[[str], T], log: Log,
                  none_answered: str) -> tuple[str, T]:
    """The first source ``attempt`` succeeds on, and its answer; a lone source's error as is."""
    failures: list[str] = []
    for source in sources:
        try:
            return source, attempt(source)
        except SourceError as exc:
            if len(sources) == 1:
                raise   # the run ends on it: the command line says its more with -v
            more = getattr(exc, "more", None)
            if more:
                progress.detail(more)
            # a line that names the source already is not prefixed with it again
            named = str(exc) if exc.source == source else f"source {source}: {exc}"
            log(f"{named}; trying the next")
            failures.append(named)
    raise SourceError(f"{none_answered}: " + "; ".join(failures))


def _resolve_one(source: str, ref: str, cache: Path, log: Log, base: Base | None,
                 package: PackageId) -> Resolved:
    kind = kind_of(source)
    if ref != BASE_REF or kind.reads_base:
        return kind.resolve(source, ref, cache, log, package=package, base=base)
    pin = _pin_of(base, package)
    assert base is not None
    if pin.commit and not kind.holds_commits:
        raise SourceError(f"base {base.name} holds {package.label} {base.version}, built from "
                          f"commit {pin.ref}, and the source {source} holds releases only; name "
                          f"a git source with {package.option('repo', 'URL')}, or patch the base as "
                          f"it is with {_as_is(package)}", source=source)
    log(f"base {base.name} holds {package.label} {base.version}: pinning "
        + (f"commit {pin.ref}" if pin.commit else pin.ref))
    try:
        found = kind.resolve(source, pin.ref, cache, log, package=package, base=base)
    except mirror.MissingError as exc:
        raise mirror.MissingError(
            f"{exc}; base {base.name} holds {package.label} {base.version}, built from it: "
            f"name a source that has it with {package.option('repo', 'URL')}, or patch the base "
            f"as it is with {_as_is(package)}", source=exc.source) from None
    # ranges are judged on what the base holds (a dev build 0.31.1.dev7 is >=0.31)
    return replace(found, version=base.version)


def list_tags(sources: Sequence[str], cache: Path, log: Log = lambda m: None,
              package: PackageId = VLLM) -> tuple[str, list[str]]:
    """Every tag the first source that answers has now (a git source is fetched first, so new
    releases show), and that source; ``pypi`` lists the releases on PyPI as ``vX.Y.Z``."""
    _check_words(sources, package)
    return _first_answer(sources, lambda s: kind_of(s).tags(s, cache, log, package=package),
                         log, f"no source could list {package.label} releases")


def checkout(resolved: Resolved, dest: Path, paths: Sequence[str] | None = None, *,
             scratch: bool = False) -> None:
    """Check ``resolved.commit`` out at ``dest`` (new), sharing the mirror's objects; only
    ``paths`` when given.  A ``scratch`` checkout, removed after the run, holds none of the
    mirror's branches and tags (only its own branch and tag ``patchkit/base``)."""
    git.clone_shared(resolved.repo, dest, resolved.commit, paths, tag=BASE_TAG, refs=not scratch)
