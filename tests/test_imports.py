"""What a run imports: libcst only when a transform is involved, docker only for an image,
and GitPython not for the CLI's start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

PROBE = """
import json, sys
from patchkit import cli
code = cli.main(sys.argv[1:])
print(json.dumps({"code": code, "libcst": "libcst" in sys.modules,
                  "docker": "docker" in sys.modules, "git": "git" in sys.modules}))
"""


def _git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def _project(tmp_path: Path, *, transform: bool) -> Path:
    up = tmp_path / "up"
    (up / "pkg").mkdir(parents=True)
    (up / "pkg" / "mod.py").write_text("A = 1\n")
    _git("init", "-q", cwd=up)
    _git("add", "-A", cwd=up)
    _git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "v1", cwd=up)
    _git("tag", "v1", cwd=up)
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
    env = dict(os.environ, PYTHONPATH=str(SRC))
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=proj, env=env, text=True,
                          capture_output=True, check=False)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_series_of_diffs_imports_neither_libcst_nor_docker(tmp_path):
    got = _run(_project(tmp_path, transform=False), "apply")
    assert got == {"code": 0, "libcst": False, "docker": False, "git": True}


def test_a_transform_brings_libcst_and_still_no_docker(tmp_path):
    got = _run(_project(tmp_path, transform=True), "apply")
    assert got == {"code": 0, "libcst": True, "docker": False, "git": True}


def test_help_and_validate_import_no_border_library(tmp_path):
    proj = _project(tmp_path, transform=False)
    assert _run(proj, "validate") == {"code": 0, "libcst": False, "docker": False, "git": False}
