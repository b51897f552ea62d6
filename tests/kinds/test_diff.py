from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from testing.upstream import dedent, make_diff, make_upstream, sh

from patchkit.kinds.diff import gitapply as diffapply
from patchkit.kinds.diff.text import parse

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
    out = diffapply.apply_file(write(tmp_path, make_diff(BASE, CHANGED, "pkg/mod.py")), tree)
    assert (out.status, out.reason, out.offsets) == ("applied", None, [])
    assert "y = 20" in (tree / "pkg/mod.py").read_text()
    # in the work tree alone, and named, so the engine commits exactly what the diff did
    assert out.files == ["pkg/mod.py"]
    assert sh("git", "diff", "--name-only", cwd=tree) == "pkg/mod.py"
    assert sh("git", "diff", "--cached", "--name-only", cwd=tree) == ""


def test_offset_is_applied_and_reported(tree, tmp_path):
    (tree / "pkg/mod.py").write_text("# one\n# two\n# three\n" + BASE)
    sh("git", "commit", "-qam", "shift", cwd=tree)
    out = diffapply.apply_file(write(tmp_path, make_diff(BASE, CHANGED, "pkg/mod.py")), tree)
    assert out.status == "applied"
    assert [str(o) for o in out.offsets] == ["hunk 1 of pkg/mod.py at line 7 (offset +3)"]


def test_reverse_applying_diff_is_upstream(tree, tmp_path):
    (tree / "pkg/mod.py").write_text(CHANGED)
    sh("git", "commit", "-qam", "fixed upstream", cwd=tree)
    out = diffapply.apply_file(write(tmp_path, make_diff(BASE, CHANGED, "pkg/mod.py")), tree)
    assert out.status == "upstream"
    assert (tree / "pkg/mod.py").read_text() == dedent(CHANGED)


def test_fuzz_is_refused(tree, tmp_path):
    # an outer context line changed upstream: `patch -F2` would take it, patchkit must not
    (tree / "pkg/mod.py").write_text(BASE.replace("def beta():\n", "def beta():  # note\n"))
    sh("git", "commit", "-qam", "drift", cwd=tree)
    before = (tree / "pkg/mod.py").read_text()
    out = diffapply.apply_file(write(tmp_path, make_diff(BASE, CHANGED, "pkg/mod.py")), tree)
    assert (out.status, out.reason) == ("failed", "fuzz")
    assert "hunk 1 of pkg/mod.py" in out.message
    assert (tree / "pkg/mod.py").read_text() == before


def test_conflict_names_hunk_and_expected_lines(tree, tmp_path):
    (tree / "pkg/mod.py").write_text(BASE.replace("    x = 1\n    y = 2\n    return x + y\n",
                                                  "    return 42\n"))
    sh("git", "commit", "-qam", "rewrite", cwd=tree)
    out = diffapply.apply_file(write(tmp_path, make_diff(BASE, CHANGED, "pkg/mod.py")), tree)
    assert (out.status, out.reason) == ("failed", "conflict")
    assert out.message.startswith("hunk 1 of pkg/mod.py: expected at line 4 (lines 4-10): ")
    # the first line where the file is not what the hunk expects, both sides quoted
    assert out.message.endswith("line 6 is '    return 42', the hunk expects '    x = 1'")


def test_missing_file_is_anchor_missing(tree, tmp_path):
    out = diffapply.apply_file(write(tmp_path, make_diff(BASE, CHANGED, "pkg/gone.py")), tree)
    assert (out.status, out.reason) == ("failed", "anchor-missing")
    assert "pkg/gone.py" in out.message


@pytest.mark.parametrize("path", ["../outside.py", "pkg/../../outside.py", ".git/config"])
def test_escaping_paths_are_refused(tree, tmp_path, path):
    diff = f"--- /dev/null\n+++ b/{path}\n@@ -0,0 +1 @@\n+owned = True\n"
    out = diffapply.apply_file(write(tmp_path, diff), tree)
    assert (out.status, out.reason) == ("failed", "unsafe-path")
    assert not (tree.parent / "outside.py").exists()


def test_absolute_path_is_refused(tree, tmp_path):
    target = tmp_path / "abs.py"
    diff = f"--- /dev/null\n+++ {target}\n@@ -0,0 +1 @@\n+owned = True\n"
    out = diffapply.apply_file(write(tmp_path, diff), tree)
    assert out.status == "failed" and out.reason == "unsafe-path"
    assert not target.exists()


def test_write_through_symlink_is_refused(tree, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (tree / "link").symlink_to(outside)
    diff = "--- /dev/null\n+++ b/link/evil.py\n@@ -0,0 +1 @@\n+owned = True\n"
    out = diffapply.apply_file(write(tmp_path, diff), tree)
    assert (out.status, out.reason) == ("failed", "unsafe-path")
    assert "symlink" in out.message
    assert not (outside / "evil.py").exists()


def test_symlink_creation_is_refused(tree, tmp_path):
    diff = ("diff --git a/pkg/ln b/pkg/ln\nnew file mode 120000\n--- /dev/null\n+++ b/pkg/ln\n"
            "@@ -0,0 +1 @@\n+/etc/passwd\n\\ No newline at end of file\n")
    out = diffapply.apply_file(write(tmp_path, diff), tree)
    assert (out.status, out.reason) == ("failed", "unsafe-path")
    assert not (tree / "pkg/ln").exists()


def test_not_a_diff(tree, tmp_path):
    out = diffapply.apply_file(write(tmp_path, "hello\n"), tree)
    assert (out.status, out.reason) == ("failed", "error")


def test_crlf_diff_against_lf_file_names_the_line_ends(tree, tmp_path):
    diff = tmp_path / "p.diff"
    diff.write_bytes(make_diff(BASE, CHANGED, "pkg/mod.py").replace("\n", "\r\n").encode())
    out = diffapply.apply_file(diff, tree)
    assert (out.status, out.reason) == ("failed", "error")
    assert out.message == ("p.diff has CRLF line ends and pkg/mod.py has LF ones: convert the "
                           "diff (e.g. dos2unix) and try again")
    assert sh("git", "status", "--porcelain", cwd=tree) == ""


def test_binary_change_without_its_content_is_an_error_not_fuzz(tree, tmp_path):
    diff = ("diff --git a/pkg/blob.bin b/pkg/blob.bin\nnew file mode 100644\n"
            "index 0000000..c94be36\nBinary files /dev/null and b/pkg/blob.bin differ\n")
    out = diffapply.apply_file(write(tmp_path, diff), tree)
    assert (out.status, out.reason) == ("failed", "error")
    assert "git diff --binary" in out.message
    assert not (tree / "pkg/blob.bin").exists()


def test_a_diff_git_cannot_use_is_an_error_not_fuzz(tree, tmp_path):
    # a binary patch with a short index line: git refuses the diff itself, no hunk is involved
    diff = ("diff --git a/pkg/blob.bin b/pkg/blob.bin\nnew file mode 100644\n"
            "index 0000000..c94be36\nGIT binary patch\nliteral 10\nRcmZQzWJ=1+ODw8n000X)0*L?s\n\n"
            "literal 0\nHcmV?d00001\n\n")
    out = diffapply.apply_file(write(tmp_path, diff), tree)
    assert (out.status, out.reason) == ("failed", "error")
    assert "full index line" in out.message


def test_quoted_names_are_checked_and_reported_as_the_tree_has_them(tree, tmp_path):
    target = tree / "pkg/dïr x/mödule.py"
    target.parent.mkdir()
    target.write_text("A = 1\n")
    sh("git", "add", "-A", cwd=tree)
    sh("git", "commit", "-qm", "non-ascii", cwd=tree)
    quoted = '"a/pkg/d\\303\\257r x/m\\303\\266dule.py"', '"b/pkg/d\\303\\257r x/m\\303\\266dule.py"'
    diff = (f"diff --git {quoted[0]} {quoted[1]}\n--- {quoted[0]}\n+++ {quoted[1]}\n"
            "@@ -1 +1 @@\n-A = 1\n+A = 2\n")
    out = diffapply.apply_file(write(tmp_path, diff), tree)
    assert (out.status, out.files) == ("applied", ["pkg/dïr x/mödule.py"])
    assert target.read_text() == "A = 2\n"


def test_write_through_a_symlink_with_a_quoted_name_is_refused(tree, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (tree / "lïnk").symlink_to(outside)
    diff = ('diff --git "a/l\\303\\257nk/evil.py" "b/l\\303\\257nk/evil.py"\nnew file mode 100644\n'
            '--- /dev/null\n+++ "b/l\\303\\257nk/evil.py"\n@@ -0,0 +1 @@\n+owned = True\n')
    out = diffapply.apply_file(write(tmp_path, diff), tree)
    assert (out.status, out.reason) == ("failed", "unsafe-path")
    assert not (outside / "evil.py").exists()


def test_every_hunk_and_file_in_the_way_is_named_and_the_tree_left_alone(tmp_path):
    """Hunks 1 and 3 of a.txt and hunk 1 of b.txt meet changed lines, c.txt is gone and n.txt
    is there already; hunk 2 of a.txt would apply."""
    repo = tmp_path / "r"
    repo.mkdir()
    sh("git", "init", "-q", cwd=repo)
    for name, n in (("a.txt", 100), ("b.txt", 100), ("c.txt", 50)):
        (repo / name).write_text("".join(f"{i}\n" for i in range(1, n + 1)))
    sh("git", "add", ".", cwd=repo)
    sh("git", "commit", "-qm", "base", cwd=repo)
    edits = {"a.txt": ("10", "50", "90"), "b.txt": ("20",), "c.txt": ("5",)}
    for name, lines in edits.items():
        text = (repo / name).read_text()
        for ln in lines:
            text = text.replace(f"\n{ln}\n", f"\nX{ln}\n", 1)
        (repo / name).write_text(text)
    (repo / "n.txt").write_text("new\n")
    sh("git", "add", "-N", "n.txt", cwd=repo)
    diff_file = tmp_path / "p.diff"
    diff_file.write_text(sh("git", "diff", cwd=repo) + "\n")
    sh("git", "checkout", "-q", ".", cwd=repo)
    for name, ln in (("a.txt", "11"), ("a.txt", "89"), ("b.txt", "21")):
        text = (repo / name).read_text()
        (repo / name).write_text(text.replace(f"\n{ln}\n", "\nQ\n", 1))
    (repo / "c.txt").unlink()
    (repo / "n.txt").write_text("mine\n")
    sh("git", "add", "-A", ".", cwd=repo)
    sh("git", "commit", "-qm", "target", cwd=repo)
    patch = parse(diff_file.read_text())
    ways = diffapply.find_in_the_way(patch, diff_file, repo)
    assert [(w.file, w.hunk, w.reason) for w in ways] == [
        ("a.txt", 1, "conflict"), ("a.txt", 3, "conflict"), ("b.txt", 1, "conflict"),
        ("c.txt", None, "gone"), ("n.txt", None, "exists")]
    assert [w.line for w in ways[:3]] == [7, 87, 17]
    assert diffapply.in_the_way_summary(patch, ways) == (
        "3 of 6 hunks in 2 of 4 files conflict: a.txt hunks 1, 3; b.txt hunk 1; "
        "1 file is gone: c.txt; 1 file is there already: n.txt")
    assert sh("git", "status", "--porcelain", cwd=repo) == ""
    out = diffapply.apply_file(diff_file, repo)
    assert out.status == "failed" and out.in_the_way == ways
    assert out.message.startswith("3 of 6 hunks in 2 of 4 files conflict: ")


def test_the_files_reported_are_the_paths_git_reads_for_every_shape_of_diff(tmp_path):
    """Whatever the diff's shape, an applied diff reports the paths git's own ``--numstat``
    reads from it: a plain diff as it names them, renames and copies both ends, quoted and
    unprefixed names as the tree has them."""
    repo = tmp_path / "r"
    files = {"pkg/mod.py": BASE, "pkg/old.py": "OLD = 1\n", "pkg/run.sh": "echo\n",
             "pkg/a.py": BASE * 3, "pkg/sp ace.py": "S = 1\n", "pkg/mödule.py": "M = 1\n"}
    make_upstream(repo, {"v1": files})
    (repo / "pkg/mod.py").write_text(CHANGED)
    (repo / "pkg/new.py").write_text("NEW = 1\n")
    (repo / "pkg/old.py").unlink()
    (repo / "pkg/run.sh").chmod(0o755)
    (repo / "pkg/blob.bin").write_bytes(bytes(range(256)))
    (repo / "pkg/a.py").rename(repo / "pkg/b.py")
    (repo / "pkg/c.py").write_text(dedent(BASE) * 3)
    (repo / "pkg/sp ace.py").write_text("S = 2\n")
    (repo / "pkg/mödule.py").write_text("M = 2\n")
    sh("git", "add", "-A", cwd=repo)
    sh("git", "commit", "-qm", "every shape", cwd=repo)
    shapes = {"plain": ["--no-renames"], "renames": ["-M"], "copies": ["-C", "-C"],
              "quoted": ["-c", "core.quotePath=true"],
              # (unidiff reads a name with a space only after a/ and b/)
              "other prefixes": ["--no-renames", "--src-prefix=x/", "--dst-prefix=y/"]}
    for shape, opts in shapes.items():
        config = opts[:2] if opts[0] == "-c" else []
        args = [*config, "diff", "--binary", "--full-index", *opts[len(config):], "v1", "HEAD",
                *(["--", ":!pkg/sp ace.py"] if shape == "other prefixes" else [])]
        diff = write(tmp_path, sh("git", *args, cwd=repo) + "\n", f"{shape}.diff")
        tree = tmp_path / shape.replace(" ", "-")
        sh("git", "clone", "-q", "--branch", "v1", str(repo), str(tree))
        seen = subprocess.run(["git", "apply", "--numstat", "-z", str(diff)], cwd=tree,
                              check=True, capture_output=True, text=True).stdout
        out = diffapply.apply_file(diff, tree)
        assert (shape, out.status) == (shape, "applied"), out.message
        assert (shape, out.files) == (shape, diffapply._numstat_paths(seen))
        assert (tree / "pkg/blob.bin").read_bytes() == bytes(range(256))
