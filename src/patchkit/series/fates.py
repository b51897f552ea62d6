"""The one judge of a patch's fate between the pin and a release, for ``rebase-check``,
``bump`` and their reports.

A fix that takes effect at the pin (``applied`` there) and does not at a release is **lost**
there, unless one of these holds:

- it is upstream there, proven the way ``apply`` proves it (``upstream``);
- a patch that takes effect there names it in ``supersedes:`` (**superseded**);
- it is retired (``retired: {from: vX, why}``) and the release no longer has the code it
  changes (**retired**, with the proof: ``prove``).

Other changes are not losses: a fix that takes effect for the first time (**newly applied**),
or went upstream, superseded or retired.  A retirement claimed at a release that still has the
code is **refused**, and fails like a lost fix.  The callers only render what is decided here.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from patchkit import git
from patchkit import kinds, source, versions
from patchkit.errors import ManifestError
from patchkit.kinds import Remains
from patchkit.manifest import Manifest, Patch, Retired
from patchkit.report import ApplyReport, Status


class Change(enum.Enum):
    UNCHANGED = "unchanged"
    NEWLY_APPLIED = "newly applied"
    NOW_UPSTREAM = "now upstream"
    SUPERSEDED = "superseded"
    NOT_YET = "not yet"   # a release before the pin, where the fix does not take effect yet
    MADE_BY = "made by an earlier patch"   # the tree has it only because an earlier patch made it
    RETIRED = "retired"
    FAILED = "failed"                 # it fails there: the failure is the finding
    LOST = "lost"
    REFUSED = "retirement refused"    # retired there, but the release still has its code

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Proof:
    """A retirement judged at one release: what of the patch's code is gone, or still there."""

    patch: str
    retired: Retired
    at: str                 # the release's ref
    remains: Remains

    @property
    def ok(self) -> bool:
        return self.remains.proven_gone

    @property
    def line(self) -> str:
        """The proof, or the refusal, in one line."""
        if self.ok:
            return (f"retired from {self.retired.ref} ({self.retired.why}); proven at {self.at}: "
                    + "; ".join(self.remains.gone))
        if not self.remains.still:
            return (f"{self.patch} is retired from {self.retired.ref}, but nothing of what it "
                    f"changes is gone at {self.at} to prove it")
        return (f"{self.patch} is retired from {self.retired.ref}, but {self.at} still has its "
                f"code: {self.remains.still[0]}")


@dataclass(frozen=True)
class Fate:
    """One patch between the pin and one release."""

    patch: str
    pin: Status | None          # at the pin; None: not in the series there
    at: Status | None           # at the release; None: not in the series there
    change: Change
    why: str = ""               # one line: the successor, the proof, why it is lost
    successor: str | None = None

    @property
    def lost(self) -> bool:
        return self.change is Change.LOST

    @property
    def fails(self) -> bool:
        """It fails the release: lost there, or retired there against the proof."""
        return self.change in (Change.LOST, Change.REFUSED)

    @property
    def noted(self) -> bool:
        """A change worth listing under a matrix or in a body: anything but unchanged and a
        failure (which is reported as one)."""
        return self.change not in (Change.UNCHANGED, Change.FAILED, Change.NOT_YET)

    def to_dict(self) -> dict:
        return {"change": self.change.value, "pin": self.pin and self.pin.value,
                "at": self.at and self.at.value, "why": self.why, "successor": self.successor}


def judge(patch: str, pin: Status | None, at: Status | None, *, ref: str, pin_ref: str,
          upstream: bool = False, successor: str | None = None,
          proof: Proof | None = None, made_by: str | None = None,
          older: bool = False) -> Fate:
    """The fate of ``patch`` at release ``ref``, from its status at the pin and there.
    ``upstream``: proven upstream there in a way the status does not show (a port that marked
    or dropped it); ``successor``: a patch that takes effect there and supersedes it;
    ``proof``: its retirement judged there (a retired patch at or after its release);
    ``made_by``: found upstream there only because that earlier patch of the series made its
    change (never "upstream": the release does not have it); ``older``: a release before the
    pin, where a fix that is not there yet is no loss (a move of the pin forwards loses fixes;
    a look back only tells where each fix begins)."""
    if proof is not None and not proof.ok:
        return Fate(patch, pin, at, Change.REFUSED, proof.line)
    if at is Status.FAILED:
        return Fate(patch, pin, at, Change.FAILED)
    if pin is Status.APPLIED and at is not Status.APPLIED:
        if made_by is not None:
            return Fate(patch, pin, at, Change.MADE_BY,
                        f"made by {made_by}, earlier in the series; the release does not have it",
                        made_by)
        if upstream or at is Status.UPSTREAM:
            return Fate(patch, pin, at, Change.NOW_UPSTREAM, f"upstream at {ref}")
        if successor is not None:
            return Fate(patch, pin, at, Change.SUPERSEDED, f"carried by {successor}, which it "
                        "supersedes, at this older release" if older
                        else f"superseded by {successor}", successor)
        if proof is not None:
            return Fate(patch, pin, at, Change.RETIRED, proof.line)
        now = at.value if at else "removed"
        if older:
            return Fate(patch, pin, at, Change.NOT_YET,
                        f"{patch} takes effect at {pin_ref}, not yet at {ref} ({now})")
        return Fate(patch, pin, at, Change.LOST,
                    f"{patch} took effect at {pin_ref} and not at {ref} ({now}): it is not "
                    "upstream there, no patch that takes effect there supersedes it, and it is "
                    "not retired")
    if at is Status.APPLIED and pin is not Status.APPLIED:
        return Fate(patch, pin, at, Change.NEWLY_APPLIED, f"takes effect at {ref}")
    if proof is not None:   # retired at the pin already, and still proven
        return Fate(patch, pin, at, Change.RETIRED, proof.line)
    return Fate(patch, pin, at, Change.UNCHANGED)


def successor_of(patch: str, series: Sequence[Patch],
                 status: Callable[[str], Status | None], *, older: bool = False) -> str | None:
    """The first patch of ``series`` that supersedes ``patch`` and takes effect (``status``
    applied).  ``older``: the release is older than the pin, where the fix is carried the
    other way, by a patch that ``patch`` itself supersedes."""
    if older:
        mine = next((p.supersedes for p in series if p.id == patch), ())
        return next((q for q in mine if status(q) is Status.APPLIED), None)
    return next((q.id for q in series if patch in q.supersedes
                 and status(q.id) is Status.APPLIED), None)


def judge_reports(series: Sequence[Patch], pin: ApplyReport, at: ApplyReport, *, ref: str,
                  pin_ref: str, proofs: Mapping[str, Proof], older: bool = False
                  ) -> tuple[Fate, ...]:
    """Every patch of ``series`` between two trials of it (rebase-check's pin and target;
    ``older``: a target before the pin)."""
    made = {r.id: r.made_by for r in at.patches if r.made_by}
    return tuple(judge(p.id, pin.status_of(p.id), at.status_of(p.id), ref=ref, pin_ref=pin_ref,
                       successor=successor_of(p.id, series, at.status_of, older=older),
                       proof=proofs.get(p.id),
                       made_by=made.get(p.id), older=older) for p in series)


# ------------------------------------------------------------------------------ retirement

def prove(manifest: Manifest, patch: Patch, resolved: source.Resolved) -> Proof:
    """``patch``'s retirement judged at ``resolved``: its code read from the release's own
    commit (not a checkout, which the series may have changed)."""
    assert patch.retired is not None

    def read(path: str) -> bytes | None:
        spec = f"{resolved.commit}:{path}"
        return git.read_blobs(resolved.repo, [spec])[spec]

    remains = kinds.get(patch.kind).remains(manifest.root / patch.path, read, resolved.version)
    return Proof(patch.id, patch.retired, resolved.ref, remains)


def proofs_at(manifest: Manifest, series: Sequence[Patch], resolved: source.Resolved
              ) -> dict[str, Proof]:
    """The retirements of ``series`` that hold at ``resolved`` (its release is the one they
    name or a later one), each proven there."""
    return {p.id: prove(manifest, p, resolved) for p in series
            if p.retired is not None and p.retired.holds_at(resolved.version)}


def check_retired_releases(manifest: Manifest, series: Sequence[Patch], tags: Sequence[str],
                           label: str) -> None:
    """Each ``retired.from`` of ``series`` is a release the source has (``tags``): one line at
    the entry's line when not."""
    have = {versions.release_tag(t) for t in tags} - {None}
    for p in series:
        if p.retired is not None and p.retired.version not in have:
            raise ManifestError(f"retired.from: {label} has no release {p.retired.ref} (its "
                                "sources list none such)", path=manifest.path.name,
                                line=p.lines.get("retired") or p.retired.line, entry=p.label)


def retire_hint(patch: Patch, label: str, ref: str) -> str:
    """What a port that stops on a patch whose code is gone says: how to retire it."""
    return (f"if {label} {ref} no longer has the code {patch.id} changes, retire it: "
            f'`retired: {{from: {ref}, why: "..."}}` on its entry (patchkit proves the code '
            "is gone)")
