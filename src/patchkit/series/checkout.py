"""The applied checkout: what ``patchkit apply`` leaves in ``--workdir``, and its one reader.

Tag ``patchkit/base`` is the pristine upstream commit, one commit per applied patch follows,
tag ``patchkit/applied`` marks the end of the series, and ``.git/patchkit-report.json`` holds
the apply report.  "Is this an applied checkout?" is :func:`is_checkout`; everything that reads
one goes through :class:`AppliedCheckout`; "what of it is a person's work?" is
:func:`user_work`, and :func:`save_work` keeps that work in a bundle before it is replaced.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from patchkit import git
from patchkit.errors import CommandError, UsageError
from patchkit.report import ApplyReport, PackageInfo
from patchkit.source import BASE_TAG

REPORT_FILE = "patchkit-report.json"
APPLIED_TAG = "patchkit/applied"
# the last commit ``patchkit export`` turned into patches: it and the commits below it are the
# series' now, not a person's work (a tag, so that what the clone came with covers it)
EXPORTED_TAG = "patchkit/exported"


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
        gone = git.missing_alternates(workdir)
        if gone:
            raise UsageError(f"{workdir} borrows its git objects from {gone[0]}, which is gone "
                             "(was the cache deleted?); run 'patchkit apply --discard' again")
        base = git.resolve_commit(workdir, BASE_TAG) or report.vllm.commit
        if not base:
            raise UsageError(f"{workdir} has no {BASE_TAG} tag")
        return cls(workdir, report, base, git.head(workdir))

    @property
    def vllm(self) -> PackageInfo:
        return self.report.vllm

    def pin(self, package: str) -> PackageInfo:
        """What ``package``'s checkout was made from (its ref, commit and version): its own
        section of the run's report, which each checkout of the run holds whole; else, for a
        checkout a run of its own made, the report's vLLM section."""
        own = self.report.packages.get(package)
        return own if own is not None else self.report.vllm

    def changes(self) -> list[Change]:
        out = [Change(status, path, int(new_mode, 8), blob)
               for status, path, _old, new_mode, blob in git.changed_files(self.root, self.base,
                                                                       self.head)]
        return sorted(out, key=lambda c: c.path)

    def pristine(self, rel_paths: Sequence[str]) -> dict[str, bytes | None]:
        blobs = git.read_blobs(self.root, [f"{self.base}:{p}" for p in rel_paths])
        return {p: blobs[f"{self.base}:{p}"] for p in rel_paths}

    def blobs(self, ids: Sequence[str]) -> dict[str, bytes | None]:
        return git.read_blobs(self.root, ids)

    def tree_id(self) -> str:
        return git.tree_of(self.root, self.head)

    def commit_time(self, commit: str) -> int:
        return git.commit_time(self.root, commit)


def has_applied_tag(path: Path) -> bool:
    return git.has_tag(path, APPLIED_TAG)


def mark_exported(path: Path, commit: str) -> None:
    """``commit`` and the commits below it are in the series' files now."""
    git.tag(path, EXPORTED_TAG, commit)


def commits_after_series(path: Path, *, merges_only: bool = False) -> list[str]:
    """The commits made on top of the applied series, oldest first."""
    return git.commits_between(path, APPLIED_TAG, "HEAD", merges_only=merges_only)


def series_subjects(path: Path) -> list[str]:
    """The subjects of the series' own commits, newest first."""
    return git.subjects_between(path, BASE_TAG, APPLIED_TAG)


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


@dataclass(frozen=True)
class UserWork:
    """What a person made in an applied checkout since ``patchkit apply`` left it: commits on
    HEAD or a branch past the series, changed and untracked files, HEAD moved elsewhere."""

    commits: int = 0
    changed: int = 0
    untracked: int = 0
    moved_to: str | None = None      # HEAD's commit when it is not patchkit/applied or past it
    unreadable: str | None = None    # why git could not say (the checkout is broken)

    def __bool__(self) -> bool:
        return bool(self.commits or self.changed or self.untracked or self.moved_to
                    or self.unreadable)

    def describe(self) -> str:
        """One phrase: "2 commits after patchkit/applied, 3 changed files, 1 untracked file"."""
        if self.unreadable:
            return f"a checkout git cannot read ({self.unreadable})"
        parts = []
        if self.moved_to:
            parts.append(f"HEAD moved to {self.moved_to[:12]} (not {APPLIED_TAG})")
        if self.commits:
            parts.append(_count(self.commits, "commit") + f" after {APPLIED_TAG}")
        if self.changed:
            parts.append(_count(self.changed, "changed file"))
        if self.untracked:
            parts.append(_count(self.untracked, "untracked file"))
        return ", ".join(parts)

    def remedies(self, workdir: Path | str) -> list[str]:
        """Each kind of work and what to do about it, one phrase each: commits are exported,
        changes committed first, untracked files committed or moved away, HEAD put back."""
        out = []
        if self.unreadable:
            out.append(f"git cannot read it ({self.unreadable}): move {workdir} aside")
        if self.moved_to:
            out.append(f"HEAD moved to {self.moved_to[:12]}, off the series: put it back with "
                       f"'git -C {workdir} checkout {APPLIED_TAG}'")
        if self.commits:
            out.append(f"{_count(self.commits, 'commit')} not yet exported: run "
                       "'patchkit export'")
        if self.changed:
            out.append(f"{_count(self.changed, 'changed file')} not committed: commit "
                       f"('git -C {workdir} commit -a'), then run 'patchkit export'")
        if self.untracked:
            out.append(f"{_count(self.untracked, 'untracked file')}: commit "
                       f"('git -C {workdir} add'), then run 'patchkit export', or move "
                       f"{'it' if self.untracked == 1 else 'them'} out of the checkout")
        return out


def user_work(path: Path) -> UserWork:
    """What of ``path``, an applied checkout, is a person's rather than patchkit's: the one
    answer to "may this workdir be replaced as it is?" (it may when the answer is empty).
    Commits ``patchkit export`` turned into patches (tag ``patchkit/exported``) are the
    series' now, not work."""
    gone = git.missing_alternates(path)
    if gone:
        return UserWork(unreadable=f"its objects in {gone[0]} are gone")
    applied = git.resolve_commit(path, APPLIED_TAG)
    if applied is None:
        return UserWork(unreadable=f"no tag {APPLIED_TAG}")
    try:
        head = git.head(path)
        commits = git.local_commits(path, applied)
        entries = git.status(path)
    except CommandError as exc:
        return UserWork(unreadable=exc.output.strip().splitlines()[-1] if exc.output.strip()
                        else f"git exit {exc.returncode}")
    # exported commits are reached by their tag, like what the clone came with
    moved = head != applied and not git.is_ancestor(path, applied, head)
    untracked = sum(code == "??" for code, _ in entries)
    return UserWork(len(commits), len(entries) - untracked, untracked, head if moved else None)


DISCARDED_REFS = "refs/heads/discarded"


@dataclass(frozen=True)
class SavedWork:
    """Where the work of a replaced checkout went: a bundle, and the refs it holds."""

    bundle: Path | None
    refs: tuple[str, ...]
    head: str

    def how_to_restore(self, workdir: Path) -> str:
        if self.bundle is None:
            return (f"replaced; nothing of its own needed saving (HEAD was {self.head[:12]}, "
                    "a commit of the source or the series)")
        names = ", ".join(r.removeprefix("refs/heads/") for r in self.refs)
        return (f"saved in {self.bundle} ({names}); "
                f"get it back with: git -C {workdir} fetch {self.bundle} "
                f"'{DISCARDED_REFS}/*:{DISCARDED_REFS}/*'")


def save_work(path: Path, folder: Path, label: str) -> SavedWork:
    """Keep what a person made in the checkout at ``path`` in a git bundle at ``dest``: HEAD as
    ``discarded/head``, every other local branch as ``discarded/branches/NAME``, and the
    uncommitted and untracked files as a commit on HEAD, ``discarded/changes``.  What the
    clone came with is left out (any clone of the source has it), so the bundle stays small;
    a ref with nothing of its own is not in it.  The bundle is ``LABEL.discarded-<key>.bundle``
    in ``folder``, its key a hash of what it holds: the same work discarded again is the same
    bundle, not one more."""
    head = git.head(path)
    applied = git.resolve_commit(path, APPLIED_TAG) or head
    refs = {f"{DISCARDED_REFS}/head": head}
    for name, commit in git.local_branches(path).items():
        if commit != head:
            refs[f"{DISCARDED_REFS}/branches/{name}"] = commit
    kept = {r: c for r, c in refs.items() if git.local_commits(path, applied, c)}
    changes = git.snapshot_commit(path, "patchkit: the uncommitted changes of a replaced checkout")
    if changes:
        kept[f"{DISCARDED_REFS}/changes"] = changes
    if not kept:
        return SavedWork(None, (), head)
    # the snapshot commit's id holds the time; its tree and parent are its content
    key = hashlib.sha256("".join(
        f"{ref} {git.tree_of(path, c) + ' ' + head if ref.endswith('/changes') else c}\n"
        for ref, c in sorted(kept.items())).encode()).hexdigest()[:16]
    dest = folder / f"{label}.discarded-{key}.bundle"
    if not dest.is_file():
        part = dest.with_name(f".{dest.name}.{os.getpid()}.part")
        try:
            git.write_bundle(path, part, kept, git.published(path, but="patchkit/"))
            os.replace(part, dest)   # a bundle is whole, or not there
        finally:
            part.unlink(missing_ok=True)
    return SavedWork(dest, tuple(kept), head)
