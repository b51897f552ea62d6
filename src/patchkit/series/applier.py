"""The apply engine: the series, in order, in a scratch checkout; into place only on success.

``run_series`` applies every patch to a checkout (one commit per patch that changed the tree)
and runs every assertion; it is shared by ``apply``, ``rebase-check`` and ``rebase``.
``apply_series`` wraps it with the fail-closed contract: scratch next to the workdir, swapped
in atomically when everything passed, removed otherwise (or kept with ``keep_failed``).
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from patchkit import interrupt, kinds, source
from patchkit import filelocks
from patchkit import git
from patchkit.errors import CommandError, Origin, SettingError, SourceError, UsageError, literal
from patchkit.kinds.common import commit_message
from patchkit.manifest import VLLM, Manifest, Patch
from patchkit.manifest import digest, variants
from patchkit.run import RunSpec
from patchkit.report import (ApplyReport, AssertionResult, Outcome, PackageInfo, PatchResult,
                             Reason, Status)
from patchkit.series import checkout
from patchkit.timeouts import DEFAULT_TIMEOUT
from patchkit.series import assertions, compiled, jit

WORKDIR, DISCARD = Origin("workdir"), Origin("discard")

__all__ = ["Progress", "Tree", "apply_one", "apply_series", "check_workdir", "commit_message",
           "in_range", "needed_paths", "package_tops", "resolve_pins", "run_series", "run_stack",
           "workdirs"]


class Progress:
    """What the engine tells as it goes; the CLI decides how it looks.  Defaults say nothing."""

    def info(self, message: str) -> None:
        pass

    def patch(self, result: PatchResult) -> None:
        pass


def in_range(patch: Patch, version: str | None) -> tuple[bool, str]:
    return patch.takes_effect({VLLM.name: version})


def apply_one(manifest: Manifest, patch: Patch, root: Path, base_commit: str,
              version: str | None, mirror: Path | None = None, *, package: str = VLLM.name,
              found: Mapping[str, str | None] | None = None,
              tops: Sequence[str] = (), commits: git.Commits | None = None,
              memo: Path | None = None, timeout: float = DEFAULT_TIMEOUT) -> PatchResult:
    """Apply one patch to the checkout of ``package`` at ``root`` and commit it; never raises
    for a bad patch.  Its ranges are judged on ``found`` (package name -> version; default: the
    one ``version`` of ``package``); with ``tops`` (the package's import folders) a patch
    touching a path outside them fails as ``unsafe-path``.  With ``commits`` (the run's
    in-process commits on ``root``) the commit is made there, and written out with the
    others; without, by git at once."""
    if patch.package != package:   # ``root`` is another package's tree
        return _result(patch, Status.SKIPPED, message=f"it patches {patch.package}, which has no "
                                                 "checkout in this run")
    found = {package: version} if found is None else found
    ok, why = patch.takes_effect(found)
    if not ok:
        if any(found.get(name, "") is None for name in patch.ranges):
            return _result(patch, Status.FAILED, Reason.ERROR, message=why)
        return _result(patch, Status.SKIPPED, message=why)
    outside = _outside(manifest, patch, tops)
    if outside:
        return _result(patch, Status.FAILED, Reason.UNSAFE_PATH, message=outside)
    kind = kinds.get(patch.kind)
    try:
        out = kind.apply(patch, manifest.root / patch.path,
                         kinds.Target(root, base_commit, version, mirror, memo, timeout))
    except OSError as exc:
        _reset(root, commits)
        return _result(patch, Status.FAILED, Reason.ERROR, message=f"{exc}")
    if not (kind.writes_only_named or out.wrote_only_files) and out.status in (Status.APPLIED,
                                                                               Status.UPSTREAM):
        # What it did not name would be left out of the commit yet ride along in the workdir.
        if commits is not None:
            commits.write()   # git's view of the tree is the commits so far
        stray = [p for p in git.dirty_paths(root) if p not in out.files]
        if stray:
            _reset(root, commits)
            shown = ", ".join(stray[:3]) + (f" and {len(stray) - 3} more" if len(stray) > 3 else "")
            return PatchResult(patch.id, patch.kind, Status.FAILED, Reason.UNSAFE_PATH, None,
                               out.files,
                               f"it changed files it does not name: {shown}",
                               package=patch.package)
    if out.status is Status.APPLIED and not out.files:
        pass  # it changes the image, not the checkout (an artifact): nothing to commit
    elif out.status is Status.APPLIED:
        message = commit_message(patch)
        return _outcome_result(patch, out, commits.commit(message, out.files)
                               if commits is not None else git.commit_all(root, message, out.files),
                               committed=True)
    elif out.status is Status.FAILED:
        _reset(root, commits)
    return _outcome_result(patch, out)


def _outcome_result(patch: Patch, out: Outcome, commit: str | None = None, *,
                    committed: bool = False) -> PatchResult:
    """``patch``'s result from its kind's ``out``; ``committed``: its change went through a
    commit, ``commit``, and none was made when it wrote bytes identical to what was there (the
    tree already has this change)."""
    same = committed and commit is None
    return PatchResult(patch.id, patch.kind, Status.UPSTREAM if same else out.status,
                       out.reason, commit, out.files,
                       "the tree already has this change" if same else out.message,
                       out.offsets, out.hunk, in_the_way=out.in_the_way, package=patch.package)


def _together(manifest: Manifest, run: Sequence[Patch], tree: Tree, commits: git.Commits,
              alone: Callable[[Patch], PatchResult], *, again: bool = True
              ) -> Iterator[PatchResult]:
    """``run`` (patches of one kind, each in range and inside its package's folders) applied
    in one go when its kind can (diffs that touch distinct files), with one commit each as
    ``apply_one`` one after the other makes them.  The patches in the way go ``alone``, and
    the ones between them together again (once: after that, each alone); in series order."""
    kind = kinds.get(run[0].kind)
    target = kinds.Target(tree.root, tree.resolved.commit, tree.resolved.version,
                          tree.resolved.repo, tree.memo, tree.timeout)
    try:
        outs = kind.apply_together([manifest.root / p.path for p in run], target) \
            if kind.writes_only_named else None
    except OSError:
        outs = None
    if outs is None or (None in outs and not again):
        yield from map(alone, run)
        return
    if None in outs:  # the tree is untouched: the others did not go in either
        between: list[Patch] = []
        for p, out in [*zip(run, outs), (None, None)]:
            if out is None:
                yield from (_together(manifest, between, tree, commits, alone, again=False)
                            if len(between) > 1 else map(alone, between))
                between = []
                if p is not None:
                    yield alone(p)
            else:
                between.append(p)
        return
    for p, out in zip(run, outs):
        yield _outcome_result(p, out, commits.commit(commit_message(p), out.files),
                              committed=True)


def _goes_alone(manifest: Manifest, patch: Patch, tree: Tree | None, variant,
                found: Mapping[str, str | None]) -> bool:
    """True when ``patch`` is not applied with others in one go: it is left out or skipped,
    or ``apply_one`` would refuse it before its kind sees it."""
    return (tree is None or bool(variants.left_out(patch, variant))
            or not patch.takes_effect(found)[0]
            or _outside(manifest, patch, tree.tops) is not None)


def _result(patch: Patch, status: Status, reason: Reason | None = None, *,
            message: str = "") -> PatchResult:
    return PatchResult(patch.id, patch.kind, status, reason, message=message,
                       package=patch.package)


def _outside(manifest: Manifest, patch: Patch, tops: Sequence[str]) -> str | None:
    """Why ``patch`` reaches outside its package's folders ``tops``, or None.  A kind that
    cannot name its paths is left to fail as it applies."""
    if not tops:
        return None
    where = ", ".join(f"{t}/" for t in tops)
    return _first_bad(manifest, patch, lambda p: p.split("/", 1)[0] not in tops or "/" not in p,
                      where)


def outside_before_release(manifest: Manifest, patch: Patch) -> str | None:
    """The part of ``_outside`` that needs no release, for ``validate``: a patch of a package
    confined to its import folders touches no file at the root and nothing in a folder another
    package of the manifest owns (``vllm/`` for a FlashInfer patch); where its own folder is
    known without its release, nothing outside it."""
    package = manifest.package(patch.package).id
    if not package.confined:
        return None
    own = compiled.known_tops(package)
    if own:
        return _outside(manifest, patch, own)
    theirs = {t: p.name for p in manifest.packages if p.name != patch.package
              for t in compiled.known_tops(p.id)}
    bad = _first_bad(manifest, patch, lambda p: "/" not in p or p.split("/", 1)[0] in theirs,
                     "")
    return bad


def _first_bad(manifest: Manifest, patch: Patch, bad: Callable[[str], bool],
               where: str) -> str | None:
    try:
        paths = kinds.get(patch.kind).touched(manifest.root / patch.path)
    except (OSError, kinds.KindError):
        return None
    paths += [a.file for a in patch.verify]
    found = next((p for p in paths if bad(p)), None)
    if found is None:
        return None
    owner = next((q.name for q in manifest.packages if q.name != patch.package
                  and "/" in found and found.split("/", 1)[0] in compiled.known_tops(q.id)),
                 None)
    shown = f"({where})" if where else (f"(it is {owner}'s)" if owner else
                                         "(a file at the root)")
    return (f"{found} is outside {patch.package}'s files {shown}; a {patch.package} patch "
            f"names paths from that package's root")


def package_tops(resolved: source.Resolved, package: source.PackageId) -> tuple[str, ...]:
    """The import folders ``package``'s patches are confined to at its pin: its root folders
    holding ``__init__.py`` (for a release from PyPI, the folders its wheel holds); none for a
    package whose source is its whole repository (vLLM's)."""
    if not package.confined:
        return ()
    return tuple(git.package_folders(resolved.repo, resolved.commit))


def _reset(root: Path, commits: git.Commits | None = None) -> None:
    """Throw away whatever a failed patch left in the scratch tree (the commits before it
    written out first)."""
    if commits is not None:
        commits.write()
    git.discard_changes(root, check=False)


def run_series(manifest: Manifest, root: Path, resolved: source.Resolved,
               progress: Progress | None = None, patches: Sequence[Patch] | None = None,
               variant=variants.EVERY) -> ApplyReport:
    """Apply the series to the fresh vLLM checkout at ``root`` and run the assertions.  With
    ``variant`` (a name, or None for the default build) the patches outside that build are
    ``skipped``; by default every patch is tried.  Another package's patches are skipped."""
    return run_stack(manifest, {VLLM.name: Tree(root, resolved)}, progress, patches, variant)


@dataclass(frozen=True)
class Tree:
    """One package's fresh checkout in a run, and the pin it was made from."""

    root: Path
    resolved: source.Resolved
    tops: tuple[str, ...] = ()   # its import folders, for a package other than vLLM
    # the checkout outlives the run (apply's): its commits are written into it, the branch
    # and tag patchkit/applied at the last; a scratch checkout removed after the run gets the
    # same commit ids in its report, and nothing written that no one would read
    keep: bool = True
    memo: Path | None = None     # the run's cache, where kept results live (None: not kept)
    timeout: float = DEFAULT_TIMEOUT   # the run's deadline for a patch author's code


def run_stack(manifest: Manifest, trees: Mapping[str, Tree], progress: Progress | None = None,
              patches: Sequence[Patch] | None = None, variant=variants.EVERY, *,
              pins: Mapping[str, source.Resolved] | None = None,
              vllm: source.Resolved | None = None) -> ApplyReport:
    """Apply the series, each patch to its package's tree of ``trees`` with one commit per
    patch that changed it, and run every assertion against the tree of its package.  Ranges
    are judged on the versions of ``pins`` (every pinned package of the run; default: those
    of ``trees``).  A patch whose package has no tree is skipped.  ``vllm`` is vLLM's pin when
    it has no tree."""
    progress = progress or Progress()
    pins = {n: t.resolved for n, t in trees.items()} if pins is None else pins
    at = trees[VLLM.name].resolved if VLLM.name in trees else vllm or pins[VLLM.name]
    found = {n: r.version for n, r in pins.items()}
    series = list(manifest.patches if patches is None else patches)
    results: list[PatchResult] = []
    with ExitStack() as held:
        # one commit per patch, made in-process; each tree's written out once, at the end
        commits = {n: held.enter_context(git.Commits(t.root)) for n, t in trees.items()}
        for result in _applied(manifest, series, trees, variant, found, commits):
            if result.status is Status.UPSTREAM and result.package in trees:
                result = _made_by_earlier(manifest, result, results, trees[result.package])
            results.append(result)
            progress.patch(result)
        for name, tree in trees.items():
            if tree.keep:
                commits[name].write(tag=checkout.APPLIED_TAG)
    checks: list[AssertionResult] = []
    for name, tree in trees.items():
        active = [p for p, r in zip(series, results)
                  if r.status is not Status.SKIPPED and p.package == name]
        checks += assertions.run_assertions(active, assertions.tree_reader(tree.root), tree.memo)
    failed_by: dict[str, AssertionResult] = {}
    for a in checks:
        if not a.ok:
            failed_by.setdefault(a.patch, a)
    return ApplyReport(PackageInfo(at.ref, at.commit, at.version, at.source), workdir=None,
                       patches=[_assertion_failed(r, failed_by[r.id])
                                if r.id in failed_by and r.status is not Status.FAILED else r
                                for r in results],
                       verify=checks, variant=variant if isinstance(variant, str) else None,
                       packages={n: PackageInfo(t.resolved.ref, t.resolved.commit,
                                                t.resolved.version, t.resolved.source)
                                 for n, t in trees.items()})


def _made_by_earlier(manifest: Manifest, result: PatchResult, earlier: Sequence[PatchResult],
                     tree: Tree) -> PatchResult:
    """An ``upstream`` ``result`` that is upstream only because an earlier applied patch of
    its package made the change: said so (``made_by``); else ``result`` as it is."""
    by = made_by(manifest, manifest.patch(result.id),
                 [(r.id, r.files) for r in earlier if r.status is Status.APPLIED
                  and r.package == result.package], tree.root, tree.resolved)
    return replace(result, made_by=by, message=_made_by_message(by)) if by else result


def _assertion_failed(result: PatchResult, failure: AssertionResult) -> PatchResult:
    """``result`` of a patch whose assertion ``failure`` failed: failed, for that reason."""
    return replace(result, status=Status.FAILED, reason=Reason.ASSERTION,
                   message=f"{failure.location()}: {failure.message}")


def _made_by_message(earlier: str) -> str:
    return (f"the tree has this change only because {earlier}, earlier in the series, made it; "
            "the release does not have it")


def made_by(manifest: Manifest, patch: Patch, earlier: Sequence[tuple[str, Sequence[str]]],
            root: Path, resolved: source.Resolved) -> str | None:
    """For a patch found ``upstream`` at ``root``: the earlier patch of the series (``earlier``:
    each applied one's id and files, in order) whose change it is, when the release itself
    does not have it (the patch tried on the release's own files, in a folder of their own);
    None when the release has it, or no earlier patch touched its files."""
    kind = kinds.get(patch.kind)
    try:
        files = kind.touched(manifest.root / patch.path)
    except kinds.KindError:
        return None
    touching = [pid for pid, done in earlier if set(done) & set(files)]
    if not touching:
        return None
    blobs = git.read_blobs(root, [f"{resolved.commit}:{f}" for f in files])
    with tempfile.TemporaryDirectory(prefix="patchkit-release-") as tmp:
        pristine = Path(tmp)
        git.init(pristine)   # git apply works inside it, never in a folder above
        for f in files:
            data = blobs[f"{resolved.commit}:{f}"]
            if data is not None:
                (pristine / f).parent.mkdir(parents=True, exist_ok=True)
                (pristine / f).write_bytes(data)
        try:
            out = kind.apply(patch, manifest.root / patch.path,
                             kinds.Target(pristine, resolved.commit, resolved.version))
        except Exception:  # noqa: BLE001  # a kind that needs more than the files: not judged
            return None
    return None if out.status is Status.UPSTREAM else touching[0]


def _applied(manifest: Manifest, series: Sequence[Patch], trees: Mapping[str, Tree], variant,
             found: Mapping[str, str | None], commits: Mapping[str, git.Commits]
             ) -> Iterator[PatchResult]:
    """Each patch's result, in order, applied to its package's tree.  A run of patches of one
    kind and package that no check refuses goes in together when its kind can do that; the
    patches between them that are passed over (out of range, left out) do not end it."""
    def alone(patch: Patch) -> PatchResult:
        interrupt.check()
        tree = trees.get(patch.package)
        why = variants.left_out(patch, variant)
        if why:
            return _result(patch, Status.SKIPPED, message=why)
        if tree is None:
            return _result(patch, Status.SKIPPED, message=f"it patches {patch.package}, which has "
                                                     "no checkout in this run")
        return apply_one(manifest, patch, tree.root, tree.resolved.commit,
                         tree.resolved.version, tree.resolved.repo, package=patch.package,
                         found=found, tops=tree.tops, commits=commits[patch.package],
                         memo=tree.memo, timeout=tree.timeout)

    def passed(patch: Patch) -> bool:   # judged without touching any tree
        return _goes_alone(manifest, patch, trees.get(patch.package), variant, found)

    at = 0
    while at < len(series):
        patch, tree = series[at], trees.get(series[at].package)
        end = at + 1
        if not passed(patch):
            # the run goes on past patches that are passed over (out of range, left out),
            # which take their place in the results as they would alone
            scan = at + 1
            while scan < len(series) and (passed(series[scan]) or (
                    series[scan].kind == patch.kind and series[scan].package == patch.package)):
                scan += 1
                if not passed(series[scan - 1]):
                    end = scan
        span = series[at:end]
        run = [p for p in span if not passed(p)]
        if len(run) > 1:
            interrupt.check()
            together = _together(manifest, run, tree, commits[patch.package], alone)
            for p in span:
                yield alone(p) if passed(p) else next(together)
        else:
            yield from map(alone, span)
        at = end


@contextmanager
def _signals_blocked() -> Iterator[None]:
    """No SIGINT/SIGTERM between the two renames of the swap."""
    sigs = {signal.SIGINT, signal.SIGTERM}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def check_workdir(workdir: Path, discard: bool = False) -> checkout.UserWork:
    """Refuse, before any work, a ``workdir`` that ``apply`` may not replace: one that is not
    a patchkit checkout, or one holding a person's work (unless ``discard``).  Returns that
    work (empty for a checkout exactly as patchkit left it, or no checkout at all)."""
    workdir = Path(workdir).absolute()
    if not workdir.exists():
        return checkout.UserWork()
    if not checkout.is_checkout(workdir):
        if workdir.is_dir() and not any(workdir.iterdir()):
            return checkout.UserWork()
        raise SettingError(f"{{workdir}} {literal(workdir)} exists and is not a patchkit "
                           "checkout; remove it or name another", WORKDIR)
    work = checkout.user_work(workdir)
    if work and not discard:
        raise SettingError(f"{{workdir}} {literal(workdir)} holds work: "
                           + literal("; ".join(work.remedies(workdir)))
                           + "; or give {discard} to replace it (what is there is saved in a "
                           "bundle beside it)", WORKDIR, DISCARD)
    return work


def workdirs(run: RunSpec, workdir: Path) -> dict[str, Path]:
    """Where each package of ``run`` goes: vLLM at ``workdir``, every other package beside it
    under its own name (``.patchkit/vllm``, ``.patchkit/flashinfer``)."""
    workdir = Path(workdir).absolute()
    places = {p.name: p.id.checkout(workdir) for p in run.pins if run.in_run(p.name)}
    if len(set(places.values())) < len(places):
        raise SettingError(f"{{workdir}} {literal(workdir)}: {literal(workdir.name)}'s checkout "
                           f"goes beside vLLM's under its own name, {literal(workdir)}; name "
                           "another {workdir}", WORKDIR)
    return places


def resolve_pins(run: RunSpec, cache: Path, log, base: source.Base | None,
                 names: Sequence[str] | None = None,
                 bases: Mapping[str, source.Base] | None = None
                 ) -> dict[str, source.Resolved]:
    """Every pin of ``run`` (or those ``names``) resolved to a commit, vLLM first.  ``base``
    is what vLLM's ref ``base`` and source ``image`` read; ``bases`` the same for each other
    package, by name (its distribution in the base image)."""
    out = {}
    for pin in run.pins:
        if names is not None and pin.name not in names:
            continue
        held = base if pin.id.primary else (bases or {}).get(pin.name)
        if held is None and not pin.id.primary and (
                pin.ref == source.BASE_REF
                or any(source.kind_of(s).reads_base for s in pin.sources)):
            raise UsageError(f"{pin.name}: a pin read from a base image (ref 'base', source "
                             "'image') needs the base read through an engine here; pin a "
                             "release or a git source")
        out[pin.name] = source.resolve(pin.sources, pin.ref, cache, log, base=held,
                                       package=pin.id)
    return out


def apply_series(manifest: Manifest, *, run: RunSpec, workdir: Path, keep_failed: bool = False,
                 progress: Progress | None = None, base: source.Base | None = None,
                 discard: bool = False, pins: Mapping[str, source.Resolved] | None = None,
                 bases: Mapping[str, source.Base] | None = None) -> ApplyReport:
    """Check out every package of ``run`` at its pin (sources fetched into the run's cache),
    apply the series of its variant, verify; move every checkout into place (vLLM's at
    ``workdir``, the others beside it) only if all passed.  On failure every
    workdir is exactly as it was.  ``base`` is the base image that the ref ``base`` and the
    source ``image`` read (``bases``: each other package's, by name).  A workdir holding a
    person's work is refused, or with ``discard`` saved, then replaced.  ``pins``: the pins of
    ``run`` already resolved (a caller that applies the series many times resolves them once)."""
    variants.check(manifest, run.variant)
    progress = progress or Progress()
    places = workdirs(run, workdir)
    for place in places.values():
        check_workdir(place, discard)
    cache = run.cache
    scratches: dict[str, Path] = {}
    kept = False
    try:
        # Before any download: a workdir that cannot be made is known at once.
        for name, place in places.items():
            scratches[name] = _scratch_beside(place)
        _check_build_sources(manifest, run, [
            (pin.name, pin.id.label, pin.sources,
             compiled.known_tops(pin.id)) for pin in run.pins])
        if pins is None:
            pins = resolve_pins(run, cache, progress.info, base, bases=bases)
        trees = {name: scratches[name] / "t" for name in places}
        ran = _checked_out_stack(manifest, pins, trees, progress, run)
        kept = keep_failed and not ran.ok
        # the run's report as the apply's: where each checkout goes; on failure the one kept,
        # on success what status compares
        report = replace(
            ran, workdir=str(places[VLLM.name]) if VLLM.name in places else None,
            packages={n: replace(p, workdir=str(places[n])) if n in places else p
                      for n, p in ran.packages.items()},
            keep_failed=str(trees.get(VLLM.name) or next(iter(trees.values())))
            if kept else None,
            digests=digest.digests(manifest) if ran.ok else {},
            settings=digest.settings(manifest) if ran.ok else {})
        if not report.ok:
            return report
        for tree in trees.values():
            checkout.write_report(tree, report)
        discarded = _move_in(trees, places, scratches, discard, report, progress)
        # what a replaced workdir held is said to the caller, not written into the checkout
        return replace(report, discarded=discarded) if discarded else report
    finally:
        if not kept:
            for scratch in scratches.values():
                shutil.rmtree(scratch, ignore_errors=True)


def _move_in(trees: Mapping[str, Path], places: Mapping[str, Path], scratches: Mapping[str, Path],
             discard: bool, report: ApplyReport, progress: Progress) -> dict | None:
    """Every checkout into its place together, the work of a replaced one saved first.
    Returns what the first replaced workdir held and where it went (``discarded``), or None."""
    discarded = None
    with ExitStack() as holding:
        for place in places.values():
            holding.enter_context(filelocks.held(place.parent / f".{place.name}.patchkit.lock",
                                             f"the workdir {place}", progress.info,
                                             vanish=True))
        interrupt.check()  # the last point where stopping leaves every workdir as it was
        # asked again: the person may have committed while the series ran
        works = {name: check_workdir(place, discard) for name, place in places.items()}
        shown = ", ".join(str(p) for p in places.values())
        # once begun, the saves and the swaps finish: a signal is raised after them, and its
        # line says the workdirs were replaced
        with interrupt.deferred(done=f"{shown} {'was' if len(places) == 1 else 'were'} "
                                     "replaced by the new checkout"):
            for name, work in works.items():
                if work:
                    saved = _save(places[name], work, progress)
                    if discarded is None:
                        discarded = dict(saved, package=name) if report.packages[
                            name].workdir != report.workdir else saved
            _swap_all(trees, places, scratches)
    return discarded


def _checked_out_stack(manifest: Manifest, pins: Mapping[str, source.Resolved],
                       trees: Mapping[str, Path], progress: Progress,
                       run: RunSpec) -> ApplyReport:
    variant = run.variant
    made: dict[str, Tree] = {}
    for name, tree in trees.items():
        resolved = pins[name]
        try:
            source.checkout(resolved, tree)
        except CommandError:
            _gone(resolved, manifest.package(name).label)
            raise
        made[name] = Tree(tree, resolved, package_tops(resolved, manifest.package(name).id),
                          memo=run.cache, timeout=run.timeout)
    # a package whose import folder is known only now, from its release
    _check_build_sources(manifest, None, [
        (name, name, [t.resolved.source], t.tops) for name, t in made.items() if t.tops],
        variant=variant)
    try:
        report = run_stack(manifest, made, progress, variant=variant, pins=pins)
        return replace(report, jit_modules=_jit_modules(manifest, made, report))
    except CommandError:
        for name, tree in made.items():   # a checkout borrows the cached repository's objects
            _gone(tree.resolved, manifest.package(name).label)
        raise


def _jit_modules(manifest: Manifest, trees: Mapping[str, Tree], report: ApplyReport
                 ) -> dict[str, dict[str, list[str]]]:
    """For each package that compiles what it ships (FlashInfer), the modules built from each
    file its applied patches changed."""
    out = {}
    dists = {p.name: p.dist for p in manifest.packages}
    for name, tree in trees.items():
        changed = [f for p in report.patches if p.package == name and p.status is Status.APPLIED
                   for f in p.files]
        found = jit.modules_for(tree.root, dists.get(name, name), changed) if changed else {}
        if found:
            out[name] = found
    return out


def _check_build_sources(manifest: Manifest, run: RunSpec | None, pins, variant=None) -> None:
    """One line, before anything is applied, for a patch to compiled code that the package's
    source cannot hold (vLLM's csrc against a wheel): it needs a source build."""
    patches = variants.selected(manifest, run.variant if run is not None else variant)
    found = compiled.first_problem(manifest, patches, pins)
    if found:
        patch, why = found
        raise UsageError(f"patch {patch.id}: {why}")


def _gone(resolved: source.Resolved, label: str) -> None:
    if not git.is_repository(resolved.repo):
        raise SourceError(f"the cached {label} repository {resolved.repo} went away during "
                          "the run (was the cache deleted?); nothing was changed, run "
                          "again") from None


def _save(workdir: Path, work: checkout.UserWork, progress: Progress) -> dict:
    """Keep the work of a workdir about to be replaced in a bundle beside it, and say where.
    One git cannot read is kept whole instead, moved aside under the same name."""
    if work.unreadable:
        dest = _discard_name(workdir, "")
        os.rename(workdir, dest)
        progress.info(f"discarding: {workdir} is {work.describe()}; moved aside to {dest}")
        return {"what": work.describe(), "moved_to": str(dest), "bundle": None, "refs": [],
                "head": None}
    saved = checkout.save_work(workdir, workdir.parent, workdir.name)
    progress.info(f"discarding: {work.describe()} of {workdir} {saved.how_to_restore(workdir)}")
    return {"what": work.describe(), "bundle": str(saved.bundle) if saved.bundle else None,
            "refs": list(saved.refs), "head": saved.head}


def _discard_name(workdir: Path, suffix: str) -> Path:
    """``NAME.discarded-<UTC time>SUFFIX`` beside the workdir, not yet taken."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    dest, n = workdir.parent / f"{workdir.name}.discarded-{stamp}{suffix}", 1
    while os.path.lexists(dest):
        n += 1
        dest = workdir.parent / f"{workdir.name}.discarded-{stamp}-{n}{suffix}"
    return dest


def _scratch_beside(workdir: Path) -> Path:
    """A scratch folder next to ``workdir``: on its file system, so the swap is a rename."""
    parent = workdir.parent
    existing = next((p for p in (parent, *parent.parents) if os.path.lexists(p)), None)
    if existing is not None and not existing.is_dir():
        raise SettingError(f"{{workdir}} {literal(workdir)}: {literal(existing)} is a file, "
                           "not a folder", WORKDIR)
    prefix = f".{workdir.name}.patchkit-"
    try:
        parent.mkdir(parents=True, exist_ok=True)
        _remove_orphans(parent, prefix)
        scratch = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
        (scratch / "pid").write_text(str(os.getpid()))
        return scratch
    except OSError as exc:
        raise SettingError(f"{{workdir}} {literal(workdir)}: cannot write in {literal(parent)}: "
                           f"{literal(exc.strerror)}", WORKDIR) from None


def _remove_orphans(parent: Path, prefix: str) -> None:
    """Scratch folders of runs that were killed outright (SIGKILL, power loss): their owner is
    gone, so nothing else will remove them."""
    for stale in parent.glob(prefix + "*"):
        try:
            pid = int((stale / "pid").read_text())
        except (OSError, ValueError):
            continue  # not ours, or still being set up
        if pid != os.getpid() and not _alive(pid):
            shutil.rmtree(stale, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _swap_all(trees: Mapping[str, Path], places: Mapping[str, Path],
              scratches: Mapping[str, Path]) -> None:
    """Each new checkout into its place, the old one into its scratch folder; a rename that
    fails puts back the ones done, so the set moves together or not at all."""
    done: list[str] = []
    with _signals_blocked():
        try:
            for name, new in trees.items():
                place, old = places[name], scratches[name] / "old"
                if place.exists() or place.is_symlink():
                    os.rename(place, old)
                done.append(name)
                os.rename(new, place)
        except OSError:
            for name in reversed(done):
                place, old = places[name], scratches[name] / "old"
                if not os.path.lexists(trees[name]) and os.path.lexists(place):
                    os.rename(place, trees[name])
                if os.path.lexists(old):
                    os.rename(old, place)
            raise


def needed_paths(manifest: Manifest, package: str | None = None) -> list[str] | None:
    """Every checkout path the series (the patches of ``package``, when given) can read or
    write, or None when some cannot be named (then a checkout must be full, so the engine
    reports the failure as ``apply`` would)."""
    found: list[str] = []
    for p in manifest.patches:
        if package is not None and p.package != package:
            continue
        try:
            found += kinds.get(p.kind).touched(manifest.root / p.path)
        except (OSError, kinds.KindError):
            return None
        found += [a.file for a in p.verify]
    return sorted(set(found))
