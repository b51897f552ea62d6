"""``patchkit apply``: the pinned checkout, the series, the assertions, into --workdir."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from patchkit.image import basevllm
from patchkit.manifest import Manifest
from patchkit.manifest.runspec import run_spec
from patchkit.report import ApplyReport
from patchkit.series import applier


def run(manifest: Manifest, *, ref: str | None, repos: Sequence[str] | None, workdir: Path,
        keep_failed: bool = False, progress: applier.Progress | None = None,
        variant: str | None = None, base: str | None = None,
        discard: bool = False, pins: Sequence[str] = (),
        packages: Sequence[str] = ()) -> ApplyReport:
    """``base`` names the base image the ref ``base`` and the source ``image`` read (default
    image.base); an engine is reached only when they are used.  ``discard``: replace a
    workdir holding a person's work (saved in a bundle beside it).  ``pins`` are ``--ref
    NAME=REF`` texts, ``packages`` the ``--package`` names the run is limited to."""
    progress = progress or applier.Progress()
    spec = run_spec(manifest, ref=ref, repos=repos, base=base, variant=variant, refs=pins,
                    only=packages)
    for place in applier.workdirs(spec, workdir).values():
        applier.check_workdir(place, discard)  # before any source or engine is asked
    holder = basevllm.for_run(spec, log=progress.info)
    bases = basevllm.for_packages(spec, log=progress.info)
    return applier.apply_series(manifest, run=spec, workdir=workdir, keep_failed=keep_failed,
                               progress=progress, base=holder, discard=discard, bases=bases)
