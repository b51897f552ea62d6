"""``patchkit cache``: what the cache holds and how large it is; ``cache prune``: remove what no
manifest pins.

The cache's layout belongs to the sources that fill it: ``repos/`` (git mirrors, one per URL),
``pypi/<dist>.git`` (one orphan commit per release laid out from PyPI) and ``pypi/wheels/``,
``image/<dist>.git`` (packages read from base images), ``registry/`` (base layers for
``--no-daemon``).  Folders a killed run left (a download, a layout, a clone under way) are
``leftover``: nothing will finish them.

A manifest pins a mirror by naming its URL as a package's source, a release repository and a
wheel by naming the release through the ``pypi`` source, the base-image trees through the
``image`` source or the ref ``base``, the registry's layers through ``image.base``.  Prune
removes the rest, with ``older_than`` only what has not been used for that long; it takes the
cache for itself first (no run may be using it), and each entry's own lock before removing it.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import time
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path

from packaging.utils import canonicalize_name

from patchkit import cache as cache_
from patchkit import git
from patchkit import manifest as manifest_
from patchkit import versions
from patchkit.errors import SourceError, UsageError
from patchkit.manifest import Manifest
from patchkit.source import image, mirror, pypi
from patchkit.source.refs import BASE_REF

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])\Z")


def parse_duration(text: str) -> float:
    """``30d``, ``12h``, ``90m``, ``2w``, ``45s`` -> seconds; UsageError for anything else."""
    m = _DURATION.match(text.strip().lower())
    if not m:
        raise UsageError(f"{text!r} is not a duration (a number and a unit, s m h d or w: "
                         "30d, 12h)")
    return float(m.group(1)) * UNITS[m.group(2)]


class EntryKind(str, Enum):
    """What an entry of the cache is (the JSON's words)."""

    MIRROR = "mirror"
    RELEASES = "releases"
    WHEEL = "wheel"
    BASE_TREES = "base-trees"
    REGISTRY = "registry"
    LEFTOVER = "leftover"
    UNREACHABLE = "unreachable"
    LOG = "log"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Entry:
    kind: EntryKind
    path: Path
    bytes: int
    used: float          # when it was last used (seconds since the epoch)
    what: str            # what it is, for a person
    locks: tuple[Path, ...] = ()   # the locks a run holds while it uses the entry
    key: tuple = ()      # what a manifest pins it by
    pinned: bool = False

    def to_dict(self) -> dict:
        return {"kind": self.kind.value, "path": str(self.path), "bytes": self.bytes,
                "used": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.used)),
                "what": self.what, "pinned": self.pinned}


@dataclass(frozen=True)
class Listing:
    cache: Path
    entries: tuple[Entry, ...]
    manifests: tuple[Path, ...]

    @property
    def bytes(self) -> int:
        return sum(e.bytes for e in self.entries)

    def to_dict(self) -> dict:
        return {"ok": True, "cache": str(self.cache), "bytes": self.bytes,
                "manifests": [str(m) for m in self.manifests],
                "entries": [e.to_dict() for e in self.entries]}


@dataclass(frozen=True)
class Pruned:
    cache: Path
    removed: tuple[Entry, ...] = ()
    kept: tuple[Entry, ...] = ()
    busy: tuple[Entry, ...] = ()     # in use by a run: left alone
    manifests: tuple[Path, ...] = ()
    dry_run: bool = False

    def to_dict(self) -> dict:
        return {"ok": True, "cache": str(self.cache), "dry_run": self.dry_run,
                "manifests": [str(m) for m in self.manifests],
                "removed": [e.to_dict() for e in self.removed],
                "bytes_removed": sum(e.bytes for e in self.removed),
                "kept": [e.to_dict() for e in self.kept],
                "busy": [e.to_dict() for e in self.busy]}


def _size(path: Path) -> tuple[int, float]:
    """Bytes under ``path`` and its newest modification time."""
    try:
        st = path.lstat()
    except OSError:
        return 0, 0.0
    if not path.is_dir() or path.is_symlink():
        return st.st_size, st.st_mtime
    total, newest = 0, st.st_mtime
    for folder, dirs, files in os.walk(path):
        for name in files + dirs:
            try:
                s = os.lstat(os.path.join(folder, name))
            except OSError:
                continue
            if name in files:
                total += s.st_size
            newest = max(newest, s.st_mtime)
    return total, newest


def _entry(kind: EntryKind, path: Path, what: str, locks: Sequence[Path] = (),
           key: tuple = (), stamps: Sequence[Path] | None = None) -> Entry:
    """An entry, last used when it or one of ``stamps`` (default: its locks) last changed: a
    run touches a lock as it takes it.  A lock shared with other entries is no stamp of this
    one (a dist's releases lock is taken for every release of it)."""
    size, used = _size(path)
    for stamp in locks if stamps is None else stamps:
        try:
            used = max(used, stamp.stat().st_mtime)
        except OSError:
            pass
    return Entry(kind, path, size, used, what, tuple(locks), key)


def _unreachable_what(marker: Path) -> str:
    try:
        data = json.loads(marker.read_text())
        until = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(data["until"])))
        return f"{data['url']} did not answer; not asked again until {until}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a source that did not answer"


def inventory(cache: Path) -> list[Entry]:
    """Everything the cache holds, largest first."""
    out: list[Entry] = []
    repos = cache / "repos"
    for p in sorted(repos.iterdir()) if repos.is_dir() else []:
        if p.name.endswith(".lock"):
            continue
        if p.name.endswith(mirror.UNREACHABLE):
            out.append(_entry(EntryKind.UNREACHABLE, p, _unreachable_what(p)))
        elif p.is_dir() and p.name.endswith(".git"):
            url = git.remote_url(p) if (p / "HEAD").is_file() else None
            out.append(_entry(EntryKind.MIRROR, p, url or p.name, [Path(f"{p}.lock")],
                              ("mirror", p.name)))
        else:   # <mirror>.git.XXXX: a first clone, made under that mirror's lock
            owner = p.name.rsplit(".", 1)[0]
            out.append(_entry(EntryKind.LEFTOVER, p, "a clone a killed run left",
                              [repos / f"{owner}.lock"]))
    for word, kind in ((pypi.WORD, EntryKind.RELEASES), (image.WORD, EntryKind.BASE_TREES)):
        folder = cache / word
        for p in sorted(folder.iterdir()) if folder.is_dir() else []:
            if p.name.endswith(".lock") or p.name == "wheels":
                continue
            if p.is_dir() and p.name.endswith(".git"):
                dist = p.name[:-4]
                n = len(git.tags(p)) if (p / "HEAD").is_file() and kind is EntryKind.RELEASES else None
                what = f"{dist}: {n} release(s) laid out" if n is not None else dist
                out.append(_entry(kind, p, what, [folder / f"{dist}.lock"],
                                  (kind, canonicalize_name(dist))))
            else:   # a layout under way names its version, not its dist: every dist's lock
                out.append(_entry(EntryKind.LEFTOVER, p, "a layout a killed run left",
                                  sorted(folder.glob("*.lock"))))
    wheels = cache / pypi.WORD / "wheels"
    for p in sorted(wheels.iterdir()) if wheels.is_dir() else []:
        if p.name.startswith(pypi.DOWNLOAD):
            out.append(_entry(EntryKind.LEFTOVER, p, "a download a killed run left",
                              [pypi.download_lock(cache, p.name)]))
        elif p.suffix == ".whl":
            dist, version = p.name.split("-")[:2]
            # last used when a run read it, not when it took its dist's lock (stamps=())
            out.append(_entry(EntryKind.WHEEL, p, f"{dist} {version}",
                              [cache / pypi.WORD / f"{dist.replace('_', '-')}.lock"],
                              ("wheel", canonicalize_name(dist), version), stamps=()))
    registry = cache / "registry"
    if registry.is_dir():
        out.append(_entry(EntryKind.REGISTRY, registry, "base image layers (--no-daemon)",
                          key=("registry",)))
    log = cache_.log_file()
    if log.parent == cache and log.is_file():
        out.append(_entry(EntryKind.LOG, log, "tracebacks of unexpected errors"))
    return sorted(out, key=lambda e: -e.bytes)


def pinned_keys(manifests: Sequence[Manifest]) -> set[tuple]:
    """What the manifests pin, as entry keys."""
    keys: set[tuple] = set()
    for m in manifests:
        if m.image.base:
            keys.add(("registry",))
        for p in m.packages:
            dist = canonicalize_name(p.dist)
            for src in m.sources(p.repos):
                if src == pypi.WORD:
                    keys.add(("releases", dist))
                    try:
                        keys.add(("wheel", dist, versions.pypi_release(p.ref, "pypi")))
                    except (UsageError, SourceError, ValueError):
                        pass
                elif src == image.WORD:
                    keys.add(("base-trees", dist))
                else:
                    try:
                        url = mirror._url_of(src)
                    except SourceError:
                        continue
                    keys.add(("mirror", f"{mirror._slug(url)}.git"))
            if p.ref == BASE_REF:
                keys.add(("base-trees", dist))
    return keys


def _manifests(paths: Sequence[Path]) -> list[Manifest]:
    return [manifest_.load(p) for p in paths]


def listing(cache: Path, manifest_paths: Sequence[Path]) -> Listing:
    entries = inventory(cache) if cache.is_dir() else []
    keys = pinned_keys(_manifests(manifest_paths))
    return Listing(cache, tuple(replace(e, pinned=e.key in keys) for e in entries),
                   tuple(manifest_paths))


@contextmanager
def _taken(locks: Sequence[Path]):
    """Every lock of an entry, if no run holds one: yields False when one does."""
    fds: list[int] = []
    try:
        for lock in locks:
            try:
                fd = os.open(lock, os.O_RDWR)
            except FileNotFoundError:
                continue
            except OSError:   # a lock in a bad state (a folder): not taken, the entry stays
                yield False
                return
            fds.append(fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
        yield True
    finally:
        for fd in fds:
            os.close(fd)


def _remove(path: Path) -> None:
    """Gone at once (renamed aside), then deleted: no run ever sees half of it."""
    aside = path.with_name(f".{path.name}.pruning-{os.getpid()}")
    os.rename(path, aside)
    if aside.is_dir() and not aside.is_symlink():
        shutil.rmtree(aside, ignore_errors=True)
    else:
        aside.unlink(missing_ok=True)


def prune(cache: Path, manifest_paths: Sequence[Path], *, older_than: float | None = None,
          wait: float = 10.0, dry_run: bool = False) -> Pruned:
    """Remove from ``cache`` every entry the manifests do not pin (with ``older_than``, only
    those unused for that many seconds).  The manifests are read first: a broken one stops
    the prune before anything is removed."""
    if not manifest_paths:
        raise UsageError("no manifest to keep the pins of: run it inside a patchset project, "
                         "or give --manifest (repeatable)")
    manifests = _manifests(manifest_paths)
    if not cache.is_dir():
        return Pruned(cache, manifests=tuple(manifest_paths), dry_run=dry_run)
    if not cache_.hold_exclusive(cache, wait):
        raise UsageError(f"another patchkit run is using the cache {cache}; nothing was "
                         f"removed; run again when it has ended (or give --wait SECONDS, "
                         f"now {wait:g})")
    keys = pinned_keys(manifests)
    now = time.time()
    removed, kept, busy = [], [], []
    for e in inventory(cache):
        e = replace(e, pinned=e.key in keys)
        if e.pinned or e.kind is EntryKind.LOG or (older_than is not None
                                                   and now - e.used < older_than):
            kept.append(e)
            continue
        with _taken(e.locks) as free:
            if not free:
                busy.append(e)
                continue
            if not dry_run:
                _remove(e.path)
            removed.append(e)
    return Pruned(cache, tuple(removed), tuple(kept), tuple(busy), tuple(manifest_paths),
                  dry_run)
