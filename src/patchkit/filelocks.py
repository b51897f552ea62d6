"""The file locks patchkit takes against another run of itself.

A cache mirror, a cached release, a workdir being replaced, a rebase in progress: each is
guarded by an exclusive ``flock`` on a file beside it.  The kernel lets go of a lock when its
holder ends, so a lock that is held is held by a live run.  Another run's lock is waited for,
said once, and given up after ``WAIT`` seconds with one line naming it: every wait has a
deadline.  The deadline is long, because the other run may be cloning a mirror or building a
release from PyPI, which take minutes on a slow link; a signal ends the wait at once.

``held(path, what)`` leaves the locked file behind, as a cache's locked files stay.  ``held(...,
vanish=True)`` removes it before letting go (a workdir's lock must not litter the user's
folder); a waiter that then wins the lock on the removed file tries again on the new one.

A run never waits on itself as on another run: two threads of one run (``rebase-check``
resolving its targets side by side) take a path in turn through a lock of the process first,
quietly, and only then the file lock, which then only another run can hold.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from patchkit import interrupt
from patchkit.errors import PatchkitError
from patchkit.timeouts import shown

WAIT = 600.0  # seconds another run's lock is waited for
POLL = 0.05
SAY_AFTER = 1.0  # a wait shorter than this is not worth a line


class BusyError(PatchkitError):
    """Another patchkit run held a lock for longer than ``WAIT``."""


class LockError(PatchkitError):
    """A lock file in a bad state (a folder in its place, unreadable): named, for the user to
    remove, since no run can tell whether another one is using it."""

    exit_code = 2


_ours: dict[str, threading.Lock] = {}   # path -> the lock this process's threads take it by
_table = threading.Lock()


def _own_lock(path: Path) -> threading.Lock:
    with _table:
        return _ours.setdefault(os.path.abspath(path), threading.Lock())


def _forget_ours() -> None:
    """A forked child holds none of its parent's locks (the thread that held one is not in it)."""
    global _table
    _ours.clear()
    _table = threading.Lock()


os.register_at_fork(after_in_child=_forget_ours)


def _take_own(lock: threading.Lock, path: Path, what: str, deadline: float) -> None:
    """This run's other thread lets go of ``path`` when it is done with it: no line, the
    same deadline."""
    while not lock.acquire(timeout=POLL):
        interrupt.check()
        if time.monotonic() >= deadline:
            raise BusyError(f"{what}: this run has held {path} for more than "
                            f"{shown(WAIT)} (another of its threads, or the same one twice)")


@contextmanager
def held(path: Path | str, what: str, log: Callable[[str], None] = lambda m: None, *,
         vanish: bool = False) -> Iterator[None]:
    """Holds the file lock on ``path`` (guarding ``what``, as messages name it) for the block."""
    path = Path(path)
    deadline = time.monotonic() + WAIT
    own = _own_lock(path)
    _take_own(own, path, what, deadline)
    try:
        with _file_lock(path, what, log, deadline, vanish):
            yield
    finally:
        own.release()


@contextmanager
def _file_lock(path: Path, what: str, log: Callable[[str], None], deadline: float,
               vanish: bool) -> Iterator[None]:
    said = False
    while True:
        fd = _opened(path, what)
        try:
            said = _wait(fd, path, what, log, deadline, said)
            if not vanish or _still_named(path, fd):
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # won on a file its holder removed: take the new one
    try:
        os.utime(fd)   # when what it guards was last used (`patchkit cache` shows it)
    except OSError:
        pass
    try:
        yield
    finally:
        try:
            if vanish:
                os.unlink(path)  # still held: no one can have taken it in between
        except FileNotFoundError:
            pass
        finally:
            os.close(fd)


def _opened(path: Path, what: str) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        state = "is a folder, not a lock file" if os.path.isdir(path) else \
            f"cannot be opened ({exc.strerror})"
        raise LockError(f"{what}: the lock {path} {state}; remove it when no patchkit run is "
                        "going") from None


def _wait(fd: int, path: Path, what: str, log: Callable[[str], None], deadline: float,
          said: bool) -> bool:
    """Takes the lock on ``fd``, polling until ``deadline``; True once the wait was said."""
    start = time.monotonic()
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return said
        except BlockingIOError:
            pass
        interrupt.check()
        now = time.monotonic()
        if now >= deadline:
            raise BusyError(f"{what}: another patchkit run has held {path} for more than "
                           f"{shown(WAIT)}; run again when it has ended")
        if not said and now - start >= SAY_AFTER:
            log(f"waiting for another patchkit run that holds {what} ({path}), at most "
                f"{shown(WAIT)}")
            said = True
        time.sleep(POLL)


def _still_named(path: Path, fd: int) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False
