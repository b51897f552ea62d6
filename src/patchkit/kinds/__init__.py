"""The patch kinds: one module each, looked up here by the manifest key.

A kind's module is imported only when a patch of that kind is met, so that a series of diffs
never imports libcst.  A new kind is a new module with a ``KIND`` object (see
:class:`patchkit.kinds.base.PatchKind`) and one line below.
"""

from __future__ import annotations

import importlib

from patchkit.kinds.base import KindError, PatchKind, Rebase, Reader, Remains, Stop, Target

TABLE = {
    "diff": "patchkit.kinds.diff",
    "transform": "patchkit.kinds.transform",
    "overlay": "patchkit.kinds.overlay",
    "artifact": "patchkit.kinds.artifact",
}
NAMES = tuple(TABLE)

__all__ = ["NAMES", "KindError", "PatchKind", "Rebase", "Reader", "Remains", "Stop", "Target",
           "get"]


def get(name: str) -> PatchKind:
    """The kind a manifest entry names; KeyError for a name that is none."""
    return importlib.import_module(TABLE[name]).KIND
