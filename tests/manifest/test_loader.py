"""patchset.yaml loading: every mistake is one line naming the file, the line and the entry."""

from __future__ import annotations

import os
import re
import textwrap
from pathlib import Path

import pytest
from packaging.version import Version

from patchkit import manifest
from patchkit.errors import ManifestError

DIFF = """\
--- a/vllm/x.py
+++ b/vllm/x.py
@@ -1,1 +1,1 @@
-a = 1
+a = 2
"""
SHA = "0123456789abcdef0123456789abcdef01234567"

# Lines 1-5; the first patch entry starts on line 6.
HEAD = """\
name: demo
vllm:
  repo: pypi
  ref: v0.33.0
patches:
"""


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A patchset folder with one valid file of each kind; the cwd, so paths read as given."""
    (tmp_path / "patches").mkdir()
    (tmp_path / "patches" / "a.diff").write_text(DIFF)
    (tmp_path / "patches" / "t.py").write_text("# a transform\n")
    (tmp_path / "overlays" / "o" / "vllm").mkdir(parents=True)
    (tmp_path / "overlays" / "o" / "vllm" / "x.py").write_text("a = 3\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def write(repo: Path, text: str) -> None:
    (repo / "patchset.yaml").write_text(textwrap.dedent(text))


# ---------------------------------------------------------------------------------- a good one

def test_loads_a_full_manifest(repo: Path) -> None:
    write(repo, """\
        name: demo
        vllm:
          repo: [pypi, https://example.invalid/vllm.git]
          ref: v0.33.0
        image:
          base: vllm/vllm-openai:v0.33.0
          tag: "demo:{ref}"
        patches:
          - id: stage-a
            summary: add the nvfp4_ds_mla dtype
            upstream: https://example.invalid/pull/1
            diff: ./patches//a.diff
            vllm: ">=0.27.1,<0.33"
            verify:
              - file: vllm/utils/torch_utils.py
                in: STR_DTYPE_TO_TORCH_DTYPE
                has_key: nvfp4_ds_mla
              - file: vllm/x.py
                not: {calls: self.old}
          - id: draft-quant
            summary: normalise the draft quant config
            transform: patches/t.py
          - id: loader
            summary: fail-closed loader
            overlay: overlays/o
            replaces:
              vllm/x.py: %s
        """ % SHA.upper())
    m = manifest.load("patchset.yaml")
    assert m.name == "demo"
    assert m.path == repo / "patchset.yaml" and m.root == repo
    assert m.vllm.repos == ("pypi", "https://example.invalid/vllm.git")
    assert m.vllm.ref == "v0.33.0" and m.vllm.line == 2 and m.vllm.ref_line == 4
    assert m.image == manifest.ImageDefaults(base="vllm/vllm-openai:v0.33.0",
                                             platform="linux/arm64", tag="demo:{ref}")
    a, t, o = m.patches
    assert (a.id, a.kind, a.path, a.line, a.index) == ("stage-a", "diff", "patches/a.diff", 9, 0)
    assert a.upstream == "https://example.invalid/pull/1"
    assert a.lines["vllm"] == 13 and a.lines["diff"] == 12
    assert Version("0.32.0") in a.vllm and Version("0.33.0") not in a.vllm
    has_key, negated = a.verify
    assert (has_key.file, has_key.scope, has_key.predicate, has_key.value, has_key.line) == (
        "vllm/utils/torch_utils.py", "STR_DTYPE_TO_TORCH_DTYPE", "has_key", "nvfp4_ds_mla", 15)
    assert negated.predicate == "not" and negated.value is None
    assert negated.negated == manifest.Assertion(file="vllm/x.py", scope=None, predicate="calls",
                                                 value="self.old", line=19)
    assert (t.kind, t.path, t.vllm, t.verify) == ("transform", "patches/t.py", None, ())
    assert (o.kind, o.path, dict(o.replaces)) == ("overlay", "overlays/o", {"vllm/x.py": SHA})
    assert m.patch("loader") is o


def test_loads_packages_beside_vllm_and_ranges_on_any_of_them(repo: Path) -> None:
    (repo / "patches" / "fi.diff").write_text(DIFF.replace("vllm/x.py", "flashinfer/x.py"))
    write(repo, """\
        name: demo
        vllm:
          repo: pypi
          ref: v0.33.0
        packages:
          flashinfer:
            dist: flashinfer-python
            repo: [pypi]
            ref: v0.6.15
          b12x:
            repo: [https://example.invalid/b12x.git, image]
            ref: 1a2b3c4
        patches:
          - id: fi-weight-prefetch
            summary: prefetch the weights
            package: flashinfer
            diff: patches/fi.diff
            flashinfer: ">=0.6.15,<0.7"
            verify:
              - {file: flashinfer/x.py, contains: "a = 2"}
          - id: stage-a
            summary: a vLLM patch that needs an old FlashInfer
            diff: patches/a.diff
            flashinfer: "<0.6.16"
            vllm: ">=0.27.1"
        """)
    m = manifest.load("patchset.yaml")
    assert [p.name for p in m.packages] == ["vllm", "flashinfer", "b12x"]
    assert m.package("vllm") is m.vllm
    assert m.vllm == manifest.Package("vllm", "vllm", ("pypi",), "v0.33.0", 2, 4)
    assert m.package("flashinfer") == manifest.Package("flashinfer", "flashinfer-python",
                                                       ("pypi",), "v0.6.15", 6, 9)
    b12x = m.package("b12x")
    assert (b12x.dist, b12x.repos, b12x.ref) == (
        "b12x", ("https://example.invalid/b12x.git", "image"), "1a2b3c4")
    with pytest.raises(KeyError):
        m.package("triton")
    fi, stage = m.patches
    assert (fi.package, fi.path, fi.vllm) == ("flashinfer", "patches/fi.diff", None)
    assert list(fi.ranges) == ["flashinfer"] and fi.lines["flashinfer"] == 18
    assert Version("0.6.15") in fi.ranges["flashinfer"]
    assert Version("0.7.0") not in fi.ranges["flashinfer"]
    assert fi.verify[0].file == "flashinfer/x.py"
    assert stage.package == "vllm"
    assert list(stage.ranges) == ["flashinfer", "vllm"]   # as written
    assert str(stage.ranges["flashinfer"]) == "<0.6.16"
    assert stage.vllm is stage.ranges["vllm"] and Version("0.27.1") in stage.vllm
    assert stage.without_range("vllm").ranges == {"flashinfer": stage.ranges["flashinfer"]}


def test_a_manifest_without_packages_has_vllm_alone(repo: Path) -> None:
    for tail in ("", "packages:\n", "packages: {}\n"):
        write(repo, HEAD.replace("patches:\n", tail))
        m = manifest.load("patchset.yaml")
        assert m.packages == (m.vllm,) and m.others == ()
        assert (m.vllm.name, m.vllm.dist) == ("vllm", "vllm")


def test_patches_may_be_empty_or_absent(repo: Path) -> None:
    for tail in ("patches: []\n", "patches:\n", ""):
        write(repo, HEAD.replace("patches:\n", "") + tail)
        assert manifest.load("patchset.yaml").patches == ()


def test_merge_keys_are_followed(repo: Path) -> None:
    write(repo, HEAD + """\
  - &base
    id: one
    summary: first
    diff: patches/a.diff
  - <<: *base
    id: two
""")
    one, two = manifest.load("patchset.yaml").patches
    assert (two.id, two.summary, two.path) == ("two", "first", "patches/a.diff")


def test_image_tag_placeholders_are_fine(repo: Path) -> None:
    write(repo, "name: demo\nvllm:\n  repo: pypi\n  ref: v1\nimage:\n"
                "  base: vllm/vllm-openai@sha256:" + "a" * 64 + "\n  tag: '{name}:{ref}-{version}'\n")
    assert manifest.load("patchset.yaml").image.tag == "{name}:{ref}-{version}"


def test_symlink_inside_the_folder_is_fine(repo: Path) -> None:
    os.symlink("a.diff", repo / "patches" / "alias.diff")
    write(repo, HEAD + "  - {id: foo, summary: x, diff: patches/alias.diff}\n")
    assert manifest.load("patchset.yaml").patches[0].path == "patches/alias.diff"


# ---------------------------------------------------------------------------------- every mistake
#
# One row per mistake: the manifest text (dedented; None: no file at all), the one-line message
# it gives.  A message holding "…" is matched in pieces: it starts with the first, ends with the
# last, and holds the others in order in between.


def entries(text: str) -> str:
    """HEAD followed by the (dedented) patch entries."""
    return HEAD + textwrap.dedent(text)


def assertions(verify: str) -> str:
    """One diff entry ``foo`` whose verify list is ``verify`` (dedented)."""
    entry = textwrap.dedent("""\
        - id: foo
          summary: x
          diff: patches/a.diff
          verify:
        """)
    return HEAD + entry + textwrap.indent(textwrap.dedent(verify), "    ")


def foo(kind: str, rel: str) -> str:
    """One entry ``foo`` of ``kind`` at ``rel``."""
    return entries(f"""\
        - id: foo
          summary: x
          {kind}: {rel}
        """)


# Lines 1-4 as HEAD; `packages:` on line 5, its first entry on line 6.
def packages(entries_text: str) -> str:
    """A manifest whose `packages:` holds ``entries_text`` (indented under it)."""
    return (HEAD.replace("patches:\n", "packages:\n") + textwrap.indent(entries_text, "  ")
            + "patches: []\n")


# flashinfer declared on lines 5-9, `patches:` on 10, entry foo on 11-13, then ``extra`` on 14.
FLASHINFER = """\
packages:
  flashinfer:
    dist: flashinfer-python
    repo: [pypi]
    ref: v0.6.15
"""


def with_flashinfer(extra: str) -> str:
    """flashinfer declared, and one diff entry ``foo`` with ``extra`` as its last line."""
    return (HEAD.replace("patches:\n", FLASHINFER + "patches:\n")
            + "  - id: foo\n    summary: x\n    diff: patches/a.diff\n    " + extra)


def bad_diff(content: str):
    def setup(repo: Path) -> None:
        (repo / "patches" / "bad.diff").write_text(content)
    return setup


def huge_diff(repo: Path) -> None:
    """A sparse file past the bound: the loader must refuse it without reading it."""
    with open(repo / "patches" / "huge.diff", "wb") as fh:
        fh.truncate(100 * 1024 * 1024)


def binary_diff(repo: Path) -> None:
    (repo / "patches" / "bin.diff").write_text(
        "diff --git a/vllm/b.bin b/vllm/b.bin\nnew file mode 100644\nindex 0000000..c94be36\n"
        "Binary files /dev/null and b/vllm/b.bin differ\n")


def link_out_of_the_folder(repo: Path) -> None:
    outside = repo.parent / f"{repo.name}-outside"
    outside.mkdir()
    (outside / "a.diff").write_text(DIFF)
    os.symlink(outside, repo / "patches" / "elsewhere")


def sub_folder(repo: Path) -> None:
    (repo / "sub").mkdir()


def case(id: str, text: str | None, expected: str, *, path: str | Path = "patchset.yaml",
         setup=None):
    return pytest.param(text, expected, path, setup, id=id)


ERRORS = [
    # the file
    case("missing-manifest", None, "patchset.yaml: no such file"),
    case("path-as-given", "name: [\n", "sub/patchset.yaml:2: YAML syntax error: …",
         path=Path("sub/patchset.yaml"), setup=sub_folder),
    case("yaml-syntax", HEAD + "  - id: a\n    summary: x: y\n",
         "patchset.yaml:7: YAML syntax error: …mapping values are not allowed here…"),
    # an unclosed quote or bracket: the line it begins on, not where the scanner gave up
    case("yaml-unclosed-quote", HEAD + "  - id: a\n    summary: \"open\n    diff: a.diff\n"
         "  - id: b\n    summary: y\n",
         "patchset.yaml:7: YAML syntax error: found unexpected end of stream (while scanning a "
         "quoted scalar); it begins here and is still open at line 11"),
    case("yaml-unclosed-bracket", HEAD + "  - id: a\n    summary: [open\n    diff: a.diff\n",
         "patchset.yaml:7: YAML syntax error: …(while parsing a flow sequence); it begins here "
         "and is still open at line 8"),
    case("empty-manifest", "# nothing\n", "patchset.yaml: the manifest is empty…"),
    case("top-level-list", "- a\n- b\n",
         "patchset.yaml:1: expected a mapping with name, vllm and patches, got a list"),
    case("two-documents", HEAD + "  []\n---\nname: other\n",
         "patchset.yaml:7: YAML syntax error: expected a single document in the stream, "
         "but found another document"),
    case("nested-too-deeply", "name: " + "[" * 5000 + "]" * 5000 + "\n",
         "patchset.yaml: YAML nested too deeply to read"),
    # the top level
    case("unknown-key-close", HEAD + "  []\npatchs: []\n",
         "patchset.yaml:7: unknown key 'patchs'; did you mean 'patches'?"),
    case("unknown-key-far", HEAD + "  []\nzzz: 1\n",
         "patchset.yaml:7: unknown key 'zzz' (expected one of: name, vllm, packages, image, "
         "patches, variants, runtime, bump)"),
    case("duplicate-key", HEAD + "  []\nname: again\n",
         "patchset.yaml:7: duplicate key 'name' (first on line 1)"),
    case("missing-name", "vllm: {repo: pypi, ref: v1}\n",
         "patchset.yaml:1: missing required key 'name'"),
    case("missing-ref", "name: demo\nvllm:\n  repo: pypi\npatches: []\n",
         "patchset.yaml:3: vllm: missing required key 'ref'"),
    case("ref-is-a-number", "name: demo\nvllm:\n  repo: pypi\n  ref: 0.30\n",
         "patchset.yaml:4: vllm.ref: expected a string, got the number 0.30 "
         "(quote it to make it a string)"),
    case("ref-option", 'name: demo\nvllm:\n  repo: pypi\n  ref: "-x"\n',
         "patchset.yaml:4: vllm.ref: '-x' starts with '-'"),
    case("ref-whitespace", 'name: demo\nvllm:\n  repo: pypi\n  ref: "v1 v2"\n',
         "patchset.yaml:4: vllm.ref: 'v1 v2' holds whitespace or a control character"),
    case("ref-expression", "name: demo\nvllm:\n  repo: pypi\n  ref: HEAD~1\n",
         "patchset.yaml:4: vllm.ref: 'HEAD~1' is a revision expression; give a tag, "
         "branch or commit"),
    case("image-tag-uppercase",
         "name: demo\nvllm:\n  repo: pypi\n  ref: v1\nimage:\n  tag: 'UPPER:{ref}'\n",
         "patchset.yaml:6: image.tag: 'UPPER:{ref}' is not an image reference: "
         "the repository name must be lowercase"),
    case("image-base-space",
         "name: demo\nvllm:\n  repo: pypi\n  ref: v1\nimage:\n  base: vllm/vllm openai\n",
         "patchset.yaml:6: image.base: 'vllm/vllm openai' is not an image "
         "reference: it is not NAME[:TAG] (lowercase letters, digits, and "
         ". _ - / as separators)"),
    case("repo-number", "name: demo\nvllm:\n  repo: 5\n  ref: v1\n",
         "patchset.yaml:3: vllm.repo: expected a string or a list of strings, "
         "got the number 5"),
    case("repo-empty-list", "name: demo\nvllm:\n  repo: []\n  ref: v1\n",
         "patchset.yaml:3: vllm.repo: the list of repositories is empty"),
    case("repo-list-mapping", "name: demo\nvllm:\n  repo: [pypi, {a: b}]\n  ref: v1\n",
         "patchset.yaml:3: vllm.repo[1]: expected a string, got a mapping"),
    case("repo-empty", 'name: demo\nvllm:\n  repo: ""\n  ref: v1\n',
         "patchset.yaml:3: vllm.repo: must not be empty"),
    case("patches-mapping", HEAD + "  {}\n",
         "patchset.yaml:6: patches: expected a list of patch entries, got a mapping"),
    case("platform", HEAD + "  []\nimage:\n  platform: arm64\n",
         "patchset.yaml:8: image.platform: 'arm64' is not a platform like linux/arm64"),
    # patch entries
    case("entry-string", entries("- just-a-string\n"),
         "patchset.yaml:6: patches[0]: expected a patch entry (a mapping), got the string "
         "'just-a-string'"),
    case("unknown-patch-key", entries("""\
        - id: foo
          sumary: x
          diff: patches/a.diff
        """), "patchset.yaml:7: patches[0] (id=foo): unknown key 'sumary'; did you mean "
              "'summary'?"),
    case("summary-number", entries("""\
        - id: ok
          summary: fine
          diff: patches/a.diff
        - id: foo
          summary: 3
          diff: patches/a.diff
        """), "patchset.yaml:10: patches[1] (id=foo): summary: expected a string, got the "
              "number 3 (quote it to make it a string)"),
    case("summary-two-lines", entries("""\
        - id: foo
          summary: |
            two
            lines
          diff: patches/a.diff
        """), "patchset.yaml:7: patches[0] (id=foo): summary: must be one line"),
    case("summary-blank", entries("""\
        - id: foo
          summary: "  "
          diff: patches/a.diff
        """), "patchset.yaml:7: patches[0] (id=foo): summary: must not be empty"),
    case("missing-id", entries("""\
        - summary: x
          diff: patches/a.diff
        """), "patchset.yaml:6: patches[0]: missing required key 'id'"),
    case("missing-summary", entries("""\
        - id: foo
          diff: patches/a.diff
        """), "patchset.yaml:6: patches[0] (id=foo): missing required key 'summary'"),
    *[case(f"malformed-id-{bad_id}", entries(f"""\
        - id: {bad_id}
          summary: x
          diff: patches/a.diff
        """), f"patchset.yaml:6: patches[0] (id={bad_id}): id: '{bad_id}' is not a valid id…")
      for bad_id in ["Foo", "-foo", "foo_bar", "foo bar"]],
    case("id-too-long", entries(f"""\
        - id: {'a' * 101}
          summary: x
          diff: patches/a.diff
        """), f"patchset.yaml:6: patches[0] (id={'a' * 37}...): id: '{'a' * 37}...' is 101 "
              "characters long; an id has at most 100"),
    case("duplicate-id", entries("""\
        - id: foo
          summary: x
          diff: patches/a.diff
        - id: bar
          summary: y
          diff: patches/a.diff
        - id: foo
          summary: z
          diff: patches/a.diff
        """), "patchset.yaml:12: patches[2] (id=foo): id: duplicate id 'foo' (first used on "
              "line 6)"),
    case("no-kind", entries("""\
        - id: foo
          summary: x
        """), "patchset.yaml:6: patches[0] (id=foo): no patch kind: give exactly one of "
              "diff, transform, overlay, artifact"),
    case("two-kinds", entries("""\
        - id: foo
          summary: x
          diff: patches/a.diff
          transform: patches/t.py
        """), "patchset.yaml:9: patches[0] (id=foo): transform: two patch kinds (diff and "
              "transform) in one entry; give exactly one of diff, transform, overlay, artifact"),
    case("no-diff-file", foo("diff", "patches/nope.diff"),
         "patchset.yaml:8: patches[0] (id=foo): diff: no such file: patches/nope.diff"),
    case("no-transform-file", foo("transform", "patches/nope.py"),
         "patchset.yaml:8: patches[0] (id=foo): transform: no such file: patches/nope.py"),
    case("no-overlay-folder", foo("overlay", "overlays/nope"),
         "patchset.yaml:8: patches[0] (id=foo): overlay: no such directory: overlays/nope"),
    case("transform-not-python", foo("transform", "patches/a.diff"),
         "patchset.yaml:8: patches[0] (id=foo): transform: patches/a.diff is not a Python "
         "file (.py)"),
    case("diff-is-a-folder", foo("diff", "patches"),
         "patchset.yaml:8: patches[0] (id=foo): diff: patches is not a file"),
    case("overlay-is-a-file", foo("overlay", "patches/t.py"),
         "patchset.yaml:8: patches[0] (id=foo): overlay: patches/t.py is a file; an overlay is "
         "a directory of files laid over the checkout"),
    case("diff-of-text", foo("diff", "patches/bad.diff"),
         "patchset.yaml:8: patches[0] (id=foo): diff: patches/bad.diff …holds no file changes…",
         setup=bad_diff("just some text\n")),
    case("diff-empty", foo("diff", "patches/bad.diff"),
         "patchset.yaml:8: patches[0] (id=foo): diff: patches/bad.diff …holds no file changes…",
         setup=bad_diff("")),
    case("diff-invalid", foo("diff", "patches/bad.diff"),
         "patchset.yaml:8: patches[0] (id=foo): diff: patches/bad.diff …"
         "is not a valid unified diff: …",
         setup=bad_diff("--- a/x\n+++ b/x\n@@ -1,2 +1,2 @@\n-a\n")),
    case("diff-unsafe-path", foo("diff", "patches/bad.diff"),
         "patchset.yaml:8: patches[0] (id=foo): diff: patches/bad.diff …"
         "touches an unsafe path: …",
         setup=bad_diff("--- a/../x\n+++ b/../x\n@@ -1 +1 @@\n-a\n+b\n")),
    case("diff-too-large", foo("diff", "patches/huge.diff"),
         "patchset.yaml:8: patches[0] (id=foo): diff: patches/huge.diff is 100 MiB; a patch "
         "file is at most 64 MiB", setup=huge_diff),
    case("diff-binary", foo("diff", "patches/bin.diff"),
         "patchset.yaml:8: patches[0] (id=foo): diff: patches/bin.diff names a binary "
         "change without its content ('Binary files /dev/null and b/vllm/b.bin differ'); "
         "make it with `git diff --binary`", setup=binary_diff),
    case("path-climbs", foo("diff", "../outside.diff"),
         "patchset.yaml:8: patches[0] (id=foo): diff: …climbs out of the tree with '..'…"),
    case("path-climbs-inside", foo("diff", "patches/../../outside.diff"),
         "patchset.yaml:8: patches[0] (id=foo): diff: …climbs out of the tree with '..'…"),
    case("path-absolute", foo("diff", "/etc/passwd"),
         "patchset.yaml:8: patches[0] (id=foo): diff: …absolute path…"),
    case("path-the-folder", foo("diff", "./"),
         "patchset.yaml:8: patches[0] (id=foo): diff: …'./' names the folder itself…"),
    case("symlink-out-of-the-folder", foo("diff", "patches/elsewhere/a.diff"),
         "patchset.yaml:8: patches[0] (id=foo): diff: patches/elsewhere/a.diff leads "
         "outside the manifest's folder (through a symlink)", setup=link_out_of_the_folder),
    *[case(f"specifier-{spec}", entries(f"""\
        - id: foo
          summary: x
          diff: patches/a.diff
          vllm: "{spec}"
        """), f"patchset.yaml:9: patches[0] (id=foo): vllm: invalid PEP 440 version specifier "
              f"'{spec}' (e.g. \">=0.27.1,<0.33\")")
      for spec in [">=0.27.1 <0.33", "0.27.x", "=>1", ">=abc"]],
    case("replaces-on-a-diff", entries(f"""\
        - id: foo
          summary: x
          diff: patches/a.diff
          replaces:
            vllm/x.py: {SHA}
        """), "patchset.yaml:9: patches[0] (id=foo): replaces: only an overlay patch replaces "
              "files (this is a diff patch)"),
    case("replaces-not-in-the-overlay", entries(f"""\
        - id: foo
          summary: x
          overlay: overlays/o
          replaces:
            vllm/x.py: {SHA}
            vllm/y.py: {SHA}
        """), "patchset.yaml:11: patches[0] (id=foo): replaces: vllm/y.py is not a file under "
              "the overlay overlays/o"),
    case("replaces-not-a-sha", entries("""\
        - id: foo
          summary: x
          overlay: overlays/o
          replaces:
            vllm/x.py: abc123
        """), "patchset.yaml:10: patches[0] (id=foo): replaces[vllm/x.py]: expected the "
              "upstream git blob sha (40 hex digits), got 'abc123'"),
    # assertions
    case("verify-mapping", assertions("  {file: a.py, defines: x}\n"),
         "patchset.yaml:10: patches[0] (id=foo): verify: expected a list of assertions, got a "
         "mapping"),
    case("no-predicate", assertions("""\
        - file: vllm/x.py
          in: A
        """), "patchset.yaml:10: patches[0] (id=foo): verify[0]: no predicate; give exactly one "
              "of defines, calls, has_key, contains, not, not_contains"),
    case("two-predicates", assertions("""\
        - file: vllm/x.py
          defines: a
        - file: vllm/x.py
          calls: f
          contains: g
        """), "patchset.yaml:14: patches[0] (id=foo): verify[1]: two predicates (calls and "
              "contains); give exactly one of defines, calls, has_key, contains, not, not_contains"),
    case("unknown-predicate", assertions("""\
        - file: vllm/x.py
          define: a
        """), "patchset.yaml:11: patches[0] (id=foo): verify[0]: unknown key 'define'; "
              "did you mean 'defines'?"),
    case("assertion-without-a-file", assertions("- defines: a\n"),
         "patchset.yaml:10: patches[0] (id=foo): verify[0]: missing required key 'file'"),
    case("not-with-a-file", assertions("""\
        - file: vllm/x.py
          not:
            file: vllm/y.py
            calls: f
        """), "patchset.yaml:12: patches[0] (id=foo): verify[0].not: 'file' is not allowed "
              "inside 'not' (it checks the assertion's own file and scope)"),
    case("not-with-two-predicates", assertions("""\
        - file: vllm/x.py
          not: {calls: f, defines: g}
        """), "patchset.yaml:11: patches[0] (id=foo): verify[0].not: two predicates (calls "
              "and defines); give exactly one of defines, calls, has_key, contains"),
    case("not-of-a-string", assertions("""\
        - file: vllm/x.py
          not: calls f
        """), "patchset.yaml:11: patches[0] (id=foo): verify[0].not: expected a mapping with "
              "one predicate, got the string 'calls f'"),
    case("not-inside-not", assertions("""\
        - file: vllm/x.py
          not: {not: {calls: f}}
        """), "patchset.yaml:11: patches[0] (id=foo): verify[0].not: 'not' inside 'not'; "
              "state the predicate itself"),
    case("not-contains-inside-not", assertions("""\
        - file: vllm/x.py
          not: {not_contains: f}
        """), "patchset.yaml:11: patches[0] (id=foo): verify[0].not: 'not_contains' inside "
              "'not'; state the predicate itself"),
    case("artifact-bad-sha", entries("""\
        - id: foo
          summary: x
          artifact:
            wheel: https://example.com/x.whl
            sha256: abc
            member: a/b.so
            member_sha256: abc
            dist: flashinfer-jit-cache
        """), "patchset.yaml:10: patches[0] (id=foo): artifact.sha256: expected a sha256 (64 "
              "hex digits), got 'abc'"),
    case("artifact-missing-dist", entries(f"""\
        - id: foo
          summary: x
          artifact:
            wheel: https://example.com/x.whl
            sha256: {"a" * 64}
            member: a/b.so
            member_sha256: {"b" * 64}
        """), "patchset.yaml:9: patches[0] (id=foo): artifact: missing required key 'dist'"),
    case("artifact-plain-http", entries(f"""\
        - id: foo
          summary: x
          artifact:
            wheel: http://example.com/x.whl
            sha256: {"a" * 64}
            member: a/b.so
            member_sha256: {"b" * 64}
            dist: d
        """), "patchset.yaml:9: patches[0] (id=foo): artifact.wheel: 'http://example.com/x.whl': "
              "give a path beside the manifest or an https URL"),
    # assertions on C, C++ and CUDA files
    case("cxx-has-key", assertions("""\
        - file: csrc/moe.cuh
          has_key: x
        """), "patchset.yaml:11: patches[0] (id=foo): verify[0].has_key: has_key does not "
              "apply to CUDA files; give one of defines, calls, contains"),
    case("cxx-dotted-scope", assertions("""\
        - file: csrc/moe.cpp
          in: Runner.run
          contains: x
        """), "patchset.yaml:11: patches[0] (id=foo): verify[0].in: 'Runner.run' is not a C++ "
              "name like function, Class::method or ns::function"),
    case("cxx-defines-not-a-name", assertions("""\
        - file: csrc/moe.c
          defines: a b
        """), "patchset.yaml:11: patches[0] (id=foo): verify[0].defines: 'a b' is not a C name "
              "like NAME or ns::NAME"),
    case("python-scope-with-colons", assertions("""\
        - file: vllm/x.py
          in: A::b
          contains: x
        """), "patchset.yaml:11: patches[0] (id=foo): verify[0].in: 'A::b' is not a dotted name "
              "like Class.method"),
    # packages beside vllm
    case("packages-a-list", HEAD.replace("patches:\n", "packages: [flashinfer]\n"),
         "patchset.yaml:5: packages: expected a mapping of package name -> {dist, repo, ref}, "
         "got a list"),
    case("package-entry-null", packages("flashinfer:\n"),
         "patchset.yaml:6: packages.flashinfer: expected a mapping with dist, repo and ref, "
         "got nothing (null)"),
    case("package-unknown-key", packages("flashinfer: {dsit: x, repo: pypi, ref: v1}\n"),
         "patchset.yaml:6: packages.flashinfer: unknown key 'dsit'; did you mean 'dist'?"),
    case("package-missing-ref", packages("flashinfer:\n  repo: pypi\n"),
         "patchset.yaml:7: packages.flashinfer: missing required key 'ref'"),
    case("package-missing-repo", packages("flashinfer:\n  ref: v1\n"),
         "patchset.yaml:7: packages.flashinfer: missing required key 'repo'"),
    case("package-repo-number", packages("flashinfer:\n  repo: 5\n  ref: v1\n"),
         "patchset.yaml:7: packages.flashinfer.repo: expected a string or a list of strings, "
         "got the number 5"),
    case("package-repo-empty-list", packages("flashinfer:\n  repo: []\n  ref: v1\n"),
         "patchset.yaml:7: packages.flashinfer.repo: the list of repositories is empty"),
    case("package-repo-list-mapping", packages("flashinfer:\n  repo: [pypi, {a: b}]\n"
                                               "  ref: v1\n"),
         "patchset.yaml:7: packages.flashinfer.repo[1]: expected a string, got a mapping"),
    case("package-ref-expression", packages("flashinfer:\n  repo: pypi\n  ref: HEAD~1\n"),
         "patchset.yaml:8: packages.flashinfer.ref: 'HEAD~1' is a revision expression; give a "
         "tag, branch or commit"),
    case("package-ref-base-without-a-base", packages("flashinfer:\n  repo: image\n"
                                                     "  ref: base\n"),
         "patchset.yaml:8: packages.flashinfer.ref: 'base' pins what the base image holds, and "
         "image.base is not set"),
    case("package-name-uppercase", packages("FlashInfer: {repo: pypi, ref: v1}\n"),
         "patchset.yaml:6: packages: 'FlashInfer' is not a valid package name (lowercase "
         "letters, digits and '-', starting with a letter or digit)"),
    case("package-name-too-long", packages("a" * 101 + ": {repo: pypi, ref: v1}\n"),
         "patchset.yaml:6: packages: 'aaaa…...' is 101 characters long; a package name has "
         "at most 100"),
    case("package-vllm-again", packages("vllm: {repo: pypi, ref: v1}\n"),
         "patchset.yaml:6: packages: 'vllm' is pinned by the vllm: section; it cannot be "
         "declared again under packages:"),
    *[case(f"package-named-{key}", packages(f"{key}: {{repo: pypi, ref: v1}}\n"),
           f"patchset.yaml:6: packages: {key!r} is a key of a patch entry, and a package's name "
           f"is a range key on patches; name the package otherwise (dist: {key} keeps its "
           "distribution name)")
      for key in ("id", "summary", "diff", "verify", "variants", "runtime", "package",
                  "replaces", "sha256", "upstream")],
    case("package-dist-space", packages("flashinfer:\n  dist: flash infer\n  repo: pypi\n"
                                        "  ref: v1\n"),
         "patchset.yaml:7: packages.flashinfer.dist: 'flash infer' is not a distribution name "
         "(letters, digits, '.', '_' and '-', starting and ending with a letter or digit)"),
    case("package-dist-taken", packages("fi: {dist: flashinfer-python, repo: pypi, ref: v1}\n"
                                        "flashinfer:\n  dist: Flashinfer_Python\n"
                                        "  repo: pypi\n  ref: v1\n"),
         "patchset.yaml:8: packages.flashinfer.dist: 'Flashinfer_Python' is already the "
         "distribution of package 'fi' (line 6)"),
    case("package-dist-is-vllm", packages("mine: {repo: pypi, ref: v1}\n"
                                          "vllm-fork: {dist: vllm, repo: pypi, ref: v1}\n"),
         "patchset.yaml:7: packages.vllm-fork.dist: 'vllm' is already the distribution of "
         "package 'vllm' (line 2)"),
    case("patch-unknown-package", with_flashinfer("package: flashinfr\n"),
         "patchset.yaml:14: patches[0] (id=foo): package: unknown package 'flashinfr'; "
         "did you mean 'flashinfer'?"),
    case("patch-unknown-package-far", with_flashinfer("package: triton\n"),
         "patchset.yaml:14: patches[0] (id=foo): package: unknown package 'triton' "
         "(expected one of: vllm, flashinfer)"),
    case("patch-package-none-declared", entries("""\
        - id: foo
          summary: x
          package: flashinfer
          diff: patches/a.diff
        """), "patchset.yaml:8: patches[0] (id=foo): package: unknown package 'flashinfer': "
              "the manifest has only vllm (declare others under packages:)"),
    case("patch-package-number", with_flashinfer("package: 5\n"),
         "patchset.yaml:14: patches[0] (id=foo): package: expected a string, got the number 5 "
         "(quote it to make it a string)"),
    case("range-on-an-undeclared-package", with_flashinfer("triton: \"<3.4\"\n"),
         "patchset.yaml:14: patches[0] (id=foo): triton: a range on package 'triton', which "
         "the manifest does not have (packages: vllm, flashinfer; declare it under packages:)"),
    case("range-on-a-misspelt-package", with_flashinfer("flashnfer: \"<0.6.16\"\n"),
         "patchset.yaml:14: patches[0] (id=foo): flashnfer: a range on package 'flashnfer', "
         "which the manifest does not have; did you mean 'flashinfer'?"),
    case("range-on-flashinfer-undeclared", entries("""\
        - id: foo
          summary: x
          diff: patches/a.diff
          flashinfer: "<0.6.16"
        """), "patchset.yaml:9: patches[0] (id=foo): flashinfer: a range on package "
              "'flashinfer', which the manifest does not have (packages: vllm; declare it under "
              "packages:)"),
    case("unknown-key-with-packages", with_flashinfer("flashinfer-x: yes\n"),
         "patchset.yaml:14: patches[0] (id=foo): unknown key 'flashinfer-x'; did you mean "
         "'flashinfer'?"),
    case("range-bad-specifier", with_flashinfer("flashinfer: \">>0.6\"\n"),
         "patchset.yaml:14: patches[0] (id=foo): flashinfer: invalid PEP 440 version specifier "
         "'>>0.6' (e.g. \">=0.27.1,<0.33\")"),
    case("range-a-number", with_flashinfer("flashinfer: 0.6\n"),
         "patchset.yaml:14: patches[0] (id=foo): flashinfer: expected a string, got the number "
         "0.6 (quote it to make it a string)"),
    *[case(f"assertion-{name}", assertions(verify + "\n"),
           "patchset.yaml:10: patches[0] (id=foo): " + expected + "…")
      for name, verify, expected in [
          ("file-climbs", "- {file: ../x.py, defines: a}",
           "verify[0].file: path '../x.py' climbs out"),
          ("file-absolute", "- {file: /x.py, defines: a}", "verify[0].file: absolute path"),
          ("in-not-dotted", "- {file: a.py, in: A..b, defines: a}",
           "verify[0].in: 'A..b' is not a dotted name"),
          ("defines-not-a-name", "- {file: a.py, defines: a.b}",
           "verify[0].defines: 'a.b' is not a Python name"),
          ("calls-not-dotted", "- {file: a.py, calls: f()}",
           "verify[0].calls: 'f()' is not a dotted name"),
          ("contains-number", "- {file: a.py, contains: 7}",
           "verify[0].contains: expected a string, got the number 7"),
      ]],
]


TWO = """\
    - id: old-fix
      summary: x
      diff: patches/a.diff
    - id: new-fix
      summary: y
      diff: patches/a.diff
      supersedes: {}
    """
ERRORS += [
    case("supersedes-unknown", entries(TWO.format("[old-fx]")),
         "patchset.yaml:12: patches[1] (id=new-fix): supersedes: no patch has the id 'old-fx'; "
         "did you mean 'old-fix'?"),
    case("supersedes-itself", entries(TWO.format("[new-fix]")),
         "patchset.yaml:12: patches[1] (id=new-fix): supersedes[0]: a patch cannot supersede "
         "itself"),
    case("supersedes-not-a-list", entries(TWO.format("old-fix")),
         "patchset.yaml:12: patches[1] (id=new-fix): supersedes: expected a list of patch ids, "
         "got …"),
    case("supersedes-other-package",
         HEAD.replace("patches:\n", FLASHINFER + "patches:\n") + textwrap.dedent(TWO.format(
             "[old-fix]")).replace("  diff: patches/a.diff\n  supersedes",
                                   "  diff: patches/a.diff\n  package: flashinfer\n  supersedes"),
         "patchset.yaml:…: patches[1] (id=new-fix): supersedes: 'old-fix' patches vllm, this "
         "patch flashinfer: a fix is carried on within its package"),
]

RETIRED = """\
    - id: old-fix
      summary: x
      diff: patches/a.diff
      retired: {}
    """
LOOP = """\
    - id: old-fix
      summary: x
      diff: patches/a.diff
      retired: {{from: v0.32.0, why: gone}}
      supersedes: [new-fix]
    - id: new-fix
      summary: y
      diff: patches/a.diff
      supersedes: {}
    """
ERRORS += [
    case("retired-no-why", entries(RETIRED.format("{from: v0.32.0}")),
         "patchset.yaml:9: patches[0] (id=old-fix): retired: missing required key 'why'"),
    case("retired-no-release", entries(RETIRED.format("{why: gone}")),
         "patchset.yaml:9: patches[0] (id=old-fix): retired: missing required key 'from'"),
    case("retired-not-a-tag", entries(RETIRED.format("{from: 0.32.0, why: gone}")),
         "patchset.yaml:9: patches[0] (id=old-fix): retired.from: '0.32.0' is not a release tag "
         "of vLLM (vX.Y.Z)"),
    case("retired-empty-why", entries(RETIRED.format("{from: v0.32.0, why: ' '}")),
         "patchset.yaml:9: patches[0] (id=old-fix): retired.why: …"),
    case("retired-a-word", entries(RETIRED.format("v0.32.0")),
         "patchset.yaml:9: patches[0] (id=old-fix): retired: expected a mapping {from: vX.Y.Z, "
         "why: \"...\"}, got …"),
    case("retired-unknown-key", entries(RETIRED.format("{from: v0.32.0, why: x, since: 1}")),
         "patchset.yaml:9: patches[0] (id=old-fix): retired: unknown key 'since'…"),
    case("supersedes-retired-loop", entries(LOOP.format("[old-fix]")),
         "patchset.yaml:10: patches[0] (id=old-fix): supersedes: a loop (old-fix -> new-fix -> "
         "old-fix): each patch carries on the next one's fix, so none stands alone; old-fix is "
         "retired as well"),
]


def test_retired_is_a_release_and_a_reason(repo: Path) -> None:
    write(repo, entries(RETIRED.format('{from: v0.32.0, why: "vLLM removed the setting"}')))
    (p,) = manifest.load("patchset.yaml").patches
    assert (p.retired.ref, p.retired.why) == ("v0.32.0", "vLLM removed the setting")
    assert p.takes_effect({"vllm": "0.31.0"}) == (True, "")
    assert p.takes_effect({"vllm": "0.32.0"}) == (
        False, "retired from v0.32.0: vLLM removed the setting")


def test_supersedes_names_earlier_fixes(repo: Path) -> None:
    write(repo, entries(TWO.format("[old-fix]")))
    old, new = manifest.load("patchset.yaml").patches
    assert (old.supersedes, new.supersedes) == ((), ("old-fix",))


def matches(expected: str, message: str) -> bool:
    return re.fullmatch(".*".join(map(re.escape, expected.split("…"))), message, re.S) is not None


def test_cxx_assertions_take_qualified_scopes_and_not_contains(repo: Path) -> None:
    write(repo, assertions("""\
        - file: csrc/moe.cuh
          in: CutlassMoeFCRunner<T, W>::compute
          not_contains: TLLM_THROW
        - file: csrc/moe.cuh
          in: tk::moe::kernel
          calls: this->sync
        """))
    first, second = manifest.load("patchset.yaml").patches[0].verify
    assert (first.predicate, first.scope, first.negated.predicate, first.negated.value) == (
        "not", "CutlassMoeFCRunner<T, W>::compute", "contains", "TLLM_THROW")
    assert first.describe() == "not contains TLLM_THROW in CutlassMoeFCRunner<T, W>::compute"
    assert (second.predicate, second.value) == ("calls", "this->sync")


@pytest.mark.parametrize("text, expected, path, setup", ERRORS)
def test_each_mistake_is_one_line_naming_its_line(repo: Path, text: str | None, expected: str,
                                                  path: str | Path, setup) -> None:
    if setup is not None:
        setup(repo)
    if text is not None:
        (repo / path).write_text(textwrap.dedent(text))
    with pytest.raises(ManifestError) as info:
        manifest.load(path)
    message = str(info.value)
    assert "\n" not in message
    assert matches(expected, message), message


# ------------------------------------------------------------------------------ image.serve

def test_image_serve_gives_a_command_and_an_environment(repo: Path) -> None:
    write(repo, HEAD.replace("patches:\n", "image:\n  serve:\n    command: [vllm, serve, /m]\n"
                             "    env: {HF_HUB_OFFLINE: 1, MY_NAME: qwen}\npatches: []\n"))
    serve = manifest.load(repo / "patchset.yaml").image.serve
    assert serve.command == ("vllm", "serve", "/m")
    assert serve.env == (("HF_HUB_OFFLINE", "1"), ("MY_NAME", "qwen"))
    write(repo, HEAD.replace("patches:\n", "patches: []\n"))
    assert manifest.load(repo / "patchset.yaml").image.serve is None


@pytest.mark.parametrize("serve, message", [
    ("serve: {command: []}", "patchset.yaml:6: image.serve.command: give the program to run"),
    ("serve: {command: vllm serve}", "patchset.yaml:6: image.serve.command: expected a list"),
    ("serve: {env: {1x: a}}", "patchset.yaml:6: image.serve.env: '1x' is not a variable name"),
    ("serve: {env: {A: }}", "patchset.yaml:6: image.serve.env.A: give a value"),
    ("serve: {cmd: [a]}", "patchset.yaml:6: image.serve: unknown key 'cmd'; did you mean "
                          "'command'?"),
    ("serve: [vllm, serve]", "patchset.yaml:6: image.serve: expected a mapping"),
])
def test_a_bad_image_serve_is_one_line_naming_its_line(repo: Path, serve: str,
                                                        message: str) -> None:
    write(repo, HEAD.replace("patches:\n", f"image:\n  {serve}\npatches: []\n"))
    with pytest.raises(ManifestError) as info:
        manifest.load(repo / "patchset.yaml")
    assert message in str(info.value), str(info.value)
    assert "\n" not in str(info.value)


# ------------------------------------------------------------------- inputs found by fuzzing
# Each was an exit 3 ("unexpected error") or a line of 100 KB; each is one short line now.

LONG = "a" * 300   # longer than a file name may be


def _refused(repo: Path, text: str | None = None) -> str:
    if text is not None:
        (repo / "patchset.yaml").write_text(text)
    with pytest.raises(ManifestError) as err:
        manifest.load("patchset.yaml")
    said = str(err.value)
    assert "\n" not in said and len(said) < 400, said
    return said


@pytest.mark.parametrize("key,value", [
    ("diff", f"patches/{LONG}.diff"),
    ("transform", f"patches/{LONG}.py"),
    ("overlay", f"overlays/{LONG}"),
    ("diff", f"{LONG}/x.diff"),
])
def test_a_path_with_a_name_too_long_for_the_system(repo: Path, key: str, value: str) -> None:
    said = _refused(repo, HEAD + f"  - id: p\n    summary: s\n    {key}: {value}\n")
    assert said.startswith(f"patchset.yaml:8: patches[0] (id=p): {key}: path '")
    assert "has a name longer than 255 bytes" in said


def test_a_diff_touching_a_path_too_long(repo: Path) -> None:
    (repo / "patches/a.diff").write_text(DIFF.replace("vllm/x.py", f"vllm/{LONG}.py"))
    said = _refused(repo, HEAD + "  - id: p\n    summary: s\n    diff: patches/a.diff\n")
    assert "touches an unsafe path" in said and "longer than 255 bytes" in said


@pytest.mark.parametrize("key", ["repo", "ref"])
def test_a_value_of_100000_characters_is_refused_and_quoted_short(repo: Path, key: str) -> None:
    text = HEAD.replace(f"  {key}: ", f"  {key}: {'h' * 100_000}#")
    said = _refused(repo, text)
    line = 3 if key == "repo" else 4
    value = text.splitlines()[line - 1].split(": ", 1)[1]
    assert said == (f"patchset.yaml:{line}: vllm.{key}: '{'h' * 80}…' is {len(value)} "
                    "characters long; a value has at most 4096")


def test_a_nul_byte_in_a_value(repo: Path) -> None:
    said = _refused(repo, HEAD.replace("repo: pypi", "repo: py\0pi"))
    assert said == ("patchset.yaml:3: YAML syntax error: character #x0000 is not allowed in "
                    "YAML text")


@pytest.mark.parametrize("target", ["/dev/zero", "/dev/null"])
def test_a_manifest_that_is_a_link_to_a_device(repo: Path, target: str) -> None:
    os.symlink(target, repo / "patchset.yaml")
    assert _refused(repo) == ("patchset.yaml: is not a regular file (a device, a pipe or a "
                              "socket), not a manifest file")


def test_a_manifest_that_is_a_pipe_is_not_waited_on(repo: Path) -> None:
    os.mkfifo(repo / "patchset.yaml")
    assert "is not a regular file" in _refused(repo)


def test_a_manifest_over_one_mib(repo: Path) -> None:
    said = _refused(repo, HEAD + "#" * (1 << 20))
    assert said == "patchset.yaml: larger than 1 MiB; a manifest is a short text file"
