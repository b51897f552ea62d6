"""The overlay kind's file handling: compared and copied a chunk at a time."""

from __future__ import annotations

from patchkit.kinds import overlay


def test_same_bytes_reads_past_the_first_chunk(tmp_path):
    a, b, c, d = (tmp_path / n for n in "abcd")
    a.write_bytes(b"x" * 10 + b"1")
    b.write_bytes(b"x" * 10 + b"2")     # same size, differs in the last chunk
    c.write_bytes(b"x" * 10 + b"1")
    d.write_bytes(b"x" * 10)
    assert not overlay.same_bytes(a, b, chunk=4)
    assert overlay.same_bytes(a, c, chunk=4)
    assert not overlay.same_bytes(a, d, chunk=4)


def test_an_overlay_the_tree_holds_byte_for_byte_is_upstream(tmp_path):
    tree, root = tmp_path / "overlay", tmp_path / "checkout"
    for base in (tree, root):
        (base / "pkg").mkdir(parents=True)
        (base / "pkg/big.bin").write_bytes(bytes(range(256)) * 8192)   # 2 MiB, several chunks
    outcome = overlay.apply_tree(tree, root, "HEAD", {})
    assert (outcome.status, outcome.message) == ("upstream",
                                                 "the tree already holds every overlay file")
