"""The diff kind: a git-style unified diff, owner of unidiff and ``git apply``.

The kind's protocol here: the manifest check, applying, refreshing a diff that applied at an
offset, and what ``rebase`` does at a stop and when it is taken up again.  The work is each
job's own module: ``gitapply.py`` applies a diff and names what is in its way, ``text.py``
reads and edits the diff's text (shared with the intake of new diffs), ``merge.py`` merges a
stopped diff into the new checkout with conflict markers.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from unidiff import PatchSet
from unidiff.errors import UnidiffParseError

from patchkit import git
from patchkit import paths
from patchkit.errors import PatchkitError, UsageError
from patchkit.kinds.base import KindError, Reader, Rebase, Remains, Stop, Target
from patchkit.kinds.common import ABORT, commit_message, generic_stop
from patchkit.kinds.diff.gitapply import applies_exactly, apply_file, apply_together
from patchkit.kinds.diff.merge import merge_into
from patchkit.kinds.diff.text import (DiffParseError, binary_without_data, conflict_markers, parse,
                                      preamble, read_text, shift_hunks, touched,
                                      write_text_if_changed)
from patchkit.report import Outcome, PatchResult, Reason


class DiffKind:
    name = "diff"
    is_folder = False
    replaces_files = False
    writes_only_named = True

    def check(self, full: Path, rel: str) -> str | None:
        try:
            text = full.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            return f"{rel} is not UTF-8 text ({exc.reason} at byte {exc.start})"
        except OSError as exc:
            return f"cannot read {rel}: {exc.strerror}"
        try:
            patch_set = PatchSet(text)
        except UnidiffParseError as exc:
            return f"{rel} is not a valid unified diff: {exc}"
        if len(patch_set) == 0:
            return f"{rel} holds no file changes (not a unified diff?)"
        binary = binary_without_data(text)
        if binary:
            return (f"{rel} names a binary change without its content ({binary!r}); "
                    "make it with `git diff --binary`")
        for patched in patch_set:
            try:
                paths.check_relative(patched.path)
            except paths.UnsafePathError as exc:
                return f"{rel} touches an unsafe path: {exc}"
        return None

    def sources(self, full: Path, rel: str) -> list[str]:
        return [rel]

    def touched(self, full: Path) -> list[str]:
        try:
            return touched(parse(read_text(full)))
        except (OSError, DiffParseError) as exc:
            raise KindError(str(exc)) from None

    def compile(self, full: Path, rel: str) -> str:
        patch_set = parse(read_text(full))   # the loader's check has parsed it once already
        files = len(patch_set)
        hunks = sum(len(f) for f in patch_set)
        return (f"{files} file{'s' if files != 1 else ''}, {hunks} "
                f"hunk{'s' if hunks != 1 else ''}")

    def apply(self, patch, full: Path, target: Target) -> Outcome:
        return apply_file(full, target.root)

    def apply_together(self, fulls: Sequence[Path], target: Target
                       ) -> list[Outcome | None] | None:
        return apply_together(fulls, target.root)

    def refresh(self, patch, full: Path, tree: Path, result: PatchResult) -> str | None:
        """Rewrite a diff that applied at an offset to apply exactly at its commit's parent.
        Moving the hunk headers keeps every other byte; git's own diff of the commit is the
        fallback when that is not exact."""
        if not result.offsets:
            return None
        old = read_text(full)
        new = shift_hunks(old, {(o.path, o.hunk): o.offset for o in result.offsets})
        how = "hunk headers moved"
        parent, commit = f"{result.commit}~1", str(result.commit)
        if not applies_exactly(tree, new, parent, commit):
            new = preamble(old) + git.diff(tree, parent, commit)
            how = "rewritten from the commit"
            if not applies_exactly(tree, new, parent, commit):
                raise PatchkitError(f"{patch.path}: could not rewrite it to apply exactly")
        write_text_if_changed(full, new)
        return f"{how}: " + "; ".join(map(str, result.offsets))

    def stop(self, rebase: Rebase, patch, result: PatchResult, head: str) -> Stop:
        if result.reason not in (Reason.CONFLICT, Reason.FUZZ, Reason.ANCHOR_MISSING):
            return generic_stop(rebase, patch, result, head)
        marked, notes = merge_into(rebase, patch, rebase.manifest.root / patch.path)
        shown = rebase.shown
        lines = [head, "",
                 (f"The checkout {shown} holds {rebase.label} {rebase.to} with the patches "
                  f"before {patch.id}, and {patch.id} merged in as far as it goes:")]
        lines += [f"  {f}: {n} conflict{'s' if n != 1 else ''} between <<<<<<< and >>>>>>>"
                  for f, n in marked.items()]
        lines += [f"  {n}" for n in notes]
        lines += ["", (f"Edit the checkout until it makes the change {patch.id} should make (no "
                       "conflict marker left), then"),
                  f"`patchkit rebase --continue` writes that change to {patch.path} and goes on.",
                  ("Leaving the checkout as upstream has it (no change) drops the patch by "
                   "hand at this release: it counts as lost there unless upstream has its "
                   "change, a patch that takes effect supersedes it, or it is retired."), ABORT]
        return Stop(patch.id, self.name, result.reason or Reason.ERROR, result.message,
                    [f"{shown}/{f}" for f in marked] or [shown], lines)

    def resume(self, rebase: Rebase, patch, stop: Stop) -> None:
        """The edited checkout becomes the new diff (or, unchanged, marks it upstream)."""
        tree = rebase.tree
        leftovers = [f for f in git.untracked(tree) if f.endswith((".rej", ".orig"))]
        if leftovers:
            raise UsageError(f"remove {', '.join(leftovers)} from {rebase.shown} first "
                             "(what they hold must be in the files by now)")
        git.stage_all(tree)
        text = git.diff(tree, "HEAD", cached=True)
        markers = conflict_markers(text)
        if markers:
            git.unstage_all(tree)
            raise UsageError(f"conflict markers left in {rebase.shown}: {', '.join(markers[:5])}"
                             f"{' ...' if len(markers) > 5 else ''}; resolve them, then "
                             "`patchkit rebase --continue`")
        if not text.strip():
            rebase.dropped_by_hand(patch, "resolved to no change")
            return
        file = rebase.manifest.root / patch.path
        new = preamble(read_text(file)) + text
        commit = git.commit_all(tree, commit_message(patch))
        assert commit
        if not applies_exactly(tree, new, f"{commit}~1", commit):
            raise PatchkitError(f"{patch.path}: the resolution does not turn into a clean diff")
        write_text_if_changed(file, new)
        rebase.resolved(patch, commit, f"{patch.path} rewritten from the checkout")

    def changes(self, full: Path) -> frozenset[tuple[str, ...]]:
        """Each hunk as (file, the lines it removes, the lines it adds)."""
        try:
            patch_set = parse(read_text(full))
        except (OSError, DiffParseError):
            return frozenset()
        return frozenset(
            (pf.path, "".join(ln.value for ln in hunk if ln.is_removed),
             "".join(ln.value for ln in hunk if ln.is_added))
            for pf in patch_set for hunk in pf)

    def remains(self, full: Path, read: Reader, version: str | None) -> Remains:
        """Per file the diff changes: gone, or each hunk's changed lines gone (a hunk that
        only adds: the context it adds to gone)."""
        from patchkit.kinds.diff.remains import remains

        return remains(parse(read_text(full)), read)


KIND = DiffKind()
