"""Syntax-tree assertions: what each patch promises about the patched tree.

An assertion names a file, an optional scope (``Class.method`` in Python, ``Class::method`` in
C++) and one predicate.  The file's language (``patchkit.syntax``, chosen by suffix) parses it,
finds the scope and searches it; this module runs the assertions and words their outcomes.

The file and the scope must exist or the assertion fails, even under ``not``: a check that
cannot find its target proves nothing.  Failures point at the deepest part of the scope that was
found and say what is there, so a renamed method or a moved call is a one-look fix.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from patchkit import paths
from patchkit.kinds import memo
from patchkit.manifest.model import Assertion, Patch
from patchkit.report import AssertionResult
from patchkit import syntax
from patchkit.syntax import Language, Search, Unusable
from patchkit.syntax.base import listing as _listing

Reader = Callable[[str], "str | None"]


class _TreeReader:
    """A reader over a checkout: the file's text, or ``None`` when it is absent; and the lines
    the series changed in it (against the checkout's pristine tag), which a failure message
    may point near.

    A path through a symlink raises :class:`paths.UnsafePathError`, which fails the assertion
    with that message rather than reading outside the checkout.
    """

    def __init__(self, root: Path) -> None:
        self.root = root

    def __call__(self, rel: str) -> str | None:
        path = paths.safe_join(self.root, rel)
        try:
            data = path.read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None
        return data.decode("utf-8")

    def changed(self, rel: str) -> list[int]:
        from patchkit import git
        from patchkit.source import BASE_TAG

        return git.changed_lines(self.root, BASE_TAG, rel)


def tree_reader(root: Path) -> Reader:
    """A reader over a checkout (see ``_TreeReader``)."""
    return _TreeReader(root)


def run_assertions(patches: Iterable[Patch], read: Reader,
                   cache: Path | None = None) -> list[AssertionResult]:
    """Every assertion of every patch, in order; each file is read and parsed once.  What the
    assertions on one file found, when they all hold, is kept by content in the run's
    ``cache`` (``kinds.memo``, space ``assertions``; None: nothing kept): the same file, the
    same assertions and the same judging code give the same results without a parse (a matrix
    meets the same file in many releases, and every run meets it again).  A failure is judged
    afresh each time: its message points at the lines the series changed, which the file's
    text alone does not say."""
    files = _Files(read)
    checks = [(patch.id, assertion) for patch in patches for assertion in patch.verify]
    by_file: dict[str, list[int]] = {}
    for n, (_id, assertion) in enumerate(checks):
        by_file.setdefault(assertion.file, []).append(n)
    results: list[AssertionResult | None] = [None] * len(checks)
    for rel, at in by_file.items():
        mine = [checks[n] for n in at]
        key = files.key(rel, mine) if cache is not None else None
        found = _kept(cache, key, len(mine)) if key else None
        if found is None:
            found = [_check(patch_id, assertion, files) for patch_id, assertion in mine]
            if key and all(r.ok for r in found):
                memo.keep(cache, SPACE, key, [r.to_dict() for r in found])
        for n, result in zip(at, found):
            results[n] = result
    return [r for r in results if r is not None]


SPACE = "assertions"
FORMAT = "patchkit-assertions/1"
# the code that judges: this module and the languages
_JUDGES = [Path(__file__), *sorted(Path(syntax.__file__).parent.glob("*.py"))]
_judges: list[bytes] = []


def _kept(cache: Path | None, key: str, count: int) -> list[AssertionResult] | None:
    def read(data: list) -> list[AssertionResult]:
        found = [AssertionResult.from_dict(d) for d in data]
        if len(found) != count:
            raise ValueError(f"{len(found)} results where {count} assertions were judged")
        return found

    return memo.kept(cache, SPACE, key, read)


def _spec(assertion: Assertion) -> list:
    """What an assertion asks, without where the manifest says it."""
    inner = _spec(assertion.negated) if assertion.negated is not None else None
    return [assertion.file, assertion.scope, assertion.predicate, assertion.value, inner]


# ------------------------------------------------------------------------------------ files

class _Files:
    def __init__(self, read: Reader) -> None:
        self.read = read
        self.cache: dict[str, object] = {}
        self.texts: dict[str, str | Unusable] = {}
        self.lines: dict[str, list[int]] = {}

    def changed(self, rel: str) -> list[int]:
        """The lines the series changed in ``rel``, where the reader can tell (a checkout);
        asked only for a failure's message, once per file."""
        if rel not in self.lines:
            changed = getattr(self.read, "changed", None)
            try:
                self.lines[rel] = changed(rel) if changed is not None else []
            except Exception:  # noqa: BLE001  # a hint for a message, never a failure itself
                self.lines[rel] = []
        return self.lines[rel]

    def key(self, rel: str, checks: list[tuple[str, Assertion]]) -> str | None:
        """The digest of everything the results of ``checks`` on ``rel`` depend on; None when
        the file cannot be read (then they are not kept)."""
        text = self.text(rel)
        if isinstance(text, Unusable):
            return None
        language = syntax.for_file(rel)
        if not _judges:
            _judges.extend(p.read_bytes() for p in _JUDGES)
        h = memo.Digest(FORMAT)
        for code in _judges:
            h.add("judge", code)
        h.add("language", f"{language.name} {language.engine}".encode())
        h.add("file", rel.encode())
        h.add("text", text.encode("utf-8", "surrogateescape"))
        h.add("checks", json.dumps([[i, _spec(a)] for i, a in checks]).encode())
        return h.hexdigest()

    def text(self, rel: str) -> str | Unusable:
        if rel not in self.texts:
            self.texts[rel] = self._read(rel)
        return self.texts[rel]

    def _read(self, rel: str) -> str | Unusable:
        try:
            text = self.read(rel)
        except paths.UnsafePathError as exc:
            return Unusable(f"cannot read: {exc}")
        except UnicodeDecodeError as exc:
            return Unusable(f"not UTF-8 text ({exc.reason} at byte {exc.start})")
        except OSError as exc:
            return Unusable(f"cannot read: {exc.strerror or exc}")
        if text is None:
            return Unusable("no such file")
        return text

    def parse(self, rel: str, language: Language) -> object:
        if rel not in self.cache:
            text = self.text(rel)
            self.cache[rel] = text if isinstance(text, Unusable) else language.parse(text, rel)
        return self.cache[rel]


# ------------------------------------------------------------------------------------ predicates

def _closest(value: str, search: Search) -> str:
    candidates = [text for text in dict.fromkeys(search.seen) if len(text) <= 200]
    close = [text for text in candidates if value in text][:5]
    close += [text for text in difflib.get_close_matches(value, candidates, n=5, cutoff=0.6)
              if text not in close]
    if not close:
        return f"nothing close among {len(candidates)} strings and names there"
    return "closest there: " + ", ".join(repr(text) for text in close[:5])


@dataclass(frozen=True)
class _Predicate:
    """One predicate: how it searches a scope, and how each outcome is said."""

    found: Callable[[str, str, Search], str]    # (scope label, value, search)
    absent: Callable[[str, str], str]            # (scope label, value)
    there: Callable[[str, Search], str]         # (value, search): what the scope holds


_PREDICATES: dict[str, _Predicate] = {
    "defines": _Predicate(lambda at, v, s: f"{at} defines {v}",
                          lambda at, v: f"{v} is not defined in {at}",
                          lambda v, s: f"defined there: {_listing(s.seen)}"),
    "calls": _Predicate(lambda at, v, s: f"{at} calls {s.hit_text}",
                        lambda at, v: f"no call to {v} in {at}",
                        lambda v, s: f"calls there: {_listing(s.seen)}"),
    "has_key": _Predicate(lambda at, v, s: f"{at} has the key {v!r}",
                          lambda at, v: f"no key {v!r} in {at}",
                          lambda v, s: f"keys there: {_listing([repr(k) for k in s.seen])}"),
    "contains": _Predicate(lambda at, v, s: f"{at} contains {v!r}",
                           lambda at, v: f"no string or name {v!r} in {at}", _closest),
}


def _check(patch_id: str, assertion: Assertion, files: _Files) -> AssertionResult:
    """One assertion against the (cached) parsed files."""

    def result(ok: bool, message: str, line: int | None, col: int | None) -> AssertionResult:
        return AssertionResult(patch=patch_id, file=assertion.file, line=line, col=col, ok=ok,
                               message=message)

    language = syntax.for_file(assertion.file)
    tree = files.parse(assertion.file, language)
    if isinstance(tree, Unusable):
        return result(False, tree.message, tree.line, tree.col)
    resolved = language.resolve(tree, assertion.scope)
    if isinstance(resolved, tuple):   # said again near what the series changed in the file
        resolved = language.resolve(tree, assertion.scope, near=files.changed(assertion.file))
    if isinstance(resolved, tuple):
        deepest, message = resolved
        return result(False, message, deepest.line, deepest.col)
    scope = resolved
    if scope.trouble:
        return result(False, scope.trouble, scope.line, scope.col)

    negate = assertion.predicate == "not"
    inner = assertion.negated if negate else assertion
    assert inner is not None and inner.value is not None, assertion
    predicate = _PREDICATES[inner.predicate]
    search = language.search(inner.predicate, scope, inner.value)
    if search.found:
        found = predicate.found(scope.label, inner.value, search)
        if negate:
            return result(False, f"{found}, which it must not", search.line, search.col)
        return result(True, found, search.line, search.col)
    absent = predicate.absent(scope.label, inner.value)
    if negate:
        return result(True, absent, scope.line, scope.col)
    there = predicate.there(inner.value, search)
    return result(False, f"{absent}; {there}", scope.line, scope.col)
