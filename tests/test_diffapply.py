from __future__ import annotations

from pathlib import Path

import pytest
from fixtures import dedent, make_diff, make_upstream, sh

from patchkit import diffapply

BASE = """\
def alpha():
    return 1


def beta():
    x = 1
    y = 2
    return x + y


def gamma():
    return 3
"""
CHANGED = BASE.replace("    y = 2\n", "    y = 20\n")


@pytest.fixture
def tree(tmp_path):
    return make_upstream(tmp_path / "up", {"v1": {"pkg/mod.py": BASE}})


def write(tmp_path: Path, text: str, name="p.diff") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_applies_exactly(tree, tmp_path):
    out = diffapply.apply(write(tmp_path, make_diff(BASE, CHANGED, "pkg/mod.py")), tree)
    assert (out.status, out.reason, out.offsets) == ("applied", None, [])
    assert "y = 20" in (tree / "pkg/mod.py").read_text()
    # staged, so the engine can commit exactly what the diff did
    assert sh("git", "diff", "--cached", "--name-only", cwd=tree) == "pkg/mod.py"


def test_offset_is_applied_and_reported(tree, tmp_path):
    (tree / "pkg/mod.py").write_text("# one\n# two\n# three\n" + BASE)
    sh("git", "commit", "-qam", "shift", cwd=tree)
    out = diffapply.apply(write(tmp_path, make_diff(BASE, CHANGED, "pkg/mod.py")), tree)
    assert out.status == "applied"
    assert out.offsets == ["hunk 1 of pkg/mod.py at line 7 (offset +3)"]


def test_reverse_applying_diff_is_upstream(tree, tmp_path):
    (tree / "pkg/mod.py").write_text(CHANGED)
    sh("git", "commit", "-qam", "fixed upstream", cwd=tree)
    out = diffapply.apply(write(tmp_path, make_diff(BASE, CHANGED, "pkg/mod.py")), tree)
    assert out.status == "upstream"
    assert (tree / "pkg/mod.py").read_text() == dedent(CHANGED)


def test_fuzz_is_refused(tree, tmp_path):
    # an outer context line changed upstream: `patch -F2` would take it, patchkit must not
    (tree / "pkg/mod.py").write_text(BASE.replace("def beta():\n", "def beta():  # note\n"))
    sh("git", "commit", "-qam", "drift", cwd=tree)
    before = (tree / "pkg/mod.py").read_text()
    out = diffapply.apply(write(tmp_path, make_diff(BASE, CHANGED, "pkg/mod.py")), tree)
    assert (out.status, out.reason) == ("failed", "fuzz")
    assert "hunk 1 of pkg/mod.py" in out.message
    assert (tree / "pkg/mod.py").read_text() == before


def test_conflict_names_hunk_and_expected_lines(tree, tmp_path):
    (tree / "pkg/mod.py").write_text(BASE.replace("    x = 1\n    y = 2\n    return x + y\n",
                                                  "    return 42\n"))
    sh("git", "commit", "-qam", "rewrite", cwd=tree)
    out = diffapply.apply(write(tmp_path, make_diff(BASE, CHANGED, "pkg/mod.py")), tree)
    assert (out.status, out.reason) == ("failed", "conflict")
    assert out.message.startswith("hunk 1 of pkg/mod.py: expected at line")
    assert "x = 1" in out.message


def test_missing_file_is_anchor_missing(tree, tmp_path):
    out = diffapply.apply(write(tmp_path, make_diff(BASE, CHANGED, "pkg/gone.py")), tree)
    assert (out.status, out.reason) == ("failed", "anchor-missing")
    assert "pkg/gone.py" in out.message


@pytest.mark.parametrize("path", ["../outside.py", "pkg/../../outside.py", ".git/config"])
def test_escaping_paths_are_refused(tree, tmp_path, path):
    diff = f"--- /dev/null\n+++ b/{path}\n@@ -0,0 +1 @@\n+owned = True\n"
    out = diffapply.apply(write(tmp_path, diff), tree)
    assert (out.status, out.reason) == ("failed", "unsafe-path")
    assert not (tree.parent / "outside.py").exists()


def test_absolute_path_is_refused(tree, tmp_path):
    target = tmp_path / "abs.py"
    diff = f"--- /dev/null\n+++ {target}\n@@ -0,0 +1 @@\n+owned = True\n"
    out = diffapply.apply(write(tmp_path, diff), tree)
    assert out.status == "failed" and out.reason == "unsafe-path"
    assert not target.exists()


def test_write_through_symlink_is_refused(tree, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (tree / "link").symlink_to(outside)
    diff = "--- /dev/null\n+++ b/link/evil.py\n@@ -0,0 +1 @@\n+owned = True\n"
    out = diffapply.apply(write(tmp_path, diff), tree)
    assert (out.status, out.reason) == ("failed", "unsafe-path")
    assert "symlink" in out.message
    assert not (outside / "evil.py").exists()


def test_symlink_creation_is_refused(tree, tmp_path):
    diff = ("diff --git a/pkg/ln b/pkg/ln\nnew file mode 120000\n--- /dev/null\n+++ b/pkg/ln\n"
            "@@ -0,0 +1 @@\n+/etc/passwd\n\\ No newline at end of file\n")
    out = diffapply.apply(write(tmp_path, diff), tree)
    assert (out.status, out.reason) == ("failed", "unsafe-path")
    assert not (tree / "pkg/ln").exists()


def test_not_a_diff(tree, tmp_path):
    out = diffapply.apply(write(tmp_path, "hello\n"), tree)
    assert (out.status, out.reason) == ("failed", "error")
