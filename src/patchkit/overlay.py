"""The overlay kind: a tree of whole files laid over the checkout root.

New files are simply added.  A file that replaces an upstream one must say which upstream blob
it was written against (``replaces:`` in the manifest); when upstream has moved on, the patch
fails with ``overlay-drift`` instead of silently throwing the upstream change away.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path

from patchkit import git as g
from patchkit import paths
from patchkit.report import Outcome


def files_of(overlay: Path) -> list[str]:
    """Checkout-relative paths of the overlay's entries, sorted; links and specials included so
    that apply can refuse them."""
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(overlay, followlinks=False):
        base = Path(dirpath)
        for name in filenames + [d for d in dirnames if (base / d).is_symlink()]:
            found.append((base / name).relative_to(overlay).as_posix())
    return sorted(found)


def apply(overlay: Path, root: Path, base_commit: str, replaces: Mapping[str, str],
          mirror: Path | None = None) -> Outcome:
    rels = files_of(overlay)
    if not rels:
        return Outcome("failed", "error", f"{overlay.name}: the overlay holds no files")
    plan: list[tuple[Path, Path]] = []
    same = 0
    for rel in rels:
        src = overlay / rel
        mode = os.lstat(src).st_mode
        if not stat.S_ISREG(mode):
            kind = "a symlink" if stat.S_ISLNK(mode) else "not a regular file"
            return Outcome("failed", "unsafe-path", f"{rel}: {kind}; overlays copy regular "
                                  "files only", rels)
        try:
            dest = paths.safe_join(root, rel)
        except paths.UnsafePathError as exc:
            return Outcome("failed", "unsafe-path", str(exc), rels)
        if dest.exists() and not dest.is_file():
            return Outcome("failed", "conflict", f"{rel}: the checkout has a directory there",
                                  rels)
        if dest.is_file() and dest.read_bytes() == src.read_bytes():
            same += 1
            continue
        upstream_blob = g.blob_id(root, base_commit, rel)
        if upstream_blob is not None:
            recorded = replaces.get(rel)
            if recorded is None:
                return Outcome(
                    "failed", "overlay-drift",
                    f"{rel} replaces an upstream file (blob {upstream_blob[:12]}) but the manifest "
                    f"records no `replaces: {{{rel}: <blob>}}` for it", rels)
            if recorded != upstream_blob:
                where = f"git -C {mirror or root} diff {recorded[:12]} {upstream_blob[:12]}"
                return Outcome(
                    "failed", "overlay-drift",
                    f"{rel} changed upstream since the overlay was written (recorded blob "
                    f"{recorded[:12]}, now {upstream_blob[:12]}); see the upstream change with: "
                    f"{where}", rels)
        plan.append((src, dest))
    if same == len(rels):
        return Outcome("upstream", None, "the tree already holds every overlay file", rels)
    for src, dest in plan:
        dest.parent.mkdir(parents=True, exist_ok=True)
        # Re-check right before writing: nothing may be written through a link.
        paths.safe_join(root, dest.relative_to(root).as_posix())
        dest.write_bytes(src.read_bytes())
    return Outcome("applied", None, "", rels)
