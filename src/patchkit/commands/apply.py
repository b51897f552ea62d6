"""``patchkit apply``: the pinned checkout, the series, the assertions, into --workdir."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from patchkit.manifest import Manifest
from patchkit.report import ApplyReport
from patchkit.series import engine


def run(manifest: Manifest, *, ref: str | None, repos: Sequence[str] | None, workdir: Path,
        keep_failed: bool = False, progress: engine.Progress | None = None,
        variant: str | None = None) -> ApplyReport:
    return engine.apply_series(manifest, ref=ref, repos=repos, workdir=workdir, keep_failed=keep_failed,
                        progress=progress, variant=variant)
