"""What the image tests ask an engine straight through the Docker SDK, beside patchkit, to check
what patchkit did: an image's files, its fingerprint, whether a tag is there; and ``forget``,
which drops the tests' own images."""

from __future__ import annotations

import io
import tarfile

import docker

from patchkit.formats import layer


def files_of(client, image: str, paths: list[str]) -> dict[str, bytes | None]:
    """Reads files out of an image through a container that is never started."""
    c = client.api.create_container(image, command=["/x"], entrypoint=[])
    try:
        out = {}
        for p in paths:
            try:
                stream, _ = client.api.get_archive(c["Id"], p)
            except docker.errors.NotFound:
                out[p] = None
                continue
            with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
                member = tar.next()
                out[p] = tar.extractfile(member).read() if member.isfile() else b"<not a file>"
        return out
    finally:
        client.api.remove_container(c["Id"], force=True)


def fingerprint_of(client, ref: str) -> str:
    """The fingerprint as patchkit defines it, read straight from an engine whose image ids are
    config digests (the Docker Engines here)."""
    attrs = client.api.inspect_image(ref)
    return layer.fingerprint_of(attrs["Id"], attrs["RootFS"]["Layers"])


def absent(client, ref: str) -> bool:
    """Whether the engine has no image ``ref``."""
    try:
        client.images.get(ref)
    except docker.errors.NotFound:
        return True
    return False


def forget(client, *refs: str) -> None:
    """Drop these refs (the tests' own tags and image ids only) from an engine."""
    for ref in refs:
        try:
            client.images.remove(ref, force=True)
        except docker.errors.NotFound:
            pass


def created_of(client, images: set[str], since: float, until: float) -> list[dict]:
    """The scratch containers (patchkit's, which read an image's files) the engine's own events
    say were created of ``images`` (names or ids) between ``since`` and ``until``: asked for
    the whole seconds around them, then kept by the events' nanosecond times."""
    events = client.events(since=int(since), until=int(until) + 1, decode=True,
                           filters={"type": "container", "event": "create",
                                    "label": "io.patchkit.scratch=1"})
    return [e for e in events if since * 1e9 <= e["timeNano"] <= until * 1e9
            and e["Actor"]["Attributes"].get("image") in images]
