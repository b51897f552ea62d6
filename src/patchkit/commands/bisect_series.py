"""``patchkit bisect --series --run CMD``: the patch of your own series that makes CMD fail.

It is ``git bisect run`` over the series instead of the upstream history (``series/bisect_upstream.py``
moves the upstream commit under one patch; this moves how much of the series is applied at the
pin).  A point of the search is a prefix of the series: its first k patches, applied to the
pinned checkout as ``apply`` applies them, in a scratch folder.  The predicate is the user's
command, run with ``PATCHKIT_TREE`` naming that tree (and with ``--image``, ``PATCHKIT_IMAGE``
naming an image built from it as ``build-image --no-apply`` builds one).  Its exit code is read
as ``git bisect run`` reads it: 0 good, 125 skip, 1 to 127 bad; above 127 or ended by a signal,
an error that stops the search.  A command still running at ``--timeout`` is killed and counts
as bad: a hang is one of the failures one bisects for.  A prefix whose tree cannot be made (a
patch or an assertion fails in it) is skipped, as ``git bisect skip``.

The series is the build's patches (the default build, or ``--variant``'s) that are in range at
the pinned versions: the others are skipped by every apply and cannot be the culprit.  The empty
series (the pin alone) must pass and the whole series must fail; both are run first.  Then a
binary search keeps the longest prefix known good and the shortest known bad, and runs the
untested prefix nearest the middle between them: with one culprit and no skip, ceil(log2 n)
runs for n patches, ceil(log2 n) + 2 in all.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from enum import Enum
from dataclasses import dataclass, field
from pathlib import Path

from patchkit import imageref, process
from patchkit.series.bisect_upstream import limit_for
from patchkit.errors import UsageError
from patchkit.image import base as base_
from patchkit.image import basevllm
from patchkit.image.assembly import Choices, assemble, reach_registry
from patchkit.manifest import VLLM, Manifest, Patch, variants
from patchkit.engines.docker import Engine
from patchkit.run import Asked, RunSpec
from patchkit.report import ApplyReport, Status
from patchkit.series import applier
from patchkit.series.checkout import AppliedCheckout

__all__ = ["GOOD", "BAD", "SKIP", "ERROR", "Run", "Searched", "SeriesBisect", "Verdict",
           "check_command",
           "Flags", "outcome_of", "run", "search"]

GOOD, BAD, SKIP, ERROR = "good", "bad", "skip", "error"
KEEP = 16 * 1024   # bytes of each run's output kept for the report

class Verdict(str, Enum):
    """What the search found (the JSON's words)."""

    FOUND = "found"                  # the first bad patch is named
    PASSES = "passes"                # CMD passes with the whole series: nothing to find
    FAILS_WITHOUT = "fails-without"  # CMD fails on the pin alone: the cause is not in the series
    UNTESTABLE = "untestable"        # an end could not be tested (its tree, or CMD skipped it)
    ONLY_SKIPPED = "only-skipped"    # every prefix between the last good and first bad was skipped
    STOPPED = "error"                # CMD ended in a way that stops the search (>127, a signal)

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Run:
    """One prefix tested: how many patches it held, what CMD made of it, and why."""

    patches: int
    last: str | None           # the last patch of the prefix (None: the pin alone)
    outcome: str               # good | bad | skip | error
    why: str                   # "exit 1", "killed after 30 s", "dspark-x failed (conflict)"
    seconds: float
    exit_code: int | None = None   # None: CMD did not run, or was killed at the deadline
    output: str = ""           # the last KEEP bytes CMD wrote (stdout and stderr together)
    truncated: bool = False
    image: str | None = None
    failed: tuple[tuple[str, str], ...] = ()   # (id, reason) of what failed making the tree

    def to_dict(self) -> dict:
        return {"patches": self.patches, "last": self.last, "outcome": self.outcome,
                "why": self.why, "seconds": round(self.seconds, 2), "exit_code": self.exit_code,
                "image": self.image, "output": self.output, "truncated": self.truncated,
                "failed": [i for i, _ in self.failed]}


@dataclass(frozen=True)
class Searched:
    """What :func:`search` found: the runs made, the verdict, and the series it ran on (less
    what failed in the whole series, with why)."""

    series: tuple[Patch, ...]            # the patches searched, in order
    dropped: tuple[tuple[str, str], ...]  # (id, why) of those left out as they fail in it
    runs: tuple[Run, ...]
    verdict: Verdict
    first_bad: int | None = None        # the prefix length that first fails: series[k-1]
    candidates: tuple[str, ...] = ()     # ONLY_SKIPPED: one of these
    error: str | None = None


@dataclass(frozen=True)
class SeriesBisect:
    command: tuple[str, ...]
    series: tuple[Patch, ...]            # the patches searched, in order
    left_out: tuple[tuple[str, str], ...]  # (id, why) of the build's patches not searched
    vllm: dict                           # ref, commit, version of the pin
    variant: str | None
    image: bool
    runs: tuple[Run, ...]
    verdict: Verdict
    first_bad: int | None = None         # the prefix length that first fails: series[k-1]
    candidates: tuple[str, ...] = ()      # ONLY_SKIPPED: one of these
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.verdict is Verdict.FOUND

    @property
    def limit(self) -> int:
        return limit_for(len(self.series))

    @property
    def culprit(self) -> Patch | None:
        return self.series[self.first_bad - 1] if self.first_bad else None

    def run_of(self, patches: int) -> Run | None:
        return next((r for r in self.runs if r.patches == patches), None)

    def to_dict(self) -> dict:
        c = self.culprit
        return {"ok": self.ok, "verdict": self.verdict.value, "command": list(self.command),
                "vllm": dict(self.vllm), "variant": self.variant, "image": self.image,
                "series": [p.id for p in self.series],
                "left_out": [{"id": i, "why": w} for i, w in self.left_out],
                "first_bad": ({"id": c.id, "summary": c.summary, "position": self.first_bad}
                              if c else None),
                "candidates": list(self.candidates), "error": self.error,
                "tested": len(self.runs), "limit": self.limit,
                "runs": [r.to_dict() for r in self.runs]}


# ------------------------------------------------------------------------------ bad input

@dataclass(frozen=True)
class Flags:
    """The flags of ``patchkit bisect``, judged together before any work."""

    series: bool
    patch_id: str | None
    good: str | None
    bad: str | None
    command: str | None
    image: bool
    no_daemon: bool
    tag: str | None
    base: str | None = None
    pins: Sequence[str] = ()

    def check(self) -> None:
        """What cannot go together, one line each."""
        if not self.series:
            self._check_one_patch()
            return
        if self.patch_id is not None:
            raise UsageError(f"--series bisects the whole series: drop the PATCH_ID "
                             f"{self.patch_id!r}")
        for given, flag in ((self.good, "--good"), (self.bad, "--bad")):
            if given is not None:
                raise UsageError(f"{flag} moves the upstream commit under one patch; --series "
                                 "bisects the series at the pin: drop it")
        if self.pins:
            raise UsageError("--ref moves a pin under one patch's bisect; --series bisects the "
                             "series at the manifest's pins: drop it")
        if self.command is None:
            raise UsageError("--series needs --run CMD: the command that passes (exit 0) or "
                             "fails (1-127; 125 skips) on a tree")
        for given, flag in ((self.no_daemon, "--no-daemon"), (self.tag is not None, "--tag"),
                            (self.base is not None, "--base")):
            if given and not self.image:
                raise UsageError(f"{flag} goes with --image (an image of each tree)")

    def _check_one_patch(self) -> None:
        for given, flag in ((self.command is not None, "--run"), (self.image, "--image"),
                            (self.no_daemon, "--no-daemon"), (self.tag is not None, "--tag"),
                            (self.base is not None, "--base")):
            if given:
                raise UsageError(f"{flag} goes with --series (bisect the series with a command)")
        if self.patch_id is None:
            raise UsageError("give a PATCH_ID (the upstream commit that changed its fate), or "
                             "--series --run CMD (the patch of the series that makes CMD fail)")


def check_command(text: str) -> list[str]:
    """``--run`` split as a shell splits words (no shell runs it), its program found."""
    try:
        argv = shlex.split(text)
    except ValueError as exc:
        raise UsageError(f"--run {text!r}: {exc}") from None
    if not argv:
        raise UsageError("--run: the command is empty")
    prog = argv[0]
    if "/" not in prog:
        if shutil.which(prog) is None:
            hint = f" (the file here is ./{prog})" if Path(prog).is_file() else ""
            raise UsageError(f"--run {text!r}: {prog}: command not found on PATH{hint}")
        return argv
    where = Path(prog)
    if not where.exists():
        raise UsageError(f"--run {text!r}: {prog}: no such file")
    if where.is_dir():
        raise UsageError(f"--run {text!r}: {prog} is a folder, not a command")
    if not os.access(where, os.X_OK):
        raise UsageError(f"--run {text!r}: {prog} is not executable (chmod +x it, or run it "
                         f"through its interpreter: --run 'sh {prog}')")
    return argv


# ------------------------------------------------------------------------------ the predicate

def outcome_of(done: process.Finished, timeout: float) -> tuple[str, str]:
    """What a run of CMD says, as ``git bisect run`` reads an exit code; past the deadline,
    bad."""
    if done.timed_out:
        return BAD, f"killed after {timeout:g} s (--timeout)"
    rc = done.returncode
    assert rc is not None
    if rc < 0:
        return ERROR, f"ended by {signal.Signals(-rc).name}"
    if rc == 0:
        return GOOD, "exit 0"
    if rc == 125:
        return SKIP, "exit 125"
    return (BAD if rc <= 127 else ERROR), f"exit {rc}"


def _unmade(report: ApplyReport) -> str:
    failed = [f"{p.id} failed ({p.reason})" for p in report.patches
              if p.status is Status.FAILED]
    return "tree not made: " + (", ".join(failed) or "an assertion failed")


@dataclass
class Tester:
    """Makes the tree of a prefix, runs CMD on it, removes the tree (and the image)."""

    manifest: Manifest
    spec: RunSpec
    pins: dict
    series: list[Patch]
    command: list[str]
    scratch: Path
    timeout: float
    log: Callable[[str], None]
    images: ImageMaker | None = None

    def __call__(self, k: int) -> Run:
        last = self.series[k - 1].id if k else None
        workdir = self.scratch / f"{k:03d}" / VLLM.name
        quiet = _Quiet(self.log)
        m = dataclasses.replace(self.manifest, patches=tuple(self.series[:k]))
        image = None
        try:
            report = applier.apply_series(m, run=self.spec, workdir=workdir, pins=self.pins,
                                          progress=quiet)
            if not report.ok:
                failed = tuple((p.id, p.reason or "") for p in report.patches
                               if p.status is Status.FAILED)
                return Run(k, last, SKIP, _unmade(report), quiet.seconds(), failed=failed)
            env = {"PATCHKIT_TREE": str(workdir)}
            if self.images is not None:
                image = self.images.build(m, workdir, k)
                env["PATCHKIT_IMAGE"] = image
            done = process.run_user(self.command, env=env, timeout=self.timeout, keep=KEEP)
            outcome, why = outcome_of(done, self.timeout)
            return Run(k, last, outcome, why, quiet.seconds(), done.returncode, done.output,
                       done.truncated, image)
        finally:
            shutil.rmtree(workdir.parent, ignore_errors=True)
            if image is not None and self.images is not None:
                self.images.remove(image)


class _Quiet(applier.Progress):
    """The apply of a prefix says nothing per patch; its other lines go on; it times a run."""

    def __init__(self, log: Callable[[str], None]) -> None:
        self._log, self._started = log, time.monotonic()

    def info(self, message: str) -> None:
        self._log(message)

    def seconds(self) -> float:
        return time.monotonic() - self._started


@dataclass
class ImageMaker:
    """``--image``: each prefix's tree built into an image, tagged ``REPOSITORY:bisect-K``
    (the repository of ``--tag``, else of image.tag), on the engine or with ``--no-daemon``
    in the registry; on an engine the tag is put back where it was once CMD has run."""

    repository: str
    spec: RunSpec
    no_daemon: bool
    log: Callable[[str], None]
    registry: object | None = None
    previous: dict = field(default_factory=dict)
    held: base_.BaseStack | None = None   # the base, read once (on an engine)

    @classmethod
    def reach(cls, manifest: Manifest, spec: RunSpec, *, no_daemon: bool,
              log: Callable[[str], None], held: base_.BaseStack | None) -> ImageMaker:
        """The image name checked before any tree is made; the run's engine was connected by
        the verb, and ``held`` is its base, read once."""
        name = spec.final_tag(manifest, spec.ref, None, spec.variant)
        return cls(imageref.repository(name), spec, no_daemon, log,
                   held=None if no_daemon else held)

    @property
    def engine(self):
        return None if self.no_daemon else self.spec.engine

    def build(self, manifest: Manifest, workdir: Path, k: int) -> str:
        tag = f"{self.repository}:bisect-{k}"
        run = dataclasses.replace(self.spec, tag=tag, workdir=workdir, engine=self.engine)
        if self.engine is not None:
            self.previous[tag] = self.engine.tagged(tag)
        elif self.registry is None:
            self.registry = reach_registry(manifest, run)
        log = _Quiet(self.log).info
        report = assemble(manifest, run, Choices(push=self.no_daemon, no_daemon=self.no_daemon,
                                                 immutable=False),
                          tree=AppliedCheckout.open(workdir), lock=None, log=log,
                          held=self.held,
                          registry=self.registry)
        return report.tag or tag

    def remove(self, tag: str) -> None:
        if self.engine is not None:
            self.engine.restore_tag(tag, self.previous.pop(tag, None))


# ------------------------------------------------------------------------------ the search

def search(series: Sequence[Patch], test: Callable[[int], Run],
           shrink: Callable[[Run], Sequence[tuple[str, str]]] | None = None) -> Searched:
    """The runs and the verdict of the search over the prefixes of ``series``.  When the tree
    of the whole series cannot be made, ``shrink`` names the patches that failed in it (with
    why), which are left out: the search then runs on the subset that still applies."""
    series = tuple(series)
    runs: list[Run] = []
    dropped: list[tuple[str, str]] = []

    def done(verdict: Verdict, **found) -> Searched:
        return Searched(series, tuple(dropped), tuple(runs), verdict, **found)

    def stopped(r: Run) -> Searched:
        return done(Verdict.STOPPED,
                    error=(f"CMD {r.why} with {_count(r.patches)}: an exit above 127 or a "
                           "signal stops the bisect (as git bisect run)"))

    for end, expected, wrong in ((0, GOOD, Verdict.FAILS_WITHOUT), (1, BAD, Verdict.PASSES)):
        if end == 0:
            r = test(0)
        else:
            r, series = _whole(series, test, shrink, dropped)
        runs.append(r)
        if r.outcome == ERROR:
            return stopped(r)
        if r.outcome == SKIP:
            return done(Verdict.UNTESTABLE)
        if r.outcome != expected:
            return done(wrong)
    lo, hi, skipped = 0, len(series), set()
    while True:
        open_ = [k for k in range(lo + 1, hi) if k not in skipped]
        if not open_:
            break
        mid = (lo + hi) / 2
        k = min(open_, key=lambda j: (abs(j - mid), j))
        r = test(k)
        runs.append(r)
        if r.outcome == ERROR:
            return stopped(r)
        if r.outcome == GOOD:
            lo = k
        elif r.outcome == BAD:
            hi = k
        else:
            skipped.add(k)
    if hi - lo > 1:
        return done(Verdict.ONLY_SKIPPED, candidates=tuple(p.id for p in series[lo:hi]))
    return done(Verdict.FOUND, first_bad=hi)


def _whole(series: tuple[Patch, ...], test: Callable[[int], Run],
           shrink: Callable[[Run], Sequence[tuple[str, str]]] | None,
           dropped: list[tuple[str, str]]) -> tuple[Run, tuple[Patch, ...]]:
    """The run of the whole series, after leaving out what fails in it (with ``shrink``, which
    says why of each: added to ``dropped``), and the series it ran on."""
    while True:
        r = test(len(series))
        gone = dict(shrink(r)) if r.failed and shrink is not None else {}
        if not gone or not series:
            return r, series
        series = tuple(p for p in series if p.id not in gone)
        dropped.extend(gone.items())


def _count(k: int) -> str:
    return "the pin alone (no patch)" if k == 0 else f"{k} patch{'es' if k != 1 else ''}"


# ------------------------------------------------------------------------------ the verb

def _series_at(manifest: Manifest, spec: RunSpec, pins: dict
               ) -> tuple[list[Patch], list[tuple[str, str]]]:
    """The build's patches in range at the pinned versions, and why each other one is out."""
    found = {name: r.version for name, r in pins.items()}
    kept, out = [], []
    for p in manifest.patches:
        why = variants.left_out(p, spec.variant)
        if why is None and not spec.in_run(p.package):
            why = f"it patches {p.package}, which is not in this run"
        if why is None:
            ok, range_why = p.takes_effect(found)
            why = None if ok else range_why
        if why is None:
            kept.append(p)
        else:
            out.append((p.id, why))
    return kept, out


def _run_of(manifest: Manifest, asked: Asked, *, on_engine: bool) -> RunSpec:
    """The run, with an engine when images are built on one or a pin reads a base image."""
    variants.check(manifest, asked.variant)
    wants = asked.engine is None and (on_engine or asked.reads_base(manifest))
    return asked.spec(manifest, Engine.connect(timeout=asked.timeout) if wants else None)


def run(manifest: Manifest, command: str, asked: Asked, *, image: bool = False,
        no_daemon: bool = False, progress: applier.Progress | None = None) -> SeriesBisect:
    """The first patch of the series (of the run's variant's build, at the pin) whose addition
    turns ``command`` from passing to failing, with every run made (each bounded by the run's
    timeout).  The command, the variant and with ``image`` the engine are checked before any
    tree is made; the run is made of ``asked``, with an engine when images are built on one
    or a pin is read from a base image."""
    progress = progress or applier.Progress()
    argv = check_command(command)
    on_engine = image and not no_daemon
    spec = _run_of(manifest, asked, on_engine=on_engine)
    with ExitStack() as hold:   # the base, read once, open for the whole search
        held = (base_.judged(manifest, spec, spec.engine, None, hold, progress.info)
                if on_engine else basevllm.held(spec, hold, log=progress.info))
        images = ImageMaker.reach(manifest, spec, no_daemon=no_daemon, log=progress.info,
                                  held=held) if image else None
        holder = basevllm.for_run(spec, held, log=progress.info)
        return _search(manifest, spec, argv, holder, images, progress)


def _search(manifest: Manifest, spec: RunSpec, argv: list[str], holder, images,
            progress: applier.Progress) -> SeriesBisect:
    """The search of :func:`run`, its run made and its base read."""
    pins = applier.resolve_pins(spec, spec.cache, progress.info, holder)
    series, left_out = _series_at(manifest, spec, pins)
    if not series:
        raise UsageError(f"the build has no patch in range at the pin {spec.ref}: nothing to "
                         "bisect")
    at = pins.get(VLLM.name) or next(iter(pins.values()))
    limit = limit_for(len(series))
    count = f"{len(series)} patch{'' if len(series) == 1 else 'es'}"
    progress.info(f"bisecting {count} at {at.ref} with "
                  f"{shlex.join(argv)} "
                  f"(at most {limit} runs)")
    scratch = Path(tempfile.mkdtemp(prefix="patchkit-bisect-series-"))
    try:
        tester = Tester(manifest, spec, pins, series, argv, scratch, spec.timeout, progress.info,
                        images)

        def logged(k: int) -> Run:
            r = tester(k)
            progress.info(f"{_count(k)}{f' (up to {r.last})' if r.last else ''}: "
                          f"{r.outcome} ({r.why}, {r.seconds:.1f} s)")
            return r

        def shrink(whole: Run) -> list[tuple[str, str]]:
            """What fails in the whole series, to leave out: bisect the subset that applies."""
            gone = dict(whole.failed)
            series[:] = [p for p in series if p.id not in gone]
            if gone:
                progress.info(f"left out, as they fail in the whole series: {', '.join(gone)}")
            return [(pid, f"it fails in the whole series at the pin ({why}); bisected without "
                          "it") for pid, why in gone.items()]

        found = search(series, logged, shrink)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return SeriesBisect(tuple(argv), found.series, (*left_out, *found.dropped),
                        {"ref": at.ref, "commit": at.commit, "version": at.version},
                        spec.variant, images is not None, found.runs, found.verdict,
                        found.first_bad, found.candidates, found.error)
