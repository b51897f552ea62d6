"""Results: what happened to each patch and each assertion, and how it is rendered.

The words are the contract's: status ``applied | upstream | skipped | failed`` and, for
``failed``, one reason of ``REASONS``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

STATUSES = ("applied", "upstream", "skipped", "failed")
REASONS = ("conflict", "fuzz", "anchor-missing", "ambiguous-anchor", "unsafe-path",
           "overlay-drift", "assertion", "error")


@dataclass
class Outcome:
    """What one patch kind's applier did to the tree, before the engine commits it."""

    status: str  # applied | upstream | failed
    reason: str | None = None
    message: str = ""
    files: list[str] = field(default_factory=list)
    offsets: list[str] = field(default_factory=list)


@dataclass
class VllmInfo:
    ref: str
    commit: str
    version: str | None
    repo: str | None = None


@dataclass
class PatchResult:
    id: str
    kind: str
    status: str
    reason: str | None = None
    commit: str | None = None
    files: list[str] = field(default_factory=list)
    message: str = ""
    offsets: list[str] = field(default_factory=list)  # "hunk 2 of f.py at +3", when any

    def __post_init__(self) -> None:
        assert self.status in STATUSES, self.status
        assert (self.reason is None) == (self.status != "failed"), (self.status, self.reason)
        assert self.reason is None or self.reason in REASONS, self.reason


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


@dataclass
class ApplyReport:
    vllm: VllmInfo
    workdir: str | None
    patches: list[PatchResult] = field(default_factory=list)
    verify: list[AssertionResult] = field(default_factory=list)
    keep_failed: str | None = None  # the scratch checkout kept by --keep-failed

    @property
    def ok(self) -> bool:
        return (all(p.status != "failed" for p in self.patches)
                and all(a.ok for a in self.verify))

    def to_dict(self) -> dict:
        data = {"ok": self.ok, "vllm": asdict(self.vllm), "workdir": self.workdir,
                "patches": [asdict(p) for p in self.patches],
                "verify": [asdict(a) for a in self.verify]}
        if self.keep_failed:
            data["kept"] = self.keep_failed
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)
