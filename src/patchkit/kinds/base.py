"""The protocol every patch kind implements, and the values kinds hand back.

A kind is one module under ``kinds/`` with a ``KIND`` object of this shape, named once in the
kind table (``kinds/__init__.py``).  Callers look the kind up by the manifest key and never ask
which kind it is: what differs between kinds (how the manifest entry is checked, which checkout
paths it touches, how it applies, what ``rebase`` does when it applied at an offset, stopped,
or is taken up again) is the kind's to say.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from patchkit.report import Outcome, PatchResult, Reason
from patchkit.timeouts import DEFAULT_TIMEOUT


class Patch(Protocol):
    """What a kind reads of a manifest entry (``patchkit.manifest.Patch``)."""

    id: str
    summary: str
    kind: str
    path: str
    upstream: str | None
    replaces: dict[str, str]
    index: int


class Manifest(Protocol):
    """What a kind reads of the manifest (``patchkit.manifest.Manifest``)."""

    root: Path
    path: Path


class KindError(Exception):
    """The kind cannot say what a patch touches (it does not parse, it does not import).
    ``line``: the line of the patch file at fault, when known."""

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(message)
        self.line = line


@dataclass(frozen=True)
class Target:
    """The checkout a patch is applied to."""

    root: Path                 # the work tree
    base_commit: str           # the pristine upstream commit
    version: str | None        # the package's release, when known
    mirror: Path | None = None  # the cached repository the checkout borrows from
    memo: Path | None = None    # the run's cache, where kept results live (None: nothing kept)
    timeout: float = DEFAULT_TIMEOUT   # the deadline of the patch author's code (a transform)


@dataclass(frozen=True)
class Remains:
    """What of a patch's target a release still has (``still``) and what is gone there
    (``gone``), one phrase each: the proof, or the refusal, of a ``retired:`` claim."""

    still: tuple[str, ...] = ()
    gone: tuple[str, ...] = ()

    @property
    def proven_gone(self) -> bool:
        return not self.still and bool(self.gone)


#: reads a file of the release, by its checkout path: its bytes, None when it has no such file
Reader = Callable[[str], "bytes | None"]


@dataclass
class Stop:
    """Where a rebase stopped and what the user is to do."""

    patch: str
    kind: str
    reason: Reason
    message: str
    edit: list[str] = field(default_factory=list)          # the files to change
    instructions: list[str] = field(default_factory=list)  # lines for a person
    drift: dict[str, str] = field(default_factory=dict)    # overlay file -> new upstream blob


class Rebase(Protocol):
    """What a kind may ask of a rebase in progress."""

    tree: Path          # the checkout of the target with the patches before this one
    to: str             # the target ref
    frm: str            # the old pin
    shown: str          # how to name the checkout to a person
    label: str          # the package the checkout holds, as messages name it: vLLM, flashinfer
    manifest: Manifest
    base_commit: str    # the target's pristine commit

    def old_pin(self, patch: Patch) -> AbstractContextManager[tuple[Path, PatchResult] | None]:
        """A checkout of the old pin with the patches before ``patch`` and then ``patch``
        applied, and ``patch``'s result there; None when the old pin cannot give it."""
        ...

    def mark_upstream(self, patch: Patch, why: str) -> None: ...

    def dropped_by_hand(self, patch: Patch, why: str) -> None:
        """A person resolved ``patch`` to no change at the target: it is set aside there (a
        range, or its entry dropped) in words that claim nothing of upstream."""
        ...

    def resolved(self, patch: Patch, commit: str, detail: str) -> None: ...

    def record_replaces(self, patch: Patch, drift: dict[str, str]) -> None:
        """Write ``replaces:`` of an overlay entry: file -> the upstream blob it replaces."""
        ...


class PatchKind(Protocol):
    name: str                  # the manifest key: `diff: FILE`
    is_folder: bool            # the patch is a folder of files rather than one file
    replaces_files: bool       # the entry may record `replaces:`
    writes_only_named: bool    # it cannot write a path it does not report

    def check(self, full: Path, rel: str) -> str | None:
        """What is wrong with the patch file, for the manifest loader; None when fine."""

    def sources(self, full: Path, rel: str) -> list[str]:
        """The manifest-relative files the patch is made of."""

    def touched(self, full: Path) -> list[str]:
        """Every checkout path the patch reads or writes; KindError when it cannot tell."""

    def compile(self, full: Path, rel: str) -> str:
        """All that can be checked without a tree (a diff parsed, a transform imported and its
        classes found, an overlay's files listed): what was found, in a few words; KindError
        (with the patch file's line where known) when it is broken."""

    def apply(self, patch: Patch, full: Path, target: Target) -> Outcome:
        """Apply to ``target.root``, all or nothing; never raises for a bad patch."""

    def apply_together(self, fulls: Sequence[Path], target: Target) -> list[Outcome | None] | None:
        """Several patches of this kind, one after the other in the series, applied in one go:
        each one's Outcome as ``apply`` one after the other would give it, when they all go in
        (written to the work tree, each naming its files).  When some would not, the tree is
        untouched and those are None in the list; None when the kind cannot apply these
        together."""

    def refresh(self, patch: Patch, full: Path, tree: Path, result: PatchResult) -> str | None:
        """After it applied at an offset in a rebase: rewrite it to apply exactly; what was
        done, or None when the kind has nothing to rewrite."""

    def stop(self, rebase: Rebase, patch: Patch, result: PatchResult, head: str) -> Stop:
        """The rebase stops at ``patch``: prepare the checkout and say what to do."""

    def resume(self, rebase: Rebase, patch: Patch, stop: Stop) -> None:
        """``rebase --continue`` after a stop at ``patch``: take the user's resolution."""

    def changes(self, full: Path) -> frozenset[tuple[str, ...]]:
        """The changes the patch makes, as values two patches can be compared by (a diff's
        hunks: file, lines removed, lines added; an overlay's files and their bytes): two
        patches sharing one make the same change.  Empty where the kind cannot tell without a
        tree (a transform)."""

    def remains(self, full: Path, read: Reader, version: str | None) -> Remains:
        """What of the code the patch changes the release ``read`` reads still has: every file
        it changes gone, or the thing it changes there gone (a diff's changed lines and their
        context, a transform's anchor), proves a retirement."""
