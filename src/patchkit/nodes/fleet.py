"""The nodes ``images`` and ``rollback`` act on: the engine DOCKER_HOST names, then the
manifest's ``image.nodes``, then each one given, each reached once.

A node that cannot be reached is kept as its one line (``Node.error``): the verbs go on with
the others and say it.  Two addresses that reach the same engine (its info ID) are one node,
the first address naming it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Sequence, TypeVar

from patchkit.errors import PatchkitError
from patchkit.engines.docker import Engine, docker_host, engine_url

DEFAULT = "unix:///var/run/docker.sock"   # the SDK's when DOCKER_HOST is unset


@dataclass
class Node:
    url: str
    engine: Engine | None = None
    error: str | None = None       # why it could not be reached


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
    kept; the same engine reached twice is one node."""
    connect = connect or (lambda url: Engine.connect(url, timeout=timeout))

    def one(url: str) -> tuple[Engine, str]:
        engine = connect(url)
        try:
            return engine, engine.identity()
        except BaseException:
            engine.close()
            raise

    nodes: list[Node] = []
    seen: dict[str, str] = {}
    for url, (got, error) in zip(urls, each(urls, one)):
        if error is not None:
            nodes.append(Node(url, error=str(error)))
            continue
        engine, identity = got
        if identity in seen:
            engine.close()
            continue
        seen[identity] = url
        nodes.append(Node(url, engine))
    return nodes


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
