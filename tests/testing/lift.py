"""Run pieces of the patched vLLM sources without vLLM: lift one definition out of a file with
``ast`` and execute it in a namespace of stubs (no torch, no GPU).  ``Logger`` stands in for
vLLM's logger and keeps what it was told."""

from __future__ import annotations

import ast
import copy
import subprocess
from pathlib import Path
from typing import Any

_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def base_text(tree: Path, rel: str) -> str:
    """The file as upstream shipped it: the checkout's ``patchkit/base`` tag."""
    return subprocess.run(["git", "-C", str(tree), "show", f"patchkit/base:{rel}"],
                          check=True, capture_output=True, text=True).stdout


def find(source: str, dotted: str) -> ast.AST:
    """The definition (def, class or assignment) that ``Class.method`` names, exactly once."""
    node: ast.AST = ast.parse(source)
    for part in dotted.split("."):
        hits = [child for child in getattr(node, "body", ())
                if (isinstance(child, _DEFS) and child.name == part)
                or (isinstance(child, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == part for t in child.targets))]
        assert len(hits) == 1, f"{dotted}: {len(hits)} definitions of {part}"
        node = hits[0]
    return node


def lift(source: str, dotted: str, namespace: dict[str, Any]) -> Any:
    """Execute the definition ``dotted`` of ``source`` in ``namespace`` and return what it binds.

    Decorators and annotations are dropped: a lifted method is a plain function taking ``self``
    (a property's getter included), and annotations need not resolve among the stubs."""
    node = copy.deepcopy(find(source, dotted))
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        node.decorator_list = []
        node.returns = None
        for arg in ast.walk(node.args):
            if isinstance(arg, ast.arg):
                arg.annotation = None
        name = node.name
    elif isinstance(node, ast.ClassDef):
        name = node.name
    else:
        assert isinstance(node, ast.Assign)
        name = dotted.split(".")[-1]
    module = ast.Module(body=[node], type_ignores=[])
    exec(compile(ast.fix_missing_locations(module), f"<{dotted}>", "exec"), namespace)
    return namespace[name]


class Logger:
    """vLLM's logger, keeping each line it is told (its %-arguments filled in)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def _record(self, msg: str, *args: object, **_: object) -> None:
        self.lines.append(msg % args if args else msg)

    info = info_once = warning = warning_once = debug = _record
