"""AST assertions: what each patch promises about the patched tree, checked with ``ast``.

An assertion names a file, an optional dotted scope (``Class.method``, ``func.inner``,
``MODULE_CONSTANT``) and one predicate.  The file and the scope must exist or the assertion fails,
even under ``not``: a check that cannot find its target proves nothing.  Failures point at the
deepest part of the scope that was found and say what is there, so a renamed method or a moved
call is a one-look fix.
"""

from __future__ import annotations

import ast
import difflib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from patchkit import paths
from patchkit.manifest.model import Assertion, Patch
from patchkit.report import AssertionResult

Reader = Callable[[str], "str | None"]

_LISTED = 10  # names shown in a failure message before "... (N more)"


def tree_reader(root: Path) -> Reader:
    """A reader over a checkout: the file's text, or ``None`` when it is absent.

    A path through a symlink raises :class:`paths.UnsafePathError`, which fails the assertion
    with that message rather than reading outside the checkout.
    """

    def read(rel: str) -> str | None:
        path = paths.safe_join(root, rel)
        try:
            data = path.read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None
        return data.decode("utf-8")

    return read


def run_assertions(patches: Iterable[Patch], read: Reader) -> list[AssertionResult]:
    """Every assertion of every patch, in order; each file is read and parsed once."""
    files = _Files(read)
    return [_check(patch.id, assertion, files) for patch in patches for assertion in patch.verify]


# ------------------------------------------------------------------------------------ files

@dataclass(frozen=True)
class _Unusable:
    message: str
    line: int | None = None
    col: int | None = None


class _Files:
    def __init__(self, read: Reader) -> None:
        self.read = read
        self.cache: dict[str, ast.Module | _Unusable] = {}

    def parse(self, rel: str) -> ast.Module | _Unusable:
        if rel not in self.cache:
            self.cache[rel] = self._parse(rel)
        return self.cache[rel]

    def _parse(self, rel: str) -> ast.Module | _Unusable:
        try:
            text = self.read(rel)
        except paths.UnsafePathError as exc:
            return _Unusable(f"cannot read: {exc}")
        except UnicodeDecodeError as exc:
            return _Unusable(f"not UTF-8 text ({exc.reason} at byte {exc.start})")
        except OSError as exc:
            return _Unusable(f"cannot read: {exc.strerror or exc}")
        if text is None:
            return _Unusable("no such file")
        try:
            return ast.parse(text, filename=rel)
        except SyntaxError as exc:
            col = (exc.offset - 1) if exc.offset else 0
            return _Unusable(f"does not parse: {exc.msg}", exc.lineno or 1, max(col, 0))
        except ValueError as exc:  # e.g. NUL bytes in the source
            return _Unusable(f"does not parse: {exc}", 1, 0)


# ------------------------------------------------------------------------------------ scopes

@dataclass(frozen=True)
class _Scope:
    nodes: tuple[ast.AST, ...]   # one or more (a property's getter and setter share a name)
    label: str                   # "the module" or the dotted scope

    @property
    def line(self) -> int:
        return getattr(self.nodes[0], "lineno", 1)

    @property
    def col(self) -> int:
        return getattr(self.nodes[0], "col_offset", 0)


_COMPOUND_FIELDS = ("body", "orelse", "handlers", "finalbody", "cases")


def _statements(node: ast.AST) -> Iterator[ast.stmt]:
    """Statements that belong to ``node``'s own body, through if/try/with/for/match blocks
    (``if TYPE_CHECKING:`` and ``try: import`` guards are common), but not into nested defs."""
    for name in _COMPOUND_FIELDS:
        for child in getattr(node, name, None) or ():
            if isinstance(child, (ast.stmt, ast.excepthandler, ast.match_case)):
                if isinstance(child, ast.stmt):
                    yield child
                if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    yield from _statements(child)


def _members(node: ast.AST) -> Iterator[tuple[str, ast.AST]]:
    """The names a scope step can resolve to inside ``node``, with their nodes."""
    for stmt in _statements(node):
        if isinstance(stmt, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            yield stmt.name, stmt
        elif isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                if isinstance(target, ast.Name):
                    yield target.id, stmt
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            yield stmt.target.id, stmt


def _resolve(module: ast.Module, dotted: str | None) -> _Scope | tuple[_Scope, str]:
    """The scope, or ``(deepest scope found, failure message)``."""
    scope = _Scope((module,), "the module")
    if not dotted:
        return scope
    parts = dotted.split(".")
    for depth, part in enumerate(parts):
        found = tuple(node for parent in scope.nodes
                      for name, node in _members(parent) if name == part)
        if not found:
            names = [name for parent in scope.nodes for name, _ in _members(parent)]
            owner = scope.label if depth else "the module"
            if names:
                there = f"{owner} defines: {_listing(names)}"
            elif isinstance(scope.nodes[0], (ast.Assign, ast.AnnAssign)):
                there = f"{owner} is an assignment, with no scopes inside"
            else:
                there = f"{owner} defines nothing"
            close = difflib.get_close_matches(part, names, n=1, cutoff=0.7)
            hint = (f" (did you mean {'.'.join([*parts[:depth], close[0]])}?)"
                    if close else "")
            return scope, f"scope {dotted} not found{hint}; {there}"
        scope = _Scope(found, ".".join(parts[:depth + 1]))
    return scope


# ------------------------------------------------------------------------------------ predicates

@dataclass(frozen=True)
class _Search:
    hit: ast.AST | None
    hit_text: str | None       # how the hit reads, e.g. "self._verify_draft_quant_path"
    seen: list[str]            # what was there instead, in source order, for the message


def _inside(scope: _Scope, kinds: tuple[type, ...] = (ast.AST,)) -> list[ast.AST]:
    """Every node of ``kinds`` within the scope (not the scope's own def), in source order;
    nodes at one place in the order ``ast.walk`` meets them."""
    nodes: list[ast.AST] = []
    for top in scope.nodes:
        for child in ast.iter_child_nodes(top):
            nodes.extend(n for n in _walk(child) if isinstance(n, kinds))
    return sorted((n for n in nodes if hasattr(n, "lineno")),
                  key=lambda n: (n.lineno, n.col_offset))


def _walk(node: ast.AST) -> list[ast.AST]:
    """``ast.walk(node)`` as a list, in its order, without a generator per node: the search
    of a big module is most of an assertion's time."""
    found = [node]
    for n in found:  # grows as it goes: breadth first, as ast.walk
        for name in n._fields:
            value = getattr(n, name, None)
            if isinstance(value, ast.AST):
                found.append(value)
            elif isinstance(value, list):
                found.extend(v for v in value if isinstance(v, ast.AST))
    return found


_DEFINING = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef, ast.Assign, ast.AnnAssign,
             ast.NamedExpr, ast.alias)


def _first(pairs: Iterable[tuple[str, ast.AST]], want: Callable[[str], bool]) -> _Search:
    seen: list[str] = []
    for text, node in pairs:
        if want(text):
            return _Search(node, text, seen)
        seen.append(text)
    return _Search(None, None, seen)


def _dotted(expr: ast.AST) -> str:
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        return f"{_dotted(expr.value)}.{expr.attr}"
    if isinstance(expr, ast.Call):
        return f"{_dotted(expr.func)}()"
    if isinstance(expr, ast.Subscript):
        return f"{_dotted(expr.value)}[]"
    return f"<{type(expr).__name__.lower()}>"


def _targets(target: ast.AST) -> Iterator[tuple[str, str, ast.AST]]:
    """(bound name, how it reads, node) for an assignment target."""
    if isinstance(target, ast.Name):
        yield target.id, target.id, target
    elif isinstance(target, ast.Attribute):
        yield target.attr, _dotted(target), target
    elif isinstance(target, (ast.Tuple, ast.List)):
        for element in target.elts:
            yield from _targets(element)
    elif isinstance(target, ast.Starred):
        yield from _targets(target.value)


def _definitions(scope: _Scope) -> Iterator[tuple[str, str, ast.AST]]:
    for node in _inside(scope, _DEFINING):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node.name, node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                yield from _targets(target)
        elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)):
            yield from _targets(node.target)
        elif isinstance(node, ast.alias):
            bound = node.asname or node.name
            yield bound, bound, node
            if not node.asname and "." in node.name:  # `import a.b` binds `a`
                yield node.name.split(".")[0], node.name, node


def _defines(scope: _Scope, name: str) -> _Search:
    seen: list[str] = []
    for bound, text, node in _definitions(scope):
        if bound == name or text == name:
            return _Search(node, text, seen)
        seen.append(text)
    return _Search(None, None, seen)


def _calls(scope: _Scope, dotted: str) -> _Search:
    calls = ((_dotted(n.func), n) for n in _inside(scope, (ast.Call,)))
    return _first(calls, lambda name: name == dotted or name.endswith("." + dotted))


def _keys(scope: _Scope) -> Iterator[tuple[str, ast.AST]]:
    for node in _inside(scope, (ast.Dict, ast.Call)):
        if isinstance(node, ast.Dict):
            for key in node.keys:
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    yield key.value, key
        elif isinstance(node, ast.Call) and _dotted(node.func) == "dict":
            for keyword in node.keywords:
                if keyword.arg is not None:
                    yield keyword.arg, keyword


def _has_key(scope: _Scope, key: str) -> _Search:
    return _first(_keys(scope), lambda text: text == key)


def _mentions(scope: _Scope) -> Iterator[tuple[str, ast.AST]]:
    for node in _inside(scope, (ast.Constant, ast.Name, ast.Attribute)):
        if isinstance(node, ast.Constant):
            if isinstance(node.value, str):
                yield node.value, node
            elif not isinstance(node.value, bytes):
                yield repr(node.value), node
        elif isinstance(node, (ast.Name, ast.Attribute)):
            yield _dotted(node), node


def _contains(scope: _Scope, text: str) -> _Search:
    return _first(_mentions(scope), lambda found: found == text)


def _closest(value: str, search: _Search) -> str:
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

    search: Callable[[_Scope, str], _Search]
    found: Callable[[str, str, _Search], str]    # (scope label, value, search)
    absent: Callable[[str, str], str]            # (scope label, value)
    there: Callable[[str, _Search], str]         # (value, search): what the scope holds


_PREDICATES: dict[str, _Predicate] = {
    "defines": _Predicate(_defines, lambda at, v, s: f"{at} defines {v}",
                          lambda at, v: f"{v} is not defined in {at}",
                          lambda v, s: f"defined there: {_listing(s.seen)}"),
    "calls": _Predicate(_calls, lambda at, v, s: f"{at} calls {s.hit_text}",
                        lambda at, v: f"no call to {v} in {at}",
                        lambda v, s: f"calls there: {_listing(s.seen)}"),
    "has_key": _Predicate(_has_key, lambda at, v, s: f"{at} has the key {v!r}",
                          lambda at, v: f"no key {v!r} in {at}",
                          lambda v, s: f"keys there: {_listing([repr(k) for k in s.seen])}"),
    "contains": _Predicate(_contains, lambda at, v, s: f"{at} contains {v!r}",
                           lambda at, v: f"no string or name {v!r} in {at}", _closest),
}


def _check(patch_id: str, assertion: Assertion, files: _Files) -> AssertionResult:
    """One assertion against the (cached) parsed files."""

    def result(ok: bool, message: str, line: int | None, col: int | None) -> AssertionResult:
        return AssertionResult(patch=patch_id, file=assertion.file, line=line, col=col, ok=ok,
                               message=message)

    module = files.parse(assertion.file)
    if isinstance(module, _Unusable):
        return result(False, module.message, module.line, module.col)
    resolved = _resolve(module, assertion.scope)
    if isinstance(resolved, tuple):
        deepest, message = resolved
        return result(False, message, deepest.line, deepest.col)
    scope = resolved

    negate = assertion.predicate == "not"
    inner = assertion.negated if negate else assertion
    assert inner is not None and inner.value is not None, assertion
    predicate = _PREDICATES[inner.predicate]
    search = predicate.search(scope, inner.value)
    if search.hit is not None:
        line, col = search.hit.lineno, search.hit.col_offset  # type: ignore[attr-defined]
        found = predicate.found(scope.label, inner.value, search)
        if negate:
            return result(False, f"{found}, which it must not", line, col)
        return result(True, found, line, col)
    absent = predicate.absent(scope.label, inner.value)
    if negate:
        return result(True, absent, scope.line, scope.col)
    there = predicate.there(inner.value, search)
    return result(False, f"{absent}; {there}", scope.line, scope.col)


def _listing(items: Iterable[str]) -> str:
    unique = list(dict.fromkeys(items))
    if not unique:
        return "none"
    shown = ", ".join(unique[:_LISTED])
    more = len(unique) - _LISTED
    return f"{shown}, ... ({more} more)" if more > 0 else shown
