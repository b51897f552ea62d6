"""bump: the series ported to a package's newest release, written as one change to review.

What Renovate and Dependabot do for a dependency, for the pin of a patch series.  Per package
(vLLM and each entry of ``packages:``) with a newer release:

1. the bump branch is judged as it is now, here and at the remote, before anything is written:
   a commit on it that this bump did not write is refused (a reviewer's push is never
   overwritten);
2. in a scratch work tree of the project (``.patchkit/bump/<package>-<version>``, detached at
   HEAD: the user's branch, index and files are never touched), ``rebase`` moves the pin:
   offsets refreshed, patches the release already has dropped, every patch proven to apply
   exactly on a fresh checkout;
3. both sides are tried as ``apply`` tries them (``series.trial``): every patch's fate at the
   old pin and at the new release, and the assertions that ran.  A patch that took effect at
   the old pin and does not at the new release is upstream, or superseded by a patch that
   takes effect there and says ``supersedes: [id]``, or the bump needs a hand;
4. the manifest's ``bump.probes`` run there; files they change are part of the change;
5. one commit, whose id follows from its inputs, on ``patchkit/bump-<package>-<version>``, and
   with ``--push REMOTE`` that branch at the remote (only if it is still what it was there).
   A port whose result is the branch's tip already writes and pushes nothing.

A port that stops, a lost fix, an assertion that fails or a probe that fails ends the bump as
"needs a hand" (``EXIT_NEEDS_A_HAND``): no branch is written, and the scratch tree is kept for
a person to finish there (``patchkit rebase --continue`` after a stop), then ``patchkit bump
--package NAME`` again takes it from there and says what the person changed.  ``--dry-run``
does all of it in a throwaway tree and writes nothing.  The pull request body is
``render.bump``'s.
"""

from __future__ import annotations

import enum
import json
import re
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from patchkit import git
from patchkit import kinds, manifest, process, source, versions
from patchkit.errors import CommandError, ImageError, PatchkitError, SourceError, UsageError
from patchkit.engines import registry
from patchkit.image.base import in_registry
from patchkit.imageref import fill_release, is_template, split_tag
from patchkit.kinds import Stop
from patchkit.manifest import Manifest
from patchkit.run import RunSpec, run_spec
from patchkit.report import ApplyReport, Status
from patchkit.series import applier, fates, rebase, trial
from patchkit.series.fates import Change
from patchkit.series.releases import release_targets

EXIT_NEEDS_A_HAND = 4
TRAILER = "Patchkit-Bump"
TREE_TRAILER = "Patchkit-Tree"
REMOTE_TIMEOUT = 60.0
ATTEMPT = "bump-attempt.json"   # in the scratch tree's .patchkit/: what the automatic port left
_GITHUB = re.compile(r"^(?:https://|git@|ssh://git@)github\.com[/:]([\w.-]+)/([\w.-]+?)(?:\.git)?/?$")
_PULL = re.compile(r"github\.com/([\w.-]+)/([\w.-]+)/pull/(\d+)")


class BumpStatus(enum.Enum):
    CURRENT = "current"            # nothing newer than the pin
    BUMPED = "bumped"              # the branch written (and pushed)
    UNCHANGED = "unchanged"        # the branch holds this very port already: nothing written
    DRY_RUN = "dry-run"            # proven, nothing written
    NEEDS_A_HAND = "needs-a-hand"  # a person finishes it; nothing written to a branch


@dataclass(frozen=True)
class Probe:
    command: str
    returncode: int | None     # None: killed at the deadline
    seconds: float
    output: str                # the last lines it wrote

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def summary(self) -> str:
        """Its own last word (pytest's ``N passed in ...``): the last line it wrote."""
        lines = [ln.strip() for ln in self.output.splitlines() if ln.strip()]
        return lines[-1] if lines else ""


@dataclass(frozen=True)
class Fate:
    """One patch on both sides of the port."""

    id: str
    before: Status | None    # at the old pin; None: not in the series there
    after: Status | None     # at the new release; None: not in the series any more
    port: str             # what the port did: applied | refreshed | resolved | upstream |
                          # dropped | skipped | removed | added | stopped | untried
    detail: str = ""
    upstream: str | None = None    # the manifest's upstream link
    successor: str | None = None   # the patch that takes effect in its place (supersedes: it)
    # what ``series.fates`` judged of it between the two sides (a port that stopped: unjudged)
    change: Change = Change.UNCHANGED
    why: str = ""                  # the judge's line: the proof of a retirement, why it is lost

    @property
    def newly_applied(self) -> bool:
        return self.after is Status.APPLIED and self.before is not Status.APPLIED

    @property
    def no_longer_applied(self) -> bool:
        return self.before is Status.APPLIED and self.after is not Status.APPLIED

    @property
    def went_upstream(self) -> bool:
        """Proven upstream at the new release, the way ``apply`` proves it."""
        return self.change is Change.NOW_UPSTREAM

    @property
    def retired(self) -> bool:
        return self.change is Change.RETIRED

    @property
    def lost(self) -> bool:
        """It took effect at the old pin and nothing says where its fix is now, or it is
        retired there against the proof (``series.fates`` judges both)."""
        return self.change in (Change.LOST, Change.REFUSED)


@dataclass(frozen=True)
class BaseMove:
    """``image.base`` across the port: where it was, where the port moved it, what was proven
    of it there (one line), and whether it needs a person."""

    old: str
    new: str | None            # None: it names no release, and was left alone
    proof: str
    template: bool = False     # it names the release itself ({ref}, {version}): not rewritten
    missing: bool = False      # not at the new tag in its registry, or holding another vLLM

    @property
    def moved(self) -> bool:
        return self.new is not None and self.new != self.old


@dataclass(frozen=True)
class HandWork:
    """What a person changed, relative to the automatic attempt, in a port they finished."""

    files: tuple[str, ...]
    diff: str


@dataclass(frozen=True)
class Links:
    compare: str | None = None    # the upstream changes between the two releases
    release: str | None = None    # the new release's page


@dataclass(frozen=True)
class Bump:
    """One package's bump, whole."""

    package: str               # the manifest's name for it (vllm, flashinfer, ...)
    label: str                 # as messages name it (vLLM)
    from_ref: str
    to_ref: str | None         # None: nothing newer
    status: BumpStatus
    why: str = ""              # needs a hand: the one-line reason
    branch: str | None = None
    commit: str | None = None
    pushed: str | None = None  # the remote the branch went to
    fates: tuple[Fate, ...] = ()
    stop: Stop | None = None
    probes: tuple[Probe, ...] = ()
    assertions: int = 0        # the assertions that ran on the ported tree
    assertions_failed: int = 0
    changed: tuple[str, ...] = ()  # files of the change
    by_hand: HandWork | None = None
    worktree: str | None = None    # where a person finishes a bump that needs a hand, in the
                                   # project (.patchkit/bump/<package>-<version>)
    notes: tuple[str, ...] = ()
    links: Links = Links()
    lost: tuple[str, ...] = ()     # fixes that stopped taking effect with nothing in their place
    on: str | None = None          # the commit the port sits on: HEAD when the bump ran
    base_image: BaseMove | None = None   # image.base moved with the release (vLLM's bump)
    on_subject: str = ""
    evidence: str | None = None    # the current build and its last evidence, in one line

    @property
    def needs_a_hand(self) -> bool:
        return self.status is BumpStatus.NEEDS_A_HAND

    @property
    def dry_run(self) -> bool:
        return self.status is BumpStatus.DRY_RUN

    @property
    def ok(self) -> bool:
        return not self.needs_a_hand

    def to_dict(self) -> dict:
        data = asdict(self)
        data["status"] = self.status.value
        data["fates"] = [dict(asdict(f), before=f.before and f.before.value,
                              after=f.after and f.after.value, change=f.change.value)
                         for f in self.fates]
        data["needs_a_hand"] = self.needs_a_hand
        data["probes"] = [dict(asdict(p), ok=p.ok, summary=p.summary) for p in self.probes]
        data["newly_applied"] = [f.id for f in self.fates if f.newly_applied]
        data["no_longer_applied"] = [f.id for f in self.fates if f.no_longer_applied]
        return data


def branch_name(package: str, version: str) -> str:
    return f"patchkit/bump-{package}-{version}"


@dataclass(frozen=True)
class Ask:
    """What a bump was asked: the release to move to (default the newest), whether only to
    try it, where to push the branch, and vLLM's sources (``--vllm-repo``)."""

    to: str | None
    dry_run: bool
    push: str | None
    repos: Sequence[str] | None


def run(manifest_path: Path, *, package: str | None = None, to: str | None = None,
        dry_run: bool = False, push: str | None = None, repos: Sequence[str] | None = None,
        progress: applier.Progress | None = None) -> list[Bump]:
    """Bump ``package`` (default: every package of the manifest, vLLM first)."""
    progress = progress or applier.Progress()
    if to and not package:
        raise UsageError("--to names a release of one package: give --package too")
    if dry_run and push:
        raise UsageError("--dry-run writes nothing, so it pushes nothing: drop --push")
    m = manifest.load(manifest_path)
    names = [package] if package else [p.name for p in m.packages]
    # an unknown package: one line, with "did you mean"
    spec = run_spec(m, repos=repos, only=names)
    if repos and not all(m.package(n).id.primary for n in names):
        raise UsageError("--vllm-repo goes with vLLM's bump (--package vllm)")
    project = _project(m, dry_run)
    ask = Ask(to, dry_run, push, repos)
    return [_bump_one(m, project, spec, name, ask, progress) for name in names]


def _project(m: Manifest, dry_run: bool) -> Path:
    """The work tree the manifest is in.  A real bump refuses changes to tracked files (it
    ports HEAD, and would leave them out); untracked files are never part of it, and a dry run
    writes nothing, so neither is in the way."""
    top = git.toplevel(m.root)
    if top is None:
        raise UsageError(f"{m.path} is not in a git work tree: bump writes its change as a "
                         "commit on a branch")
    if dry_run:
        return top
    dirty = [path for xy, path in git.status(top)
             if xy != "??" and not path.startswith(".patchkit/")]
    if dirty:
        more = f" and {len(dirty) - 1} more" if len(dirty) > 1 else ""
        raise UsageError(f"the work tree {top} has changes to tracked files ({dirty[0]}{more}): "
                         "commit or stash them first; bump ports HEAD, as a commit of its own")
    return top


# ------------------------------------------------------------------------------ one package

def _evidence(m: Manifest) -> str:
    """How the build this bump replaces served, as its last evidence says."""
    from patchkit.engines.docker import Engine
    from patchkit.nodes import evidence
    from patchkit.run import built_tag

    return evidence.current_line(built_tag(m), lambda: Engine.connect(timeout=30.0))


def _bump_one(m: Manifest, project: Path, spec: RunSpec, name: str, ask: Ask,
              progress: applier.Progress) -> Bump:
    pin = spec.pin(name)
    old = _resolve_pin(spec, name, m, progress)
    target = ask.to or _newest(m, spec, name, progress)
    if target is None:
        return Bump(name, pin.id.label, pin.ref, None, BumpStatus.CURRENT)
    new = _resolve_target(spec, name, target, progress)
    version = new.version or target.removeprefix("v")
    branch = branch_name(name, version)
    tips = _branch_tips(project, branch, name, version, ask.push)
    others = applier.resolve_pins(spec, spec.cache, progress.info, None,
                                  [q.name for q in spec.pins if q.name != name])
    scratch = Path(tempfile.mkdtemp(prefix="patchkit-bump-")) / "tree" if ask.dry_run \
        else project / ".patchkit" / "bump" / f"{name}-{version}"
    # the manifest's sources name the project upstream even when this run reads another
    sources = (*m.package(name).repos, *pin.sources)
    head = git.head(project)
    base = Bump(name, pin.id.label, pin.ref, target,
                BumpStatus.DRY_RUN if ask.dry_run else BumpStatus.BUMPED,
                branch=None if ask.dry_run else branch,
                links=_links(sources, pin, target, version),
                on=head, on_subject=git.commit_info(project, head).subject, evidence=_evidence(m))
    job = _Job(m, project, spec, ask, progress, scratch, _Sides(m, name, old, new, others),
               base, version)
    resumed = scratch.exists() and _finished_by_hand(scratch, job.rel, base.label, version)
    if not resumed:
        scratch.parent.mkdir(parents=True, exist_ok=True)
        git.add_worktree(project, scratch, "HEAD")
    result = None
    try:
        result = job.run(resumed)
        return result if result.needs_a_hand or ask.dry_run \
            else _write(project, scratch, result, version, tips, ask.push)
    finally:
        # kept: a port for a person to finish, and one a person finished that an error cut
        # short (their work is in it)
        kept = result.needs_a_hand if result is not None else resumed
        if ask.dry_run or not kept:
            git.remove_worktree(project, scratch)
            if ask.dry_run:
                shutil.rmtree(scratch.parent, ignore_errors=True)
            else:
                _remove_empty(scratch.parent, project)


@dataclass(frozen=True)
class _Job:
    """One package's port, with everything decided: the manifest as HEAD has it, the scratch
    tree the port is made in, the two sides it is tried on, and the bump it fills in."""

    m: Manifest
    project: Path
    spec: RunSpec
    ask: Ask
    progress: applier.Progress
    scratch: Path
    side: _Sides
    base: Bump
    version: str

    @property
    def rel(self) -> Path:
        return self.m.path.relative_to(self.project)

    @property
    def where(self) -> str:
        """The scratch tree as the body names it: its path in the project, never this
        machine's (a dry run's throwaway tree is named by nothing)."""
        try:
            return self.scratch.relative_to(self.project).as_posix()
        except ValueError:
            return "a throwaway tree"

    def run(self, resumed: bool) -> Bump:
        """The port (or the one a person finished), proven on both sides, then the probes."""
        before = self.side.before()
        if resumed:
            attempt = _Attempt.load(self.scratch)
            steps, stopped, hand = attempt.steps, attempt.stopped, attempt.hand_work(self.scratch)
            notes = (*attempt.notes, f"the port was finished by hand in {self.where}")
            began = git.head(self.scratch)
            if began != self.base.on:
                conflicts = self._onto_head(began)
                if conflicts:
                    return self._moved_under(began, conflicts, notes, hand)
                notes += (f"HEAD moved from {began[:12]} to {self.base.on[:12]} while the port "
                          f"waited: the port's own changes were replayed on "
                          f"{self.base.on[:12]}",)
        else:
            done = rebase.start(manifest.load(self.scratch / self.rel), self.spec,
                                self.base.to_ref, drop_upstream=True,
                                package=self.base.package, progress=self.progress)
            ours = {p.id for p in self.m.patches if p.package == self.base.package}
            steps = {s.id: s for s in done.steps if s.id in ours}
            stopped, notes, hand = None, tuple(done.notes), None
            if done.stop is not None:
                return self._stopped(before, steps, done.stop, notes)
        ported = manifest.load(self.scratch / self.rel)
        after = self.side.after(ported)
        fates = self._fates(ported, before, after, steps, stopped)
        result = replace(self.base, fates=fates, notes=notes, by_hand=hand,
                         assertions=len(after.verify),
                         assertions_failed=sum(not a.ok for a in after.verify),
                         lost=tuple(f.id for f in fates if f.lost))
        why = _stopped_by(result, after, self.base.to_ref)
        if why:
            return self._needs_a_hand(result, why)
        moved = self._base_image(ported)
        if moved is not None:   # said in the proof, with what was proven: not again in a note
            result = replace(result, base_image=moved, notes=tuple(
                n for n in result.notes if not n.startswith("image.base: ")))
            if moved.missing:
                return self._needs_a_hand(result, moved.proof)
        probes = _probes(ported, result, self.base.package, self.base.to_ref)
        result = replace(result, probes=probes)
        failing = next((p for p in probes if not p.ok), None)
        if failing is not None:
            how = ("ran past its deadline" if failing.returncode is None
                   else f"exit {failing.returncode}")
            return self._needs_a_hand(result, f"the probe `{failing.command}` failed ({how})")
        return result

    def _base_image(self, ported: Manifest) -> BaseMove | None:
        """``image.base`` at the new release (vLLM's bump alone moves it): the port moved a tag
        that names the old release (``rebase``), a template names it by itself.  The registry
        is asked for it without pulling a layer: a tag it lacks, or a base whose config declares
        another vLLM, needs a hand; a registry that does not answer is said, not proven; one
        that refuses is bad input."""
        old = self.m.image.base
        if not old or not self.m.package(self.base.package).id.primary:
            return None
        from_ref, to_ref, label = self.base.from_ref, self.base.to_ref, self.base.label
        template = is_template(old)
        if template:
            was, new = fill_release(old, from_ref), fill_release(old, to_ref)
        else:
            was, new = old, ported.image.base or old
            if new == old:
                return BaseMove(old, None, f"`{old}` names no release of {from_ref}: left "
                                           "alone, not checked")
        host = registry.host_of(new)
        try:
            found = in_registry(new, self.spec.platform, REMOTE_TIMEOUT)
        except registry.UnreachableError as exc:
            return BaseMove(was, new, f"not checked: the registry {host} did not answer "
                                      f"({exc.detail})", template=template)
        except ImageError as exc:
            raise UsageError(f"image.base {new}: the registry {host} refused it: {exc}"
                             ) from None
        if found is None:
            return BaseMove(was, new, f"image.base {new} is not in the registry {host} (no tag "
                                      f"{split_tag(new)[1]} there): push the base of {label} "
                                      f"{to_ref} there, or set image.base by hand",
                            template=template, missing=True)
        if found.vllm is None:
            return BaseMove(was, new, f"the registry {host} has it ({found.digest[:19]}); which "
                                      f"{label} it holds its config does not say (its files do: "
                                      "`build-image` proves them)", template=template)
        if not versions.same_release(found.vllm, self.version):
            return BaseMove(was, new, f"image.base {new} holds {label} {found.vllm} "
                                      f"({found.said_by}), not {self.version}",
                            template=template, missing=True)
        return BaseMove(was, new, f"proven: the registry {host} has it ({found.digest[:19]}), "
                                  f"and its {found.said_by} says {label} {found.vllm}",
                        template=template)

    def _onto_head(self, began: str) -> list[str]:
        """The port a person finished, moved onto the project's HEAD, which moved since the
        port began at ``began``: the port's own changes (its tree against ``began``) replayed
        on HEAD, three-way, so that nothing committed on HEAD meanwhile is undone.  The files
        where the two conflict (nothing moved), or none."""
        port = git.user_commit_of(self.scratch, git.worktree_tree(self.scratch), began, "the port")
        merged, conflicts = git.merged_tree(self.scratch, self.base.on, port)
        if merged is None:
            return conflicts
        git.move_worktree(self.scratch, self.base.on, merged)
        return []

    def _moved_under(self, began: str, conflicts: Sequence[str], notes: tuple[str, ...],
                     hand: HandWork | None) -> Bump:
        now = self.base.on[:12]
        files = ", ".join(conflicts)
        how = (f"bring the port onto HEAD in {self.where}: `git stash -u && git checkout -q "
               f"--detach {now} && git stash pop`, resolve {files} there, then bump again")
        return replace(self._needs_a_hand(
            self.base, f"HEAD moved from {began[:12]} to {now} since the port began, and the "
                       f"port's own changes conflict with it in {files}"),
            notes=(*notes, how), by_hand=hand)

    def _fates(self, ported: Manifest, before: ApplyReport, after: ApplyReport,
               steps: Mapping[str, rebase.Step], stopped: str | None) -> tuple[Fate, ...]:
        series = [p for p in ported.patches if p.package == self.base.package]
        proofs = fates.proofs_at(ported, series, self.side.new)
        by_hand = ("removed", "dropped-by-hand")
        found = _fates(self.m, ported, self.base.package, (before, after), steps, stopped)
        upstream: set[str] = set()
        if any(f.port in by_hand for f in found):
            # an entry a person removed, or resolved to no change: upstream only if the
            # release has its change, proven as apply proves it (the old series tried there)
            tried = self.side.old_at_new()
            upstream = {f.id for f in found if tried.status_of(f.id) is Status.UPSTREAM}
        out = []
        for f in found:
            if f.port in by_hand and f.id in upstream:
                f = replace(f, port="dropped", detail=f"upstream: {f.detail or 'removed by hand'};"
                                                      " its change is in the release")
            judged = fates.judge(f.id, f.before, f.after, ref=self.base.to_ref,
                                 pin_ref=self.base.from_ref,
                                 upstream=f.port in ("upstream", "dropped"),
                                 successor=f.successor, proof=proofs.get(f.id),
                                 made_by=_made_by(f, after))
            out.append(replace(f, change=judged.change, why=judged.why))
        return tuple(out)

    def _stopped(self, before: ApplyReport, steps: Mapping[str, rebase.Step], stop: Stop,
                 notes: tuple[str, ...]) -> Bump:
        if not self.ask.dry_run:
            _Attempt.save(self.scratch, steps, stop.patch, notes)
        fates = _fates_at_stop(self.m, self.base.package, before, steps, stop)
        what = f"`{stop.patch}` could not be ported to" if stop.patch \
            else "the assertions do not hold on"
        return replace(self._needs_a_hand(self.base, f"{what} {self.base.label} "
                                                     f"{self.base.to_ref}"),
                       fates=fates, stop=stop, notes=notes)

    def _needs_a_hand(self, result: Bump, why: str) -> Bump:
        return replace(result, status=BumpStatus.NEEDS_A_HAND, why=why, branch=None,
                       worktree=None if self.ask.dry_run else self.where)


def _remove_empty(folder: Path, top: Path) -> None:
    """``folder`` and the folders above it up to ``top``, those that are empty: a bump leaves
    no trace where it left no port."""
    while folder != top:
        try:
            folder.rmdir()
        except OSError:
            return
        folder = folder.parent


def _stopped_by(result: Bump, after: ApplyReport, target: str) -> str:
    """Why the proven port still needs a person, or ''."""
    refused = [f for f in result.fates if f.change is Change.REFUSED]
    if refused:
        return refused[0].why
    if result.lost:
        lost = [f for f in result.fates if f.lost]
        names = ", ".join(f"`{f.id}`" for f in lost)
        where = "is" if len(lost) == 1 else "are"
        now = lost[0].after or "removed"
        one = len(lost) == 1
        return (f"{names} took effect at {result.from_ref} and not at {target} ({now}); "
                f"{'it' if one else 'they'} {where} not upstream there, no patch that takes "
                f"effect there supersedes {'it' if one else 'them'}, and "
                f"{'it is' if one else 'they are'} not retired")
    bad = [p for p in after.patches if p.status is Status.FAILED]
    if bad:
        return f"`{bad[0].id}` fails on {result.label} {target}: {bad[0].reason}"
    if result.assertions_failed:
        return (f"{result.assertions_failed} of {result.assertions} assertions fail on "
                f"{result.label} {target}")
    return ""


class _Sides:
    """The two trials of a port: the series as it was at the old pin, the ported series at
    the new release; each a fresh sparse checkout, as ``rebase-check`` makes them."""

    def __init__(self, m: Manifest, package: str, old: source.Resolved, new: source.Resolved,
                 others: Mapping[str, source.Resolved]) -> None:
        self.m, self.package, self.old, self.new, self.others = m, package, old, new, others

    def before(self) -> ApplyReport:
        return self._trial(self.m, self.old, "before")

    def after(self, ported: Manifest) -> ApplyReport:
        return self._trial(ported, self.new, "after")

    def old_at_new(self) -> ApplyReport:
        """The series as it was, at the new release: which of its patches are upstream there."""
        return self._trial(self.m, self.new, "upstream")

    def _trial(self, m: Manifest, at: source.Resolved, name: str) -> ApplyReport:
        series = [p for p in m.patches if p.package == self.package]
        with tempfile.TemporaryDirectory(prefix=f"patchkit-bump-{name}-") as tmp:
            return trial.run(m, at, Path(tmp) / "tree", package=self.package,
                             others=self.others, paths=applier.needed_paths(m, self.package),
                             series=series)


def _upstreams(m: Manifest) -> dict[str, str | None]:
    return {p.id: p.upstream for p in m.patches}


def _fates(old: Manifest, new: Manifest, package: str, sides: tuple[ApplyReport, ApplyReport],
           steps: Mapping[str, rebase.Step], stopped: str | None) -> tuple[Fate, ...]:
    """Every patch of ``package``, old series then new, on both sides of the port."""
    before, after = sides
    old_ids = [p.id for p in old.patches if p.package == package]
    new_ids = [p.id for p in new.patches if p.package == package]
    links = {**_upstreams(old), **_upstreams(new)}
    out = []
    for pid in dict.fromkeys(old_ids + new_ids):
        step = steps.get(pid)
        if step is not None:
            port, detail = step.action, step.detail
        elif pid == stopped:
            port, detail = "resolved", "finished by hand"
        else:
            port, detail = _carried(old, new, pid), ""
        was, status = before.status_of(pid), after.status_of(pid)
        successor = fates.successor_of(pid, new.patches, after.status_of) \
            if was is Status.APPLIED and status is not Status.APPLIED else None
        out.append(Fate(pid, was, status, port, detail, links.get(pid), successor))
    return tuple(out)


def _fates_at_stop(m: Manifest, package: str, before: ApplyReport,
                   steps: Mapping[str, rebase.Step], stop: Stop) -> tuple[Fate, ...]:
    """The table of a port that stopped: what the port did up to the stop; nothing after it
    was tried."""
    links = _upstreams(m)
    out, seen = [], False
    for p in m.patches:
        if p.package != package:
            continue
        step = steps.get(p.id)
        if p.id == stop.patch:
            seen = True
            out.append(Fate(p.id, before.status_of(p.id), None, "stopped", stop.message,
                            links.get(p.id)))
        elif step is not None:
            out.append(Fate(p.id, before.status_of(p.id), None, step.action, step.detail,
                            links.get(p.id)))
        else:
            out.append(Fate(p.id, before.status_of(p.id), None, "untried",
                            f"after `{stop.patch}`" if seen else "", links.get(p.id)))
    return tuple(out)


def _carried(old: Manifest, new: Manifest, pid: str) -> str:
    """What a port finished by hand did with a patch the automatic attempt did not reach:
    ``applied`` (its files as they were), ``refreshed`` (its files changed), ``removed`` or
    ``added`` (its entry)."""
    try:
        old_p = old.patch(pid)
    except KeyError:
        return "added"
    try:
        new_p = new.patch(pid)
    except KeyError:
        return "removed"
    files = set(kinds.get(old_p.kind).sources(old.root / old_p.path, old_p.path)) | set(
        kinds.get(new_p.kind).sources(new.root / new_p.path, new_p.path))
    same = all(_read(old.root / f) == _read(new.root / f) for f in files)
    return "applied" if same else "refreshed"


def _read(path: Path) -> bytes | None:
    if path.is_dir():
        return b"\0".join(_read(p) or b"" for p in sorted(path.rglob("*")) if p.is_file())
    try:
        return path.read_bytes()
    except OSError:
        return None


# ------------------------------------------------------------------------------ inputs

def _resolve_pin(spec: RunSpec, name: str, m: Manifest, progress) -> source.Resolved:
    """The pin as the sources have it: a pin they do not have is bad input, never the start
    of a port."""
    pin = spec.pin(name)
    try:
        return source.resolve(pin.sources, pin.ref, spec.cache, progress.info, package=pin.id)
    except SourceError as exc:
        package = m.package(name)
        where = f"{m.path.name}:{package.ref_line}" if package.ref_line else m.path.name
        raise UsageError(f"the pin {pin.id.label} {pin.ref} ({where}) is not on its sources: "
                         f"{exc}") from None


def _resolve_target(spec: RunSpec, name: str, target: str, progress) -> source.Resolved:
    """The release ``target`` names, once it is known to be newer than the pin."""
    pin = spec.pin(name)
    resolved = source.resolve(pin.sources, target, spec.cache, progress.info, package=pin.id)
    if (versions.release_tag(pin.ref) is not None and versions.release_tag(target) is not None
            and versions.release_tag(target) <= versions.release_tag(pin.ref)):
        raise UsageError(f"{pin.id.label} {target} is not newer than the pin {pin.ref}: bump "
                         "only moves a pin forwards")
    return resolved


def _newest(m: Manifest, spec: RunSpec, name: str, progress) -> str | None:
    targets = release_targets(m, spec, log=progress.info, package=name)
    return targets[-1] if targets else None


def _links(sources: Sequence[str], pin, target: str, version: str) -> Links:
    """Where a reviewer reads what changed upstream: a GitHub source's compare view and
    release page, else PyPI's page of the release."""
    for src in sources:
        found = _GITHUB.match(src.strip())
        if found:
            base = f"https://github.com/{found.group(1)}/{found.group(2)}"
            return Links(f"{base}/compare/{pin.ref}...{target}", f"{base}/releases/tag/{target}")
    if any(s.strip() == "pypi" for s in sources):
        return Links(None, f"https://pypi.org/project/{pin.dist}/{version}/")
    return Links()


# ------------------------------------------------------------------------------ the branch

@dataclass(frozen=True)
class _Tips:
    """The bump branch as it was found, here and at the remote (None: absent)."""

    local: str | None
    remote: str | None


def _branch_tips(project: Path, branch: str, name: str, version: str,
                 push: str | None) -> _Tips:
    """The branch here and at ``push``, judged before anything is written: a commit on either
    that this bump did not write is refused.  What counts as known is HEAD's history alone,
    so a fetch (which moves remote-tracking branches) never makes a reviewer's commit look
    like the project's."""
    local = git.resolve_commit(project, f"refs/heads/{branch}")
    if local is not None:
        _refuse_foreign(project, local, branch, name, version, "here")
    if not push:
        return _Tips(local, None)
    url = git.remote_url(project, push) or push
    try:
        remote = git.remote_branch(project, push, branch, REMOTE_TIMEOUT)
        if remote is not None and remote != local:
            git.fetch_commit(project, push, branch, REMOTE_TIMEOUT)
    except CommandError as exc:
        raise UsageError(f"cannot reach the remote {push!r} ({url}): {_git_reason(exc)}"
                         ) from None
    if remote is not None:
        shown = push if url == push else f"{push} ({url})"
        _refuse_foreign(project, remote, branch, name, version, f"at {shown}")
    return _Tips(local, remote)


def _refuse_foreign(project: Path, tip: str, branch: str, name: str, version: str,
                    where: str) -> None:
    foreign = [c for c in git.commits_between(project, "HEAD", tip)
               if not _ours(project, c, name, version)]
    if foreign:
        n = len(foreign)
        first = git.commit_info(project, foreign[-1])
        more = f" and {n - 1} more" if n > 1 else ""
        raise UsageError(f"the branch {branch} {where} has {n} commit{'s' if n > 1 else ''} "
                         f"this bump did not write ({first.sha[:12]} {first.subject!r}{more}): "
                         f"bump never overwrites {'them' if n > 1 else 'it'}; merge "
                         f"{'them' if n > 1 else 'it'} or delete the branch, then bump again")


def _ours(project: Path, commit: str, name: str, version: str) -> bool:
    """A commit this bump wrote: its trailer names the package and release, and the tree it
    names is its own (an amended or rewritten bump commit is a person's)."""
    trailers = git.commit_info(project, commit).trailers
    return ((TRAILER, f"{name} {version}") in trailers
            and (TREE_TRAILER, git.tree_of(project, commit)) in trailers)


def _git_reason(exc: CommandError) -> str:
    """git's own reason, whole: its error lines, else everything it said."""
    lines = [ln.strip() for ln in exc.output.splitlines() if ln.strip()]
    errors = [re.sub(r"^(fatal|error): ", "", ln) for ln in lines
              if ln.startswith(("fatal:", "error:"))]
    if exc.timeout is not None:
        return f"no answer within {exc.timeout:g} s"
    return "; ".join(errors or lines) or f"git exit {exc.returncode}"


def _write(project: Path, scratch: Path, result: Bump, version: str, tips: _Tips,
           push: str | None) -> Bump:
    """The port as one commit on the bump branch (and at ``push``); nothing written where the
    branch holds it already.  The commit sits on HEAD as the bump found it (a port finished by
    hand was moved onto it first)."""
    head = result.on
    assert head == git.head(scratch), "the port is on the project's HEAD"
    tree = git.worktree_tree(scratch)
    commit = next((tip for tip in (tips.local, tips.remote)
                   if tip and git.tree_of(project, tip) == tree
                   and git.parents(project, tip) == [head]), None)
    if commit is None:
        commit = git.user_commit_of(scratch, tree, head, _message(result, version, tree))
    changed = tuple(path for _s, path, *_ in git.changed_files(scratch, head, commit))
    result = replace(result, commit=commit, changed=changed)
    wrote = False
    if commit != tips.local:
        git.move_ref(project, f"refs/heads/{result.branch}", commit, tips.local)
        wrote = True
    if push and commit != tips.remote:
        try:
            git.push_branch(project, push, result.branch, commit, tips.remote, REMOTE_TIMEOUT)
        except CommandError as exc:
            raise PatchkitError(f"could not push {result.branch} to {push}: {_git_reason(exc)}; "
                                "the branch is written here, push it by hand") from None
        wrote = True
    if push:
        result = replace(result, pushed=_remote_name(project, push))
    return result if wrote else replace(result, status=BumpStatus.UNCHANGED)


def _remote_name(project: Path, push: str) -> str:
    """The remote as a body names it: its name (``origin``), never this machine's path of it.
    A URL or path given for ``--push`` is named by the remote configured with it, else by its
    last part (``vllm-patches.git``), a URL without its credentials."""
    known = git.remotes(project)
    if push in known:
        return push
    for name, url in known.items():
        if url == push or (Path(url).is_absolute() and Path(push).is_absolute()
                           and Path(url).resolve() == Path(push).resolve()):
            return name
    if "://" in push:
        scheme, _, rest = push.partition("://")
        return f"{scheme}://{rest.rpartition('@')[2]}"
    return Path(push.rstrip("/")).name or push


def _message(result: Bump, version: str, tree: str) -> str:
    """The commit message: the title, the fates in short, and the trailers that mark the
    commit as this bump's.  No time or host in it: the same port gives the same commit."""
    fates = [f"- {f.id}: {f.before or 'absent'} -> {f.after or 'absent'}"
             + (f" ({f.port})" if f.port not in ("applied", "skipped") else "")
             for f in result.fates if not {f.before, f.after} <= {None, Status.SKIPPED}]
    sections = [[f"Bump {result.label} from {result.from_ref} to {result.to_ref}"], fates]
    newly = [f.id for f in result.fates if f.newly_applied]
    gone = [f"{f.id} ({_gone_why(f)})" for f in result.fates if f.no_longer_applied]
    sections.append(([f"Newly applied: {', '.join(newly)}"] if newly else [])
                    + ([f"No longer applied: {', '.join(gone)}"] if gone else []))
    proof = [f"{result.assertions} assertions ran and hold on {result.to_ref}."]
    if result.by_hand:
        proof.append(f"Finished by hand: {', '.join(result.by_hand.files)}.")
    sections += [proof, [f"{TRAILER}: {result.package} {version}", f"{TREE_TRAILER}: {tree}"]]
    return "\n\n".join("\n".join(s) for s in sections if s)


def _made_by(f: Fate, after: ApplyReport) -> str | None:
    """The earlier patch whose change ``f`` found in the tree (the port's step, or the trial
    at the new release), never the release's."""
    if f.port == "made-by-earlier":
        return f.detail.split("made by ", 1)[1].split(",", 1)[0]
    return next((r.made_by for r in after.patches if r.id == f.id and r.made_by), None)


def _gone_why(f: Fate) -> str:
    if f.successor and f.change is Change.SUPERSEDED:
        return f"superseded by {f.successor}"
    if f.went_upstream:
        return "upstream"
    if f.retired:
        return "retired"
    if f.change is Change.MADE_BY:
        return f.why.split(";", 1)[0]
    if f.port == "dropped-by-hand":
        return "dropped by hand; lost"
    return "lost"


# ------------------------------------------------------------------------------ a person's port

class _Attempt:
    """What the automatic port left in the scratch tree when it stopped: the tree as it was
    (a commit, so that what the person changes after can be shown), the steps it took, the
    patch it stopped at and its notes."""

    def __init__(self, snapshot: str, steps: dict[str, rebase.Step], stopped: str,
                 notes: tuple[str, ...]) -> None:
        self.snapshot, self.steps, self.stopped, self.notes = snapshot, steps, stopped, notes

    @staticmethod
    def save(scratch: Path, steps: Mapping[str, rebase.Step], stopped: str,
             notes: Sequence[str]) -> None:
        tree = git.worktree_tree(scratch)
        snapshot = git.user_commit_of(scratch, tree, git.head(scratch), "the automatic attempt")
        data = {"snapshot": snapshot, "stopped": stopped, "notes": list(notes),
                "steps": [asdict(s) for s in steps.values()]}
        path = scratch / ".patchkit" / ATTEMPT
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2) + "\n")

    @classmethod
    def load(cls, scratch: Path) -> _Attempt:
        try:
            data = json.loads((scratch / ".patchkit" / ATTEMPT).read_text())
            steps = {s["id"]: rebase.Step.from_dict(s) for s in data["steps"]}
            return cls(str(data["snapshot"]), steps, str(data["stopped"]),
                       tuple(data.get("notes", ())))
        except (OSError, ValueError, KeyError, TypeError):
            raise UsageError(f"{scratch} holds no record of the automatic port ({ATTEMPT}): "
                             f"drop it with `git worktree remove --force {scratch}` and bump "
                             "again") from None

    def hand_work(self, scratch: Path) -> HandWork:
        tree = git.worktree_tree(scratch)
        files = tuple(path for _s, path, *_ in git.changed_files(scratch, self.snapshot, tree))
        return HandWork(files, git.diff(scratch, self.snapshot, tree) if files else "")


def _finished_by_hand(scratch: Path, rel: Path, label: str, version: str) -> bool:
    """A port left for a person: True once they finished it (the bump goes on from there);
    one line while it still needs them, or when it holds nothing."""
    drop = f"drop it with `git worktree remove --force {scratch}`"
    if rebase.in_progress((scratch / rel).parent):
        raise UsageError(f"the port of {label} to {version} in {scratch} still needs a hand: "
                         f"resolve it there (`patchkit rebase --continue`), then run this bump "
                         f"again; or {drop}")
    if not [p for _xy, p in git.status(scratch) if not p.startswith(".patchkit/")]:
        raise UsageError(f"the port of {label} to {version} in {scratch} holds no change (was "
                         f"its rebase aborted?): {drop}")
    return True


# ------------------------------------------------------------------------------ probes

def _probes(m: Manifest, result: Bump, name: str, target: str) -> tuple[Probe, ...]:
    """The ported manifest's probes, run in its folder, in order, until one fails."""
    done: list[Probe] = []
    for command in m.bump.probes:
        done.append(_probe(command, m, name, result, target))
        if not done[-1].ok:
            break
    return tuple(done)


def _probe(command: str, m: Manifest, name: str, result: Bump, target: str) -> Probe:
    # PATCHKIT_PYTHON: the interpreter patchkit runs in, which can import it (and its tests)
    env = {"PATCHKIT_BUMP_PACKAGE": name, "PATCHKIT_BUMP_FROM": result.from_ref,
           "PATCHKIT_BUMP_REF": target, "PATCHKIT_PYTHON": sys.executable}
    done = process.run_user(["sh", "-c", command], env=env, timeout=m.bump.timeout, cwd=m.root)
    tail = "\n".join(done.output.rstrip().splitlines()[-20:])
    return Probe(command, done.returncode, round(done.seconds, 1), tail)


def exit_code(results: Sequence[Bump]) -> int:
    return EXIT_NEEDS_A_HAND if any(r.needs_a_hand for r in results) else 0


def pull_name(url: str | None) -> str | None:
    """``vllm#51835`` for a GitHub pull request link."""
    found = _PULL.search(url or "")
    return f"{found.group(2)}#{found.group(3)}" if found else None
