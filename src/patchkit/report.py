"""Results: what happened to each patch and each assertion, as typed values.

The words are the contract's: a :class:`Status` (``applied | upstream | skipped | failed``) and,
for ``failed``, one :class:`Reason`.  Both are enums: code compares members, never text; each
member is its word where it is written (JSON, text, a label).  An :class:`ApplyReport` is
written as JSON (the apply report of a checkout, ``--format json``) by
:meth:`ApplyReport.to_dict` and read back by :meth:`ApplyReport.from_dict`, the one reader of
that shape.  Reports and their parts are frozen: the run that makes one builds it once.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import Enum

from patchkit.packageid import VLLM


class Word(str, Enum):
    """A word of a report: compared as a member, written (JSON, text) as the word itself."""

    def __str__(self) -> str:
        return self.value


class Status(Word):
    """What happened to a patch."""

    APPLIED = "applied"      # it changed the tree
    UPSTREAM = "upstream"    # the tree already has the change; nothing written
    SKIPPED = "skipped"      # the release is outside its range, or its package is not in the run
    FAILED = "failed"        # with one Reason


class Reason(Word):
    """Why a patch failed."""

    CONFLICT = "conflict"
    FUZZ = "fuzz"
    ANCHOR_MISSING = "anchor-missing"
    AMBIGUOUS_ANCHOR = "ambiguous-anchor"
    UNSAFE_PATH = "unsafe-path"
    OVERLAY_DRIFT = "overlay-drift"
    ASSERTION = "assertion"
    ERROR = "error"


# the words, in the contract's order (what a JSON report may hold)
STATUSES = tuple(s.value for s in Status)
REASONS = tuple(r.value for r in Reason)


@dataclass(frozen=True)
class Offset:
    """A hunk that applied at another line than its header says."""

    hunk: int        # 1-based, within its file
    path: str
    line: int        # where it applied
    offset: int      # lines from where its header said

    def __str__(self) -> str:
        return f"hunk {self.hunk} of {self.path} at line {self.line} (offset {self.offset:+d})"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Offset:
        return cls(int(data["hunk"]), str(data["path"]), int(data["line"]), int(data["offset"]))


@dataclass(frozen=True)
class Hunk:
    """Which hunk of a diff did not apply."""

    path: str
    number: int      # 1-based, within its file


@dataclass(frozen=True)
class InTheWay:
    """One thing that keeps a diff from applying: a hunk that does not match (``conflict``,
    with the line its header names), or a whole file (``hunk`` None): ``gone`` when the file
    to patch is not there, ``exists`` when the file to create already is."""

    file: str
    hunk: int | None
    reason: str
    line: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> InTheWay:
        hunk, line = data.get("hunk"), data.get("line")
        return cls(str(data["file"]), None if hunk is None else int(hunk), str(data["reason"]),
                   None if line is None else int(line))


@dataclass
class Outcome:
    """What one patch kind's applier did to the tree, before the engine commits it."""

    status: Status  # applied | upstream | failed
    reason: Reason | None = None
    message: str = ""
    files: list[str] = field(default_factory=list)
    offsets: list[Offset] = field(default_factory=list)
    hunk: Hunk | None = None
    in_the_way: list[InTheWay] = field(default_factory=list)
    # no author's code ran: the applier wrote ``files`` and nothing else (a kept result)
    wrote_only_files: bool = False


@dataclass(frozen=True)
class PackageInfo:
    """One package's section of a report: its pin, what it resolved to (``source``: the
    source it was taken from, as given), where it went.  vLLM's is also the report's ``vllm``
    section, which JSON writes as it always has (``repo`` for the source, no workdir)."""

    ref: str
    commit: str
    version: str | None
    source: str | None = None
    workdir: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> PackageInfo:
        return cls(str(data["ref"]), str(data.get("commit") or ""), data.get("version"),
                   data.get("source"), data.get("workdir"))


@dataclass(frozen=True)
class PatchResult:
    id: str
    kind: str
    status: Status
    reason: Reason | None = None
    commit: str | None = None
    files: list[str] = field(default_factory=list)
    message: str = ""
    offsets: list[Offset] = field(default_factory=list)
    hunk: Hunk | None = None    # a conflict's hunk; not part of the JSON report
    package: str = VLLM.name    # the package it patches
    in_the_way: list[InTheWay] = field(default_factory=list)   # every hunk and file in the way
    # upstream only because an earlier patch of the series made the change: that patch's id
    # (the release itself does not have it)
    made_by: str | None = None

    def __post_init__(self) -> None:
        assert isinstance(self.status, Status), self.status
        assert (self.reason is None) == (self.status is not Status.FAILED), (self.status,
                                                                             self.reason)
        assert self.reason is None or isinstance(self.reason, Reason), self.reason

    def to_dict(self) -> dict:
        return {"id": self.id, "kind": self.kind, "status": self.status, "reason": self.reason,
                "commit": self.commit, "files": list(self.files), "message": self.message,
                "offsets": [str(o) for o in self.offsets],
                "offset_values": [o.to_dict() for o in self.offsets], "package": self.package,
                "in_the_way": [w.to_dict() for w in self.in_the_way],
                **({"made_by": self.made_by} if self.made_by else {})}

    @classmethod
    def from_dict(cls, data: dict) -> PatchResult:
        """``offsets`` (sentences) are for people; the values are read from ``offset_values``.
        A report written before those were stored reads as having no offsets."""
        reason = data.get("reason")
        return cls(str(data["id"]), str(data.get("kind") or ""), Status(data["status"]),
                   None if reason is None else Reason(reason), data.get("commit"),
                   list(data.get("files") or []),
                   str(data.get("message") or ""),
                   [Offset.from_dict(o) for o in data.get("offset_values") or []],
                   package=str(data.get("package") or VLLM.name),
                   in_the_way=[InTheWay.from_dict(w) for w in data.get("in_the_way") or []],
                   made_by=data.get("made_by") or None)


@dataclass
class AssertionResult:
    patch: str
    file: str
    line: int | None
    col: int | None
    ok: bool
    message: str

    def location(self) -> str:
        """``file:line:col``, or ``file`` alone when there is no line (the file is missing)."""
        return f"{self.file}:{self.line}:{self.col or 0}" if self.line else self.file

    def failure_line(self) -> str:
        """``file:line:col: [patch-id] message`` (``file: [patch-id] ...`` without a line)."""
        return f"{self.location()}: [{self.patch}] {self.message}"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> AssertionResult:
        return cls(str(data["patch"]), str(data["file"]), data.get("line"), data.get("col"),
                   bool(data["ok"]), str(data.get("message") or ""))


@dataclass(frozen=True)
class ApplyReport:
    vllm: PackageInfo           # vLLM's pin, also when the run made no checkout of it
    workdir: str | None
    patches: list[PatchResult] = field(default_factory=list)
    verify: list[AssertionResult] = field(default_factory=list)
    keep_failed: str | None = None  # the scratch checkout kept by --keep-failed
    variant: str | None = None      # the variant built; None = the default build
    discarded: dict | None = None   # --discard: what the replaced workdir held, where it went
    # every package of the run by name, vllm first: its pin, version, commit, source, workdir
    packages: dict[str, PackageInfo] = field(default_factory=dict)
    # package -> patched file -> the JIT modules the package builds from it (series/jit.py)
    jit_modules: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    # each patch's digest (manifest.digest) when the checkout was made: what status compares
    digests: dict[str, str] = field(default_factory=dict)
    # each setting's digest outside `patches:` (manifest.digest.settings): what status compares
    settings: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return (all(p.status is not Status.FAILED for p in self.patches)
                and all(a.ok for a in self.verify))

    def status_of(self, patch_id: str) -> Status | None:
        return next((p.status for p in self.patches if p.id == patch_id), None)

    def skipped(self) -> set[str]:
        return {p.id for p in self.patches if p.status is Status.SKIPPED}

    def to_dict(self) -> dict:
        v = self.vllm
        data = {"ok": self.ok,
                "vllm": {"ref": v.ref, "commit": v.commit, "version": v.version, "repo": v.source},
                "workdir": self.workdir,
                "patches": [p.to_dict() for p in self.patches],
                "verify": [a.to_dict() for a in self.verify], "variant": self.variant,
                "packages": {n: p.to_dict() for n, p in self.packages.items()},
                "jit_modules": {n: {f: list(m) for f, m in files.items()}
                                for n, files in self.jit_modules.items()}}
        if self.keep_failed:
            data["kept"] = self.keep_failed
        if self.discarded:
            data["discarded"] = self.discarded
        if self.digests:
            data["digests"] = dict(self.digests)
        if self.settings:
            data["settings"] = dict(self.settings)
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, data: dict) -> ApplyReport:
        """The one reader of an apply report; raises ValueError for what is not one."""
        try:
            v = data["vllm"]
            vllm = PackageInfo(str(v["ref"]), str(v.get("commit") or ""), v.get("version"),
                               v.get("repo"))
            return cls(vllm, data.get("workdir"),
                       [PatchResult.from_dict(p) for p in data.get("patches") or []],
                       [AssertionResult.from_dict(a) for a in data.get("verify") or []],
                       data.get("kept"), data.get("variant") or None,
                       data.get("discarded") or None,
                       {str(n): PackageInfo.from_dict(p)
                        for n, p in (data.get("packages") or {}).items()},
                       {str(n): {str(f): [str(x) for x in m] for f, m in files.items()}
                        for n, files in (data.get("jit_modules") or {}).items()},
                       {str(k): str(v) for k, v in (data.get("digests") or {}).items()},
                       {str(k): str(v) for k, v in (data.get("settings") or {}).items()})
        except (KeyError, TypeError, AttributeError, AssertionError, ValueError) as exc:
            raise ValueError(f"not an apply report: {exc!r}") from None

    @classmethod
    def from_json(cls, text: str) -> ApplyReport:
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError("not an apply report: not an object")
        return cls.from_dict(data)
