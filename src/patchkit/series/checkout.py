"""The applied checkout: what ``patchkit apply`` leaves in ``--workdir``, and its one reader.

Tag ``patchkit/base`` is the pristine upstream commit, one commit per applied patch follows,
tag ``patchkit/applied`` marks the end of the series, and ``.git/patchkit-report.json`` holds
the apply report.  "Is this an applied checkout?" is :func:`is_checkout`; everything that reads
one goes through :class:`AppliedCheckout`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from patchkit import git as g
from patchkit.errors import UsageError
from patchkit.report import ApplyReport, VllmInfo
from patchkit.source import BASE_TAG

REPORT_FILE = "patchkit-report.json"
APPLIED_TAG = "patchkit/applied"


def report_path(tree: Path) -> Path:
    return tree / ".git" / REPORT_FILE


def is_checkout(path: Path) -> bool:
    """True when ``path`` is a checkout ``patchkit apply`` made (it holds an apply report)."""
    return report_path(path).is_file()


def read_report(path: Path) -> ApplyReport | None:
    """The apply report of the checkout at ``path``, or None when it has no readable one."""
    try:
        return ApplyReport.from_json(report_path(path).read_text())
    except (OSError, ValueError):
        return None


def write_report(tree: Path, report: ApplyReport) -> None:
    report_path(tree).write_text(report.to_json() + "\n")


@dataclass(frozen=True)
class Change:
    """A file the series changed."""

    status: str          # A, M, D (T, a type change, is refused)
    path: str            # checkout-relative, e.g. vllm/config/speculative.py
    mode: int            # the new file mode (0 for a deletion)
    blob: str            # the new blob id ("0"*40 for a deletion)


@dataclass(frozen=True)
class AppliedCheckout:
    """An applied workdir: tag ``patchkit/base`` = pristine upstream, HEAD = patched."""

    root: Path
    report: ApplyReport
    base: str            # the pristine commit
    head: str

    @classmethod
    def open(cls, workdir: Path) -> AppliedCheckout:
        workdir = Path(workdir)
        report = read_report(workdir)
        if report is None:
            raise UsageError(f"{workdir} is not an applied checkout (no .git/{REPORT_FILE}); "
                             "run 'patchkit apply' first")
        gone = g.missing_alternates(workdir)
        if gone:
            raise UsageError(f"{workdir} borrows its git objects from {gone[0]}, which is gone "
                             "(was the cache deleted?); run 'patchkit apply' again")
        base = g.resolve_commit(workdir, BASE_TAG) or report.vllm.commit
        if not base:
            raise UsageError(f"{workdir} has no {BASE_TAG} tag")
        return cls(workdir, report, base, g.head(workdir))

    @property
    def vllm(self) -> VllmInfo:
        return self.report.vllm

    def changes(self) -> list[Change]:
        out = [Change(status, path, int(new_mode, 8), blob)
               for status, path, _old, new_mode, blob in g.changed_files(self.root, self.base,
                                                                       self.head)]
        return sorted(out, key=lambda c: c.path)

    def pristine(self, rel_paths: Sequence[str]) -> dict[str, bytes | None]:
        blobs = g.read_blobs(self.root, [f"{self.base}:{p}" for p in rel_paths])
        return {p: blobs[f"{self.base}:{p}"] for p in rel_paths}

    def blobs(self, ids: Sequence[str]) -> dict[str, bytes | None]:
        return g.read_blobs(self.root, ids)

    def tree_id(self) -> str:
        return g.tree_of(self.root, self.head)

    def commit_time(self, commit: str) -> int:
        return g.commit_time(self.root, commit)


def has_applied_tag(path: Path) -> bool:
    return g.has_tag(path, APPLIED_TAG)


def commits_after_series(path: Path, *, merges_only: bool = False) -> list[str]:
    """The commits made on top of the applied series, oldest first."""
    return g.commits_between(path, APPLIED_TAG, "HEAD", merges_only=merges_only)


def series_subjects(path: Path) -> list[str]:
    """The subjects of the series' own commits, newest first."""
    return g.subjects_between(path, BASE_TAG, APPLIED_TAG)
