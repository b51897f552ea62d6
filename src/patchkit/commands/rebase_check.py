"""rebase-check: the series against newer vLLM releases, as a patch x release matrix.

Each target is resolved once, checked out in a scratch directory and run through the same
engine as ``apply``; targets run side by side in worker processes.  The checkout borrows the
cached objects (never copied, no clone: a scratch checkout needs none of the source's refs),
its commits are made in-process and not written (their ids are in the report), and it is
sparse: only the files the series reads or writes (the diffs' files, the transforms' ``path``,
the overlay files, the assertion files) are written out, which turns a checkout of thousands of
files into one of a few.  When those files cannot all be
named up front (a diff that does not parse, a transform that does not import) the checkout is
full, so the engine reports the failure exactly as ``apply`` would.  ``--workdir`` is never
touched.  Renderers turn the matrix into text for a person, JSON for scripts, Markdown for a CI
job summary and JUnit XML for a CI test report (``render.matrix``).
"""

from __future__ import annotations

import multiprocessing
import os
import re
import shutil
import tempfile
import traceback
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from patchkit import interrupt, process, source, versions
from patchkit.errors import PatchkitError, UsageError
from patchkit.image import basevllm
from patchkit.manifest import VLLM, Manifest, Patch, variants
from patchkit.engines.docker import Engine
from patchkit.run import Asked, RunSpec, pins
from patchkit.report import ApplyReport, PatchResult, Status
from patchkit.series import applier, fates, trial
from patchkit.series.releases import release_targets

FORMATS = ("text", "json", "markdown", "junit")
_PULL = re.compile(r"github\.com/vllm-project/vllm/pull/(\d+)")


class CheckProgress(applier.Progress):
    """What rebase-check tells as it goes (in the calling process, as each target is done)."""

    def target(self, report: ApplyReport) -> None:
        pass


def check_flags(refs: Sequence[str], releases: bool, pre: bool,
                outputs: Sequence[str]) -> list[tuple[str, Path]]:
    """What the flags ask for, checked before the run; the ``--output FORMAT:FILE`` sinks."""
    if not refs and not releases:
        raise UsageError("give --to REF (repeatable) or --releases")
    if pre and not releases:
        raise UsageError("--pre goes with --releases")
    sinks = []
    for spec in outputs:
        kind, sep, path = spec.partition(":")
        if not sep or not path or kind not in FORMATS:
            raise UsageError(f"--output {spec!r}: expected FORMAT:FILE with FORMAT one of "
                             + ", ".join(FORMATS))
        if not Path(path).parent.is_dir():
            raise UsageError(f"--output {spec!r}: no folder {Path(path).parent}")
        sinks.append((kind, Path(path)))
    return sinks


# ------------------------------------------------------------------------------ the matrix

@dataclass
class Row:
    """One patch across the targets."""

    patch: Patch
    cells: list[PatchResult]
    pin: PatchResult | None = None     # at the pin (None: the pin was not tried)
    fates: list[fates.Fate] = field(default_factory=list)   # per target, from the pin
    upstream_since: str | None = None  # the first target of the run of `upstream` to the last
    drop: bool = False                 # upstream in every target
    # --bisect: (target ref, the bisect from the pin to it, or why there is none) per failure
    bisects: list[tuple[str, object]] = field(default_factory=list)

    @property
    def pull(self) -> int | None:
        m = _PULL.search(self.patch.upstream or "")
        return int(m.group(1)) if m else None


@dataclass
class Matrix:
    manifest: Manifest
    targets: list[ApplyReport] = field(default_factory=list)
    variant: str | None = None
    # --bisect: (target ref of `package`, patch id) -> BisectResult, or why it could not run
    bisects: dict[tuple[str, str], object] = field(default_factory=dict)
    package: str = VLLM.name      # the package whose refs the targets are
    series: tuple[Patch, ...] | None = None   # the rows (default: every patch)
    at_pin: ApplyReport | None = None         # the series at the pin, the first column
    # per target, every patch's fate from the pin there (series.fates judges them)
    fates: list[tuple[fates.Fate, ...]] = field(default_factory=list)

    @property
    def label(self) -> str:
        return self.manifest.package(self.package).label

    @property
    def pin(self) -> str:
        return self.manifest.package(self.package).ref

    def ref_of(self, target: ApplyReport) -> str:
        """The target's ref: of vLLM, or of the package the matrix is over."""
        return (target.packages.get(self.package) or target.vllm).ref

    @property
    def ok(self) -> bool:
        return all(t.ok for t in self.targets) and not self.lost()

    def fate_at(self, n: int) -> tuple[fates.Fate, ...]:
        return self.fates[n] if n < len(self.fates) else ()

    def lost(self) -> list[tuple[ApplyReport, fates.Fate]]:
        """The fixes lost at a target (or retired there against the proof), target by target."""
        return [(t, f) for n, t in enumerate(self.targets) for f in self.fate_at(n) if f.fails]

    def failed_refs(self) -> list[str]:
        """The targets that fail: a patch fails there, or a fix is lost there."""
        return [self.ref_of(t) for n, t in enumerate(self.targets)
                if not t.ok or any(f.fails for f in self.fate_at(n))]

    def changes(self) -> list[tuple[str, fates.Fate]]:
        """The fates that change without loss, each at the first target it shows at."""
        seen: dict[tuple[str, fates.Change], tuple[str, fates.Fate]] = {}
        for n, t in enumerate(self.targets):
            for f in self.fate_at(n):
                if f.noted and not f.fails:
                    seen.setdefault((f.patch, f.change), (self.ref_of(t), f))
        return list(seen.values())

    @property
    def refs(self) -> list[str]:
        return [self.ref_of(t) for t in self.targets]

    def rows(self) -> list[Row]:
        rows = []
        series = self.manifest.patches if self.series is None else self.series
        for i, patch in enumerate(series):
            cells = [t.patches[i] for t in self.targets]
            row = Row(patch, cells, self.at_pin.patches[i] if self.at_pin else None,
                      [self.fate_at(n)[i] for n in range(len(self.targets))
                       if i < len(self.fate_at(n))],
                      bisects=[(ref, self.bisects[(ref, patch.id)])
                               for ref in self.refs if (ref, patch.id) in self.bisects])
            run = 0
            for c in reversed(cells):
                if c.status is not Status.UPSTREAM:
                    break
                run += 1
            if run:
                row.upstream_since = self.ref_of(self.targets[len(cells) - run])
                row.drop = run == len(cells)
            rows.append(row)
        return rows

    def failures(self) -> list[tuple[ApplyReport, PatchResult]]:
        return [(t, r) for t in self.targets for r in t.patches
                if r.status is Status.FAILED]

    def to_dict(self) -> dict:
        targets = [t.to_dict() for t in self.targets]
        for n, (t, data) in enumerate(zip(self.targets, targets)):
            data["ok"] = data["ok"] and not any(f.fails for f in self.fate_at(n))
            by_id = {f.patch: f for f in self.fate_at(n)}
            for entry in data["patches"]:
                if entry["id"] in by_id:
                    entry["fate"] = by_id[entry["id"]].to_dict()
                found = self.bisects.get((self.ref_of(t), entry["id"]))
                if found is not None:
                    entry["bisect"] = ({"ok": False, "error": found} if isinstance(found, str)
                                       else found.to_dict())
        return {
            "ok": self.ok,
            "name": self.manifest.name,
            "pin": self.manifest.vllm.ref,
            "package": self.package,
            "package_pin": self.pin,
            "variant": self.variant,
            "at_pin": self.at_pin.to_dict() if self.at_pin else None,
            "targets": targets,
            "patches": [{"id": r.patch.id, "kind": r.patch.kind, "upstream": r.patch.upstream,
                         "pull": r.pull, "upstream_since": r.upstream_since, "drop": r.drop,
                         "pin_status": _word(r.pin) if r.pin else None,
                         "status": {self.ref_of(t): _word(c)
                                    for t, c in zip(self.targets, r.cells)},
                         "fate": {self.ref_of(t): f.change.value
                                  for t, f in zip(self.targets, r.fates)},
                         "lost": [self.ref_of(t) for t, f in zip(self.targets, r.fates)
                                  if f.fails]}
                        for r in self.rows()],
            "lost": [{"id": f.patch, "target": self.ref_of(t), "change": f.change.value,
                      "why": f.why} for t, f in self.lost()],
        }


def _word(c: PatchResult) -> str:
    return str(c.status) if c.status is not Status.FAILED else f"failed:{c.reason}"


def check(manifest: Manifest, refs: Sequence[str], run: RunSpec, *, jobs: int | None = None,
          progress: CheckProgress | None = None, sparse: bool = True,
          bases: Mapping[str, source.Base] | None = None) -> Matrix:
    """Apply the series of the run's variant (None: the default build) to each of ``refs`` of
    the run's package (``--package``, else vLLM) in a scratch checkout and run the
    assertions.  ``bases`` are the base images each package's ref ``base`` and source
    ``image`` read, by name.  Every other package stays at its pin, and the ranges on it are
    judged there; for a package other than vLLM the rows are its patches."""
    variant = run.variant
    variants.check(manifest, variant)
    progress = progress or CheckProgress()
    cache, package = run.cache, run.only[0] if run.only else manifest.vllm.name
    bases = bases or {}
    base, held = bases.get(VLLM.name), bases.get(package)
    pin = run.pin(package)
    matrix = Matrix(manifest, variant=variant, package=package)
    if not pin.id.primary:
        matrix.series = tuple(p for p in manifest.patches if p.package == package)
    series = matrix.series if matrix.series is not None else manifest.patches
    if refs and any(p.retired is not None for p in series):
        _, tags = source.list_tags(pin.sources, cache, progress.info, package=pin.id)
        fates.check_retired_releases(manifest, series, tags, pin.id.label)
    at_pin, extra, resolved = _targets(pin, refs, lambda ref: source.resolve(
        pin.sources, ref, cache, progress.info, base=held, package=pin.id))
    # every other package at its pin: the ranges on it are judged at each target too
    others = applier.resolve_pins(run, cache, progress.info, base,
                                  names=[p.name for p in run.pins if p.name != package],
                                  bases=bases)
    if not resolved:
        return matrix
    # the pin is the first column, which every fate is judged from
    together = [*resolved, at_pin] if extra else resolved
    paths = applier.needed_paths(manifest) if sparse else None
    reports = _run_jobs(lambda scratch: [
        _Job(manifest, res, scratch / str(n), paths, variant, package, others, matrix.series,
             cache) for n, res in enumerate(together)], jobs, progress)
    if extra:
        matrix.targets, matrix.at_pin = reports[:-1], reports[-1]
    else:
        matrix.targets = reports
        matrix.at_pin = next(r for r, res in zip(reports, resolved) if res is at_pin)
    matrix.fates = [fates.judge_reports(series, matrix.at_pin, report, ref=res.ref,
                                        pin_ref=pin.ref, older=_older(res, at_pin),
                                        proofs=fates.proofs_at(manifest, series, res))
                    for report, res in zip(matrix.targets, resolved)]
    return matrix


def _targets(pin, refs: Sequence[str], resolve: Callable[[str], source.Resolved]
             ) -> tuple[source.Resolved | None, bool, list[source.Resolved]]:
    """The pin resolved, whether it is one more job (not a target itself), and the targets
    resolved, oldest first.  The pin is tried once: as a target when it is one, else as one
    more job; a bad target is said before the pin is fetched."""
    wanted = list(dict.fromkeys(refs))
    extra = bool(wanted) and pin.ref not in wanted
    resolved = _resolved([*wanted, *([pin.ref] if extra else [])], resolve)
    at_pin = resolved.pop() if extra else next((r for r in resolved if r.ref == pin.ref), None)
    return at_pin, extra, _by_version(resolved)


def _run_jobs(make: Callable[[Path], list["_Job"]], jobs: int | None,
              progress: CheckProgress) -> list[ApplyReport]:
    """The jobs ``make`` gives for a scratch folder, run (in processes when more than one),
    each target's report told to ``progress`` as it comes; the folder removed after."""
    scratch = Path(tempfile.mkdtemp(prefix="patchkit-rebase-check-"))
    try:
        work = make(scratch)
        # Two per core: with 3 targets on 2 cores, 2 workers would leave a core idle while the
        # third target runs alone; 3 let the OS share both cores out (measured: 3.5 s vs 4.3 s).
        workers = max(1, min(jobs or 2 * (os.cpu_count() or 1), len(work)))
        if workers > 1:
            return _in_processes(work, workers, progress)
        reports = []
        for job in work:
            reports.append(_one(job).unwrap())
            progress.target(reports[-1])
        return reports
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@dataclass(frozen=True)
class _Job:
    """One target for a worker: the checkout to make (of ``paths``, None: every file) and the
    series to apply there."""

    manifest: Manifest
    res: source.Resolved
    tree: Path
    paths: list[str] | None
    variant: str | None
    package: str
    others: dict[str, source.Resolved] | None
    series: tuple[Patch, ...] | None
    memo: Path | None          # the run's cache, where kept results live


def _one(job: _Job) -> _Outcome:
    """One target, in a worker: its report, or what stopped it as plain values (not every
    exception survives pickling)."""
    manifest, res, tree, package = job.manifest, job.res, job.tree, job.package
    try:
        return _Report(trial.run(manifest, res, tree, package=package,
                                 others=job.others or {}, paths=job.paths, series=job.series,
                                 variant=job.variant, memo=job.memo))
    except interrupt.Interrupted as exc:
        return _Stopped(exc.signum)
    except PatchkitError as exc:
        return _Failed(type(exc).exit_code, str(exc))
    except Exception as exc:  # noqa: BLE001  # a bug: carried to the parent, reported as one
        return _Bug(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")


@dataclass(frozen=True)
class _Report:
    """A worker's target applied: its report."""

    report: ApplyReport

    def unwrap(self) -> ApplyReport:
        return self.report


@dataclass(frozen=True)
class _Stopped:
    """A worker stopped by a signal (^C), raised again in the parent."""

    signum: int

    def unwrap(self) -> ApplyReport:
        raise interrupt.Interrupted(self.signum)


@dataclass(frozen=True)
class _Failed:
    """A worker's expected failure: the exit code of the original error, and its message."""

    exit_code: int
    message: str

    def unwrap(self) -> ApplyReport:
        raise TargetError(self.message, self.exit_code)


@dataclass(frozen=True)
class _Bug:
    """A worker's unexpected failure: the exception and its traceback, as text."""

    text: str

    def unwrap(self) -> ApplyReport:
        raise RuntimeError(f"a rebase-check worker failed: {self.text}")


# what a worker gives back; ``unwrap`` is the report, or raises what stopped the worker
_Outcome = _Report | _Stopped | _Failed | _Bug


class TargetError(PatchkitError):
    """A worker's expected failure, with the exit code of the original error."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


DOWNLOADS = 3   # targets resolved at once: releases from PyPI download side by side


def _resolved(refs: list[str], resolve) -> list[source.Resolved]:
    """Each ref resolved, in order, at most ``DOWNLOADS`` at a time (a release from PyPI is a
    download of hundreds of MB; a git ref waits for its mirror's lock in turn)."""
    if len(refs) < 2:
        return [resolve(ref) for ref in refs]
    with ThreadPoolExecutor(max_workers=min(DOWNLOADS, len(refs))) as pool:
        futures = [pool.submit(resolve, ref) for ref in refs]
        try:
            return [f.result() for f in futures]
        except BaseException:
            for f in futures:
                f.cancel()
            raise


def _in_processes(jobs: list, workers: int, progress: CheckProgress) -> list[ApplyReport]:
    """Targets side by side in worker processes: the work includes libcst transforms and AST
    parsing, pure Python that threads would run one at a time.  Forked workers start with
    everything imported; ^C reaches them through the process group and each stops at its next
    clean point, like the engine does in one process."""
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    results: list[ApplyReport | None] = [None] * len(jobs)
    # a worker dies with patchkit, however patchkit ends
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx,
                             initializer=process.bind_to_parent,
                             initargs=(os.getpid(),)) as pool:
        futures = {pool.submit(_one, job): n for n, job in enumerate(jobs)}
        try:
            for fut in as_completed(futures):
                interrupt.check()
                report = fut.result().unwrap()
                results[futures[fut]] = report
                progress.target(report)
        except BaseException:
            for fut in futures:
                fut.cancel()
            raise
    return [r for r in results if r is not None]


def _older(res: source.Resolved, pin: source.Resolved) -> bool:
    """Is the target a release before the pin (a look back, where a fix is carried by the
    patch it supersedes)?"""
    a, b = versions.parse(res.version), versions.parse(pin.version)
    return a is not None and b is not None and a < b


def _by_version(resolved: list[source.Resolved]) -> list[source.Resolved]:
    try:
        return sorted(resolved, key=lambda r: versions.sort_key(r.version))
    except versions.InvalidVersion:
        return resolved  # a target of unknown release: keep the order given


def run(manifest: Manifest, asked: Asked, *, refs: Sequence[str] = (), releases: bool = False,
        pre: bool = False, jobs: int | None = None, progress: CheckProgress | None = None,
        bisect: bool = False) -> Matrix:
    """The targets named and, with ``releases``, every release after the pin; then the check;
    with ``bisect``, the upstream commit that broke each failure (``series.bisect_upstream``).
    The run's base (``--base``, default image.base) is the image that a ref ``base`` and the
    source ``image`` read, of any package; it is read without running it, through the run's
    engine, and only when a pin or a target needs it.  The run's package (``--package``)
    makes the targets that package's refs and the rows its patches; its pins (``--ref
    NAME=REF``) move the other packages' pins."""
    variants.check(manifest, asked.variant)
    progress = progress or CheckProgress()
    check_flags(refs, releases, pre, ())
    package = asked.only[0] if asked.only else manifest.vllm.name
    targets = list(refs)
    pin = next(p for p in pins(manifest, ref=asked.ref, repos=asked.repos, refs=asked.refs)
               if p.name == package)
    # the refs the matrix's package is taken at; every other package at its pin
    wanted = {package: targets + ([pin.ref] if releases else [])}
    wants = asked.engine is None and asked.reads_base(manifest, wanted)
    spec = asked.spec(manifest, Engine.connect(timeout=asked.timeout) if wants else None)
    with ExitStack() as hold:   # the base, read once, open while the targets are had
        held = basevllm.held(spec, hold, refs=wanted, log=progress.info)
        return _matrix(manifest, spec, _Targets(targets, releases, pre, jobs, bisect), held,
                       wanted, progress)


@dataclass(frozen=True)
class _Targets:
    """What :func:`run` is asked to check, and how."""

    refs: list[str]
    releases: bool
    pre: bool
    jobs: int | None
    bisect: bool


def _matrix(manifest: Manifest, spec: RunSpec, asked: _Targets, held,
            wanted: Mapping[str, Sequence[str]], progress: CheckProgress) -> Matrix:
    """The check of :func:`run`, its run made and its base held open."""
    targets, releases, pre, jobs, bisect = (list(asked.refs), asked.releases, asked.pre,
                                            asked.jobs, asked.bisect)
    package = spec.only[0] if spec.only else manifest.vllm.name
    pin = spec.pin(package)
    holder = basevllm.for_run(spec, held, refs=wanted.get(VLLM.name), log=progress.info)
    bases = basevllm.for_packages(spec, held, refs=wanted, log=progress.info)
    if releases:
        found = release_targets(manifest, spec, pre=pre, log=progress.info,
                                base={**bases, VLLM.name: holder}.get(package),
                                package=package)
        whose = pin.id.aside("{} ")
        progress.info(f"{whose}releases after {pin.ref}: {', '.join(found) or 'none'}")
        targets += found
    matrix = check(manifest, targets, spec, jobs=jobs, progress=progress,
                   bases={**bases, VLLM.name: holder} if holder else bases)
    if bisect:
        from patchkit.series.bisect_upstream import bisect_failures

        matrix.bisects = bisect_failures(manifest, matrix.failures(), run=spec,
                                         progress=progress, package=package)
    return matrix
