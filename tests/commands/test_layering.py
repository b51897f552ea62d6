"""The shape of the commands, read from their syntax trees: every command function stays short
and takes few parameters (the run value carries the rest), and an engine is connected by the
verbs alone.  That no command imports another (what two commands share lives in a library
module) is the `verbs` contract of pyproject.toml, which tests/test_layers.py runs."""

from __future__ import annotations

import ast
from pathlib import Path

import patchkit

SRC = Path(patchkit.__file__).parent
COMMANDS = SRC / "commands"
MAX_LINES = 50
MAX_PARAMS = 8


def _trees(folder: Path):
    for path in sorted(folder.rglob("*.py")):
        yield path, ast.parse(path.read_text(encoding="utf-8"), str(path))


def _params(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = node.args
    names = [*a.posonlyargs, *a.args, *a.kwonlyargs]
    if names and names[0].arg in ("self", "cls"):
        names = names[1:]
    return len(names) + (a.vararg is not None) + (a.kwarg is not None)


def test_command_functions_are_short_and_take_few_parameters():
    found = []
    for path, tree in _trees(COMMANDS):
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_LINES:
                found.append(f"{path.name}:{node.lineno} {node.name} is {lines} lines long")
            if _params(node) > MAX_PARAMS:
                found.append(f"{path.name}:{node.lineno} {node.name} takes {_params(node)} "
                             "parameters")
    assert found == []


def test_the_checks_see_what_they_judge():
    """The guards above would see a breach: the rules read real nodes."""
    tree = ast.parse("def f(a, b, c, d, e, f, g, h, i):\n" + "    pass\n" * 60)
    fn = tree.body[0]
    assert _params(fn) == 9 and fn.end_lineno - fn.lineno + 1 == 61


def test_an_engine_is_connected_by_the_verbs_alone():
    """A verb connects the engine its run needs (once, with its timeout) and gives it to the
    run, which never connects one; copying to other engines connects each target, and the
    nodes images and rollback reach are connected where they are listed.  Nothing else below
    the command line connects an engine."""
    allowed = {*COMMANDS.glob("*.py"), SRC / "nodes" / "transfer.py", SRC / "engines" / "docker.py",
               SRC / "nodes" / "fleet.py"}
    found = []
    for path, tree in _trees(SRC):
        if path.parent == COMMANDS:
            continue
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr == "connect"
                    and isinstance(node.value, ast.Name) and node.value.id == "Engine"
                    and path not in allowed):
                found.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert found == []
