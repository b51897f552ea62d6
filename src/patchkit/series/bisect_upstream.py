"""The first upstream commit at which a patch's fate changes (``patchkit bisect``, and
the bisect of each failure of ``rebase-check``).

It is ``git bisect run`` with the predicate in one function, :func:`fate_at`: the patch's fate
at a commit is what the series engine makes of it there, the patches before it applied where
they apply, the patch itself with its ``vllm:`` range ignored (it is the one under test), then
its assertions.  Fate means the status and, for ``failed``, the reason; two commits where the
patch applies at different offsets have the same fate.

The fates at the good and the bad end come first.  When they differ, a binary search over
``git rev-list --first-parent good..bad`` finds a commit whose fate is not the good one while
its first parent's is: ceil(log2 n) tests for n commits, each in a sparse checkout (only the
files the series reads or writes) in a scratch folder that is removed afterwards.  A merge on
the first-parent line is one step: the side branch it brings in is not walked, so the answer
is the merge that landed the change.

vLLM tags a release on its own release branch (cut from main, with cherry-picks), so one
release is seldom an ancestor of the next.  When the good end is not an ancestor of the bad one the
search starts from their merge base instead, provided the patch has the good fate there too
(one more test); where it does not, the change happened on good's own line and it says so.

The ``pypi`` source holds one orphan commit per release and nothing between them; there the
same search runs over the releases from the good end to the bad one and ends at the pair of
adjacent releases where the fate changes.

A patch of another package (``package: flashinfer``) is bisected over that package's history
or releases, from its pin: the patches before it are that package's own, and vLLM and every
other package stay at their pins, where the ranges on them are judged.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from patchkit import git
from patchkit import kinds, source, versions
from patchkit.errors import Origin, PatchkitError, SettingError, SourceError, UsageError, literal
from patchkit.manifest import VLLM, Manifest, Patch, variants
from patchkit.run import RunSpec
from patchkit.report import ApplyReport, PatchResult, Reason, Status
from patchkit.series import applier

__all__ = ["BisectResult", "End", "Fate", "FirstBad", "Oracle", "bisect_failures", "fate_at",
           "limit_for", "pull_of"]

# vLLM's squash merges end their subject with the pull request: "[Core] Fix x (#12345)".
_SQUASHED = re.compile(r"\(#(\d+)\)")
_MERGED = re.compile(r"^Merge pull request #(\d+)\b")
NO_HISTORY = "it has one commit per release and no history between releases"


# ------------------------------------------------------------------------------ results

@dataclass(frozen=True)
class Fate:
    """A patch's fate at one commit: its status, and the reason when it failed.  The message
    (which line, which offset) is kept for the report but is no part of the fate."""

    status: Status
    reason: Reason | None = None
    message: str = field(default="", compare=False)

    def __str__(self) -> str:
        return f"{self.status}/{self.reason}" if self.reason else str(self.status)

    @classmethod
    def of(cls, result: PatchResult) -> Fate:
        return cls(result.status, result.reason, result.message)


@dataclass(frozen=True)
class End:
    """One end of the search: the ref, the commit it names, the patch's fate there."""

    ref: str
    commit: str
    fate: Fate

    def to_dict(self) -> dict:
        return {"ref": self.ref, "commit": self.commit, "fate": str(self.fate),
                "message": self.fate.message}


@dataclass(frozen=True)
class FirstBad:
    """The first commit on the first-parent line whose fate is not the good one."""

    commit: str
    subject: str
    pull: int | None
    date: str
    fate: Fate

    def to_dict(self) -> dict:
        return {"commit": self.commit, "subject": self.subject, "pull": self.pull,
                "date": self.date, "fate": str(self.fate), "message": self.fate.message}


@dataclass(frozen=True)
class BisectResult:
    patch: str
    source: str
    good: End
    bad: End
    first_bad: FirstBad | None = None
    tested: int = 0           # commits whose fate was computed, both ends included
    commits: int = 0          # the candidates: first-parent commits in good..bad (pypi: releases)
    files: tuple[str, ...] = ()   # what the diff is limited to
    variant: str | None = None  # the build whose earlier patches are applied
    diff: str = ""            # the upstream change of those files at first_bad (pypi: between
                              # the two releases of `narrowed`)
    base: End | None = None   # where the search starts when good is on a side line: the merge base
    narrowed: tuple[End, End] | None = None   # pypi: the adjacent releases where it changes
    why: str | None = None    # pypi: why the search stops at a pair of releases
    package: str = VLLM.name  # the package whose history (or releases) is walked

    @property
    def changed(self) -> bool:
        return self.good.fate != self.bad.fate

    @property
    def span(self) -> int:
        """The commits (pypi: releases) the search runs over, both ends included: the
        candidates, the good end, and the merge base it starts from when there is one."""
        return self.commits + 1 + (self.base is not None)

    @property
    def limit(self) -> int:
        return limit_for(self.commits) + (self.base is not None)

    @property
    def ok(self) -> bool:
        """The question is answered: the commit is named, or the fate does not change."""
        return self.first_bad is not None or not self.changed

    def to_dict(self) -> dict:
        data = {"ok": self.ok, "patch": self.patch, "package": self.package,
                "source": self.source,
                "good": self.good.to_dict(), "bad": self.bad.to_dict(),
                "base": self.base.to_dict() if self.base else None, "changed": self.changed,
                "first_bad": self.first_bad.to_dict() if self.first_bad else None,
                "tested": self.tested, "commits": self.commits, "limit": self.limit,
                "variant": self.variant, "files": list(self.files), "diff": self.diff}
        if self.narrowed:
            data["narrowed"] = {"good": self.narrowed[0].to_dict(),
                                "bad": self.narrowed[1].to_dict(), "why": self.why}
        return data


def limit_for(n: int) -> int:
    """The most commits a bisect over ``n`` candidates tests: the two ends and ceil(log2 n)."""
    return (math.ceil(math.log2(n)) if n > 1 else 0) + 2


def pull_of(subject: str) -> int | None:
    """The pull request a commit subject names: ``... (#12345)`` or ``Merge pull request #N``."""
    found = _SQUASHED.findall(subject)
    if found:
        return int(found[-1])
    m = _MERGED.match(subject)
    return int(m.group(1)) if m else None


# ------------------------------------------------------------------------------ the predicate

def fate_at(manifest: Manifest, patch: Patch, at: source.Resolved, scratch: Path,
            paths: Sequence[str] | None = None, before: Sequence[Patch] | None = None,
            variant: str | None = None,
            pins: Mapping[str, source.Resolved] | None = None,
            cache: Path | None = None) -> Fate:
    """This patch's fate at ``at.commit`` of its package: the patches of that package before it
    in the build of ``variant`` (``before``, default all of them) applied where they apply, then
    the patch itself with its range on its package ignored (and whatever variants it names),
    then its assertions; in a checkout under ``scratch`` of ``paths`` (default: every file),
    removed afterwards.  The ranges on the other packages are judged at ``pins`` (needed, with
    vLLM's, for a patch of another package)."""
    package = patch.package
    if before is None:
        before = _earlier(manifest, patch, variant)
    series = [*before, patch.without_range(package)]
    work = Path(tempfile.mkdtemp(prefix="at-", dir=scratch))
    try:
        tree = work / "t"
        source.checkout(at, tree, paths, scratch=True)
        tops = applier.package_tops(at, manifest.package(package).id)
        scratch_tree = applier.Tree(tree, at, tops, keep=False, memo=cache)   # removed below
        report = applier.run_stack(manifest, {package: scratch_tree},
                                   patches=series, pins={**(pins or {}), package: at})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return Fate.of(report.patches[-1])


def _position(manifest: Manifest, patch: Patch) -> int:
    return next(i for i, p in enumerate(manifest.patches) if p.id == patch.id)


def _earlier(manifest: Manifest, patch: Patch, variant: str | None) -> list[Patch]:
    """The patches of ``patch``'s package before it in the build of ``variant``."""
    return [q for q in manifest.patches[:_position(manifest, patch)]
            if q.package == patch.package and variants.left_out(q, variant) is None]


def _reaching(manifest: Manifest, patch: Patch, variant: str | None) -> tuple[Patch, ...]:
    """The patches before ``patch`` that can change its fate: those that touch a file it reads,
    or a file read by another such patch.  The others touch only files it never sees, so
    leaving them out gives the same fate for less work.  All of them when some patch cannot
    say what it touches."""
    earlier = _earlier(manifest, patch, variant)
    try:
        reads = set(_touched(manifest, patch)) | {a.file for a in patch.verify}
        keep = []
        for q in reversed(earlier):
            files = set(_touched(manifest, q))
            if files & reads:
                keep.append(q)
                reads |= files
    except (OSError, kinds.KindError):
        return tuple(earlier)
    return tuple(reversed(keep))


def _touched(manifest: Manifest, patch: Patch) -> list[str]:
    return kinds.get(patch.kind).touched(manifest.root / patch.path)


class Oracle:
    """:func:`fate_at` for one patch, each commit computed once (``rebase-check`` asks
    the pin's fate once for all its targets)."""

    def __init__(self, manifest: Manifest, patch: Patch, scratch: Path,
                 log: Callable[[str], None] = lambda m: None, variant: str | None = None,
                 pins: Mapping[str, source.Resolved] | None = None,
                 cache: Path | None = None) -> None:
        self.manifest, self.patch, self.scratch, self.log = manifest, patch, scratch, log
        self.variant, self.pins, self.cache = variant, dict(pins or {}), cache
        self.before = _reaching(manifest, patch, variant)
        upto = (*self.before, patch)
        self.paths = applier.needed_paths(dataclasses.replace(manifest, patches=upto))
        self.fates: dict[str, Fate] = {}

    def __call__(self, at: source.Resolved) -> Fate:
        if at.commit not in self.fates:
            fate = fate_at(self.manifest, self.patch, at, self.scratch, self.paths, self.before,
                           pins=self.pins, cache=self.cache)
            self.fates[at.commit] = fate
            shown = at.commit[:10] if at.ref == at.commit else f"{at.ref} ({at.commit[:10]})"
            where = self.manifest.package(self.patch.package).id.aside("{} ")
            self.log(f"{self.patch.id} at {where}{shown}: {fate}")
        return self.fates[at.commit]


# ------------------------------------------------------------------------------ the search

def _first_change(candidates: Sequence[str], fate_of: Callable[[str], Fate], good: Fate) -> int:
    """The index of a candidate whose fate is not ``good`` while the one before it (or the good
    end, before the first) has it; the last candidate is known not to."""
    lo, hi = -1, len(candidates) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fate_of(candidates[mid]) == good:
            lo = mid
        else:
            hi = mid
    return hi


# Where each end of a search came from, as messages name it: the good and bad settings given
# (the command line words them), or the default taken ("the pin"), each with what follows it.
End_ = tuple[Origin, str]
Names = tuple[End_, End_]
GIVEN: Names = ((Origin("good"), ""), (Origin("bad"), ""))


def _said(names: Names, template: str) -> SettingError:
    """An error whose ``template`` names the ends as ``{good}`` and ``{bad}``."""
    (good, of_good), (bad, of_bad) = names
    good, bad = replace(good, setting="good"), replace(bad, setting="bad")
    return SettingError(template.replace("{good}", "{good}" + literal(of_good))
                        .replace("{bad}", "{bad}" + literal(of_bad)), good, bad)


def _at_commit(end: source.Resolved, commit: str) -> source.Resolved:
    version = source.version_of(end.repo, commit)
    return source.Resolved(end.source, end.repo, commit, commit, version)


def _merge_base(good: source.Resolved, bad: source.Resolved, names: Names) -> str | None:
    """None when good is an ancestor of bad; else the merge base the search starts from (good
    is on a side line: vLLM tags each release on its own release branch, off main); one line
    when good comes after bad or the two share no history."""
    repo, old, new = good.repo, good.commit, bad.commit
    if git.is_ancestor(repo, old, new):
        return None
    what = f"{{good}} {literal(good.ref)} is not an ancestor of {{bad}} {literal(bad.ref)}"
    if git.is_ancestor(repo, new, old):
        raise _said(names, f"{what}: it comes after it (swap them?)")
    base = git.merge_base(repo, old, new)
    if base is None:
        raise _said(names, f"{what}: their histories never meet")
    return base


def _releases_between(good: source.Resolved, bad: source.Resolved, cache: Path,
                      log: Callable[[str], None], names: Names,
                      package: source.PackageId = source.VLLM) -> list[str]:
    """The release tags after good up to bad, oldest first, bad last (a source with no
    history has nothing else between them)."""
    lo, hi = versions.parse(good.version), versions.parse(bad.version)
    if lo is None or hi is None:
        raise SourceError(f"cannot order {good.ref} and {bad.ref}: not releases")
    if lo >= hi:
        raise _said(names, f"{{good}} {literal(good.ref)} is not older than {{bad}} "
                           f"{literal(bad.ref)} (swap them?)")
    _, tags = source.list_tags([good.source], cache, log, package=package)
    found: dict[versions.Version, str] = {}
    for tag in tags:
        v = versions.release_tag(tag)
        if v is not None and lo < v < hi and not v.is_prerelease:
            found.setdefault(v, tag)
    return [found[v] for v in sorted(found)] + [bad.ref]


def newest_release(src: str, cache: Path, log: Callable[[str], None] = lambda m: None,
                   package: source.PackageId = source.VLLM) -> str:
    """The newest release tag vX.Y.Z of a source of ``package`` (pre-releases left out)."""
    _, tags = source.list_tags([src], cache, log, package=package)
    found = [(v, t) for t in tags if (v := versions.release_tag(t)) and not v.is_prerelease]
    if not found:
        raise SettingError(f"{literal(src)} has no {literal(package.label)} release tag "
                           "vX.Y.Z to bisect up to; give {bad} REF", Origin("bad"))
    return max(found)[1]


def patch_named(manifest: Manifest, patch_id: str) -> Patch:
    try:
        return manifest.patch(patch_id)
    except KeyError:
        ids = [p.id for p in manifest.patches]
        close = difflib.get_close_matches(patch_id, ids, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else (
            f" (the series has {', '.join(ids)})" if ids else " (the series is empty)")
        raise UsageError(f"no patch {patch_id!r} in {manifest.path.name}{hint}") from None


def package_of(manifest: Manifest, patch: Patch) -> source.PackageId:
    """Who the patch's package is to its sources."""
    return manifest.package(patch.package).id


def _files(manifest: Manifest, patch: Patch) -> list[str]:
    """The files the patch reads or writes (its own and its assertions')."""
    return applier.needed_paths(dataclasses.replace(manifest, patches=(patch,))) or []


def between(manifest: Manifest, patch: Patch, good: source.Resolved, bad: source.Resolved,
            oracle: Oracle, cache: Path, names: Names = GIVEN) -> BisectResult:
    """Bisect ``patch`` from ``good`` to ``bad`` (refs of its package, both resolved in the
    same source); ``names`` say in messages where each end came from: the setting given, or
    the default taken."""
    if good.commit == bad.commit:
        raise _said(names, f"{{good}} {literal(good.ref)} and {{bad}} {literal(bad.ref)} are "
                           f"the same commit {good.commit[:12]}: nothing lies between them")
    history = source.kind_of(good.source).has_history
    package = package_of(manifest, patch)
    # What can be checked without a checkout is checked before the first one.
    base = _merge_base(good, bad, names) if history else None
    candidates = (git.first_parent_commits(good.repo, base or good.commit, bad.commit) if history
                  else _releases_between(good, bad, cache, oracle.log, names, package))
    asked: set[str] = set()

    def fate(at: source.Resolved) -> Fate:
        asked.add(at.commit)
        return oracle(at)

    ends = End(good.ref, good.commit, fate(good)), End(bad.ref, bad.commit, fate(bad))
    files = tuple(_files(manifest, patch))
    found: dict = {}   # what the search names, for the result
    start = good
    if ends[0].fate != ends[1].fate and base is not None:
        start = _at_commit(bad, base)
        found["base"] = End("merge base", base, fate(start))
        if found["base"].fate != ends[0].fate:
            raise _said(names, (
                f"{{good}} {literal(good.ref)} is not an ancestor of {{bad}} "
                f"{literal(bad.ref)}, and at their merge base {base[:12]} the patch is "
                f"{found['base'].fate}, not {ends[0].fate}: its fate changes on "
                f"{literal(good.ref)}'s own line; bisect from a commit of "
                f"{literal(bad.ref)}'s history ({{good}} REF)"))
    if ends[0].fate != ends[1].fate:
        seen: dict[str, source.Resolved] = {}

        def resolved(candidate: str) -> source.Resolved:
            if candidate not in seen:
                seen[candidate] = (bad if candidate in (bad.ref, bad.commit) else
                                   _at_commit(bad, candidate) if history else
                                   source.resolve([good.source], candidate, cache, oracle.log,
                                                  package=package))
            return seen[candidate]

        i = _first_change(candidates, lambda c: fate(resolved(c)), ends[0].fate)
        at = resolved(candidates[i])
        if history:
            info = git.commit_info(good.repo, at.commit)
            found["first_bad"] = FirstBad(info.sha, info.subject, pull_of(info.subject),
                                          info.date, fate(at))
            found["diff"] = git.diff_paths(good.repo, f"{at.commit}^1", at.commit, list(files))
        else:
            before = resolved(candidates[i - 1]) if i else start
            found["narrowed"] = (End(before.ref, before.commit, fate(before)),
                                 End(at.ref, at.commit, fate(at)))
            found["why"] = (f"the {good.source} source cannot narrow it further: {NO_HISTORY}; "
                            "bisect on a git source to name the commit")
            found["diff"] = git.diff_paths(good.repo, before.commit, at.commit, list(files))
    return BisectResult(patch.id, good.source, *ends, tested=len(asked), commits=len(candidates),
                        files=files, variant=oracle.variant, package=patch.package, **found)


def ranged(manifest: Manifest, package: str) -> list[str]:
    """The packages other than ``package`` whose pins the bisect needs: those some patch has
    a range on, and vLLM's, which the report names (a pin nothing asks about is not resolved,
    nor its base read)."""
    return sorted(({n for p in manifest.patches for n in p.ranges} | {VLLM.name}) - {package})


def end_names(package: source.PackageId, good: str | None, bad: str | None) -> Names:
    """How messages name the ends: the setting given or the default taken, and the package
    when it is not vLLM (``good flashinfer v0.6.15``)."""
    of = package.aside(" {}")
    whose = package.aside("{}'s") or "the"
    return ((Origin("good"), of) if good is not None else (Origin("good", f"{whose} pin"), ""),
            (Origin("bad"), of) if bad is not None
            else (Origin("bad", f"{whose} newest release"), ""))


# ------------------------------------------------------------------------------ rebase-check

def bisect_failures(manifest: Manifest, failures: Sequence[tuple[ApplyReport, PatchResult]], *,
                    run: RunSpec, progress: applier.Progress | None = None,
                    package: str = VLLM.name
                    ) -> dict[tuple[str, str], BisectResult | str]:
    """``rebase-check``'s bisect: for each failed patch x target (a ref of ``package``), the
    bisect from that package's pin in ``run`` to that target, for its variant; where it cannot
    run, why (one line)."""
    progress = progress or applier.Progress()
    cache = run.cache
    out: dict[tuple[str, str], BisectResult | str] = {}
    if not failures:
        return out
    scratch = Path(tempfile.mkdtemp(prefix="patchkit-bisect-"))
    oracles: dict[str, Oracle] = {}
    pins: dict[str, source.Resolved] = {}
    others: dict[str, source.Resolved] | None = None   # every other package, at its pin
    at = run.pin(package)
    pid = at.id
    try:
        for target, failed in failures:
            info = target.packages.get(package) or target.vllm
            key = (info.ref, failed.id)
            src = info.source or at.sources[0]
            if not source.kind_of(src).has_history:
                out[key] = f"cannot bisect on the {src} source: {NO_HISTORY}"
                continue
            patch = manifest.patch(failed.id)
            try:
                if src not in pins:
                    pins[src] = source.resolve([src], at.ref, cache, progress.info, package=pid)
                bad = source.resolve([src], info.ref, cache, progress.info, package=pid)
                if others is None:
                    others = applier.resolve_pins(run, cache, progress.info, None,
                                                  names=ranged(manifest, package))
                oracle = oracles.setdefault(patch.id, Oracle(manifest, patch, scratch,
                                                             progress.info, run.variant, others,
                                                             cache))
                out[key] = between(manifest, patch, pins[src], bad, oracle, cache,
                                   (end_names(pid, None, None)[0],
                                    (Origin("bad", "the target"), "")))
            except PatchkitError as exc:
                out[key] = f"cannot bisect: {exc}"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return out
