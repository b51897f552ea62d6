"""A patchset's builds as one node holds them, newest first, and the history that orders them.

A build is an image whose labels name the patchset (``labels.PATCHSET_LABEL``).  Its tags fall
in three kinds: its immutable tag (``<moving>-<12 hex>``, ``labels.immutable_tag``), the moving
tags it carries (a tag ``T`` whose ``T-<12 hex>`` names the same build: the build is current
under ``T``), and tags patchkit did not make (a user's own).

Builds are reproducible, so an image's creation time is its release commit's and says nothing
of when it was built.  They are ordered by when the node got them: the first time patchkit saw
each build on that node, kept in the history under the cache (``nodes/<hash>.json``, one per
engine as its ID, host name and root directory together name it: machines cloned from one
image report one ID, and must not share a history; ``Engine.identity``).  A
build the history does not know yet is entered at the engine's last-tag time (the time the
node tagged it: build-image, copy-image and rollback tag each build when it arrives), else at
its creation time.  Entered once, a build keeps its place: a rollback tags an older build
again, and does not make it the newest.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from patchkit import cache as cache_
from patchkit.files import write_if_changed
from patchkit.image import labels
from patchkit.engines.docker import Engine
from patchkit.engines.facts import Inspected


@dataclass(frozen=True)
class Build:
    """One build on one node."""

    id: str
    fixed: str | None                 # its immutable tag (None: the node holds it under none)
    moving: tuple[str, ...]           # the moving tags on it: it is current under each
    foreign: tuple[str, ...]          # tags patchkit did not make
    created: str | None
    got: float                        # when the node got it (see the module's doc)
    facts: labels.ImageFacts
    image: Inspected = field(repr=False, compare=False)
    more_fixed: tuple[str, ...] = ()  # its immutable tags beside other moving tags

    @property
    def current(self) -> bool:
        return bool(self.moving)

    @property
    def tags(self) -> tuple[str, ...]:
        return (((self.fixed,) if self.fixed else ()) + self.more_fixed + self.moving
                + self.foreign)

    def lineage(self, moving: str) -> bool:
        """Whether this build was made under the moving tag ``moving``."""
        return any(labels.moving_of(t) == moving
                   for t in ((self.fixed,) if self.fixed else ()) + self.more_fixed)

    def fixed_for(self, moving: str) -> str | None:
        """Its immutable tag beside ``moving``."""
        return next((t for t in ((self.fixed,) if self.fixed else ()) + self.more_fixed
                     if labels.moving_of(t) == moving), None)

    def to_dict(self) -> dict:
        f = self.facts
        return {"id": self.id, "tags": list(self.tags), "immutable_tag": self.fixed,
                "more_immutable_tags": list(self.more_fixed),
                "moving_tags": list(self.moving), "other_tags": list(self.foreign),
                "current": self.current,
                # a reproducible build's time that is not real (the epoch, 2000-01-01): None
                "created": labels.real_time(self.created),
                "commit": f.commit, "patchkit": f.patchkit,
                "got": _iso(self.got), "vllm": f.version or f.installed,
                "packages": {k: v.get("version") for k, v in (f.packages or {}).items()},
                "patches": [p for p, s in f.statuses.items() if s == "applied"]}


@dataclass
class NodeBuilds:
    """A node's builds of one patchset, newest first."""

    node: str
    identity: str
    builds: list[Build]

    def current(self, moving: str) -> Build | None:
        return next((b for b in self.builds if moving in b.moving), None)

    def by_tag(self, tag: str) -> Build | None:
        return next((b for b in self.builds if tag in b.tags), None)

    def lineage(self, moving: str) -> list[Build]:
        return [b for b in self.builds if b.lineage(moving) or moving in b.moving]


def read(engine: Engine, patchset: str, history: "History") -> NodeBuilds:
    """The builds of ``patchset`` that ``engine`` holds, newest first; the history learns the
    ones it did not know."""
    identity = engine.identity()
    seen = history.of(identity)
    out = []
    for image_id in dict.fromkeys(engine.images_with_label(labels.PATCHSET_LABEL, patchset)):
        image = engine.inspect(image_id)
        if image is None:   # removed meanwhile
            continue
        got = seen.get(image.id)
        if got is None:
            got = image.last_tagged or image.created_at or time.time()
            seen[image.id] = got
        out.append(_build(image, got))
    history.save(identity, seen)
    out.sort(key=lambda b: (b.got, b.created or ""), reverse=True)
    return NodeBuilds(engine.host, identity, out)


def make(image: Inspected, got: float = 0.0) -> Build:
    """One image as a build: its immutable, moving and other tags, its facts."""
    return _build(image, got)


def _build(image: Inspected, got: float) -> Build:
    tags = [t for t in image.repo_tags if t and "<none>" not in t]
    fixed = [t for t in tags if labels.moving_of(t) is not None
             and t == labels.immutable_tag(labels.moving_of(t), image.labels, image.id)]
    moving = [t for t in tags if t not in fixed
              and labels.immutable_tag(t, image.labels, image.id) in fixed]
    foreign = [t for t in tags if t not in fixed and t not in moving]
    return Build(image.id, fixed[0] if fixed else None, tuple(moving), tuple(foreign),
                 image.created, got, labels.ImageFacts.from_labels(image.labels), image,
                 tuple(fixed[1:]))


class History:
    """When each node got each build, as patchkit first saw it there: one file per engine
    under the cache (``nodes/<sha256 of the engine's identity>.json``: its ID, host name and
    root directory, never its ID alone)."""

    def __init__(self, cache: Path) -> None:
        self.cache = cache

    def _path(self, identity: str) -> Path:
        folder = cache_.cache_subdir(self.cache, "nodes")
        return folder / f"{hashlib.sha256(identity.encode()).hexdigest()[:32]}.json"

    def of(self, identity: str) -> dict[str, float]:
        # none yet, or unreadable (dropped): learnt again from the engine
        return cache_.kept_json(self._path(identity), _got) or {}

    def save(self, identity: str, got: dict[str, float]) -> None:
        data = {"engine": identity, "got": dict(sorted(got.items()))}
        write_if_changed(self._path(identity), (json.dumps(data, indent=1) + "\n").encode())

    def forget(self, identity: str, image_ids: list[str]) -> None:
        """Builds removed from the node: got again later, they are new there."""
        seen = self.of(identity)
        if any(i in seen for i in image_ids):
            self.save(identity, {k: v for k, v in seen.items() if k not in image_ids})

    def got_now(self, identity: str, image_id: str) -> None:
        """The node got ``image_id`` now (a rollback copied it there)."""
        seen = self.of(identity)
        if image_id not in seen:
            seen[image_id] = time.time()
            self.save(identity, seen)


def _got(data: dict) -> dict[str, float]:
    return {str(k): float(v) for k, v in (data.get("got") or {}).items()}


def _pending(data: dict) -> tuple[str, str]:
    if not data["to"]:
        raise ValueError("no build to go to")
    return str(data["moving"]), str(data["to"])


def _iso(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


class Pending:
    """A rollback that some node did not take (it could not be reached): the build it goes
    to, kept under the cache (``rollbacks/<sha256 of the moving tag>.json``) until a run
    puts it on every node, so that the same command run again completes it rather than
    going one build further back."""

    def __init__(self, moving: str, cache: Path) -> None:
        self.moving = moving
        self.cache = cache

    def _path(self) -> Path:
        folder = cache_.cache_subdir(self.cache, "rollbacks")
        return folder / f"{hashlib.sha256(self.moving.encode()).hexdigest()[:32]}.json"

    def to(self) -> str | None:
        data = cache_.kept_json(self._path(), _pending)
        return data[1] if data is not None and data[0] == self.moving else None

    def keep(self, to: str) -> None:
        write_if_changed(self._path(), (json.dumps({"moving": self.moving, "to": to}) + "\n"
                                        ).encode())

    def done(self) -> None:
        try:
            self._path().unlink()
        except FileNotFoundError:
            pass
