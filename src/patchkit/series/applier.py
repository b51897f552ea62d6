"""The apply engine: the series, in order, in a scratch checkout; into place only on success.

``run_series`` applies every patch to a checkout (one commit per patch that changed the tree)
and runs every assertion; it is shared by ``apply``, ``rebase-check`` and ``rebase``.
``apply_series`` wraps it with the fail-closed contract: scratch next to the workdir, swapped
in atomically when everything passed, removed otherwise (or kept with ``keep_failed``).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from patchkit import interrupt, kinds, source, versions
from patchkit import git as g
from patchkit.errors import CommandError, SourceError, UsageError
from patchkit.kinds.common import commit_message
from patchkit.manifest import VLLM, Manifest, Patch
from patchkit.manifest import variants
from patchkit.manifest.runspec import RunSpec, run_spec
from patchkit.report import ApplyReport, PatchResult, VllmInfo
from patchkit.series import checkout as applied
from patchkit.series import assertions
from patchkit.cache import cache_dir

__all__ = ["Progress", "apply_one", "apply_series", "check_workdir", "commit_message", "in_range",
           "needed_paths", "run_series"]


class Progress:
    """What the engine tells as it goes; the CLI decides how it looks.  Defaults say nothing."""

    def info(self, message: str) -> None:
        pass

    def patch(self, result: PatchResult) -> None:
        pass


def in_range(patch: Patch, version: str | None) -> tuple[bool, str]:
    return versions.in_ranges(patch.ranges, {"vllm": version})


def apply_one(manifest: Manifest, patch: Patch, root: Path, base_commit: str,
              version: str | None, mirror: Path | None = None) -> PatchResult:
    """Apply one patch to the checkout at ``root`` and commit it; never raises for a bad patch."""
    if patch.package != VLLM:   # ``root`` is vLLM's tree: another package's files are not here
        return PatchResult(patch.id, patch.kind, "skipped", message=f"it patches {patch.package}, "
                           "and only vllm's patches are applied (no other package has a checkout)")
    ok, why = in_range(patch, version)
    if not ok:
        if version is None:
            return PatchResult(patch.id, patch.kind, "failed", "error", message=why)
        return PatchResult(patch.id, patch.kind, "skipped", message=why)
    kind = kinds.get(patch.kind)
    try:
        out = kind.apply(patch, manifest.root / patch.path,
                         kinds.Target(root, base_commit, version, mirror))
    except OSError as exc:
        _reset(root)
        return PatchResult(patch.id, patch.kind, "failed", "error", message=f"{exc}")
    result = PatchResult(patch.id, patch.kind, out.status, out.reason, None, out.files,
                         out.message, out.offsets, out.hunk, out.in_the_way)
    if not kind.writes_only_named and out.status in ("applied", "upstream"):
        # What it did not name would be left out of the commit yet ride along in the workdir.
        stray = [p for p in g.dirty_paths(root) if p not in out.files]
        if stray:
            _reset(root)
            shown = ", ".join(stray[:3]) + (f" and {len(stray) - 3} more" if len(stray) > 3 else "")
            return PatchResult(patch.id, patch.kind, "failed", "unsafe-path", None, out.files,
                               f"it changed files it does not name: {shown}")
    if out.status == "applied":
        result.commit = g.commit_all(root, commit_message(patch), [] if out.staged else out.files)
        if result.commit is None:  # wrote bytes identical to what was there
            result.status, result.message = "upstream", "the tree already has this change"
    elif out.status == "failed":
        _reset(root)
    return result


def _reset(root: Path) -> None:
    """Throw away whatever a failed patch left in the scratch tree."""
    g.discard_changes(root, check=False)


def run_series(manifest: Manifest, root: Path, resolved: source.Resolved,
               progress: Progress | None = None, patches: Sequence[Patch] | None = None,
               variant=variants.EVERY) -> ApplyReport:
    """Apply the series to the fresh checkout at ``root`` and run the assertions.  With
    ``variant`` (a name, or None for the default build) the patches outside that build are
    ``skipped``; by default every patch is tried."""
    progress = progress or Progress()
    report = ApplyReport(VllmInfo(resolved.ref, resolved.commit, resolved.version, resolved.source),
                         workdir=None, variant=variant if isinstance(variant, str) else None)
    series = list(manifest.patches if patches is None else patches)
    for patch in series:
        interrupt.check()
        why = variants.left_out(patch, variant)
        if why:
            result = PatchResult(patch.id, patch.kind, "skipped", message=why)
        else:
            result = apply_one(manifest, patch, root, resolved.commit, resolved.version,
                               resolved.repo)
        report.patches.append(result)
        progress.patch(result)
    active = [p for p, r in zip(series, report.patches) if r.status != "skipped"]
    report.verify = assertions.run_assertions(active, assertions.tree_reader(root))
    failed_by = {}
    for a in report.verify:
        if not a.ok:
            failed_by.setdefault(a.patch, a)
    for r in report.patches:
        if r.id in failed_by and r.status != "failed":
            a = failed_by[r.id]
            r.status, r.reason = "failed", "assertion"
            r.message = f"{a.location()}: {a.message}"
    g.tag(root, applied.APPLIED_TAG, g.head(root))
    return report


@contextmanager
def _signals_blocked() -> Iterator[None]:
    """No SIGINT/SIGTERM between the two renames of the swap."""
    sigs = {signal.SIGINT, signal.SIGTERM}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def check_workdir(workdir: Path, discard: bool = False) -> applied.UserWork:
    """Refuse, before any work, a ``workdir`` that ``apply`` may not replace: one that is not
    a patchkit checkout, or one holding a person's work (unless ``discard``).  Returns that
    work (empty for a checkout exactly as patchkit left it, or no checkout at all)."""
    workdir = Path(workdir).absolute()
    if not workdir.exists():
        return applied.UserWork()
    if not applied.is_checkout(workdir):
        if workdir.is_dir() and not any(workdir.iterdir()):
            return applied.UserWork()
        raise UsageError(f"--workdir {workdir} exists and is not a patchkit checkout; "
                         "remove it or name another")
    work = applied.user_work(workdir)
    if work and not discard:
        raise UsageError(f"--workdir {workdir} holds work: {work.describe()}; turn commits into "
                         "patches with 'patchkit export', or give --discard to replace it "
                         "(what is there is saved in a bundle beside it)")
    return work


def apply_series(manifest: Manifest, *, workdir: Path, run: RunSpec | None = None,
                 ref: str | None = None, repos: Sequence[str] | None = None,
                 variant: str | None = None, keep_failed: bool = False,
                 progress: Progress | None = None, cache: Path | None = None,
                 base: source.Base | None = None, discard: bool = False) -> ApplyReport:
    """Check out the pinned vLLM of ``run`` (default: the one ``ref``, ``repos`` and
    ``variant`` make), apply the series of its variant, verify; move into ``workdir`` only if
    all passed.  On failure ``workdir`` is exactly as it was.  ``base`` is the base image that
    the ref ``base`` and the source ``image`` read.  A workdir holding a person's work is
    refused, or with ``discard`` saved, then replaced."""
    run = run or run_spec(manifest, ref=ref, repos=repos, variant=variant)
    variants.check(manifest, run.variant)
    progress = progress or Progress()
    workdir = Path(workdir).absolute()
    check_workdir(workdir, discard)
    cache = cache or cache_dir()
    # Before any download: a workdir that cannot be made is known at once.
    scratch = _scratch_beside(workdir)
    kept = False
    try:
        resolved = source.resolve(run.sources, run.ref, cache, progress.info, base=base)
        tree = scratch / "t"
        report = _checked_out_series(manifest, resolved, tree, progress, run.variant)
        report.workdir = str(workdir)
        if not report.ok:
            if keep_failed:
                kept = True
                report.keep_failed = str(tree)
            return report
        applied.write_report(tree, report)
        with _vanishing_lock(workdir.parent / f".{workdir.name}.patchkit.lock"):
            interrupt.check()  # the last point where stopping leaves the workdir as it was
            # asked again: the person may have committed while the series ran
            work = check_workdir(workdir, discard)
            # once begun, the save and the swap finish: a signal is raised after them, and
            # its line says the workdir was replaced
            with interrupt.deferred(done=f"{workdir} was replaced by the new checkout"):
                if work:
                    report.discarded = _save(workdir, work, progress)
                _swap(tree, workdir, scratch)
        return report
    finally:
        if not kept:
            shutil.rmtree(scratch, ignore_errors=True)


def _checked_out_series(manifest: Manifest, resolved: source.Resolved, tree: Path,
                        progress: Progress, variant: str | None) -> ApplyReport:
    try:
        source.checkout(resolved, tree)
        return run_series(manifest, tree, resolved, progress, variant=variant)
    except CommandError:
        # the checkout borrows the cached repository's objects
        if not g.is_repository(resolved.repo):
            raise SourceError(f"the cached vLLM repository {resolved.repo} went away during "
                              "the run (was the cache deleted?); nothing was changed, run "
                              "again") from None
        raise


def _save(workdir: Path, work: applied.UserWork, progress: Progress) -> dict:
    """Keep the work of a workdir about to be replaced in a bundle beside it, and say where.
    One git cannot read is kept whole instead, moved aside under the same name."""
    if work.unreadable:
        dest = _discard_name(workdir, "")
        os.rename(workdir, dest)
        progress.info(f"--discard: {workdir} is {work.describe()}; moved aside to {dest}")
        return {"what": work.describe(), "moved_to": str(dest), "bundle": None, "refs": [],
                "head": None}
    dest = _discard_name(workdir, ".bundle")
    saved = applied.save_work(workdir, dest)
    progress.info(f"--discard: {work.describe()} of {workdir} {saved.how_to_restore(workdir)}")
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


@contextmanager
def _vanishing_lock(path: Path) -> Iterator[None]:
    """An exclusive lock that leaves no file behind: the holder unlinks the file before it lets
    go, and a waiter that won the lock on a file already unlinked tries again on the new one."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    interrupt.check()
                    time.sleep(0.05)
            try:
                if os.stat(path).st_ino == os.fstat(fd).st_ino:
                    break
            except FileNotFoundError:
                pass
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    try:
        yield
    finally:
        try:
            os.unlink(path)  # still held: no one can have taken it in between
        except FileNotFoundError:
            pass
        finally:
            os.close(fd)


def _scratch_beside(workdir: Path) -> Path:
    """A scratch folder next to ``workdir``: on its file system, so the swap is a rename."""
    parent = workdir.parent
    existing = next((p for p in (parent, *parent.parents) if os.path.lexists(p)), None)
    if existing is not None and not existing.is_dir():
        raise UsageError(f"--workdir {workdir}: {existing} is a file, not a folder")
    prefix = f".{workdir.name}.patchkit-"
    try:
        parent.mkdir(parents=True, exist_ok=True)
        _remove_orphans(parent, prefix)
        scratch = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
        (scratch / "pid").write_text(str(os.getpid()))
        return scratch
    except OSError as exc:
        raise UsageError(f"--workdir {workdir}: cannot write in {parent}: {exc.strerror}") from None


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


def _swap(new: Path, workdir: Path, scratch: Path) -> None:
    with _signals_blocked():
        if workdir.exists() or workdir.is_symlink():
            os.rename(workdir, scratch / "old")
        os.rename(new, workdir)


def needed_paths(manifest: Manifest) -> list[str] | None:
    """Every checkout path the series can read or write, or None when some cannot be named
    (then a checkout must be full, so the engine reports the failure as ``apply`` would)."""
    found: list[str] = []
    for p in manifest.patches:
        try:
            found += kinds.get(p.kind).touched(manifest.root / p.path)
        except (OSError, kinds.KindError):
            return None
        found += [a.file for a in p.verify]
    return sorted(set(found))
