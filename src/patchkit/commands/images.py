"""``patchkit images``: this patchset's builds on every node, newest first, which one is
current, and the nodes that drift; ``images --prune --keep N``: the builds beyond the newest N
removed from each node, but never one that is current, that a container uses, or that carries
a tag patchkit did not make.

The nodes are the engine DOCKER_HOST names, the manifest's ``image.nodes`` and each one given
(:mod:`patchkit.nodes.fleet`); the builds and their order are :mod:`patchkit.nodes.ledger`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from patchkit.cache import cache_dir
from patchkit.errors import ImageError, PatchkitError, UsageError
from patchkit.nodes import ledger
from patchkit.nodes.evidence import Record, Store
from patchkit.nodes import fleet
from patchkit.engines.docker import Engine
from patchkit.manifest import Manifest
from patchkit.timeouts import DEFAULT_TIMEOUT


@dataclass
class NodeListing:
    node: str
    builds: list[ledger.Build] = field(default_factory=list)
    error: str | None = None
    evidence: dict[str, list[Record]] = field(default_factory=dict)  # by image id

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_dict(self) -> dict:
        def image(b: ledger.Build) -> dict:
            records = self.evidence.get(b.id, [])
            return {**b.to_dict(), "evidence": [r.to_dict() for r in records],
                    "last_evidence": records[-1].to_dict() if records else None}
        data: dict = {"node": self.node, "ok": self.ok,
                      "images": [image(b) for b in self.builds]}
        if self.error is not None:
            data["error"] = self.error
        return data


@dataclass
class Drift:
    """A moving tag that names different builds on different nodes."""

    tag: str
    holders: dict[str, str | None]     # node -> the immutable tag it runs (None: nothing)

    def to_dict(self) -> dict:
        return {"tag": self.tag, "nodes": self.holders}


@dataclass
class Listing:
    """What ``images`` found; ``to_dict`` is the ``--format json`` shape."""

    patchset: str
    nodes: list[NodeListing]
    drift: list[Drift]
    problems: list[str] = field(default_factory=list)   # evidence named and skipped
    pairings: list[fleet.Pairing] = field(default_factory=list)   # addresses sharing an ID

    @property
    def ok(self) -> bool:
        return all(n.ok for n in self.nodes)

    def to_dict(self) -> dict:
        return {"ok": self.ok, "patchset": self.patchset,
                "nodes": [n.to_dict() for n in self.nodes],
                "drift": [d.to_dict() for d in self.drift],
                "evidence_problems": self.problems,
                "same_engine_id": [p.to_dict() for p in self.pairings]}


def run(manifest: Manifest, nodes: Sequence[str] = (), *, timeout: float = DEFAULT_TIMEOUT,
        history: ledger.History | None = None,
        connect: Callable[[str], Engine] | None = None) -> Listing:
    """This patchset's builds on every node (exit 1 when a node cannot be reached: the others
    are listed), each with its evidence (the cache's, and what its registries hold)."""
    urls = fleet.addresses(manifest.image.nodes, nodes, "--node")
    history = history or ledger.History(cache_dir())
    reached = fleet.reach(urls, timeout, connect)
    try:
        listed = [got for got, _ in fleet.each(
            reached, lambda n: _listing(n, manifest.name, history))]
    finally:
        fleet.close(reached)
    problems = _evidence(listed, Store(history.cache, timeout))
    return Listing(manifest.name, listed, drift(listed), problems, fleet.pairings(reached))


def _evidence(listed: Sequence[NodeListing], store: Store) -> list[str]:
    """Each build's records, read once per build whatever the nodes holding it."""
    found: dict[str, list[Record]] = {}
    problems: list[str] = []
    for node in listed:
        for b in node.builds:
            if b.id not in found:
                got = store.of(b.id, b.image.repo_digests)
                found[b.id] = got.records
                problems += [p for p in got.problems if p not in problems]
            node.evidence[b.id] = found[b.id]
    return problems


@dataclass
class Evidence:
    """``images --evidence TAG``: every record of one build, oldest first."""

    tag: str
    image_id: str | None
    records: list[Record]
    problems: list[str]

    @property
    def ok(self) -> bool:
        return True

    def to_dict(self) -> dict:
        return {"ok": True, "build": self.tag, "image_id": self.image_id,
                "records": [r.to_dict() for r in self.records], "problems": self.problems}


def evidence(manifest: Manifest, tag: str, nodes: Sequence[str] = (), *,
             timeout: float = DEFAULT_TIMEOUT, cache=None,
             connect: Callable[[str], Engine] | None = None) -> Evidence:
    """Every record of the build ``tag`` names (its immutable tag, or an image id): found on
    the first node that holds it (its registries too), else in the cache alone."""
    store = Store(cache, timeout)
    urls = fleet.addresses(manifest.image.nodes, nodes, "--node")
    reached = fleet.reach(urls, timeout, connect)
    try:
        for node in reached:
            if node.engine is None:
                continue
            try:
                image = node.engine.inspect(tag)
            except PatchkitError:
                continue
            if image is not None:
                got = store.of(image.id, image.repo_digests)
                return Evidence(tag, image.id, got.records, got.problems)
    finally:
        fleet.close(reached)
    got = store.by_tag(tag)
    if not got.records:
        raise UsageError(f"--evidence {tag}: no node reached holds such a build, and the cache "
                         "has no evidence of it")
    return Evidence(tag, got.records[-1].image_id, got.records, got.problems)


def _listing(node: fleet.Node, patchset: str, history: ledger.History) -> NodeListing:
    if node.engine is None:
        return NodeListing(node.url, error=node.error)
    try:
        return NodeListing(node.url, ledger.read(node.engine, patchset, history).builds)
    except PatchkitError as exc:
        return NodeListing(node.url, error=str(exc))


def drift(listed: Sequence[NodeListing]) -> list[Drift]:
    """Each moving tag whose current build is not the same on every node reached."""
    reached = [n for n in listed if n.ok]
    tags = sorted({t for n in reached for b in n.builds for t in b.moving})
    out = []
    for tag in tags:
        holders = {n.node: next((b.fixed_for(tag) or b.fixed or b.id for b in n.builds
                                 if tag in b.moving), None)
                   for n in reached}
        if len(set(holders.values())) > 1:
            out.append(Drift(tag, holders))
    return out


# ------------------------------------------------------------------------------------ prune

@dataclass
class Removed:
    tag: str
    id: str
    bytes: int


@dataclass
class Kept:
    tag: str
    id: str
    why: str


@dataclass
class NodePrune:
    node: str
    removed: list[Removed] = field(default_factory=list)
    kept: list[Kept] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def freed(self) -> int:
        return sum(r.bytes for r in self.removed)

    def to_dict(self) -> dict:
        data: dict = {"node": self.node, "ok": self.ok,
                      "removed": [vars(r) for r in self.removed],
                      "kept": [vars(k) for k in self.kept], "bytes_freed": self.freed}
        if self.error is not None:
            data["error"] = self.error
        return data


@dataclass
class Pruned:
    patchset: str
    keep: int
    nodes: list[NodePrune]
    dry_run: bool = False
    pairings: list[fleet.Pairing] = field(default_factory=list)   # addresses sharing an ID

    @property
    def ok(self) -> bool:
        return all(n.ok for n in self.nodes)

    def to_dict(self) -> dict:
        return {"ok": self.ok, "patchset": self.patchset, "keep": self.keep,
                "dry_run": self.dry_run, "nodes": [n.to_dict() for n in self.nodes],
                "same_engine_id": [p.to_dict() for p in self.pairings]}


def prune(manifest: Manifest, keep: int, nodes: Sequence[str] = (), *, dry_run: bool = False,
          timeout: float = DEFAULT_TIMEOUT, history: ledger.History | None = None,
          connect: Callable[[str], Engine] | None = None) -> Pruned:
    """On every node, this patchset's builds beyond the newest ``keep`` removed, but those
    current, used by a container (running or stopped), or carrying a tag patchkit did not
    make; what each removal freed, by the engine's count of the bytes no other image shares."""
    if keep < 1:
        raise UsageError(f"keep {keep}: keep at least 1 build (the newest) on each node")
    urls = fleet.addresses(manifest.image.nodes, nodes, "--node")
    history = history or ledger.History(cache_dir())
    reached = fleet.reach(urls, timeout, connect)
    try:
        done = [got for got, _ in fleet.each(
            reached, lambda n: _prune_node(n, manifest.name, keep, dry_run, history))]
    finally:
        fleet.close(reached)
    return Pruned(manifest.name, keep, done, dry_run, fleet.pairings(reached))


def _prune_node(node: fleet.Node, patchset: str, keep: int, dry_run: bool,
                history: ledger.History) -> NodePrune:
    result = NodePrune(node.url, error=node.error)
    engine = node.engine
    if engine is None:
        return result
    try:
        listed = ledger.read(engine, patchset, history)
        found = listed.builds
        beyond = found[keep:]
        if not beyond:
            return result
        users = engine.users()
        own = engine.own_bytes()
        for b in beyond:
            name = b.fixed or b.id[:19]
            why = _kept_why(b, users)
            if why:
                result.kept.append(Kept(name, b.id, why))
                continue
            if not dry_run:
                # its names, all patchkit's: the image goes with the last
                for ref in ((b.fixed, *b.more_fixed) if b.fixed else (b.id,)):
                    engine.untag(ref)
                if engine.inspect(b.id) is not None:
                    raise ImageError(f"{name} is still there after its tags were removed")
            result.removed.append(Removed(name, b.id, own.get(b.id, 0)))
        if not dry_run:
            history.forget(listed.identity, [r.id for r in result.removed])
    except PatchkitError as exc:
        result.error = str(exc)
    return result


def _kept_why(b: ledger.Build, users: dict[str, list[str]]) -> str | None:
    if b.current:
        return f"current under {', '.join(b.moving)}"
    if b.foreign:
        return f"carries {', '.join(b.foreign)}, a tag patchkit did not make"
    if users.get(b.id):
        return f"container {', '.join(users[b.id])} uses it"
    return None
