"""The nodes ``images`` and ``rollback`` act on: the engine DOCKER_HOST names, then the
manifest's ``image.nodes``, then each one given, each reached once.

A node that cannot be reached is kept as its one line (``Node.error``): the verbs go on with
the others and say it.  Two addresses that reach the same engine (its info ID) are one node,
the first address naming it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from patchkit.errors import PatchkitError
from patchkit.image.docker import Engine, docker_host, engine_url

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
    """Each node connected, or its error kept; the same engine reached twice is one node."""
    connect = connect or (lambda url: Engine.connect(url, timeout=timeout))
    nodes: list[Node] = []
    seen: dict[str, str] = {}
    for url in urls:
        try:
            engine = connect(url)
            identity = engine.identity()
        except PatchkitError as exc:
            nodes.append(Node(url, error=str(exc)))
            continue
        if identity in seen:
            engine.close()
            continue
        seen[identity] = url
        nodes.append(Node(url, engine))
    return nodes


def close(nodes: Sequence[Node]) -> None:
    for node in nodes:
        if node.engine is not None:
            node.engine.close()
