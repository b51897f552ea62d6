"""A trial: one package's series applied to a scratch checkout of one ref of it, and the
assertions run, as ``apply`` runs them; the checkout is removed after.

What ``rebase-check`` does for each target, and what ``bump`` proves both sides of a port
with: the fate of every patch at the old pin and at the new release, and the assertions that
ran there.  Every other package stays at its pin (``others``), where the ranges on it are
judged."""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from patchkit import source
from patchkit.manifest import Manifest, Patch
from patchkit.report import ApplyReport
from patchkit.series import applier


def run(manifest: Manifest, resolved: source.Resolved, dest: Path, *, package: str,
        others: Mapping[str, source.Resolved], paths: Sequence[str] | None = None,
        series: Sequence[Patch] | None = None, variant=None,
        memo: Path | None = None) -> ApplyReport:
    """The report of ``series`` (default: every patch) at ``resolved`` of ``package``, checked
    out at ``dest`` (only ``paths`` when given); ``dest`` is gone afterwards.  ``memo``: where
    a pure transform's result is kept (the run's cache's; None: not kept)."""
    try:
        source.checkout(resolved, dest, paths, scratch=True)
        at = applier.Tree(dest, resolved,
                          applier.package_tops(resolved, manifest.package(package).id),
                          keep=False, memo=memo)
        return applier.run_stack(manifest, {package: at}, patches=series, variant=variant,
                                 pins={**others, package: resolved})
    finally:
        shutil.rmtree(dest, ignore_errors=True)
