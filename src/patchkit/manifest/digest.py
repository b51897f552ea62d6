"""What a patch is, as one hash: its manifest entry and the bytes of the file or tree it names.

An apply records each patch's digest in its report, so that ``patchkit status`` can say which
patches were edited since (a diff rewritten, a range moved, an assertion added)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

from patchkit.manifest.model import Manifest, Patch


def patch_digest(root: Path, patch: Patch) -> str:
    """sha256 of ``patch``'s entry (everything but where it stands in patchset.yaml) and of
    the content it names under ``root``; a file that cannot be read counts as absent."""
    h = hashlib.sha256()
    entry = (patch.id, patch.summary, patch.kind, patch.path, patch.upstream, patch.package,
             sorted((k, str(v)) for k, v in patch.ranges.items()), patch.verify,
             sorted(patch.replaces.items()), patch.variants, patch.sha256, patch.runtime)
    h.update(repr(entry).encode())
    for rel, data in _content(root / patch.path):
        h.update(b"\0" + rel.encode("utf-8", "surrogateescape") + b"\0")
        h.update(hashlib.sha256(data).digest() if data is not None else b"-")
    return h.hexdigest()


def digests(m: Manifest, patches: Iterable[Patch] | None = None) -> dict[str, str]:
    """Each patch's digest by id (every patch of ``m`` by default)."""
    return {p.id: patch_digest(m.root, p) for p in (m.patches if patches is None else patches)}


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
