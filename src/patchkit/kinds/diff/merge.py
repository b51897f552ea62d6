"""The 3-way merge of a diff that stopped a rebase: its change merged into the new checkout
with conflict markers, file by file against the old pin, else by ``git apply --3way``, else
with ``.rej`` files beside the files it could not merge."""

from __future__ import annotations

import tempfile
from pathlib import Path

from patchkit import git
from patchkit.kinds.base import Rebase


def _count_markers(tree: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    for rel in git.modified(tree):
        try:
            text = (tree / rel).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        n = sum(1 for line in text.splitlines() if line.startswith("<<<<<<< "))
        if n:
            out[rel] = n
    return out


def _merge_from_old_pin(rebase: Rebase, patch) -> tuple[dict[str, int] | None, list[str]]:
    """Three-way merge per file: base = the file at the old pin with the patches before it,
    theirs = that with the patch, ours = the new checkout.  None when the old pin cannot give
    it."""
    with rebase.old_pin(patch) as got:
        if got is None:
            return None, []
        old, r = got
        tree, to, frm, label = rebase.tree, rebase.to, rebase.frm, rebase.label
        marked: dict[str, int] = {}
        notes: list[str] = []
        for rel in r.files:
            base = git.show(old, f"HEAD~1:{rel}")
            theirs = git.show(old, f"HEAD:{rel}")
            ours = tree / rel
            if not ours.exists():
                if base is None and theirs is not None:
                    ours.parent.mkdir(parents=True, exist_ok=True)
                    ours.write_text(theirs)
                elif base is not None:
                    notes.append(f"{rel}: not in {label} {to} any more; make the change {patch.id} "
                                 f"made there (see {patch.path}) wherever that code went")
                continue
            if theirs is None:
                if ours.read_text(errors="replace") == base:
                    ours.unlink()
                else:
                    notes.append(f"{rel}: {patch.id} deletes it, but upstream changed it; delete "
                                 "it if that is still right")
                continue
            with tempfile.TemporaryDirectory(prefix="patchkit-merge-") as tmp:
                b, t = Path(tmp) / "base", Path(tmp) / "theirs"
                b.write_text(base or "")
                t.write_text(theirs)
                conflicts = git.merge_file(ours, b, t,
                                           (f"{label} {to}", f"{label} {frm}", patch.id))
            if conflicts < 0:
                return None, []
            if conflicts:
                marked[rel] = conflicts
        return marked, notes


def merge_into(rebase: Rebase, patch, diff_file: Path) -> tuple[dict[str, int], list[str]]:
    """Merge the diff into the checkout with conflict markers: per file against the old pin,
    else ``git apply --3way``, else ``--reject``.  The files with markers (and how many), and
    notes about files that could not be merged."""
    marked, notes = _merge_from_old_pin(rebase, patch)
    if marked is not None:
        return marked, notes
    tree = rebase.tree
    r = git.apply(tree, diff_file, three_way=True)
    if "lacks the necessary blob" not in r.stderr and "--3way" not in r.stderr:
        git.unstage_all(tree)  # leave the index at HEAD, the markers in the files
        found = _count_markers(tree)
        if found or r.ok:
            return found, []
    git.discard_changes(tree, check=False)
    git.apply(tree, diff_file, reject=True)
    rejects = git.untracked(tree, "*.rej")
    return {}, ([f"{r}: the hunks that did not apply (delete the .rej file when done)"
                 for r in rejects] or ["nothing of the diff applies"])
