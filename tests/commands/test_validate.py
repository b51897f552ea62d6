"""``patchkit validate`` compiles what it can without a tree: a broken transform is caught
there, with its file and line, not only at apply."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from testing import one_error, patchkit
from testing.project import TRANSFORM, make_project


@pytest.fixture
def project(tmp_path) -> Path:
    return make_project(tmp_path)


def test_a_good_series_is_counted_by_kind(project):
    out = patchkit("validate", cwd=project)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ("patchset.yaml: ok (3 patches, 1 diff parsed, 1 transform "
                                  "imported, 1 overlay listed, 3 assertions, vLLM v1)")
    doc = json.loads(patchkit("validate", "--format", "json", cwd=project).stdout)
    assert doc["compiled"] == [
        {"id": "table-nvfp4", "kind": "diff", "path": "patches/table.diff",
         "found": "1 file, 1 hunk"},
        {"id": "fast-mode", "kind": "transform", "path": "patches/fast.py",
         "found": "1 Transform class (Fast)"},
        {"id": "extra-file", "kind": "overlay", "path": "overlays/extra", "found": "1 file"}]
    assert doc["warnings"] == [] and out.stderr == ""


def test_two_patches_making_one_change_are_warned_of(project):
    """The second finds the change made by the first wherever both take effect: a warning
    naming both, and validate still passes."""
    (project / "patches/again.diff").write_text((project / "patches/table.diff").read_text())
    (project / "overlays/again/pkg").mkdir(parents=True)
    (project / "overlays/again/pkg/extra.py").write_text("EXTRA = 1\n")
    with (project / "patchset.yaml").open("a") as f:
        f.write("  - id: table-again\n    summary: nvfp4 again\n    diff: patches/again.diff\n"
                "  - id: extra-again\n    summary: extra again\n    overlay: overlays/again\n")
    out = patchkit("validate", cwd=project)
    assert out.returncode == 0, out.stderr
    assert out.stderr.splitlines() == [
        "warning: patchset.yaml:26: patches[3] (id=table-again): makes the same change as "
        "table-nvfp4 (in pkg/mod.py): where both take effect, table-again finds it made by "
        "table-nvfp4",
        "warning: patchset.yaml:29: patches[4] (id=extra-again): makes the same change as "
        "extra-file (in pkg/extra.py): where both take effect, extra-again finds it made by "
        "extra-file"]
    doc = json.loads(patchkit("validate", "--format", "json", cwd=project).stdout)
    assert len(doc["warnings"]) == 2


@pytest.mark.parametrize("source, line, words", [
    (TRANSFORM.replace("    def transform(self, module):", "    def transform(self, module)"),
     12, "SyntaxError: expected ':'"),
    (TRANSFORM.replace("    def transform(self, module):", "   def transform(self, module):"), 12,
     "IndentationError: unindent does not match any outer indentation level"),
    (TRANSFORM.replace("class Fast(Transform):", "class Fast:"), 1,
     "defines no patchkit.transform.Transform subclass"),
    (TRANSFORM.replace("import libcst.matchers as m", "import libcst.matchers as m\n"
                       "import no_such_module_here"), 3,
     "import failed: ModuleNotFoundError: No module named 'no_such_module_here'"),
    (TRANSFORM.replace('    path = "pkg/mod.py"\n', ""), 6, "Fast sets no `path`"),
    (TRANSFORM.replace('path = "pkg/mod.py"', 'path = "../outside.py"'), 6, "Fast.path: "),
])
def test_a_broken_transform_is_exit_2_with_its_file_and_line(project, source, line, words):
    (project / "patches/fast.py").write_text(source)
    out = patchkit("validate", cwd=project)
    assert out.returncode == 2, out.stdout + out.stderr
    error = one_error(out)
    assert error.startswith(f"patchkit validate: error: patches/fast.py:{line}: patches[1] "
                            "(id=fast-mode): "), error
    assert words in error and "Traceback" not in out.stderr


def test_a_manifest_elsewhere_names_the_file_from_here(project):
    (project / "patches/fast.py").write_text("class Fast(:\n")
    out = patchkit("validate", "--manifest", f"{project.name}/patchset.yaml",
                   cwd=project.parent)
    assert out.returncode == 2
    assert one_error(out).startswith(f"patchkit validate: error: {project.name}/patches/"
                                     "fast.py:1: patches[1] (id=fast-mode): SyntaxError")


def test_an_empty_overlay_is_exit_2(project):
    (project / "overlays/extra/pkg/extra.py").unlink()
    out = patchkit("validate", cwd=project)
    assert out.returncode == 2
    assert "overlays/extra: the overlay holds no files" in one_error(out)


@pytest.mark.parametrize("path,shown", [("vllm/pwned.py", "(it is vllm's)"),
                                        ("pwned.py", "(a file at the root)")])
def test_validate_applies_applys_path_rules_to_another_packages_patch(tmp_path, path, shown):
    """A FlashInfer patch writing a vLLM path (or a file at the root) is refused by validate,
    as apply refuses it, with the entry's line."""
    from testing.flashinfer import make_stack

    proj = make_stack(tmp_path, "  - id: fi-escape\n    summary: writes into vLLM's files\n"
                                "    package: flashinfer\n"
                                "    diff: patches/flashinfer/fi-escape.diff\n")
    (proj / "patches/flashinfer/fi-escape.diff").write_text(
        f"--- /dev/null\n+++ b/{path}\n@@ -0,0 +1 @@\n+x = 1\n")
    p = patchkit("validate", cwd=proj)
    assert p.returncode == 2, p.stdout
    line = next(n for n, text in enumerate((proj / "patchset.yaml").read_text().splitlines(), 1)
                if "id: fi-escape" in text)
    assert one_error(p) == (f"patchkit validate: error: patchset.yaml:{line}: patches[4] "
                            f"(id=fi-escape): {path} is outside flashinfer's files {shown}; a "
                            "flashinfer patch names paths from that package's root")
