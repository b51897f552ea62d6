"""``patchkit bisect PATCH_ID``: the first upstream commit at which a patch's fate changes (the
search is :mod:`patchkit.series.bisect_upstream`'s)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from patchkit import source
from patchkit.errors import UsageError
from patchkit.manifest import Manifest, variants
from patchkit.run import run_spec
from patchkit.series import applier
from patchkit.series.bisect_upstream import (BisectResult, Oracle, between, end_names, newest_release,
                                    package_of, patch_named, ranged)

Ends = tuple[str | None, str | None]


def run(manifest: Manifest, patch_id: str, *, ends: Ends = (None, None),
        repos: Sequence[str] | None = None, cache: Path | None = None,
        progress: applier.Progress | None = None, variant: str | None = None,
        pins: Sequence[str] = ()) -> BisectResult:
    """The first commit of the patch's package between good (``ends[0]``, default: its pin)
    and bad (``ends[1]``, default: its newest release tag) at which the patch's fate changes,
    with the patches of that package before it that the build of ``variant`` (None: the
    default build) has.  vLLM (from ``repos``) and every other package stay at their pins;
    ``pins`` (``--ref NAME=REF``) move them."""
    good, bad = ends
    progress = progress or applier.Progress()
    variants.check(manifest, variant)
    patch = patch_named(manifest, patch_id)
    name = patch.package
    if good is not None and any(text.partition("=")[0].strip() == name for text in pins):
        raise UsageError(f"--good {good} and --ref {name}= both say where the bisect starts; "
                         "give one")
    moved_by_flag = manifest.package(name).id.primary   # --good is vLLM's ref, for run_spec
    spec = run_spec(manifest, ref=good if moved_by_flag else None, repos=repos, variant=variant,
                    refs=pins, cache=cache)
    at, package = spec.pin(name), package_of(manifest, patch)
    lo = source.resolve(at.sources, good if good is not None else at.ref, spec.cache,
                        progress.info, package=package)
    hi_ref = newest_release(lo.source, spec.cache, progress.info, package) if bad is None \
        else bad
    hi = source.resolve([lo.source], hi_ref, spec.cache, progress.info, package=package)
    others = applier.resolve_pins(spec, spec.cache, progress.info, None,
                                  names=ranged(manifest, name))
    scratch = Path(tempfile.mkdtemp(prefix="patchkit-bisect-"))
    try:
        oracle = Oracle(manifest, patch, scratch, progress.info, spec.variant, others,
                        spec.cache)
        return between(manifest, patch, lo, hi, oracle, spec.cache,
                       end_names(package, good, bad))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
