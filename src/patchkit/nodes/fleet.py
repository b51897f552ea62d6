"""The nodes ``images`` and ``rollback`` act on: the engine DOCKER_HOST names, then the
manifest's ``image.nodes``, then each one given, each reached once.

A node that cannot be reached is kept as its one line (``Node.error``): the verbs go on with
the others and say it.  Two addresses are one node, the first address naming it, only when the
engine's ID, host name and root directory all agree (``Engine.sameness``): machines cloned from
one image, or two dockerds given one key file, report one ID and are still two engines.  Either
way, two addresses that share an ID are told (``Pairing``): merged, and why; or kept apart,
and by what.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable, Sequence, TypeVar

from patchkit.errors import PatchkitError
from patchkit.engines.docker import Engine, docker_host, engine_url

DEFAULT = "unix:///var/run/docker.sock"   # the SDK's when DOCKER_HOST is unset


@dataclass(frozen=True)
class Pairing:
    """Two addresses whose engines report one ID: ``merged`` (one engine, listed once as
    ``into``) or not (two engines that share an ID), and the facts that decided it."""

    address: str
    into: str
    merged: bool
    reason: str

    def to_dict(self) -> dict:
        return {"address": self.address, "into": self.into, "merged": self.merged,
                "reason": self.reason}


@dataclass
class Node:
    url: str
    engine: Engine | None = None
    error: str | None = None       # why it could not be reached
    pairings: list[Pairing] = field(default_factory=list)   # told about this address


def addresses(manifest_nodes: Sequence[str], given: Sequence[str], what: str) -> list[str]:
    """Every node's address in order, each once, checked (a usage error names the bad one):
    DOCKER_HOST's first."""
    out = [docker_host() or DEFAULT]
    for text in [*manifest_nodes, *given]:
        url = engine_url(text, what)
        if url not in out:
            out.append(url)
    return out


def reach(urls: Sequence[str], timeout: float,
          connect: Callable[[str], Engine] | None = None) -> list[Node]:
    """Each node connected (all at once: an ssh handshake is most of the wait), or its error
    kept; the same engine reached twice is one node (see the module's doc), and the address
    left out is said on the node kept (``Node.pairings``)."""
    connect = connect or (lambda url: Engine.connect(url, timeout=timeout))

    def one(url: str) -> tuple[Engine, tuple[str, str, str] | None]:
        engine = connect(url)
        try:
            return engine, engine.sameness()
        except BaseException:
            engine.close()
            raise

    nodes: list[Node] = []
    seen: list[tuple[Node, tuple[str, str, str]]] = []
    for url, (got, error) in zip(urls, each(urls, one)):
        if error is not None:
            nodes.append(Node(url, error=str(error)))
            continue
        engine, facts = got
        same = next((n for n, f in seen if facts is not None and f == facts), None)
        if same is not None and facts is not None:
            engine.close()
            same.pairings.append(Pairing(url, same.url, True, _same(facts)))
            continue
        twin = next(((n, f) for n, f in seen if facts is not None and f[0] == facts[0]), None)
        node = Node(url, engine)
        if twin is not None and facts is not None:
            node.pairings.append(Pairing(url, twin[0].url, False, _apart(facts, twin[1])))
        if facts is not None:
            seen.append((node, facts))
        nodes.append(node)
    return nodes


def pairings(nodes: Sequence[Node]) -> list[Pairing]:
    """What was said of addresses that share an engine ID, in the nodes' order."""
    return [p for n in nodes for p in n.pairings]


def _same(facts: tuple[str, str, str]) -> str:
    engine_id, name, root = facts
    return (f"one engine: its ID {_short(engine_id)}, host name {name or '(none)'} and root "
            f"directory {root or '(none)'} agree")


def _apart(facts: tuple[str, str, str], other: tuple[str, str, str]) -> str:
    what = [f"{word} {a or '(none)'} vs {b or '(none)'}"
            for word, a, b in (("host name", facts[1], other[1]),
                               ("root directory", facts[2], other[2])) if a != b]
    return (f"two engines that share the ID {_short(facts[0])} (a cloned machine or a shared "
            f"key file): {'; '.join(what)}")


def _short(engine_id: str) -> str:
    return engine_id if len(engine_id) <= 14 else engine_id[:14] + "..."


T = TypeVar("T")
R = TypeVar("R")


def each(items: Sequence[T], fn: Callable[[T], R]) -> list[tuple[R | None, PatchkitError | None]]:
    """``fn`` on every item, each in a thread of its own (the nodes are asked at once): per
    item, in order, its value or the error it raised.  An error that is not patchkit's is
    raised here once every thread has ended."""
    out: list = [(None, None)] * len(items)
    unexpected: list[BaseException] = []

    def call(i: int, item: T) -> None:
        try:
            out[i] = (fn(item), None)
        except PatchkitError as exc:
            out[i] = (None, exc)
        except BaseException as exc:
            unexpected.append(exc)

    threads = [threading.Thread(target=call, args=(i, item), daemon=True)
               for i, item in enumerate(items)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if unexpected:
        raise unexpected[0]
    return out


def close(nodes: Sequence[Node]) -> None:
    for node in nodes:
        if node.engine is not None:
            node.engine.close()
