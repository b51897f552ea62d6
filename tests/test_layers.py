"""The floors of docs/architecture.md, enforced: import-linter checks every import of patchkit
(those inside functions too) against the contracts in pyproject.toml, and the table in
docs/architecture.md names the same floors in the same order."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:   # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def _lint(config: Path, cwd: Path, path: str | None = None) -> subprocess.CompletedProcess:
    """``lint-imports`` on ``config``, as CI or a person would run it."""
    env = None if path is None else {"PYTHONPATH": path, "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; "
         "sys.exit(lint_imports_command())", "--config", str(config), "--no-cache"],
        cwd=cwd, capture_output=True, text=True, timeout=300, env=env)


def _contracts() -> dict[str, dict]:
    settings = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["tool"]["importlinter"]
    return {c["id"]: c for c in settings["contracts"]}


def test_every_import_keeps_to_its_floor():
    done = _lint(PYPROJECT, ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def test_the_contract_sees_an_import_inside_a_function(tmp_path):
    """A lower floor that reaches up, even from inside a function, breaks the contract; the
    same import at the right floor keeps it."""
    pkg = tmp_path / "house"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "top.py").write_text("from house import bottom\n")
    (pkg / "bottom.py").write_text(textwrap.dedent("""\
        def late():
            from house import top
            return top
        """))
    config = tmp_path / "contracts.toml"
    config.write_text(textwrap.dedent("""\
        [tool.importlinter]
        root_package = "house"

        [[tool.importlinter.contracts]]
        name = "floors"
        type = "layers"
        containers = ["house"]
        layers = ["top", "bottom"]
        """))
    broken = _lint(config, tmp_path, str(tmp_path))
    assert broken.returncode != 0 and "house.bottom -> house.top" in broken.stdout, broken.stdout
    (pkg / "bottom.py").write_text("def late():\n    return None\n")
    assert _lint(config, tmp_path, str(tmp_path)).returncode == 0


def _floors_in_contract() -> list[set[str]]:
    """The floors of the contract, bottom first, each as the set of its modules."""
    layers = _contracts()["floors"]["layers"]
    return [set(re.split(r"\s*[|:]\s*", layer.strip())) for layer in reversed(layers)]


def _floors_in_docs() -> list[set[str]]:
    """The floors of docs/architecture.md's table, bottom first: the modules of each row,
    under the floor its first cell names (an empty cell: the floor above it goes on)."""
    floors: list[tuple[str, set[str]]] = []
    for line in ARCHITECTURE.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 3 or cells[0] == "floor" \
                or all(set(c) <= set("-") for c in cells):
            continue
        modules = {m.removesuffix(".py").removesuffix("/").split("/")[0]
                   for m in re.findall(r"`([\w/.]+)`", cells[1])}
        if cells[0]:
            floors.append((cells[0], modules))
        else:
            floors[-1][1].update(modules)
    return [modules for _, modules in floors]


def test_the_table_in_the_docs_is_the_contracts():
    assert _floors_in_docs() == _floors_in_contract()


@pytest.mark.parametrize("contract", ["floors", "image", "engines", "nodes", "formats"])
def test_a_new_module_must_be_given_a_floor(contract):
    assert _contracts()[contract]["exhaustive"] is True


def _modules() -> dict[str, ast.Module]:
    src = ROOT / "src" / "patchkit"
    return {str(p.relative_to(src)): ast.parse(p.read_text(encoding="utf-8"))
            for p in sorted(src.rglob("*.py"))}


def test_only_the_sdk_border_imports_the_docker_sdk():
    """docs/architecture.md and engine-border.md: `engines/sdk.py` is the only importer of the
    Docker SDK (functions' imports too)."""
    importers = set()
    for name, tree in _modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "docker"
                                                    for a in node.names):
                importers.add(name)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 \
                    and (node.module or "").split(".")[0] == "docker":
                importers.add(name)
    assert importers == {"engines/sdk.py"}


def test_image_labels_are_named_in_the_label_schema_alone():
    """docs/architecture.md: `image/labels.py` writes and reads every image label; the one other
    `io.patchkit.` name is the label of the engine border's own scratch containers."""
    named = {}
    for name, tree in _modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and node.value.startswith("io.patchkit."):
                named.setdefault(name, set()).add(node.value)
    assert named.pop("engines/docker.py") == {"io.patchkit.scratch"}
    assert set(named) == {"image/labels.py"}
