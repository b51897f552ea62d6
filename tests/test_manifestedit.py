from __future__ import annotations

import difflib

import pytest
import yaml
from fixtures import dedent

from patchkit.errors import ManifestError
from patchkit.manifest.edit import ManifestText, scalar, write_if_changed

TEXT = dedent("""
    # top comment
    name: demo
    vllm:
      repo: [a, b]      # flow list stays
      ref: 'v0.27.1'    # quoted pin
    image:
      base: vllm/vllm-openai:v0.27.1
    patches:
      # --- section one
      - id: one
        summary: >-
          folded
          summary
        diff: patches/one.diff   # trailing
        verify:
          - file: x.py
            defines: X

      # --- section two
      - id: two
        summary: plain
        vllm: ">=0.27.1"
        overlay: overlays/two
        replaces:
          x.py: aaaa
    # trailing comment
""")


def changed_lines(before: str, after: str) -> list[str]:
    return [line for line in difflib.unified_diff(before.splitlines(), after.splitlines(),
                                                   lineterm="", n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]


def test_set_scalar_keeps_quotes_and_comments():
    t = ManifestText(TEXT)
    t.set_scalar(("vllm", "ref"), "v0.33.0")
    assert changed_lines(TEXT, t.text) == ["-  ref: 'v0.27.1'    # quoted pin",
                                           "+  ref: 'v0.33.0'    # quoted pin"]
    t.set_scalar(("patches", 1, "vllm"), ">=0.27.1,<0.33.0")
    assert '    vllm: ">=0.27.1,<0.33.0"\n' in t.text
    t.set_scalar(("patches", 1, "replaces", "x.py"), "bbbb")
    assert "      x.py: bbbb\n" in t.text
    assert yaml.safe_load(t.text)["patches"][1]["replaces"] == {"x.py": "bbbb"}
    assert len(changed_lines(TEXT, t.text)) == 6


def test_set_scalar_replaces_a_folded_block():
    t = ManifestText(TEXT)
    t.set_scalar(("patches", 0, "summary"), "one line: now")
    data = yaml.safe_load(t.text)
    assert data["patches"][0]["summary"] == "one line: now"
    assert data["patches"][0]["diff"] == "patches/one.diff"
    assert "    diff: patches/one.diff   # trailing\n" in t.text


def test_plain_values_that_would_not_read_back_are_quoted():
    assert scalar("v0.33.0") == "v0.33.0"
    assert scalar(">=0.27.1") == '">=0.27.1"'
    assert scalar("a: b") == '"a: b"'
    assert scalar("yes") == '"yes"'
    assert scalar("12") == '"12"'
    assert scalar("x # y") == '"x # y"'
    assert scalar("it's", "'") == "'it''s'"
    for v in ("v1", ">=1,<2", "a: b", "yes", "null", "- x", "@x", "it's"):
        assert yaml.safe_load(f"k: {scalar(v)}")["k"] == v


def test_insert_key_after_a_key_at_the_entry_indent():
    t = ManifestText(TEXT)
    t.insert_key(("patches", 0), "vllm", "<0.33.0", after="diff", style='"')
    assert changed_lines(TEXT, t.text) == ['+    vllm: "<0.33.0"']
    lines = t.text.splitlines()
    assert lines[lines.index('    vllm: "<0.33.0"') - 1] == "    diff: patches/one.diff   # trailing"
    assert yaml.safe_load(t.text)["patches"][0]["verify"] == [{"file": "x.py", "defines": "X"}]


def test_insert_nested_mapping_and_into_mapping():
    t = ManifestText(TEXT)
    t.insert_key(("patches", 0), "replaces", {"a.py": "cccc"}, after="diff")
    t.insert_key(("patches", 1, "replaces"), "y.py", "dddd")
    data = yaml.safe_load(t.text)
    assert data["patches"][0]["replaces"] == {"a.py": "cccc"}
    assert data["patches"][1]["replaces"] == {"x.py": "aaaa", "y.py": "dddd"}
    assert t.text.endswith("      y.py: dddd\n# trailing comment\n")


def test_delete_item_keeps_section_comments():
    t = ManifestText(TEXT)
    t.delete_item(("patches",), 0)
    assert "id: one" not in t.text and "folded" not in t.text
    assert "  # --- section one\n\n  # --- section two\n  - id: two\n" in t.text
    assert [p["id"] for p in yaml.safe_load(t.text)["patches"]] == ["two"]
    t.delete_item(("patches",), 0)
    assert yaml.safe_load(t.text)["patches"] is None
    assert t.text.endswith("  # --- section two\n# trailing comment\n")


def test_append_item_follows_existing_indentation():
    t = ManifestText(TEXT)
    t.append_item(("patches",), [("id", "three"), ("summary", "new: one"),
                                 ("diff", "patches/three.diff")])
    assert changed_lines(TEXT, t.text) == ["+  - id: three", '+    summary: "new: one"',
                                           "+    diff: patches/three.diff"]
    assert "      x.py: aaaa\n  - id: three\n" in t.text
    assert yaml.safe_load(t.text)["patches"][2] == {"id": "three", "summary": "new: one",
                                                    "diff": "patches/three.diff"}
    wide = "name: x\npatches:\n    -   id: a\n        summary: s\n        diff: d\n"
    t = ManifestText(wide)
    t.append_item(("patches",), [("id", "b"), ("summary", "t"), ("diff", "e")])
    assert t.text == wide + "    -   id: b\n        summary: t\n        diff: e\n"


@pytest.mark.parametrize("tail", ["patches:\n", "patches: []   # none yet\n", "patches: ~\n", ""])
def test_append_item_to_an_empty_or_absent_list(tail):
    text = "name: demo  # keep\nvllm:\n  repo: x\n  ref: v1\n" + tail
    t = ManifestText(text)
    t.append_item(("patches",), [("id", "a"), ("summary", "s"), ("diff", "patches/a.diff")])
    assert yaml.safe_load(t.text)["patches"] == [{"id": "a", "summary": "s", "diff": "patches/a.diff"}]
    assert t.text.startswith("name: demo  # keep\n")
    if "none yet" in tail:
        assert "patches:   # none yet\n" in t.text


def test_flow_style_list_is_refused():
    t = ManifestText("name: x\npatches: [{id: a, summary: b, diff: c}]\n")
    with pytest.raises(ManifestError, match="flow-style"):
        t.append_item(("patches",), [("id", "b")])


def test_write_if_changed(tmp_path):
    f = tmp_path / "m.yaml"
    assert write_if_changed(f, b"a\n") is True
    f.chmod(0o600)
    before = f.stat().st_mtime_ns
    assert write_if_changed(f, b"a\n") is False
    assert f.stat().st_mtime_ns == before
    assert write_if_changed(f, b"b\n") is True
    assert f.read_bytes() == b"b\n" and f.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["m.yaml"]
