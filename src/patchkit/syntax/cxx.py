"""C, C++ and CUDA, judged on tree-sitter's syntax tree; owner of tree-sitter.

``in:`` names one function definition (or a class or struct with a body) by its name, by
``Class::method`` or by a namespace-qualified name: the written parts must be the last parts of
the definition's full name (its enclosing namespaces and classes, then its declarator), template
arguments ignored on both sides.  No such definition, or more than one (an overload, a function
defined twice under ``#if`` branches), fails the assertion and says which.

Real headers are macro-heavy and tree-sitter leaves error nodes where a macro hides the syntax.
An assertion is judged inside its own definition: error nodes elsewhere in the file do not
matter, and error nodes inside it fail the assertion, named by line (what the parser could not
read cannot prove anything).  A whole-file assertion (no ``in:``) is judged on what parsed.
"""

from __future__ import annotations

import difflib
import importlib
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from patchkit.syntax.base import GrammarError, Scope, Search, listing

_NAME = r"~?[A-Za-z_][A-Za-z0-9_]*"
_QUALIFIED_RE = re.compile(rf"(::)?{_NAME}(::{_NAME})*\Z")
_CALLED_RE = re.compile(rf"(::)?{_NAME}((::|\.){_NAME})*\Z")
_ERRORS_SHOWN = 5

# Definitions a scope can name, and what each is called by.
_SCOPES = ("function_definition", "class_specifier", "struct_specifier", "union_specifier")
_CLASSES = ("class_specifier", "struct_specifier", "union_specifier")
_LITERALS = ("string_literal", "raw_string_literal", "char_literal", "concatenated_string")
# names whose text is already what `contains` compares (no spaces, no template arguments)
_PLAIN = frozenset({"identifier", "field_identifier", "type_identifier", "namespace_identifier",
                    "number_literal", "true", "false", "nullptr", "statement_identifier"})
_NAMES = ("identifier", "field_identifier", "type_identifier", "namespace_identifier",
          "number_literal", "true", "false", "nullptr", "qualified_identifier",
          "field_expression", "template_function", "template_type", "statement_identifier")


def plain(text: str) -> str:
    """A C++ name without whitespace or template arguments: ``A<T, 2>::f`` -> ``A::f``."""
    if "<" in text:
        text = _untemplated(text)
    return "".join(text.split()).replace("->", ".")


def _untemplated(text: str) -> str:
    """``text`` without its template argument lists (``operator<`` and the like kept)."""
    cut = text.find("operator")
    head, tail = (text, "") if cut < 0 else (text[:cut], text[cut:])
    out: list[str] = []
    depth = 0
    for ch in head:
        if ch == "<":
            depth += 1
        elif ch == ">" and depth:
            depth -= 1
        elif not depth:
            out.append(ch)
    return "".join(out) + tail


def _written(text: str) -> str:
    """A name as the manifest writes it, for checking: template arguments dropped, spaces
    kept (``a b`` is no name)."""
    return _untemplated(text.strip()).replace("->", ".")


def _parts(text: str) -> tuple[str, ...]:
    return tuple(p for p in plain(text).split("::") if p)


class _Grammar:
    """One tree-sitter grammar from PyPI, loaded on first use."""

    def __init__(self, module: str, dist: str) -> None:
        self.module = module
        self.dist = dist
        self._parser: Any = None
        self._language: Any = None
        self._queries: dict[tuple[str, ...], Any] = {}

    def parser(self, name: str) -> Any:
        if self._parser is None:
            try:
                import tree_sitter
                grammar = importlib.import_module(self.module)
                self._language = tree_sitter.Language(grammar.language())
                self._parser = tree_sitter.Parser(self._language)
            except Exception as exc:  # an absent or broken binding: ImportError, OSError, ...
                raise GrammarError(
                    f"cannot load the tree-sitter grammar for {name} files ({self.module}: "
                    f"{type(exc).__name__}: {exc}); install it with `pip install tree-sitter "
                    f"{self.dist}`") from None
        return self._parser

    def nodes(self, node: Any, kinds: tuple[str, ...]) -> list[Any]:
        """Every node of ``kinds`` under ``node`` (itself included), in source order, found by
        a tree-sitter query: the walk runs in C, not node by node in Python."""
        import tree_sitter

        query = self._queries.get(kinds)
        if query is None:
            present = [k for k in kinds if self._language.id_for_node_kind(k, True)]
            query = tree_sitter.Query(self._language,
                                      "[" + " ".join(f"({k})" for k in present) + "] @n")
            self._queries[kinds] = query
        found = tree_sitter.QueryCursor(query).captures(node).get("n", [])
        return sorted(found, key=lambda n: (n.start_byte, -n.end_byte))


@dataclass(frozen=True)
class _Tree:
    root: Any          # tree_sitter.Node
    definitions: list[tuple[tuple[str, ...], Any]]  # (full name parts, node), in source order


def _descendants(node: Any) -> Iterator[Any]:
    """``node`` and everything under it, in source order (a cursor: no list per node)."""
    cursor = node.walk()
    depth = 0
    while True:
        yield cursor.node
        if cursor.goto_first_child():
            depth += 1
            continue
        while True:
            if depth == 0:
                return
            if cursor.goto_next_sibling():
                break
            cursor.goto_parent()
            depth -= 1


def _inside(scope: Scope) -> Iterator[Any]:
    """Every node under the scope's definitions, in source order (not the definition itself)."""
    for top in scope.nodes:
        for child in top.children:
            yield from _descendants(child)


def _text(node: Any) -> str:
    return node.text.decode("utf-8", "replace")


def _declarator_name(node: Any) -> Any | None:
    """The name node a function definition declares (through pointer and reference
    declarators), or None."""
    decl = node.child_by_field_name("declarator")
    while decl is not None and decl.type != "function_declarator":
        inner = decl.child_by_field_name("declarator")
        decl = inner if inner is not None else (decl.named_children[-1]
                                                if decl.named_children else None)
    return None if decl is None else decl.child_by_field_name("declarator")


def _own_name(node: Any) -> tuple[str, ...]:
    if node.type == "function_definition":
        name = _declarator_name(node)
        return _parts(_text(name)) if name is not None else ()
    name = node.child_by_field_name("name")
    return _parts(_text(name)) if name is not None else ()


def _full_name(node: Any) -> tuple[str, ...]:
    """The definition's name with the namespaces and classes around it."""
    outer: list[str] = []
    parent = node.parent
    while parent is not None:
        if parent.type == "namespace_definition" or parent.type in _CLASSES:
            name = parent.child_by_field_name("name")
            if name is not None:
                outer[:0] = _parts(_text(name))
        parent = parent.parent
    return (*outer, *_own_name(node))


def _index(grammar: _Grammar, root: Any) -> list[tuple[tuple[str, ...], Any]]:
    found = []
    for node in grammar.nodes(root, _SCOPES):
        if node.child_by_field_name("body") is not None:
            name = _full_name(node)
            if name:
                found.append((name, node))
    return found


def _errors(node: Any) -> list[int]:
    """The lines of the error and missing nodes under ``node``."""
    if not node.has_error:
        return []
    return sorted({n.start_point[0] + 1 for n in _descendants(node)
                   if n.type == "ERROR" or n.is_missing})


def _enclosing(scope: str, read: tuple[str, ...]) -> str:
    """What the asked ``scope`` puts around the name as it was read: ``flashinfer::``."""
    want = _parts(scope)
    return "::".join(want[:len(want) - len(read)]) + "::"


def _nearest_error(root: Any, lines: Sequence[int]) -> tuple[int, int, int, int] | None:
    """The error or missing node nearest to any of ``lines`` (one that spans a line first,
    the smallest such), as (first line, last line, column, the line of ``lines`` nearest to
    it); None when the file parses clean."""
    if not root.has_error or not lines:
        return None
    best: tuple[tuple[int, int], tuple[int, int, int, int]] | None = None
    for n in _descendants(root):
        if n.type != "ERROR" and not n.is_missing:
            continue
        first, last = n.start_point[0] + 1, n.end_point[0] + 1
        for line in lines:
            away = 0 if first <= line <= last else min(abs(line - first), abs(line - last))
            key = (away, last - first)
            if best is None or key < best[0]:
                best = (key, (first, last, n.start_point[1], line))
    return best[1] if best else None


def _span(first: int, last: int) -> str:
    return f"line {first}" if first == last else f"lines {first} to {last}"


def _scope_of(node: Any, label: str) -> Scope:
    lines = _errors(node)
    trouble = None
    if lines:
        shown = ", ".join(map(str, lines[:_ERRORS_SHOWN]))
        more = f" and {len(lines) - _ERRORS_SHOWN} more" if len(lines) > _ERRORS_SHOWN else ""
        trouble = (f"{label} does not parse: syntax error nodes at line{'s' * (len(lines) > 1)} "
                   f"{shown}{more}; nothing in it can be judged (a macro the parser cannot "
                   "read? errors outside it do not matter)")
    return Scope((node,), label, node.start_point[0] + 1, node.start_point[1], trouble)


# ------------------------------------------------------------------------------------ predicates

def _first(pairs: Iterator[tuple[str, Any]], want: Callable[[str], bool]) -> Search:
    seen: list[str] = []
    for text, node in pairs:
        if want(text):
            return Search(text, node.start_point[0] + 1, node.start_point[1], seen)
        seen.append(text)
    return Search(None, None, None, seen)


def _call_names(scope: Scope) -> Iterator[tuple[str, Any]]:
    for node in _inside(scope):
        if node.type == "call_expression":
            function = node.child_by_field_name("function")
            if function is not None:
                yield plain(_text(function)), node


def _calls(scope: Scope, value: str) -> Search:
    want = plain(value).lstrip(":")
    return _first(_call_names(scope), lambda name: name == want or name.endswith("::" + want)
                  or name.endswith("." + want))


def _bound(declarator: Any) -> Any | None:
    """The identifier a declarator binds (``int *p = 0`` -> ``p``); None for a prototype."""
    while declarator is not None:
        if declarator.type == "function_declarator":
            return None
        if declarator.type in ("identifier", "field_identifier", "type_identifier",
                               "qualified_identifier"):
            return declarator
        inner = declarator.child_by_field_name("declarator")
        declarator = inner if inner is not None else (
            declarator.named_children[-1] if declarator.named_children else None)
    return None


def _definitions(scope: Scope) -> Iterator[tuple[str, str, Any]]:
    """(full name, name as written, node) of each definition inside the scope."""
    for node in _inside(scope):
        kind = node.type
        if kind in _SCOPES or kind == "enum_specifier":
            if node.child_by_field_name("body") is not None:
                own = _own_name(node)
                if own:
                    yield "::".join(_full_name(node)), "::".join(own), node
        elif kind in ("declaration", "field_declaration", "type_definition"):
            for declarator in node.children_by_field_name("declarator"):
                bound = _bound(declarator)
                if bound is not None:
                    name = plain(_text(bound))
                    yield name, name, bound
        elif kind in ("alias_declaration", "preproc_def", "preproc_function_def",
                      "namespace_definition", "concept_definition"):
            name_node = node.child_by_field_name("name")
            if name_node is not None:
                name = plain(_text(name_node))
                yield name, name, name_node


def _defines(scope: Scope, value: str) -> Search:
    want = plain(value).lstrip(":")
    seen: list[str] = []
    for full, shown, node in _definitions(scope):
        if want in (full, shown) or full.endswith("::" + want) or shown.endswith("::" + want):
            return Search(shown, node.start_point[0] + 1, node.start_point[1], seen)
        seen.append(shown)
    return Search(None, None, None, seen)


def _literal(node: Any) -> str:
    kind = node.type
    if kind == "raw_string_literal":
        inner = [c for c in node.children if c.type == "raw_string_content"]
        return _text(inner[0]) if inner else ""
    if kind == "concatenated_string":
        return "".join(_literal(c) for c in node.named_children if c.type in _LITERALS)
    body = _text(node)
    if not body or body[-1] not in "\"'":
        return body
    return body[body.find(body[-1]) + 1:-1]  # after a prefix (u8, L) and the quote


def _mentions(grammar: _Grammar, scope: Scope) -> Iterator[tuple[str, Any]]:
    inside_literal = -1
    for top in scope.nodes:
        for node in grammar.nodes(top, _LITERALS + _NAMES):
            if node.start_byte < inside_literal or node == top:
                continue  # a literal's own pieces
            if node.type in _LITERALS:
                inside_literal = node.end_byte
                yield _literal(node), node
            else:
                text = _text(node)
                yield (text if node.type in _PLAIN else plain(text)), node


_SEARCHES: dict[str, Callable[[_Grammar, Scope, str], Search]] = {
    "defines": lambda grammar, scope, value: _defines(scope, value),
    "calls": lambda grammar, scope, value: _calls(scope, value),
    "contains": lambda grammar, scope, value: _first(_mentions(grammar, scope),
                                                     lambda found: found == value),
}


# ------------------------------------------------------------------------------------ the language

class Cxx:
    """One of C, C++ and CUDA: they differ by grammar alone."""

    predicates = tuple(_SEARCHES)
    compiled = True  # built before it runs (a change needs a rebuild)
    file_label = "the file"

    def __init__(self, name: str, grammar: _Grammar) -> None:
        self.name = name
        self.grammar = grammar

    def ready(self) -> None:
        self.grammar.parser(self.name)

    def scope_problem(self, scope: str) -> str | None:
        if not _QUALIFIED_RE.match(_written(scope)):
            return (f"{scope!r} is not a {self.name} name like function, Class::method or "
                    "ns::function")
        return None

    def value_problem(self, predicate: str, value: str) -> str | None:
        if predicate == "defines" and not _QUALIFIED_RE.match(_written(value)):
            return f"{value!r} is not a {self.name} name like NAME or ns::NAME"
        if predicate == "calls" and not _CALLED_RE.match(_written(value)):
            return f"{value!r} is not a {self.name} callee like name, ns::name or obj.method"
        return None

    def parse(self, text: str, rel: str) -> _Tree:
        tree = self.grammar.parser(self.name).parse(text.encode("utf-8"))
        return _Tree(tree.root_node, _index(self.grammar, tree.root_node))

    def resolve(self, tree: _Tree, scope: str | None, near: Sequence[int] = ()
                ) -> Scope | tuple[Scope, str]:
        top = Scope((tree.root,), self.file_label)
        if not scope:
            return top
        want = _parts(scope)
        hits = [(name, node) for name, node in tree.definitions
                if name[-len(want):] == want]
        if len(hits) == 1:
            return _scope_of(hits[0][1], scope)
        if hits:
            lines = ", ".join(str(node.start_point[0] + 1) for _, node in hits)
            first = hits[0][1]
            where = Scope((first,), scope, first.start_point[0] + 1, first.start_point[1])
            return where, (f"scope {scope} names {len(hits)} definitions (lines {lines}): an "
                           "overload or a definition repeated under #if; an assertion needs "
                           "exactly one")
        # a definition whose name is the end of the one asked for (norm::RMSNorm for
        # flashinfer::norm::RMSNorm) is that name read outside what encloses it: never listed
        # as something else the file defines
        misread = [(name, node) for name, node in tree.definitions
                   if len(name) < len(want) and want[-len(name):] == name]
        names = ["::".join(name) for name, _ in tree.definitions
                 if want[-1] != name[-1]]
        if misread:
            return self._misread(tree, scope, misread[0], names, near)
        tails = {"::".join(name[-len(want):]): "::".join(name) for name, _ in tree.definitions}
        close = difflib.get_close_matches("::".join(want), list(tails), n=1, cutoff=0.7)
        hint = f" (did you mean {tails[close[0]]}?)" if close else ""
        said = f"scope {scope} not found{hint}; the file defines: {listing(names)}"
        error = _nearest_error(tree.root, near) if near else None
        if error is not None:   # the error node nearest to the change, and the change there
            first, last, col, at = error
            where = Scope((tree.root,), scope, at if first <= at <= last else first,
                          0 if first <= at <= last else col)
            return where, (f"{said}; the syntax error node nearest to the change at line {at} "
                           f"({_span(first, last)}) may hide it: a definition inside one is not "
                           "seen")
        errors = _errors(tree.root)
        unread = (f"; a definition inside a syntax error node is not seen (error nodes at "
                  f"line{'s' * (len(errors) > 1)} {', '.join(map(str, errors[:_ERRORS_SHOWN]))}"
                  f"{' and more' if len(errors) > _ERRORS_SHOWN else ''})" if errors else "")
        return top, f"{said}{unread}"

    def _misread(self, tree: _Tree, scope: str, misread: tuple[tuple[str, ...], Any],
                 names: list[str], near: Sequence[int]) -> tuple[Scope, str]:
        """``scope`` is there, but the parser read it as ``misread`` (outside what encloses
        it): a syntax error took the enclosing namespace or class away.  The message names the
        error node nearest to the change (the lines ``near``; else to the definition), and
        points at the change inside it, else at the definition."""
        name, node = misread
        line = node.start_point[0] + 1
        read = f"{'::'.join(name)} at line {line} is read outside {_enclosing(scope, name)}"
        error = _nearest_error(tree.root, near or [line])
        if error is None:
            where = Scope((node,), scope, line, node.start_point[1])
            return where, (f"scope {scope} not found: {read}; the file defines: "
                           f"{listing(names)}")
        first, last, col, at = error
        inside = first <= at <= last
        where = Scope((node,), scope, at if inside else first,
                      (node.start_point[1] if at == line else 0) if inside else col)
        nearest = f"the change at line {at}" if near else "it"
        return where, (f"scope {scope} not found: {read}, because of the syntax error node "
                       f"nearest to {nearest} ({_span(first, last)}; an unbalanced brace, or a "
                       "macro the parser cannot read?)")

    def search(self, predicate: str, scope: Scope, value: str) -> Search:
        return _SEARCHES[predicate](self.grammar, scope, value)

    # -- for transforms -------------------------------------------------------------------------
    def definition_spans(self, text: str, name: str) -> list[tuple[int, int]]:
        """The (start, end) character offsets in ``text`` of every definition ``name`` names,
        by the same rule as ``in:``."""
        data = text.encode("utf-8")
        tree = self.parse(text, "")
        want = _parts(name)
        spans = []
        for full, node in tree.definitions:
            if full[-len(want):] == want:
                top = node.parent if node.parent is not None and \
                    node.parent.type == "template_declaration" else node
                spans.append((len(data[:top.start_byte].decode("utf-8", "replace")),
                              len(data[:node.end_byte].decode("utf-8", "replace"))))
        return spans

    def error_count(self, text: str) -> int:
        """How many error and missing nodes the parser leaves in ``text``."""
        root = self.grammar.parser(self.name).parse(text.encode("utf-8")).root_node
        if not root.has_error:
            return 0
        return sum(1 for n in _descendants(root) if n.type == "ERROR" or n.is_missing)


C = Cxx("C", _Grammar("tree_sitter_c", "tree-sitter-c"))
CPP = Cxx("C++", _Grammar("tree_sitter_cpp", "tree-sitter-cpp"))
CUDA = Cxx("CUDA", _Grammar("tree_sitter_cuda", "tree-sitter-cuda"))
