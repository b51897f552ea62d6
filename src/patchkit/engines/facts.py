"""What an engine reports, as values: an image (:class:`Inspected`), the store it keeps images
in, when a container started, what a push or a pull moved.

Inspect output is read here once, by :meth:`Inspected.of`; nothing past the engine border
handles the engine's raw dicts.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Mapping

from patchkit.errors import ImageError
from patchkit.formats.layer import fingerprint_of, parse_env
from patchkit.imageref import Platform


# ----------------------------------------------------------------------------- image stores

@dataclass(frozen=True)
class Inspected:
    """An image as an engine holds it: what patchkit reads of ``docker image inspect``."""

    id: str                            # the engine's image id
    diff_ids: tuple[str, ...]          # the layers', bottom first (``RootFS.Layers``)
    platform: Platform
    config: Mapping = field(default_factory=dict)   # the container config (Env, Labels ...)
    repo_tags: tuple[str, ...] = ()
    repo_digests: tuple[str, ...] = ()  # ``repo@sha256:...``, one per registry it came from
    size: int | None = None
    config_digest: str | None = None   # known once ``Engine.content`` has said it
    created: str | None = None         # the config's creation time (RFC 3339)
    last_tagged: float | None = None   # when the engine last tagged it (Unix s); None: never

    @property
    def created_at(self) -> float | None:
        """The config's creation time in Unix seconds (None: not told)."""
        return _epoch(self.created)

    @classmethod
    def of(cls, attrs: Mapping) -> "Inspected":
        """The value of one image's inspect output."""
        return cls(id=attrs["Id"],
                   diff_ids=tuple((attrs.get("RootFS") or {}).get("Layers") or ()),
                   platform=Platform(attrs.get("Os") or "linux",
                                     attrs.get("Architecture") or "unknown",
                                     attrs.get("Variant") or None),
                   config=attrs.get("Config") or {},
                   repo_tags=tuple(attrs.get("RepoTags") or ()),
                   repo_digests=tuple(attrs.get("RepoDigests") or ()),
                   size=attrs.get("Size"), created=attrs.get("Created") or None,
                   # a classic store's; a load leaves it at the zero time
                   last_tagged=_epoch((attrs.get("Metadata") or {}).get("LastTagTime")))

    @functools.cached_property
    def env(self) -> dict[str, str]:
        return parse_env(self.config)

    @property
    def labels(self) -> dict[str, str]:
        return dict(self.config.get("Labels") or {})

    def digest_in(self, repo: str) -> str | None:
        """The manifest digest the registry repository ``repo`` holds this image by."""
        for rd in self.repo_digests:
            if rd.split("@", 1)[0] == repo:
                return rd.split("@", 1)[1]
        return None


@dataclass(frozen=True)
class Store:
    """Where an engine keeps its images, which decides how an image may reach it."""

    kind: str       # classic | containerd | containers-storage
    detail: str     # how it was told

    @property
    def partial_load(self) -> bool:
        """Whether a load archive may leave out the layers the engine already holds."""
        return self.kind == "classic"

    @property
    def ids_are_config_digests(self) -> bool:
        """A containerd store names an image by the digest of its manifest (or index)."""
        return self.kind != "containerd"

    def __str__(self) -> str:
        return {"classic": "the classic image store", "containerd": "containerd's image store",
                "containers-storage": "containers-storage"}[self.kind]


def store_of(version: dict, info: dict) -> Store:
    """The store an engine has, from its version and info answers."""
    for component in version.get("Components") or ():
        if component.get("Name") == "Podman Engine":
            return Store("containers-storage", f"Podman {component.get('Version') or ''}".strip())
    if "BuildahVersion" in info:  # only Podman's Docker API answers with Buildah's version
        return Store("containers-storage", f"Podman {info.get('ServerVersion') or ''}".strip())
    for pair in info.get("DriverStatus") or ():
        if len(pair) == 2 and pair[0] == "driver-type" and "containerd" in str(pair[1]):
            return Store("containerd", f"snapshotter {info.get('Driver') or pair[1]}")
    if info.get("Driver") == "overlayfs":  # containerd's snapshotter; the classic one is overlay2
        return Store("containerd", "snapshotter overlayfs")
    return Store("classic", f"storage driver {info.get('Driver') or 'unknown'}")


_STAMP = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$")


def since_start(state: dict) -> float | None:
    """The time (Unix seconds, to the microsecond) from which a container's log is its current
    start's, from its inspected ``State``; None when it never started (the whole log, empty).
    That is ``StartedAt``; but a running container that stopped before (a restart) has the
    previous run's ``FinishedAt`` before it, which the engine sets once that run's output is
    drained, so its log is read from there: a line written before the engine recorded the new
    start (a fast first line) still counts."""
    started = _epoch(state.get("StartedAt"))
    finished = _epoch(state.get("FinishedAt"))
    if started and finished and state.get("Running") and finished < started:
        return finished
    return started


def _epoch(stamp: str | None) -> float | None:
    """An RFC 3339 time as the engine writes it (``2026-12-02T01:50:00.123456789Z``), in
    Unix seconds floored to the microsecond; None for the zero time or no time."""
    found = _STAMP.match(stamp or "")
    if not found:
        return None
    whole, fraction, zone = found.groups()
    seconds = datetime.fromisoformat(whole + ("+00:00" if zone == "Z" else zone)).timestamp()
    if seconds <= 0:   # Go's zero time, 0001-01-01T00:00:00Z: never
        return None
    micros = int((fraction or ".0")[1:7].ljust(6, "0"))
    return int(seconds) + micros / 1_000_000


@dataclass(frozen=True)
class Prefix:
    """An image that holds the first ``layers`` layers of another, and the names it has."""

    names: tuple[str, ...]
    image_id: str
    layers: int


@dataclass
class Transfer:
    """What a push or a pull moved, layer by layer, as the engine's progress told it:
    ``moved`` layers went over the wire (``bytes`` of them: a push counts the layers' own
    bytes, a pull the compressed blobs it fetched), ``present`` ones the other side held."""

    moved: int = 0
    present: int = 0
    bytes: int = 0

    def __post_init__(self) -> None:
        self._sizes: dict[str, int] = {}

    _MOVED = ("Pushed", "Pull complete")
    _PRESENT = ("Layer already exists", "Already exists")

    def count(self, line: dict) -> None:
        status, lid = str(line.get("status") or ""), line.get("id")
        if not lid:
            return
        if status in self._MOVED:
            self.moved += 1
        elif status in self._PRESENT or status.startswith("Mounted from"):
            self.present += 1
        elif status in ("Pushing", "Downloading"):
            total = (line.get("progressDetail") or {}).get("total") or 0
            if total > self._sizes.get(lid, 0):
                self.bytes += total - self._sizes.get(lid, 0)
                self._sizes[lid] = total

    def to_dict(self) -> dict:
        return {"layers": self.moved, "present": self.present, "bytes": self.bytes}


def fingerprint(image: Inspected) -> str:
    """The content fingerprint of an image as an engine reports it: its config digest and its
    layers' diff_ids, never the engine's image id (a containerd store's id is the digest of a
    manifest it made, which differs between snapshotters and between loads).

    ``image`` comes from ``Engine.content``, which knows how its engine names the config.
    """
    if not image.config_digest:
        raise ImageError("no config digest is known for this image; cannot fingerprint it")
    return fingerprint_of(image.config_digest, image.diff_ids)
