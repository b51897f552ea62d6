"""``patchkit build-image``: apply, choose the build path, build, tag, push, save (the image is
made by :mod:`patchkit.image.assembly`)."""

from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

from patchkit.errors import UsageError
from patchkit.image import base as base_
from patchkit.image import basevllm, build, builders
from patchkit.nodes import transfer
from patchkit.image import lockfile
from patchkit.image.builders.protocol import Asked
from patchkit.image.assembly import BuildReport, Choices, assemble, reach_registry
from patchkit.engines.docker import Engine
from patchkit.manifest import Manifest, variants
from patchkit.run import RunSpec, run_spec
from patchkit.report import ApplyReport
from patchkit.series.applier import Progress, apply_series, check_workdir
from patchkit.series.checkout import AppliedCheckout
from patchkit.timeouts import DEFAULT_TIMEOUT

MODES = ("auto", build.OVERLAY_MODE, build.SOURCE_MODE)


@dataclass(frozen=True)
class Request:
    """What build-image is asked: the options the run value is made of, and the build's own."""

    workdir: Path
    ref: str | None = None
    repos: Sequence[str] | None = None
    base: str | None = None
    tag: str | None = None
    platform: str | None = None
    variant: str | None = None
    timeout: float = DEFAULT_TIMEOUT
    engine: Engine | None = None   # an engine handed in (else one is connected)
    push: bool = False
    save: Path | None = None
    mode: str = "auto"
    apply: bool = True
    max_jobs: int | None = None
    nvcc_threads: int | None = None
    no_daemon: bool = False
    copy_to: Sequence[str] = ()
    discard: bool = False
    locked: bool = False
    via: str | None = None

    def run_value(self, manifest: Manifest) -> RunSpec:
        """The run, made once: with no_daemon no engine, else the one handed in or
        connected here (before the apply: an engine that is not there is known at once)."""
        engine = None if self.no_daemon else (
            self.engine or Engine.connect(timeout=self.timeout))
        return run_spec(manifest, ref=self.ref, repos=self.repos, base=self.base, tag=self.tag,
                        platform=self.platform, variant=self.variant, workdir=self.workdir,
                        timeout=self.timeout, engine=engine)

    @property
    def choices(self) -> Choices:
        return Choices(self.mode, self.push, self.save, self.no_daemon, self.max_jobs,
                       self.nvcc_threads)


def run(manifest: Manifest, request: Request, *, progress: Progress | None = None,
        registry=None) -> BuildReport:
    """Build (and optionally push and save) the image; with ``no_daemon``, straight in the
    registry (``push`` required, no engine).  The engine (or the registry) is reached before
    the series is applied; ``timeout`` bounds each of its silences.  The base's installed
    distributions are judged before the apply too (the packages' pins, ``image.requires``, and
    with ``locked`` the lock).

    Expected failures raise :class:`~patchkit.errors.PatchkitError` before anything is tagged;
    a series that does not apply is a report with ``ok`` false.
    """
    progress = progress or Progress()
    started = time.monotonic()
    # What can be refused is refused before the apply, which takes a while.
    _check_options(request)
    if request.apply:
        check_workdir(Path(request.workdir), request.discard)
    variants.check(manifest, request.variant)
    spec = request.run_value(manifest)
    copy_urls, via = _check(manifest, spec, request)
    lock = lockfile.read_lock(manifest) if request.locked else None
    # Reached before the apply too: a registry that is not there is known at once.
    if request.no_daemon:
        registry = registry or reach_registry(manifest, spec)
    # the workdir used as it is is opened before the base is read
    tree = None if request.apply else _applied(spec, apply=False)
    with ExitStack() as hold:   # the base, read once, open until the image is made
        held = base_.judged(manifest, spec, spec.engine, lock, hold, progress.info)
        if request.apply:
            report = _apply(manifest, spec, held, progress=progress, discard=request.discard)
            if not report.ok:
                return BuildReport.failed_apply(report)
        report = assemble(manifest, spec, request.choices, tree=tree or _applied(spec, True),
                          held=held, lock=lock, registry=registry, log=progress.info,
                          started=started)
    if copy_urls:
        progress.info(f"copying {report.tag} to {', '.join(copy_urls)}")
        copied = transfer.copy(spec.engine, report.tag, copy_urls, log=progress.info,
                               timeout=spec.timeout, via=via)
        report = replace(report, copy=copied)
    return report


def _check(manifest: Manifest, spec: RunSpec, request: Request
           ) -> tuple[list[str], str | None]:
    """Every option checked, and the workdir, before any source is asked: the path's
    refusals, the engines to copy to and the registry to copy through."""
    builders.refuse(request.no_daemon, Asked(request.push, request.save, request.mode,
                                             tuple(request.copy_to), spec.base, spec.base_from))
    copy_urls = transfer.check_targets(request.copy_to, "--copy-to")
    via = transfer.check_via(request.via) if request.via is not None else None
    if via is not None and not copy_urls:
        raise UsageError("--via REGISTRY is the way --copy-to copies; give --copy-to ENGINE")
    return copy_urls, via


def _check_options(request: Request) -> None:
    if request.mode not in MODES:
        raise UsageError(f"--mode {request.mode!r}: expected auto, overlay or source")
    if not request.apply and (request.ref is not None or request.repos):
        raise UsageError("--vllm-ref and --vllm-repo choose what to apply; with --no-apply the "
                         "workdir is used as it is")
    if not request.apply and request.discard:
        raise UsageError("--discard replaces the workdir by a new apply; with --no-apply the "
                         "workdir is used as it is")


def _apply(manifest: Manifest, spec: RunSpec, held: base_.BaseStack | None, *,
           progress: Progress, discard: bool) -> ApplyReport:
    needs = basevllm.needed(spec)
    if needs and spec.engine is None:
        raise UsageError(f"{needs}, read through an engine, and --no-daemon has none: apply "
                         "with an engine first, then build-image --no-daemon --no-apply")
    holder = basevllm.for_run(spec, held, log=progress.info)
    bases = basevllm.for_packages(spec, held, log=progress.info) if spec.engine else {}
    return apply_series(manifest, run=spec, workdir=spec.workdir, progress=progress,
                        base=holder, discard=discard, bases=bases)


def _applied(spec: RunSpec, apply: bool) -> AppliedCheckout:
    tree = AppliedCheckout.open(spec.workdir)
    if not apply and spec.variant is not None and spec.variant != tree.report.variant:
        raise UsageError(f"--variant {spec.variant}: {spec.workdir} was applied as "
                         f"{variants.describe(tree.report.variant)}; with --no-apply the "
                         "workdir is used as it is")
    return tree


__all__ = ["BuildReport", "Request", "run"]
