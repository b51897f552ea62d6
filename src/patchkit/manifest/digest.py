"""What a patch is, as one hash: its manifest entry and the bytes of the file or tree it names;
and what the manifest says outside ``patches:``, one hash per setting.

An apply records each patch's digest and each setting's in its report, so that ``patchkit
status`` can say which patches were edited since (a diff rewritten, a range moved, an assertion
added) and which settings changed (``name:``, ``bump.probes``).  Where a value stands in
patchset.yaml (its line, its position) is no part of what it is: a line added above an entry
edits nothing."""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from patchkit.manifest.model import Manifest, Patch

# A digest of this scheme starts with it; a report's digests without it were taken by an
# older scheme (which counted line numbers) and say nothing about edits.
SCHEME = "2:"
# the fields that say where a value stands in patchset.yaml, not what it is
_PLACE = {"line", "lines", "index", "ref_line", "dist_line", "requires_lines"}


def plain(value: object) -> object:
    """``value`` as nested tuples of plain values, without where it stands in patchset.yaml."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value).__name__,) + tuple(
            (f.name, plain(getattr(value, f.name))) for f in dataclasses.fields(value)
            if f.name not in _PLACE)
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), plain(v)) for k, v in value.items()))
    if isinstance(value, (tuple, list)):
        return tuple(plain(v) for v in value)
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)   # a SpecifierSet, a Path


def patch_digest(root: Path, patch: Patch) -> str:
    """sha256 of ``patch``'s entry (everything but where it stands in patchset.yaml) and of
    the content it names under ``root``; a file that cannot be read counts as absent."""
    h = hashlib.sha256()
    h.update(repr(plain(patch)).encode())
    for rel, data in _content(root / patch.path):
        h.update(b"\0" + rel.encode("utf-8", "surrogateescape") + b"\0")
        h.update(hashlib.sha256(data).digest() if data is not None else b"-")
    return SCHEME + h.hexdigest()


def digests(m: Manifest, patches: Iterable[Patch] | None = None) -> dict[str, str]:
    """Each patch's digest by id (every patch of ``m`` by default)."""
    return {p.id: patch_digest(m.root, p) for p in (m.patches if patches is None else patches)}


def settings(m: Manifest) -> dict[str, str]:
    """A digest of each setting outside ``patches:``, by its name in patchset.yaml.  The pins
    (``vllm.ref``, a package's ``ref``) are left out: status says a moved pin its own way."""
    values: dict[str, object] = {"name": m.name, "vllm.repo": m.vllm.repos,
                                 "variants": m.variants, "runtime": m.runtime,
                                 "bump.probes": m.bump.probes, "bump.timeout": m.bump.timeout}
    for f in dataclasses.fields(m.image):
        if f.name not in _PLACE:
            values[f"image.{f.name}"] = getattr(m.image, f.name)
    for p in m.others:
        values[f"packages.{p.name}"] = (p.dist, p.repos)
    return {k: SCHEME + hashlib.sha256(repr(plain(v)).encode()).hexdigest()[:16]
            for k, v in values.items()}


def _content(path: Path) -> list[tuple[str, bytes | None]]:
    if path.is_dir():
        out = []
        for folder, dirs, files in os.walk(path):
            dirs.sort()
            for name in sorted(files):
                full = Path(folder) / name
                out.append((str(full.relative_to(path)), _read(full)))
        return out
    return [("", _read(path))]


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None
