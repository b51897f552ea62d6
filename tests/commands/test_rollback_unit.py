"""rollback at one node, without an engine: what it did, said as a status, and its line."""

from __future__ import annotations

from types import SimpleNamespace

from patchkit.commands import rollback
from patchkit.commands.rollback import NodeStatus
from patchkit.image import labels
from patchkit.nodes import fleet
from patchkit.render import images

WANT = rollback.Content(("sha256:a",), "k", None)
MOVING, TARGET = "app:v1", "app:v1-0123456789ab"


class _Engine:
    """Tags naming images; ``sticky``: a move of the moving tag does not take."""

    def __init__(self, tags: dict[str, str], sticky: bool = False) -> None:
        self.tags, self.sticky = dict(tags), sticky

    def store(self):
        return SimpleNamespace(ids_are_config_digests=False)

    def inspect(self, ref):
        if ref not in self.tags:
            return None
        return SimpleNamespace(diff_ids=WANT.diff_ids, labels={labels.INPUTS_LABEL: "k"},
                               config_digest=None)

    def tagged(self, ref):
        return self.tags.get(ref)

    def tag(self, image, ref):
        if not self.sticky:
            self.tags[ref] = image

    def restore_tag(self, ref, previous):
        self.tags[ref] = previous


def _node(engine: _Engine, current: str | None, dry_run: bool = False):
    build = None if current is None else SimpleNamespace(
        fixed_for=lambda moving: current, id="sha256:" + "f" * 64)
    nb = SimpleNamespace(current=lambda moving: build, identity="id")
    move = rollback._Move(MOVING, TARGET, WANT, engine, rollback.Request(dry_run=dry_run),
                          lambda m: None, SimpleNamespace(got_now=lambda *a: None))
    return rollback._node(fleet.Node("ssh://n", engine), nb, move)


def test_a_node_whose_moving_tag_names_the_build_already():
    done = _node(_Engine({TARGET: "i1", MOVING: "i1"}), TARGET)
    assert (done.status, done.ok, done.was) == (NodeStatus.ALREADY, True, TARGET)


def test_a_node_holding_the_build_moves_its_tag():
    engine = _Engine({TARGET: "i1", MOVING: "i2"})
    done = _node(engine, "app:v1-ffffffffffff")
    assert (done.status, done.ok, engine.tags[MOVING]) == (NodeStatus.MOVED, True, "i1")
    assert done.to_dict()["status"] == "moved"


def test_a_move_that_does_not_take_fails_and_is_put_back():
    done = _node(_Engine({TARGET: "i1", MOVING: "i2"}, sticky=True), "app:v1-ffffffffffff")
    assert (done.status, done.ok) == (NodeStatus.FAILED, False)
    assert done.error.startswith(f"after the move {MOVING} does not name {TARGET}")


def test_a_dry_run_says_a_node_lacking_the_build_would_get_a_copy():
    engine = _Engine({MOVING: "i2"})
    done = _node(engine, "app:v1-ffffffffffff", dry_run=True)
    assert (done.status, done.copy, engine.tags) == (NodeStatus.COPIED, None, {MOVING: "i2"})


def test_each_status_is_one_line():
    nodes = [rollback.NodeRollback("a", NodeStatus.ALREADY, TARGET),
             rollback.NodeRollback("b", NodeStatus.MOVED, None),
             rollback.NodeRollback("c", NodeStatus.COPIED, "x"),
             rollback.NodeRollback("d", NodeStatus.FAILED, error="unreachable")]
    said = images.rollback(rollback.Rollback(MOVING, TARGET, None, nodes, dry_run=True))
    assert said.splitlines() == [
        f"already   a: {MOVING} names {TARGET} already",
        f"would-be moved b: {MOVING} -> {TARGET} (was nothing); held there, nothing sent",
        f"would-be copied c: {MOVING} -> {TARGET} (was x); the layers it lacks to send",
        "failed    d: unreachable"]
    assert rollback.STATUSES == ("already", "moved", "copied", "failed")
