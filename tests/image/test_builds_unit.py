"""The pure parts of every build kept: the immutable tag, how a build's tags are told apart,
the history's order, and the manifest's image.nodes."""

from __future__ import annotations

import pytest

from patchkit import manifest
from patchkit.errors import ManifestError
from patchkit.image import labels
from patchkit.nodes import ledger
from patchkit.engines.facts import Inspected
from patchkit.imageref import Platform

KEY = "sha256:3f2a1b4c5d6e" + "0" * 52
LABELS = {labels.PATCHSET_LABEL: "dsv4", labels.INPUTS_LABEL: KEY}


def test_the_immutable_tag_is_the_moving_tag_and_twelve_hex_of_the_inputs():
    assert labels.immutable_tag("dsv4:v0.34.0", LABELS, "sha256:ff") == "dsv4:v0.34.0-3f2a1b4c5d6e"
    assert labels.immutable_tag("reg:5000/a/dsv4", LABELS, "x") == "reg:5000/a/dsv4:latest-3f2a1b4c5d6e"
    # a build without an inputs key (a source build) is named by its image id
    assert labels.immutable_tag("d:t", {}, "sha256:abcdef0123456789") == "d:t-abcdef012345"
    assert labels.moving_of("dsv4:v0.34.0-3f2a1b4c5d6e") == "dsv4:v0.34.0"
    assert labels.moving_of("reg:5000/dsv4:v0.34.0-3f2a1b4c5d6e") == "reg:5000/dsv4:v0.34.0"
    for not_one in ("dsv4:v0.34.0", "dsv4:v0.34.0-lone", "dsv4:v0.34.0-3F2A1B4C5D6E",
                    "dsv4:-3f2a1b4c5d6e"):
        assert labels.moving_of(not_one) is None, not_one


def image(tags, iid="sha256:" + "1" * 64, last=None, created="2026-01-01T00:00:00Z"):
    return Inspected(iid, (), Platform("linux", "arm64"), {"Labels": LABELS}, tuple(tags),
                     created=created, last_tagged=last)


def test_tags_are_told_apart_immutable_moving_and_the_users():
    b = ledger._build(image(["dsv4:v1", "dsv4:v1-3f2a1b4c5d6e", "mine:keep", "dsv4:v2"]), 1.0)
    assert b.fixed == "dsv4:v1-3f2a1b4c5d6e" and b.current
    assert b.moving == ("dsv4:v1",)
    # dsv4:v2 names the build, but patchkit did not make it beside an immutable tag
    assert b.foreign == ("mine:keep", "dsv4:v2")
    old = ledger._build(image(["dsv4:v1-3f2a1b4c5d6e"]), 1.0)
    assert (old.current, old.foreign, old.lineage("dsv4:v1")) == (False, (), True)


class FakeEngine:
    host = "unix:///x.sock"

    def __init__(self, images):
        self.images = {i.id: i for i in images}

    def identity(self):
        return "ENGINE-ID"

    def images_with_label(self, key, value):
        return list(self.images)

    def inspect(self, ref):
        return self.images.get(ref)


def test_the_order_is_when_the_node_got_them_and_a_retag_does_not_change_it(tmp_path):
    history = ledger.History(tmp_path)
    a = image(["dsv4:v1-3f2a1b4c5d6e"], "sha256:" + "a" * 64, last=100.0)
    b = image(["dsv4:v1", "dsv4:v1-3f2a1b4c5d6e"], "sha256:" + "b" * 64, last=200.0)
    first = ledger.read(FakeEngine([a, b]), "dsv4", history)
    assert [x.id for x in first.builds] == [b.id, a.id]
    # a tagged again later (a rollback): the engine's last-tag time moves, the order does not
    a2 = image(a.repo_tags, a.id, last=300.0)
    again = ledger.read(FakeEngine([a2, b]), "dsv4", history)
    assert [x.id for x in again.builds] == [b.id, a.id]
    # a loaded image never tagged: its creation time
    c = image(["dsv4:v1-aaaaaaaaaaaa"], "sha256:" + "c" * 64, last=None,
              created="1970-01-01T00:01:00Z")
    assert [x.id for x in ledger.read(FakeEngine([a2, b, c]), "dsv4", history).builds][-1] == c.id


def test_a_pending_rollback_is_kept_until_done(tmp_path):
    p = ledger.Pending("dsv4:v1", tmp_path)
    assert p.to() is None
    p.keep("dsv4:v1-3f2a1b4c5d6e")
    assert ledger.Pending("dsv4:v1", tmp_path).to() == "dsv4:v1-3f2a1b4c5d6e"
    assert ledger.Pending("dsv4:v2", tmp_path).to() is None
    p.done()
    assert p.to() is None


@pytest.mark.parametrize("nodes, said", [
    ("[ssh://spark-2, 'spark-3']", "image.nodes[1]: 'spark-3' is not an engine address"),
    ("[ssh://spark-2, ssh://spark-2]", "image.nodes[1]: 'ssh://spark-2' is listed already"),
    ("ssh://spark-2", "image.nodes: expected a list of engine addresses"),
])
def test_image_nodes_are_engine_addresses(tmp_path, nodes, said):
    path = tmp_path / "patchset.yaml"
    path.write_text(f"name: x\nvllm: {{repo: pypi, ref: v0.27.1}}\nimage:\n  nodes: {nodes}\n"
                    "patches: []\n")
    with pytest.raises(ManifestError) as err:
        manifest.load(path)
    assert said in str(err.value) and ":4:" in str(err.value)


def test_image_nodes_load(tmp_path):
    path = tmp_path / "patchset.yaml"
    path.write_text("name: x\nvllm: {repo: pypi, ref: v0.27.1}\nimage:\n"
                    "  nodes: [ssh://spark-2, 'unix:///run/d.sock']\npatches: []\n")
    assert manifest.load(path).image.nodes == ("ssh://spark-2", "unix:///run/d.sock")


def test_a_build_current_under_two_moving_tags_has_two_immutable_tags():
    b = ledger._build(image(["dsv4:v1", "dsv4:v1-3f2a1b4c5d6e", "dsv4:latest",
                             "dsv4:latest-3f2a1b4c5d6e"]), 1.0)
    assert set(b.moving) == {"dsv4:v1", "dsv4:latest"} and b.foreign == ()
    assert b.fixed_for("dsv4:latest") == "dsv4:latest-3f2a1b4c5d6e"
    assert b.lineage("dsv4:v1") and b.lineage("dsv4:latest") and not b.lineage("dsv4:v2")


def test_a_build_removed_is_forgotten(tmp_path):
    history = ledger.History(tmp_path)
    history.save("E", {"a": 1.0, "b": 2.0})
    history.forget("E", ["a"])
    assert history.of("E") == {"b": 2.0}


@pytest.mark.parametrize("kept", [b"[1, 2]", b'{"got": {"sha256:a": "soon"}}', b"\xff", None])
def test_a_damaged_node_history_or_pending_rollback_is_dropped(tmp_path, kept):
    """Found by fuzzing: a kept file that does not read as expected is no failure; it is
    dropped (learnt again from the engine) and made again."""
    from patchkit.nodes.ledger import History, Pending

    history, pending = History(tmp_path), Pending("demo:latest", tmp_path)
    history.save("engine-1", {"sha256:a": 1.0})
    pending.keep("sha256:b")
    for path in (history._path("engine-1"), pending._path()):
        path.unlink()
        if kept is None:
            path.mkdir()   # a folder in its place
        else:
            path.write_bytes(kept)
    assert history.of("engine-1") == {} and pending.to() is None
    assert not history._path("engine-1").exists() and not pending._path().exists()
    history.got_now("engine-1", "sha256:c")
    assert list(history.of("engine-1")) == ["sha256:c"]
