"""Python, judged with ``ast``: ``in:`` is a dotted scope (``Class.method``, ``func.inner``,
``MODULE_CONSTANT``), found through ``if``/``try``/``with`` blocks but not into nested defs."""

from __future__ import annotations

import ast
import difflib
import re
from collections.abc import Callable, Iterable, Iterator, Sequence

from patchkit.syntax.base import Scope, Search, Unusable, listing

_DOTTED_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")


# ------------------------------------------------------------------------------------ scopes

def _scope(nodes: tuple[ast.AST, ...], label: str) -> Scope:
    """A scope over one or more nodes (a property's getter and setter share a name)."""
    return Scope(nodes, label, getattr(nodes[0], "lineno", 1), getattr(nodes[0], "col_offset", 0))


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


def _resolve(module: ast.Module, dotted: str | None) -> Scope | tuple[Scope, str]:
    """The scope, or ``(deepest scope found, failure message)``."""
    scope = _scope((module,), "the module")
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
                there = f"{owner} defines: {listing(names)}"
            elif isinstance(scope.nodes[0], (ast.Assign, ast.AnnAssign)):
                there = f"{owner} is an assignment, with no scopes inside"
            else:
                there = f"{owner} defines nothing"
            close = difflib.get_close_matches(part, names, n=1, cutoff=0.7)
            hint = (f" (did you mean {'.'.join([*parts[:depth], close[0]])}?)"
                    if close else "")
            return scope, f"scope {dotted} not found{hint}; {there}"
        scope = _scope(found, ".".join(parts[:depth + 1]))
    return scope


# ------------------------------------------------------------------------------------ predicates

def _search(hit: ast.AST | None, hit_text: str | None, seen: list[str]) -> Search:
    if hit is None:
        return Search(None, None, None, seen)
    return Search(hit_text, hit.lineno, hit.col_offset, seen)  # type: ignore[attr-defined]


def _inside(scope: Scope, kinds: tuple[type, ...] = (ast.AST,)) -> list[ast.AST]:
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


def _first(pairs: Iterable[tuple[str, ast.AST]], want: Callable[[str], bool]) -> Search:
    seen: list[str] = []
    for text, node in pairs:
        if want(text):
            return _search(node, text, seen)
        seen.append(text)
    return _search(None, None, seen)


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


def _definitions(scope: Scope) -> Iterator[tuple[str, str, ast.AST]]:
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


def _defines(scope: Scope, name: str) -> Search:
    seen: list[str] = []
    for bound, text, node in _definitions(scope):
        if bound == name or text == name:
            return _search(node, text, seen)
        seen.append(text)
    return _search(None, None, seen)


def _calls(scope: Scope, dotted: str) -> Search:
    calls = ((_dotted(n.func), n) for n in _inside(scope, (ast.Call,)))
    return _first(calls, lambda name: name == dotted or name.endswith("." + dotted))


def _keys(scope: Scope) -> Iterator[tuple[str, ast.AST]]:
    for node in _inside(scope, (ast.Dict, ast.Call)):
        if isinstance(node, ast.Dict):
            for key in node.keys:
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    yield key.value, key
        elif isinstance(node, ast.Call) and _dotted(node.func) == "dict":
            for keyword in node.keywords:
                if keyword.arg is not None:
                    yield keyword.arg, keyword


def _has_key(scope: Scope, key: str) -> Search:
    return _first(_keys(scope), lambda text: text == key)


def _mentions(scope: Scope) -> Iterator[tuple[str, ast.AST]]:
    for node in _inside(scope, (ast.Constant, ast.Name, ast.Attribute)):
        if isinstance(node, ast.Constant):
            if isinstance(node.value, str):
                yield node.value, node
            elif not isinstance(node.value, bytes):
                yield repr(node.value), node
        elif isinstance(node, (ast.Name, ast.Attribute)):
            yield _dotted(node), node


def _contains(scope: Scope, text: str) -> Search:
    return _first(_mentions(scope), lambda found: found == text)


_SEARCHES: dict[str, Callable[[Scope, str], Search]] = {
    "defines": _defines, "calls": _calls, "has_key": _has_key, "contains": _contains,
}


class Python:
    name = "Python"
    predicates = tuple(_SEARCHES)
    compiled = False  # runs from its sources
    file_label = "the module"

    def ready(self) -> None:
        return None  # `ast` is always there

    def scope_problem(self, scope: str) -> str | None:
        if not _DOTTED_RE.match(scope):
            return f"{scope!r} is not a dotted name like Class.method"
        return None

    def value_problem(self, predicate: str, value: str) -> str | None:
        if predicate == "defines" and not value.isidentifier():
            return f"{value!r} is not a Python name"
        if predicate == "calls" and not _DOTTED_RE.match(value):
            return f"{value!r} is not a dotted name like self.method"
        return None

    def parse(self, text: str, rel: str) -> ast.Module | Unusable:
        try:
            return ast.parse(text, filename=rel)
        except SyntaxError as exc:
            col = (exc.offset - 1) if exc.offset else 0
            return Unusable(f"does not parse: {exc.msg}", exc.lineno or 1, max(col, 0))
        except ValueError as exc:  # e.g. NUL bytes in the source
            return Unusable(f"does not parse: {exc}", 1, 0)

    def resolve(self, tree: ast.Module, scope: str | None, near: Sequence[int] = ()
                ) -> Scope | tuple[Scope, str]:
        return _resolve(tree, scope)   # a module that parses has no error node to point at

    def search(self, predicate: str, scope: Scope, value: str) -> Search:
        return _SEARCHES[predicate](scope, value)


PYTHON = Python()
