"""``patchkit rollback [--to TAG]``: the moving tag put on an earlier build on every node.

The build is ``--to`` (an immutable tag, ``<moving tag>-<12 hex>``), forced whatever its
evidence, else the newest build before the current one on the first node reached (the builds
in the order :mod:`patchkit.nodes.ledger` gives them) whose last evidence
(:mod:`patchkit.nodes.evidence`: what ``smoke`` or ``verify`` last found of it, in the cache or
beside it in its registry) did not fail.  A build whose last evidence failed is passed over,
and said; a build with no evidence is taken (nothing says it served badly: it was current
before, and rollback has always gone there), and said too.  Everything that can be refused is refused before any node changes (exit 2).
Then, node by node:

* a node whose moving tag names that build already: nothing (``already``);
* a node that holds the build: its moving tag moves, and no image bytes move (``moved``);
* a node that lacks it: the layers it lacks are sent as ``copy-image`` sends them, from a
  node that holds it, and proven by fingerprint under the immutable tag; only then does its
  moving tag move (``copied``).

After the move the node is read again: unless the moving tag names the build's fingerprint, it
is put back as it was and the node fails.  The build that was current stays (``--to`` rolls
forward again).  A node that cannot be reached fails alone, with one line; the rollback is
kept pending (``builds.Pending``), and the same command run again completes it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from patchkit.cache import cache_dir
from patchkit.errors import ImageError, Origin, PatchkitError, UsageError
from patchkit.nodes import ledger
from patchkit.nodes import evidence
from patchkit.image import labels
from patchkit.engines import facts
from patchkit.nodes import transfer
from patchkit.nodes import fleet
from patchkit.engines.docker import Engine
from patchkit.imageref import check_reference
from patchkit.manifest import Manifest
from patchkit.report import Word
from patchkit.run import built_tag
from patchkit.timeouts import DEFAULT_TIMEOUT

class NodeStatus(Word):
    """What a rollback did at one node (a dry run: what it would do)."""

    ALREADY = "already"      # its moving tag names the build already
    MOVED = "moved"          # it held the build: its moving tag moved, nothing sent
    COPIED = "copied"        # it lacked the build: the layers it lacked sent, then the tag moved
    FAILED = "failed"        # unreachable, or the copy or the move failed; its tag as it was


STATUSES = tuple(s.value for s in NodeStatus)


@dataclass(frozen=True)
class NodeRollback:
    node: str
    status: NodeStatus
    was: str | None = None       # the build the moving tag named before (immutable tag or id)
    error: str | None = None
    copy: transfer.TargetResult | None = None   # what was sent, when the node lacked it
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status is not NodeStatus.FAILED

    def to_dict(self) -> dict:
        data: dict = {"node": self.node, "status": self.status, "was": self.was,
                      "seconds": self.seconds}
        if self.error is not None:
            data["error"] = self.error
        if self.copy is not None:
            data["sent"] = self.copy.sent.to_dict()
        return data


@dataclass(frozen=True)
class Rollback:
    """What ``rollback`` did; ``to_dict`` is the ``--format json`` shape."""

    moving: str
    to: str
    fingerprint: str | None      # None: the source's store tells it only through an export
    nodes: list[NodeRollback]
    dry_run: bool = False
    resumed: bool = False        # it completed a rollback an earlier run left pending
    why: str | None = None       # why this build: its last evidence, or none, or --to
    passed_over: list[str] = field(default_factory=list)   # "TAG: its failed evidence"
    pairings: list[fleet.Pairing] = field(default_factory=list)   # addresses sharing an ID

    @property
    def ok(self) -> bool:
        return all(n.ok for n in self.nodes)

    def to_dict(self) -> dict:
        return {"ok": self.ok, "moving_tag": self.moving, "to": self.to,
                "fingerprint": self.fingerprint, "dry_run": self.dry_run,
                "resumed": self.resumed, "why": self.why, "passed_over": self.passed_over,
                "nodes": [n.to_dict() for n in self.nodes],
                "same_engine_id": [p.to_dict() for p in self.pairings]}


@dataclass(frozen=True)
class Request:
    """What rollback is asked."""

    to: str | None = None            # the build (its immutable tag); None: the one before
    tag: str | None = None           # the moving tag; None: --to's, else the manifest's
    nodes: Sequence[str] = ()        # more nodes besides DOCKER_HOST's and image.nodes
    dry_run: bool = False
    timeout: float = DEFAULT_TIMEOUT


@dataclass(frozen=True)
class _Move:
    """One rollback's decisions, the same for every node."""

    moving: str
    target: str
    want: "Content"
    source: Engine
    request: Request
    log: Callable[[str], None]
    history: ledger.History


def run(manifest: Manifest, request: Request = Request(), *,
        log: Callable[[str], None] = lambda m: None, history: ledger.History | None = None,
        connect: Callable[[str], Engine] | None = None) -> Rollback:
    moving = _moving(manifest, request.to, request.tag)
    urls = fleet.addresses(manifest.image.nodes, request.nodes, "--node")
    history = history or ledger.History(cache_dir())
    pending = ledger.Pending(moving, history.cache)
    reached = fleet.reach(urls, request.timeout, connect)
    try:
        found = _read(reached, manifest.name, history)
        chosen = _target(manifest, moving, request.to, found, pending,
                         evidence.Store(history.cache, request.timeout))
        target, resumed = chosen.tag, chosen.resumed
        source, want = _source(found, target)
        log(f"rolling {moving} back to {target} ({want})")
        if not request.dry_run:
            pending.keep(target)   # before any node moves: an interrupted run is completed too
        move = _Move(moving, target, want, source, request, log, history)
        done = [_node(n, nb, move) for n, nb in found]
    finally:
        fleet.close(reached)
    if not request.dry_run and all(n.ok for n in done):
        pending.done()
    return Rollback(moving, target, want.fingerprint, done, request.dry_run, resumed,
                    chosen.why, chosen.passed_over, fleet.pairings(reached))


def _moving(manifest: Manifest, to: str | None, tag: str | None) -> str:
    """The moving tag: ``tag``, else the one ``to`` was made beside, else the manifest's."""
    if tag is not None:
        check_reference(Origin("tag"), tag, digest_ok=False)
    if to is None:
        return tag or built_tag(manifest)
    check_reference(Origin("to"), to, digest_ok=False)
    beside = labels.moving_of(to)
    if beside is None:
        raise UsageError(f"--to {to}: not a build's immutable tag (<moving tag>-<12 hex>, as "
                         "'patchkit images' lists them)")
    if tag is not None and beside != tag:
        raise UsageError(f"--to {to} is a build of {beside}, not of {tag}")
    return beside


def _read(reached: Sequence[fleet.Node], patchset: str, history: ledger.History
          ) -> list[tuple[fleet.Node, ledger.NodeBuilds | None]]:
    live = [n for n in reached if n.engine is not None]
    got = dict(zip(map(id, live), fleet.each(
        live, lambda n: ledger.read(n.engine, patchset, history))))
    out = []
    for node in reached:
        nb, error = got.get(id(node), (None, None))
        if error is not None:
            node.error = str(error)
        out.append((node, nb))
    return out


@dataclass(frozen=True)
class _Chosen:
    tag: str
    resumed: bool = False
    why: str | None = None
    passed_over: list[str] = field(default_factory=list)


def _target(manifest: Manifest, moving: str, to: str | None,
            found: Sequence[tuple[fleet.Node, ledger.NodeBuilds | None]],
            pending: ledger.Pending, store: evidence.Store) -> _Chosen:
    """The build to roll back to (its immutable tag), refused with a usage error when there
    is none; whether it is a pending rollback's, and why it was chosen."""
    live = [(n, nb) for n, nb in found if nb is not None]
    if not live:
        raise ImageError("no node could be reached: "
                         + "; ".join(n.error or n.url for n, _ in found))
    if to is not None:
        return _forced(manifest, to, live)
    first, nb = live[0]
    current = nb.current(moving)
    left = pending.to()
    if left is not None and current is not None and current.fixed_for(moving) == left \
            and any(b is None or b.current(moving) is None
                    or b.current(moving).fixed_for(moving) != left for _, b in found):
        return _Chosen(left, True, "completing the rollback an earlier run left pending")
    if current is None:
        raise UsageError(f"{moving} names no build of {manifest.name} on {first.url}: "
                         "nothing to roll back from")
    lineage = nb.lineage(moving)
    older = [b for b in lineage[lineage.index(current) + 1:] if b.fixed_for(moving)]
    if not older:
        raise UsageError(f"nothing to roll back to: {first.url} holds no build of {moving} "
                         f"older than the current one "
                         f"({current.fixed_for(moving) or current.id[:19]})")
    passed: list[str] = []
    for b in older:
        tag = b.fixed_for(moving) or b.id
        last = store.of(b.id, b.image.repo_digests).last
        if last is not None and not last.ok:
            passed.append(f"{tag}: its last evidence failed ({last.describe()})")
            continue
        why = (f"the newest earlier build whose last evidence passed ({last.describe()})"
               if last is not None else
               "the newest earlier build not known to have failed: it has no evidence")
        return _Chosen(tag, False, why, passed)
    raise UsageError(f"nothing to roll back to: the last evidence of every build of {moving} "
                     f"older than the current one failed: {'; '.join(passed)} (--to forces one)")


def _forced(manifest: Manifest, to: str,
            live: Sequence[tuple[fleet.Node, ledger.NodeBuilds]]) -> _Chosen:
    """``--to``'s build, once a node reached holds it and it is this patchset's."""
    for node, _ in live:
        image = node.engine.inspect(to)
        if image is None:
            continue
        owner = labels.ImageFacts.from_labels(image.labels).patchset
        if owner != manifest.name:
            raise UsageError(f"--to {to} is " + (f"a build of the patchset {owner}"
                             if owner else "not a build of any patchset")
                             + f", not of {manifest.name} (on {node.url})")
        return _Chosen(to, why="--to: forced, whatever its evidence")
    raise UsageError(f"--to {to}: no node reached holds such a build "
                     f"({', '.join(n.url for n, _ in live)})")


@dataclass(frozen=True)
class Content:
    """What a node holds under a tag, as far as it tells without an export: the layers, the
    inputs key, and the fingerprint where the store's ids are config digests (a containerd
    store tells it only through an export, which over ssh would cross the link)."""

    diff_ids: tuple[str, ...]
    inputs: str | None
    fingerprint: str | None

    def same(self, other: "Content | None") -> bool:
        if other is None or (self.diff_ids, self.inputs) != (other.diff_ids, other.inputs):
            return False
        return None in (self.fingerprint, other.fingerprint) or \
            self.fingerprint == other.fingerprint

    def __str__(self) -> str:
        return self.fingerprint or f"{len(self.diff_ids)} layers, inputs {self.inputs}"


def _content(engine: Engine, ref: str) -> Content | None:
    image = (engine.content(ref) if engine.store().ids_are_config_digests
             else engine.inspect(ref))
    if image is None:
        return None
    return Content(image.diff_ids, image.labels.get(labels.INPUTS_LABEL),
                   facts.fingerprint(image) if image.config_digest else None)


def _source(found, target: str) -> tuple[Engine, Content]:
    """The first node that holds the build, and what it holds."""
    for node, nb in found:
        if nb is None or nb.by_tag(target) is None:
            continue
        content = _content(node.engine, target)
        if content is not None:
            return node.engine, content
    raise UsageError(f"{target}: no node reached holds it")


def _node(node: fleet.Node, nb: ledger.NodeBuilds | None, move: _Move) -> NodeRollback:
    started = time.monotonic()
    if nb is None:
        return NodeRollback(node.url, NodeStatus.FAILED, error=node.error)
    engine, moving, target, want = node.engine, move.moving, move.target, move.want
    current = nb.current(moving)
    was = (current.fixed_for(moving) or current.id[:19]) if current is not None else None
    status, copy, error = NodeStatus.ALREADY, None, None
    try:
        # the build holding both tags: the moving one names it already
        if current is None or current.fixed_for(moving) != target:
            held = want.same(_content(engine, target))
            status = NodeStatus.MOVED if held else NodeStatus.COPIED
            if not move.request.dry_run:
                if not held:
                    move.log(f"{node.url}: lacks {target}: sending the layers it lacks")
                    copied = transfer.copy(move.source, target, [node.url], log=move.log,
                                           timeout=move.request.timeout)
                    (copy,) = copied.targets
                    _proven(node, nb, move, copy)
                _moved(node, move)
    except PatchkitError as exc:
        status, error = NodeStatus.FAILED, str(exc)
    return NodeRollback(node.url, status, was, error, copy,
                        round(time.monotonic() - started, 2))


def _proven(node: fleet.Node, nb: ledger.NodeBuilds, move: _Move,
            copy: transfer.TargetResult) -> None:
    """The copy of the build to ``node`` proven to hold it, and kept in the history."""
    if not copy.ok:
        raise ImageError(copy.error or f"the copy of {move.target} failed")
    if not move.want.same(_content(node.engine, move.target)):
        raise ImageError(f"after the copy {move.target} there is not the build {move.want}")
    move.history.got_now(nb.identity, node.engine.tagged(move.target) or "")


def _moved(node: fleet.Node, move: _Move) -> None:
    """The moving tag put on the build ``node`` holds, read again, put back when it does not
    name it."""
    engine, moving, target = node.engine, move.moving, move.target
    proven = engine.tagged(target)
    previous = engine.tagged(moving)
    engine.tag(proven, moving)
    if engine.tagged(moving) != proven:
        engine.restore_tag(moving, previous)
        raise ImageError(f"after the move {moving} does not name {target}; it is put back "
                         "as it was")
    move.log(f"{node.url}: {moving} -> {target}")
