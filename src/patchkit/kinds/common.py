"""What every kind shares: the commit message of a patch, and the plain rebase stop."""

from __future__ import annotations

from patchkit.kinds.base import Patch, Rebase, Stop
from patchkit.report import PatchResult, Reason

ABORT = "`patchkit rebase --abort` puts the manifest and every patch file back as they were."


def commit_message(patch: Patch) -> str:
    """The message of the commit a patch becomes (the id and summary, the upstream link)."""
    msg = f"patchkit: {patch.id}: {patch.summary}"
    if patch.upstream:
        msg += f"\n\nUpstream: {patch.upstream}"
    return msg


def generic_stop(rebase: Rebase, patch: Patch, result: PatchResult, head: str) -> Stop:
    """Fix the patch file, then go on: what a stop says when the kind has nothing better."""
    lines = [head, "", f"Fix {patch.path}, then `patchkit rebase --continue` tries it again.", ABORT]
    return Stop(patch.id, patch.kind, result.reason or Reason.ERROR, result.message, [patch.path], lines)


def dirty_resume(rebase: Rebase, patch: Patch) -> None:
    """``--continue`` for a kind whose fix is in its own file: the checkout must be clean."""
    from patchkit import git
    from patchkit.errors import UsageError

    if git.is_dirty(rebase.tree):
        raise UsageError(
            f"the checkout {rebase.shown} has changes, but {patch.id} is a {patch.kind}: "
            f"change {patch.path} instead (`git -C {rebase.shown} reset --hard` and "
            "`git clean -fd` there drop the checkout's changes)")
