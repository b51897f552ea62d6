"""rebase: move the pin to a new ref (series/rebase.py does the work); the verb's one choice
among starting, going on and going back."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from patchkit import manifest
from patchkit.errors import UsageError
from patchkit.manifest import VLLM
from patchkit.run import run_spec
from patchkit.series import applier
from patchkit.series.rebase import RebaseResult, abort, resume, start


def run(manifest_path: Path, *, to: str | None = None, cont: bool = False, abort_: bool = False,
        drop_upstream: bool = False, repos: Sequence[str] | None = None,
        package: str | None = None,
        progress: applier.Progress | None = None) -> RebaseResult:
    """One of start (``to``), ``--continue`` or ``--abort`` (its result names the files
    restored)."""
    if sum(bool(x) for x in (to, cont, abort_)) != 1:
        raise UsageError("give exactly one of --to REF, --continue, --abort")
    if (cont or abort_) and (drop_upstream or repos or package):
        raise UsageError("--drop-upstream, --vllm-repo and --package go with --to")
    if abort_:
        return abort(manifest_path)
    if cont:
        return resume(manifest_path, progress=progress)
    assert to is not None
    return start_at(manifest_path, to, repos=repos, drop_upstream=drop_upstream,
                    package=package or VLLM.name, progress=progress)


def start_at(manifest_path: Path, to: str, *, repos: Sequence[str] | None = None,
             drop_upstream: bool = False, package: str = VLLM.name,
             progress: applier.Progress | None = None) -> RebaseResult:
    """A rebase of ``package`` in the manifest at ``manifest_path`` begun, on the run its
    options make."""
    m = manifest.load(manifest_path)
    spec = run_spec(m, repos=repos, only=[package])   # an unknown package: one line
    if not m.package(package).id.primary and repos:
        raise UsageError("--vllm-repo goes with vLLM's rebase, not --package")
    return start(m, spec, to, drop_upstream=drop_upstream, package=package, progress=progress)
