"""The overlay kind: a tree of whole files laid over the checkout root.

New files are simply added.  A file that replaces an upstream one must say which upstream blob
it was written against (``replaces:`` in the manifest); when upstream has moved on, the patch
fails with ``overlay-drift`` instead of silently throwing the upstream change away.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Mapping
from pathlib import Path

from patchkit import git
from patchkit import paths
from patchkit.kinds.base import KindError, Reader, Rebase, Remains, Stop, Target
from patchkit.kinds.common import ABORT, dirty_resume, generic_stop
from patchkit.report import Outcome, PatchResult, Reason, Status


def files_of(overlay: Path) -> list[str]:
    """Checkout-relative paths of the overlay's entries, sorted; links and specials included so
    that apply can refuse them."""
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(overlay, followlinks=False):
        base = Path(dirpath)
        for name in filenames + [d for d in dirnames if (base / d).is_symlink()]:
            found.append((base / name).relative_to(overlay).as_posix())
    return sorted(found)


def apply_tree(overlay: Path, root: Path, base_commit: str, replaces: Mapping[str, str],
          mirror: Path | None = None) -> Outcome:
    rels = files_of(overlay)
    if not rels:
        return Outcome(Status.FAILED, Reason.ERROR, f"{overlay.name}: the overlay holds no files")
    plan: list[tuple[Path, Path]] = []
    same = 0
    for rel in rels:
        src = overlay / rel
        mode = os.lstat(src).st_mode
        if not stat.S_ISREG(mode):
            kind = "a symlink" if stat.S_ISLNK(mode) else "not a regular file"
            return Outcome(Status.FAILED, Reason.UNSAFE_PATH,
                           f"{rel}: {kind}; overlays copy regular files only", rels)
        try:
            dest = paths.safe_join(root, rel)
        except paths.UnsafePathError as exc:
            return Outcome(Status.FAILED, Reason.UNSAFE_PATH, str(exc), rels)
        if dest.exists() and not dest.is_file():
            return Outcome(Status.FAILED, Reason.CONFLICT,
                           f"{rel}: the checkout has a directory there", rels)
        if dest.is_file() and same_bytes(dest, src):
            same += 1
            continue
        upstream_blob = git.blob_id(root, base_commit, rel)
        if upstream_blob is not None:
            recorded = replaces.get(rel)
            if recorded is None:
                return Outcome(Status.FAILED, Reason.OVERLAY_DRIFT,
                    f"{rel} replaces an upstream file (blob {upstream_blob[:12]}) but the manifest "
                    f"records no `replaces: {{{rel}: <blob>}}` for it", rels)
            if recorded != upstream_blob:
                where = f"git -C {mirror or root} diff {recorded[:12]} {upstream_blob[:12]}"
                return Outcome(Status.FAILED, Reason.OVERLAY_DRIFT,
                    f"{rel} changed upstream since the overlay was written (recorded blob "
                    f"{recorded[:12]}, now {upstream_blob[:12]}); see the upstream change with: "
                    f"{where}", rels)
        plan.append((src, dest))
    if same == len(rels):
        return Outcome(Status.UPSTREAM, None, "the tree already holds every overlay file", rels)
    for src, dest in plan:
        dest.parent.mkdir(parents=True, exist_ok=True)
        # Re-check right before writing: nothing may be written through a link.
        paths.safe_join(root, dest.relative_to(root).as_posix())
        shutil.copyfile(src, dest)   # streamed: an overlay file may be large
    return Outcome(Status.APPLIED, None, "", rels)


def same_bytes(a: Path, b: Path, chunk: int = 1 << 20) -> bool:
    """Whether two files hold the same bytes, read a chunk at a time."""
    if a.stat().st_size != b.stat().st_size:
        return False
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            left, right = fa.read(chunk), fb.read(chunk)
            if left != right:
                return False
            if not left:
                return True


def drift(patch, overlay: Path, tree: Path, base: str) -> dict[str, str]:
    """Overlay file -> the upstream blob it now replaces, for each file the record misses."""
    out: dict[str, str] = {}
    for rel in files_of(overlay):
        blob = git.blob_id(tree, base, rel)
        if blob is None or patch.replaces.get(rel) == blob:
            continue
        if git.hash_file(overlay / rel) == blob:
            continue  # the overlay already holds upstream's bytes
        out[rel] = blob
    return out


class OverlayKind:
    name = "overlay"
    is_folder = True
    replaces_files = True
    writes_only_named = True

    def check(self, full: Path, rel: str) -> str | None:
        return None  # a folder; what is in it is checked when it applies

    def sources(self, full: Path, rel: str) -> list[str]:
        return [f"{rel}/{f}" for f in files_of(full)]

    def touched(self, full: Path) -> list[str]:
        return files_of(full)

    def compile(self, full: Path, rel: str) -> str:
        found = files_of(full)
        if not found:
            raise KindError(f"{rel}: the overlay holds no files")
        return f"{len(found)} file{'s' if len(found) != 1 else ''}"

    def apply(self, patch, full: Path, target: Target) -> Outcome:
        return apply_tree(full, target.root, target.base_commit, patch.replaces, target.mirror)

    def apply_together(self, fulls, target: Target) -> None:
        return None  # each on its own

    def refresh(self, patch, full: Path, tree: Path, result: PatchResult) -> str | None:
        return None

    def stop(self, rebase: Rebase, patch, result: PatchResult, head: str) -> Stop:
        if result.reason is not Reason.OVERLAY_DRIFT:
            return generic_stop(rebase, patch, result, head)
        shown = rebase.shown
        found = drift(patch, rebase.manifest.root / patch.path, rebase.tree, rebase.base_commit)
        lines = [f"{patch.id} (overlay {patch.path}) replaces files that upstream changed in "
                 f"{rebase.label} {rebase.to}:"]
        for rel, new in found.items():
            old = patch.replaces.get(rel)
            if old:
                lines.append(f"  {rel}: upstream blob {old[:12]} -> {new[:12]}; the upstream "
                             f"change: git -C {shown} diff {old[:12]} {new[:12]}")
            else:
                lines.append(f"  {rel}: replaces upstream blob {new[:12]}, recorded nowhere; "
                             f"upstream's file: git -C {shown} show {new[:12]}")
        lines += ["", "Carry those upstream changes into "
                      + ", ".join(f"{patch.path}/{rel}" for rel in found) + ", then",
                  "`patchkit rebase --continue` records `replaces:` "
                  + ", ".join(f"{rel}: {new}" for rel, new in found.items())
                  + f" in {rebase.manifest.path.name} and goes on.", ABORT]
        return Stop(patch.id, self.name, Reason.OVERLAY_DRIFT, result.message,
                    [f"{patch.path}/{rel}" for rel in found], lines, found)

    def resume(self, rebase: Rebase, patch, stop: Stop) -> None:
        if not stop.drift:
            dirty_resume(rebase, patch)
            return
        rebase.record_replaces(patch, stop.drift)

    def changes(self, full: Path) -> frozenset[tuple[str, ...]]:
        return frozenset((rel, git.hash_file(full / rel)) for rel in files_of(full)
                         if (full / rel).is_file() and not (full / rel).is_symlink())

    def remains(self, full: Path, read: Reader, version: str | None) -> Remains:
        """Every file the overlay replaces gone from the release (a file it adds replaces
        nothing there, and proves nothing)."""
        found = [rel for rel in files_of(full) if read(rel) is not None]
        if found:
            more = f" and {len(found) - 1} more" if len(found) > 1 else ""
            return Remains(still=(f"{found[0]}{more}, which the overlay replaces, "
                                  f"{'is' if len(found) == 1 else 'are'} still there",))
        return Remains(gone=(f"{', '.join(files_of(full))}: no such file in the release",))


KIND = OverlayKind()
