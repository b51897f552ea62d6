"""What a run imports: libcst never (a transform imports it in the worker it runs in, and
only when its result is not kept), docker only for an image, and GitPython not for the CLI's
start.  What the tests import: no test module imports another
(what tests share lives in tests/testing/)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from testing import cli_env
from testing.upstream import make_upstream


PROBE = """
import json, sys
from patchkit import cli
from patchkit.kinds import transform
code = cli.main(sys.argv[1:])
print(json.dumps({"code": code, "libcst": "libcst" in sys.modules,
                  "docker": "docker" in sys.modules, "git": "git" in sys.modules,
                  "worker": transform.WORKER._pid is not None}))
"""


def _project(tmp_path: Path, *, transform: bool) -> Path:
    up = make_upstream(tmp_path / "up", {"v1": {"pkg/mod.py": "A = 1\n"}})
    proj = tmp_path / "proj"
    (proj / "patches").mkdir(parents=True)
    (proj / "patches" / "p.diff").write_text(
        "--- a/pkg/mod.py\n+++ b/pkg/mod.py\n@@ -1 +1,2 @@\n A = 1\n+B = 2\n")
    entries = ["  - id: p\n    summary: add B\n    diff: patches/p.diff\n"]
    if transform:
        (proj / "patches" / "t.py").write_text(
            "import libcst.matchers as m\nfrom patchkit.transform import Transform\n\n\n"
            "class AddC(Transform):\n    path = 'pkg/mod.py'\n\n"
            "    def postcondition(self, module):\n        return 'C = 3' in module.code\n\n"
            "    def transform(self, module):\n"
            "        return module.with_changes(body=[*module.body, *__import__('libcst')"
            ".parse_module('C = 3\\n').body])\n")
        entries.append("  - id: t\n    summary: add C\n    transform: patches/t.py\n")
    (proj / "patchset.yaml").write_text(
        f"name: demo\nvllm:\n  repo: {up}\n  ref: v1\npatches:\n" + "".join(entries))
    return proj


def _run(proj: Path, *args: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=proj, env=cli_env(), text=True,
                          capture_output=True, check=False)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_series_of_diffs_imports_neither_libcst_nor_docker(tmp_path):
    got = _run(_project(tmp_path, transform=False), "apply")
    assert got == {"code": 0, "libcst": False, "docker": False, "git": True, "worker": False}


def test_a_transform_runs_in_its_worker_and_still_no_docker(tmp_path):
    got = _run(_project(tmp_path, transform=True), "apply")
    assert got == {"code": 0, "libcst": False, "docker": False, "git": True, "worker": True}


def test_a_transform_whose_result_is_kept_runs_without_libcst(tmp_path):
    """The second apply finds what the transform file defines and what it made kept by
    content: neither the file nor libcst is imported."""
    proj = _project(tmp_path, transform=True)
    assert _run(proj, "apply")["worker"] is True
    got = _run(proj, "apply")
    assert got == {"code": 0, "libcst": False, "docker": False, "git": True, "worker": False}
    assert "C = 3" in (proj / ".patchkit" / "vllm" / "pkg" / "mod.py").read_text()


def test_help_and_validate_import_no_border_library(tmp_path):
    proj = _project(tmp_path, transform=False)
    assert _run(proj, "validate") == {"code": 0, "libcst": False, "docker": False, "git": False,
                                      "worker": False}


# ------------------------------------------------------------------- what the tests import

TESTS = Path(__file__).resolve().parent


def _is_test_module(dotted: str) -> bool:
    return any(part.startswith("test_") or part == "conftest" for part in dotted.split("."))


def imported_test_modules(source: str) -> list[str]:
    """The test modules (``test_*`` or ``conftest``) that ``source`` imports, however it
    spells it: ``import``, ``from ... import`` (relative too, and a module imported by name
    from its folder), ``importlib.import_module``/``__import__`` of a literal name, or
    ``pytest_plugins``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            names = [module] + [f"{module}.{alias.name}".lstrip(".") for alias in node.names]
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                   or (isinstance(node.func, ast.Name) and node.func.id == "__import__"))):
            names = [node.args[0].value]
        elif (isinstance(node, ast.Assign)
              and any(isinstance(t, ast.Name) and t.id == "pytest_plugins" for t in node.targets)):
            names = [c.value for c in ast.walk(node.value)
                     if isinstance(c, ast.Constant) and isinstance(c.value, str)]
        found += [n for n in names if n and _is_test_module(n)][:1]
    return found


@pytest.mark.parametrize("source", [
    "import test_a", "import test_a as unit", "import commands.test_a", "from test_a import X",
    "from commands.test_a import X", "from .test_a import X", "from . import test_a",
    "from commands import test_a", "from conftest import x", "import conftest",
    "def f():\n    from test_a import X\n", "importlib.import_module('commands.test_a')",
    "__import__('test_a')", "pytest_plugins = ['testing.x', 'commands.test_a']"])
def test_the_guard_sees_every_spelling_of_a_test_module_import(source):
    assert imported_test_modules(source) != [], source


@pytest.mark.parametrize("source", [
    "from testing import patchkit", "import testing.imagetree",
    "from testing.project import make_project", "import pytest",
    "from patchkit.commands import apply", "import testing", "pytest_plugins = ['testing.x']"])
def test_the_guard_passes_shared_helpers_and_the_code_under_test(source):
    assert imported_test_modules(source) == []


def test_no_test_module_imports_another():
    """What tests share is in tests/testing/, so that each test module stands alone."""
    found = {}
    for path in sorted(TESTS.rglob("*.py")):
        names = imported_test_modules(path.read_text(encoding="utf-8"))
        if names:
            found[path.relative_to(TESTS.parent).as_posix()] = names
    assert found == {}, "\n".join(f"{file} imports {', '.join(names)}: move what it shares "
                                   "to tests/testing/" for file, names in found.items())
