"""Where the project is: ``patchset.yaml`` looked for in the current folder and each folder
above it, as git looks for ``.git``, so that every verb works from anywhere below the project,
``.patchkit/vllm`` included."""

from __future__ import annotations

import os
from pathlib import Path

from patchkit.packageid import VLLM

MANIFEST = "patchset.yaml"
WORKDIR = Path(".patchkit") / VLLM.name   # vLLM's checkout, relative to the project's folder


def find(start: Path | None = None) -> Path | None:
    """The nearest ``patchset.yaml`` in ``start`` (default: the current folder) or a folder
    above it, or None.  The walk stops at a file system boundary, as git's does."""
    here = Path(os.path.abspath(start or os.getcwd()))
    try:
        device = here.stat().st_dev
    except OSError:
        return None
    for folder in (here, *here.parents):
        try:
            if folder.stat().st_dev != device:
                return None
        except OSError:
            return None
        candidate = folder / MANIFEST
        if candidate.is_file():
            return candidate
    return None


def shown(path: Path) -> str:
    """``path`` as messages name it: relative to the current folder when it is inside it,
    else absolute."""
    path = os.path.abspath(path)
    rel = os.path.relpath(path)
    return path if rel in (".", "..") or rel.startswith("../") else rel


def default_manifest() -> str:
    """What ``--manifest`` means when it is not given: the manifest found from here, else
    ``patchset.yaml`` (whose absence the loader reports)."""
    found = find()
    return shown(found) if found is not None else MANIFEST


def default_workdir() -> str:
    """What ``--workdir`` means when it is not given: ``.patchkit/vllm`` of the project found
    from here, else of the current folder."""
    found = find()
    return shown(found.parent / WORKDIR) if found is not None else str(WORKDIR)
