"""patchset.yaml loading: every mistake is one line naming the file, the line and the entry."""

from __future__ import annotations

import os
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


def error(repo: Path, text: str) -> str:
    write(repo, text)
    with pytest.raises(ManifestError) as info:
        manifest.load("patchset.yaml")
    message = str(info.value)
    assert "\n" not in message
    return message


def patch_error(repo: Path, entries: str) -> str:
    """The error for HEAD followed by the (dedented) patch entries."""
    return error(repo, HEAD + textwrap.dedent(entries))


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


# ---------------------------------------------------------------------------------- the file

def test_missing_manifest(repo: Path) -> None:
    with pytest.raises(ManifestError) as info:
        manifest.load("patchset.yaml")
    assert str(info.value) == "patchset.yaml: no such file"


def test_message_uses_the_path_as_given(repo: Path) -> None:
    (repo / "sub").mkdir()
    (repo / "sub" / "patchset.yaml").write_text("name: [\n")
    with pytest.raises(ManifestError) as info:
        manifest.load(Path("sub/patchset.yaml"))
    assert str(info.value).startswith("sub/patchset.yaml:2: YAML syntax error: ")


def test_yaml_syntax_error(repo: Path) -> None:
    message = error(repo, HEAD + "  - id: a\n    summary: x: y\n")
    assert message.startswith("patchset.yaml:7: YAML syntax error: ")
    assert "mapping values are not allowed here" in message


def test_empty_manifest(repo: Path) -> None:
    assert error(repo, "# nothing\n").startswith("patchset.yaml: the manifest is empty")


def test_top_level_must_be_a_mapping(repo: Path) -> None:
    assert error(repo, "- a\n- b\n") == (
        "patchset.yaml:1: expected a mapping with name, vllm and patches, got a list")


# ---------------------------------------------------------------------------------- top level

def test_unknown_top_level_key(repo: Path) -> None:
    assert error(repo, HEAD + "  []\npatchs: []\n") == (
        "patchset.yaml:7: unknown key 'patchs'; did you mean 'patches'?")


def test_unknown_key_without_a_close_match_lists_the_keys(repo: Path) -> None:
    assert error(repo, HEAD + "  []\nzzz: 1\n") == (
        "patchset.yaml:7: unknown key 'zzz' (expected one of: name, vllm, image, patches, "
        "variants, runtime)")


def test_duplicate_key(repo: Path) -> None:
    assert error(repo, HEAD + "  []\nname: again\n") == (
        "patchset.yaml:7: duplicate key 'name' (first on line 1)")


def test_missing_name(repo: Path) -> None:
    assert error(repo, "vllm: {repo: pypi, ref: v1}\n") == (
        "patchset.yaml:1: missing required key 'name'")


def test_missing_ref(repo: Path) -> None:
    assert error(repo, "name: demo\nvllm:\n  repo: pypi\npatches: []\n") == (
        "patchset.yaml:3: vllm: missing required key 'ref'")


def test_ref_that_yaml_reads_as_a_number(repo: Path) -> None:
    assert error(repo, "name: demo\nvllm:\n  repo: pypi\n  ref: 0.30\n") == (
        "patchset.yaml:4: vllm.ref: expected a string, got the number 0.30 "
        "(quote it to make it a string)")


@pytest.mark.parametrize("ref_yaml, expected", [
    ('"-x"', "patchset.yaml:4: vllm.ref: '-x' starts with '-'"),
    ('"v1 v2"', "patchset.yaml:4: vllm.ref: 'v1 v2' holds whitespace or a control character"),
    ("HEAD~1", "patchset.yaml:4: vllm.ref: 'HEAD~1' is a revision expression; give a tag, "
               "branch or commit"),
])
def test_ref_that_names_no_fixed_commit(repo: Path, ref_yaml: str, expected: str) -> None:
    assert error(repo, f"name: demo\nvllm:\n  repo: pypi\n  ref: {ref_yaml}\n") == expected


@pytest.mark.parametrize("image_yaml, expected", [
    ("tag: 'UPPER:{ref}'", "patchset.yaml:6: image.tag: 'UPPER:{ref}' is not an image reference: "
                           "the repository name must be lowercase"),
    ("base: vllm/vllm openai", "patchset.yaml:6: image.base: 'vllm/vllm openai' is not an image "
                               "reference: it is not NAME[:TAG] (lowercase letters, digits, and "
                               ". _ - / as separators)"),
])
def test_image_references_are_checked(repo: Path, image_yaml: str, expected: str) -> None:
    assert error(repo, f"name: demo\nvllm:\n  repo: pypi\n  ref: v1\nimage:\n  {image_yaml}\n") == (
        expected)


def test_image_tag_placeholders_are_fine(repo: Path) -> None:
    write(repo, "name: demo\nvllm:\n  repo: pypi\n  ref: v1\nimage:\n"
                "  base: vllm/vllm-openai@sha256:" + "a" * 64 + "\n  tag: '{name}:{ref}-{version}'\n")
    assert manifest.load("patchset.yaml").image.tag == "{name}:{ref}-{version}"


def test_yaml_nested_too_deeply_is_a_manifest_error(repo: Path) -> None:
    assert error(repo, "name: " + "[" * 5000 + "]" * 5000 + "\n") == (
        "patchset.yaml: YAML nested too deeply to read")


def test_binary_change_without_content_is_refused_by_validate(repo: Path) -> None:
    (repo / "patches" / "bin.diff").write_text(
        "diff --git a/vllm/b.bin b/vllm/b.bin\nnew file mode 100644\nindex 0000000..c94be36\n"
        "Binary files /dev/null and b/vllm/b.bin differ\n")
    assert patch_error(repo, """\
        - id: foo
          summary: x
          diff: patches/bin.diff
        """) == ("patchset.yaml:8: patches[0] (id=foo): diff: patches/bin.diff names a binary "
                 "change without its content ('Binary files /dev/null and b/vllm/b.bin differ'); "
                 "make it with `git diff --binary`")


@pytest.mark.parametrize("repo_yaml, expected", [
    ("5", "patchset.yaml:3: vllm.repo: expected a string or a list of strings, "
          "got the number 5"),
    ("[]", "patchset.yaml:3: vllm.repo: the list of repositories is empty"),
    ("[pypi, {a: b}]", "patchset.yaml:3: vllm.repo[1]: expected a string, got a mapping"),
    ('""', "patchset.yaml:3: vllm.repo: must not be empty"),
])
def test_bad_repo(repo: Path, repo_yaml: str, expected: str) -> None:
    assert error(repo, f"name: demo\nvllm:\n  repo: {repo_yaml}\n  ref: v1\n") == expected


def test_patches_must_be_a_list(repo: Path) -> None:
    assert error(repo, HEAD + "  {}\n") == (
        "patchset.yaml:6: patches: expected a list of patch entries, got a mapping")


def test_bad_platform(repo: Path) -> None:
    assert error(repo, HEAD + "  []\nimage:\n  platform: arm64\n") == (
        "patchset.yaml:8: image.platform: 'arm64' is not a platform like linux/arm64")


# ---------------------------------------------------------------------------------- patch entries

def test_entry_must_be_a_mapping(repo: Path) -> None:
    assert patch_error(repo, "- just-a-string\n") == (
        "patchset.yaml:6: patches[0]: expected a patch entry (a mapping), got the string "
        "'just-a-string'")


def test_unknown_patch_key_suggests(repo: Path) -> None:
    assert patch_error(repo, """\
        - id: foo
          sumary: x
          diff: patches/a.diff
        """) == "patchset.yaml:7: patches[0] (id=foo): unknown key 'sumary'; did you mean 'summary'?"


def test_summary_of_the_wrong_type(repo: Path) -> None:
    assert patch_error(repo, """\
        - id: ok
          summary: fine
          diff: patches/a.diff
        - id: foo
          summary: 3
          diff: patches/a.diff
        """) == ("patchset.yaml:10: patches[1] (id=foo): summary: expected a string, got the "
                 "number 3 (quote it to make it a string)")


def test_summary_must_be_one_line(repo: Path) -> None:
    assert patch_error(repo, """\
        - id: foo
          summary: |
            two
            lines
          diff: patches/a.diff
        """) == "patchset.yaml:7: patches[0] (id=foo): summary: must be one line"


def test_empty_summary(repo: Path) -> None:
    assert patch_error(repo, """\
        - id: foo
          summary: "  "
          diff: patches/a.diff
        """) == "patchset.yaml:7: patches[0] (id=foo): summary: must not be empty"


def test_missing_id(repo: Path) -> None:
    assert patch_error(repo, """\
        - summary: x
          diff: patches/a.diff
        """) == "patchset.yaml:6: patches[0]: missing required key 'id'"


def test_missing_summary(repo: Path) -> None:
    assert patch_error(repo, """\
        - id: foo
          diff: patches/a.diff
        """) == "patchset.yaml:6: patches[0] (id=foo): missing required key 'summary'"


@pytest.mark.parametrize("bad_id", ["Foo", "-foo", "foo_bar", "foo bar"])
def test_malformed_id(repo: Path, bad_id: str) -> None:
    message = patch_error(repo, f"""\
        - id: {bad_id}
          summary: x
          diff: patches/a.diff
        """)
    assert message.startswith(f"patchset.yaml:6: patches[0] (id={bad_id}): id: '{bad_id}' is "
                              "not a valid id")


def test_duplicate_id_names_the_first_line(repo: Path) -> None:
    assert patch_error(repo, """\
        - id: foo
          summary: x
          diff: patches/a.diff
        - id: bar
          summary: y
          diff: patches/a.diff
        - id: foo
          summary: z
          diff: patches/a.diff
        """) == "patchset.yaml:12: patches[2] (id=foo): id: duplicate id 'foo' (first used on line 6)"


def test_no_kind(repo: Path) -> None:
    assert patch_error(repo, """\
        - id: foo
          summary: x
        """) == ("patchset.yaml:6: patches[0] (id=foo): no patch kind: give exactly one of "
                 "diff, transform, overlay")


def test_two_kinds(repo: Path) -> None:
    assert patch_error(repo, """\
        - id: foo
          summary: x
          diff: patches/a.diff
          transform: patches/t.py
        """) == ("patchset.yaml:9: patches[0] (id=foo): transform: two patch kinds (diff and "
                 "transform) in one entry; give exactly one of diff, transform, overlay")


@pytest.mark.parametrize("kind, rel, expected", [
    ("diff", "patches/nope.diff", "diff: no such file: patches/nope.diff"),
    ("transform", "patches/nope.py", "transform: no such file: patches/nope.py"),
    ("overlay", "overlays/nope", "overlay: no such directory: overlays/nope"),
    ("transform", "patches/a.diff", "transform: patches/a.diff is not a Python file (.py)"),
    ("diff", "patches", "diff: patches is not a file"),
    ("overlay", "patches/t.py", "overlay: patches/t.py is a file; an overlay is a directory of "
                                "files laid over the checkout"),
])
def test_missing_or_wrong_patch_file(repo: Path, kind: str, rel: str, expected: str) -> None:
    assert patch_error(repo, f"""\
        - id: foo
          summary: x
          {kind}: {rel}
        """) == f"patchset.yaml:8: patches[0] (id=foo): {expected}"


@pytest.mark.parametrize("content, expected", [
    ("just some text\n", "holds no file changes"),
    ("", "holds no file changes"),
    ("--- a/x\n+++ b/x\n@@ -1,2 +1,2 @@\n-a\n", "is not a valid unified diff: "),
    ("--- a/../x\n+++ b/../x\n@@ -1 +1 @@\n-a\n+b\n", "touches an unsafe path: "),
])
def test_diff_that_is_not_a_diff(repo: Path, content: str, expected: str) -> None:
    (repo / "patches" / "bad.diff").write_text(content)
    message = patch_error(repo, """\
        - id: foo
          summary: x
          diff: patches/bad.diff
        """)
    assert message.startswith("patchset.yaml:8: patches[0] (id=foo): diff: patches/bad.diff ")
    assert expected in message


@pytest.mark.parametrize("rel, expected", [
    ("../outside.diff", "climbs out of the tree with '..'"),
    ("patches/../../outside.diff", "climbs out of the tree with '..'"),
    ("/etc/passwd", "absolute path"),
    ("./", "'./' names the folder itself"),
])
def test_unsafe_patch_path(repo: Path, rel: str, expected: str) -> None:
    message = patch_error(repo, f"""\
        - id: foo
          summary: x
          diff: {rel}
        """)
    assert message.startswith("patchset.yaml:8: patches[0] (id=foo): diff: ")
    assert expected in message


def test_symlink_out_of_the_manifest_folder(repo: Path, tmp_path_factory) -> None:
    outside = tmp_path_factory.mktemp("outside")
    (outside / "a.diff").write_text(DIFF)
    os.symlink(outside, repo / "patches" / "elsewhere")
    assert patch_error(repo, """\
        - id: foo
          summary: x
          diff: patches/elsewhere/a.diff
        """) == ("patchset.yaml:8: patches[0] (id=foo): diff: patches/elsewhere/a.diff leads "
                 "outside the manifest's folder (through a symlink)")


def test_symlink_inside_the_folder_is_fine(repo: Path) -> None:
    os.symlink("a.diff", repo / "patches" / "alias.diff")
    write(repo, HEAD + "  - {id: foo, summary: x, diff: patches/alias.diff}\n")
    assert manifest.load("patchset.yaml").patches[0].path == "patches/alias.diff"


@pytest.mark.parametrize("spec", [">=0.27.1 <0.33", "0.27.x", "=>1", ">=abc"])
def test_invalid_specifier(repo: Path, spec: str) -> None:
    assert patch_error(repo, f"""\
        - id: foo
          summary: x
          diff: patches/a.diff
          vllm: "{spec}"
        """) == (f"patchset.yaml:9: patches[0] (id=foo): vllm: invalid PEP 440 version specifier "
                 f"'{spec}' (e.g. \">=0.27.1,<0.33\")")


def test_replaces_on_a_diff(repo: Path) -> None:
    assert patch_error(repo, f"""\
        - id: foo
          summary: x
          diff: patches/a.diff
          replaces:
            vllm/x.py: {SHA}
        """) == ("patchset.yaml:9: patches[0] (id=foo): replaces: only an overlay patch replaces "
                 "files (this is a diff patch)")


def test_replaces_names_a_file_missing_from_the_overlay(repo: Path) -> None:
    assert patch_error(repo, f"""\
        - id: foo
          summary: x
          overlay: overlays/o
          replaces:
            vllm/x.py: {SHA}
            vllm/y.py: {SHA}
        """) == ("patchset.yaml:11: patches[0] (id=foo): replaces: vllm/y.py is not a file under "
                 "the overlay overlays/o")


def test_replaces_needs_a_blob_sha(repo: Path) -> None:
    assert patch_error(repo, """\
        - id: foo
          summary: x
          overlay: overlays/o
          replaces:
            vllm/x.py: abc123
        """) == ("patchset.yaml:10: patches[0] (id=foo): replaces[vllm/x.py]: expected the "
                 "upstream git blob sha (40 hex digits), got 'abc123'")


# ---------------------------------------------------------------------------------- assertions

def assertion_error(repo: Path, verify: str) -> str:
    entry = textwrap.dedent("""\
        - id: foo
          summary: x
          diff: patches/a.diff
          verify:
        """)
    return error(repo, HEAD + entry + textwrap.indent(textwrap.dedent(verify), "    "))


def test_verify_must_be_a_list(repo: Path) -> None:
    assert assertion_error(repo, "  {file: a.py, defines: x}\n") == (
        "patchset.yaml:10: patches[0] (id=foo): verify: expected a list of assertions, got a "
        "mapping")


def test_assertion_without_a_predicate(repo: Path) -> None:
    assert assertion_error(repo, """\
        - file: vllm/x.py
          in: A
        """) == ("patchset.yaml:10: patches[0] (id=foo): verify[0]: no predicate; give exactly one "
                 "of defines, calls, has_key, contains, not")


def test_assertion_with_two_predicates(repo: Path) -> None:
    assert assertion_error(repo, """\
        - file: vllm/x.py
          defines: a
        - file: vllm/x.py
          calls: f
          contains: g
        """) == ("patchset.yaml:14: patches[0] (id=foo): verify[1]: two predicates (calls and "
                 "contains); give exactly one of defines, calls, has_key, contains, not")


def test_unknown_predicate(repo: Path) -> None:
    assert assertion_error(repo, """\
        - file: vllm/x.py
          define: a
        """) == ("patchset.yaml:11: patches[0] (id=foo): verify[0]: unknown key 'define'; "
                 "did you mean 'defines'?")


def test_assertion_without_a_file(repo: Path) -> None:
    assert assertion_error(repo, "- defines: a\n") == (
        "patchset.yaml:10: patches[0] (id=foo): verify[0]: missing required key 'file'")


def test_not_with_a_file(repo: Path) -> None:
    assert assertion_error(repo, """\
        - file: vllm/x.py
          not:
            file: vllm/y.py
            calls: f
        """) == ("patchset.yaml:12: patches[0] (id=foo): verify[0].not: 'file' is not allowed "
                 "inside 'not' (it checks the assertion's own file and scope)")


def test_not_with_two_predicates(repo: Path) -> None:
    assert assertion_error(repo, """\
        - file: vllm/x.py
          not: {calls: f, defines: g}
        """) == ("patchset.yaml:11: patches[0] (id=foo): verify[0].not: two predicates (calls "
                 "and defines); give exactly one of defines, calls, has_key, contains")


def test_not_of_a_string(repo: Path) -> None:
    assert assertion_error(repo, """\
        - file: vllm/x.py
          not: calls f
        """) == ("patchset.yaml:11: patches[0] (id=foo): verify[0].not: expected a mapping with "
                 "one predicate, got the string 'calls f'")


def test_not_inside_not(repo: Path) -> None:
    assert assertion_error(repo, """\
        - file: vllm/x.py
          not: {not: {calls: f}}
        """) == ("patchset.yaml:11: patches[0] (id=foo): verify[0].not: 'not' inside 'not'; "
                 "state the predicate itself")


@pytest.mark.parametrize("verify, expected", [
    ("- {file: ../x.py, defines: a}", "verify[0].file: path '../x.py' climbs out"),
    ("- {file: /x.py, defines: a}", "verify[0].file: absolute path"),
    ("- {file: a.py, in: A..b, defines: a}", "verify[0].in: 'A..b' is not a dotted name"),
    ("- {file: a.py, defines: a.b}", "verify[0].defines: 'a.b' is not a Python name"),
    ("- {file: a.py, calls: f()}", "verify[0].calls: 'f()' is not a dotted name"),
    ("- {file: a.py, contains: 7}", "verify[0].contains: expected a string, got the number 7"),
])
def test_bad_assertion_values(repo: Path, verify: str, expected: str) -> None:
    message = assertion_error(repo, verify + "\n")
    assert message.startswith("patchset.yaml:10: patches[0] (id=foo): " + expected)


def test_two_documents(repo: Path) -> None:
    assert error(repo, HEAD + "  []\n---\nname: other\n") == (
        "patchset.yaml:7: YAML syntax error: expected a single document in the stream, "
        "but found another document")
