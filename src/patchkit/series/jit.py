"""The compiled consequence of a patch: which JIT modules a package builds from a patched file.

FlashInfer compiles its CUDA sources at first use, one module per ``gen_jit_spec(NAME,
SOURCES, ..., extra_include_paths=...)`` call in ``flashinfer/jit/**.py``; a module is built from
a file when the file is one of its sources or is reached from them through ``#include``.  This
module reads both from the package's own checkout, as data:

* the folders the definitions name (``jit_env.FLASHINFER_CSRC_DIR``) from the assignments of
  ``flashinfer/jit/env.py`` (``_package_root / "data" / "csrc"``);
* each definition's name: a string, or an f-string whose fields are parameters of the defining
  function, expanded with the constant arguments of every call of that function
  (``f"fused_moe_{device_arch}"`` with ``"89" ... "120"``); a field that is no such parameter
  stays as written (``{uri}``), naming a family of modules;
* each definition's sources and include folders: every path built from those folders inside
  the defining function (a file is a source, a folder an include root, an f-string part a
  wildcard);
* the ``#include`` lines of every file reached from the sources, resolved against the including
  file's folder and every include root of any module: a file present in several roots is taken
  from each, so the modules named are never fewer than those built from the file.

What is not covered: sources a definition renders from a template into the cache at run time
(their template file is named when the function names it), a path held in a module-level
constant, and modules loaded as prebuilt cubins.  The rules live in
:data:`patchkit.jitrules.RULES`, by distribution.
"""

from __future__ import annotations

import ast
import fnmatch
import itertools
import os
import posixpath
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path


from patchkit import syntax
from patchkit.jitrules import JitRules, rules_for


@dataclass
class Module:
    name: str
    function: str        # the defining function, e.g. gen_cutlass_fused_moe_module
    definition: str      # the file that holds it
    sources: set[str] = field(default_factory=set)
    includes: set[str] = field(default_factory=set)


# `#include` anywhere on a line (one in a comment too: the modules named are never fewer)
_INCLUDE_RE = re.compile(rb'#[ \t]*include[ \t]*([<"])([^>"\n]+)[>"]')


class Graph:
    """The modules of one checkout and the include graph of their sources."""

    def __init__(self, root: Path, rules: JitRules) -> None:
        self.root = root
        self.rules = rules
        self.files = _index(root, rules.package_dir)
        env = _env_paths(root, rules)
        self.modules = _modules(root, rules, env, self.files)
        roots: dict[str, None] = {}
        for name in rules.include_roots:
            roots.update(dict.fromkeys(env.get(name, [])))
        for module in self.modules:
            roots.update(dict.fromkeys(sorted(module.includes)))
        self.roots = list(roots)
        self.included_by: dict[str, set[str]] = {}
        self._walk({s for m in self.modules for s in m.sources})

    def _walk(self, start: set[str]) -> None:
        seen = set(start)
        todo = list(start)
        files = self.files
        from_roots: dict[str, list[str]] = {}   # an include -> what the roots give for it
        while todo:
            path = todo.pop()
            try:
                data = (self.root / path).read_bytes()
            except OSError:
                continue
            here = path.rsplit("/", 1)[0]
            for form, name in _INCLUDE_RE.findall(data):
                rel = name.decode("utf-8", "replace").strip()
                targets = from_roots.get(rel)
                if targets is None:
                    targets = [t for t in (_join(r, rel) for r in self.roots) if t in files]
                    from_roots[rel] = targets
                if form == b'"':
                    near = _join(here, rel)
                    if near in files:
                        targets = [near, *targets]
                for target in targets:
                    self.included_by.setdefault(target, set()).add(path)
                    if target not in seen:
                        seen.add(target)
                        todo.append(target)

    def reaching(self, path: str) -> set[str]:
        """``path`` and every file that includes it, directly or not."""
        found = {path}
        todo = [path]
        while todo:
            for parent in self.included_by.get(todo.pop(), ()):
                if parent not in found:
                    found.add(parent)
                    todo.append(parent)
        return found

    def modules_of(self, path: str) -> list[str]:
        """The modules built from ``path``, in natural order."""
        reach = self.reaching(path)
        names = {m.name for m in self.modules if m.sources & reach}
        return sorted(names, key=_natural)

    def compiled(self, path: str) -> bool:
        """Whether ``path`` is something this package compiles (a source or reached by one)."""
        return path in self.included_by or any(path in m.sources for m in self.modules) \
            or syntax.for_file(path).compiled


def modules_for(root: Path, dist: str, paths: Iterable[str]) -> dict[str, list[str]]:
    """For each of ``paths`` that the package ``dist`` (checked out at ``root``) compiles, the
    JIT modules built from it; {} for a package without JIT rules."""
    rules = rules_for(dist)
    # Python files are never compiled: a series of them costs no graph
    wanted = [p for p in dict.fromkeys(paths) if rules and p.startswith(rules.package_dir + "/")
              and not p.endswith((".py", ".pyi"))]
    if rules is None or not wanted:
        return {}
    graph = Graph(root, rules)
    return {p: graph.modules_of(p) for p in wanted if graph.compiled(p)}


# ------------------------------------------------------------------------------------ reading

def _join(base: str, rel: str) -> str:
    if rel.startswith(("./", "../", "/")) or "/." in rel:
        return posixpath.normpath(posixpath.join(base, rel))
    return f"{base}/{rel}"


def _natural(text: str) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def _index(root: Path, package_dir: str) -> set[str]:
    out: set[str] = set()
    top = root / package_dir
    for folder, dirs, names in os.walk(top):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        rel = os.path.relpath(folder, root).replace(os.sep, "/")
        out.update(f"{rel}/{n}" for n in names)
        out.update(f"{rel}/{d}/" for d in dirs)
    return out


def _env_paths(root: Path, rules: JitRules) -> dict[str, list[str]]:
    """NAME -> the checkout paths an env module's assignment names."""
    path = root / rules.package_dir / rules.env_module
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return {}
    known = {rules.package_root: [rules.package_dir]}
    for node in tree.body:
        target = value = None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        if isinstance(target, ast.Name) and value is not None:
            paths = _paths(value, lambda name: known.get(name))
            if paths:
                known[target.id] = paths
    known.pop(rules.package_root)
    return known


def _paths(expr: ast.AST, lookup) -> list[str] | None:
    """The paths (globs where an f-string part is unknown) an expression builds, or None."""
    if isinstance(expr, ast.Name):
        return lookup(expr.id)
    if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
        return lookup(expr.attr)
    if isinstance(expr, ast.List):
        out: list[str] = []
        for element in expr.elts:
            got = _paths(element, lookup)
            if got is None:
                return None
            out += got
        return out
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Div):
        left = _paths(expr.left, lookup)
        part = _part(expr.right)
        if left is None or part is None:
            return None
        return [posixpath.normpath(posixpath.join(base, part)) for base in left]
    return None


def _part(expr: ast.AST) -> str | None:
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return expr.value
    if isinstance(expr, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "*" for v in expr.values)
    return None


def _definition_files(root: Path, rules: JitRules) -> list[Path]:
    needles = [f"{name}(".encode() for name in rules.spec_functions]
    out = []
    for path in sorted((root / rules.package_dir).rglob("*.py")):
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if any(n in data for n in needles):
            out.append(path)
    return out


def _called(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None


def _modules(root: Path, rules: JitRules, env: Mapping[str, list[str]],
             files: set[str]) -> list[Module]:
    parsed = []
    for path in _definition_files(root, rules):
        try:
            text = path.read_text(encoding="utf-8")
            parsed.append((path.relative_to(root).as_posix(), text, ast.parse(text)))
        except (SyntaxError, ValueError, OSError):
            continue
    specs: list[tuple[str, dict[str, str], ast.FunctionDef, list[ast.Call]]] = []
    for rel, text, tree in parsed:
        consts = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
                  for t in n.targets if isinstance(t, ast.Name)
                  and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)}
        lines = [n for n, line in enumerate(text.splitlines(), 1)
                 if any(f"{name}(" in line for name in rules.spec_functions)]
        for fn in _functions(tree):
            if not any(fn.lineno <= n <= (fn.end_lineno or fn.lineno) for n in lines):
                continue
            found = [c for c in _own_calls(fn) if _called(c) in rules.spec_functions]
            if found:
                specs.append((rel, consts, fn, found))
    # the calls of the functions whose names build a module's name from their arguments
    wanted = {fn.name for _, _, fn, _ in specs}
    calls: dict[str, list[ast.Call]] = {}
    for _, text, tree in parsed:
        if any(f"{name}(" in text for name in wanted):
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and _called(node) in wanted:
                    calls.setdefault(_called(node), []).append(node)  # type: ignore[arg-type]
    out: list[Module] = []
    for rel, consts, fn, found in specs:
        sources, includes = _function_paths(fn, env.get, files)
        for spec in found:
            for name in _names(spec, fn, calls, rules, consts):
                # a name with a field left is a family of modules: say whose
                shown = f"{fn.name}:{name}" if "{" in name else name
                out.append(Module(shown, fn.name, rel, set(sources), set(includes)))
    return out


def _functions(tree: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    """Every function definition, found through statements alone (no expression is walked)."""
    out = []
    todo = [tree]
    while todo:
        node = todo.pop()
        for child in getattr(node, "body", ()) or ():
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append(child)
            if isinstance(child, ast.stmt):
                todo.append(child)
        for name in ("orelse", "finalbody", "handlers"):
            todo.extend(getattr(node, name, ()) or ())
    return out


def _own_calls(fn: ast.AST) -> list[ast.Call]:
    """The calls in ``fn``'s body, not in functions defined inside it."""
    out: list[ast.Call] = []
    todo = list(ast.iter_child_nodes(fn))
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Call):
            out.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return out


def _function_paths(fn: ast.AST, lookup, files: set[str]) -> tuple[set[str], set[str]]:
    """(source files, include folders) among the paths a function builds."""
    sources: set[str] = set()
    includes: set[str] = set()
    todo = list(ast.iter_child_nodes(fn))
    while todo:
        node = todo.pop()
        got = _paths(node, lookup) if isinstance(node, ast.BinOp) else None
        if got is None:
            todo.extend(ast.iter_child_nodes(node))
            continue
        for path in got:
            if "*" in path:
                sources.update(f for f in files if not f.endswith("/")
                               and fnmatch.fnmatchcase(f, path))
            elif path in files:
                sources.add(path)
            elif path + "/" in files:
                includes.add(path)
    return sources, includes


def _names(spec: ast.Call, fn: ast.FunctionDef | ast.AsyncFunctionDef,
           calls: Mapping[str, list[ast.Call]], rules: JitRules,
           consts: Mapping[str, str]) -> list[str]:
    arg = spec.args[0] if spec.args else next(
        (k.value for k in spec.keywords if k.arg == rules.name_keyword), None)
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return [arg.value]
    params = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)]
    if isinstance(arg, ast.Name):
        return [consts.get(arg.id, f"{{{arg.id}}}")]
    if not isinstance(arg, ast.JoinedStr):
        return [f"{{{ast.unparse(arg)}}}" if arg is not None else "{?}"]
    pieces: list[list[str]] = []
    for value in arg.values:
        if isinstance(value, ast.Constant):
            pieces.append([str(value.value)])
            continue
        inner = value.value
        shown = f"{{{ast.unparse(inner)}}}"
        if isinstance(inner, ast.Name) and inner.id in params:
            found = _constant_arguments(calls.get(fn.name, []), params.index(inner.id), inner.id)
            pieces.append(found or [shown])
        else:
            pieces.append([shown])
    return ["".join(p) for p in itertools.product(*pieces)]


def _constant_arguments(calls: Sequence[ast.Call], index: int, keyword: str) -> list[str]:
    """The constant strings every call passes at ``index`` (or as ``keyword``); [] when any
    call passes something else."""
    out: list[str] = []
    for call in calls:
        arg = call.args[index] if len(call.args) > index else next(
            (k.value for k in call.keywords if k.arg == keyword), None)
        if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
            return []
        out.append(arg.value)
    return list(dict.fromkeys(out))
