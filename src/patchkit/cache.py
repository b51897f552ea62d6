"""The cache folder (``$PATCHKIT_CACHE_DIR``, else ``~/.cache/patchkit``), its sub-folders, the
log file an unexpected error's traceback goes to, and the lock that keeps ``cache prune`` off
what a run is using.

Every run of the command line holds ``in-use.lock`` shared for as long as it runs (the kernel
lets go when it ends, ``kill -9`` included); ``cache prune`` takes it exclusive, so it removes
nothing while any run may be using the cache."""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from patchkit.errors import UsageError, clipped
from patchkit.files import discard

T = TypeVar("T")


def cache_dir() -> Path:
    """``$PATCHKIT_CACHE_DIR``, else the user cache dir (``~/.cache/patchkit``)."""
    env = os.environ.get("PATCHKIT_CACHE_DIR")
    if env:
        return Path(env).expanduser().absolute()
    import platformdirs

    return Path(platformdirs.user_cache_dir("patchkit", appauthor=False))


def cache_subdir(cache: Path, *parts: str) -> Path:
    """``cache/parts...``, created; a cache that cannot be written is the user's to fix."""
    path = cache.joinpath(*parts)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"the cache {cache} (PATCHKIT_CACHE_DIR) cannot be written: {path}: "
                         f"{exc.strerror}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"the cache {cache} (PATCHKIT_CACHE_DIR) cannot be written: {path}: "
                         "Permission denied")
    if _marking:
        hold_shared(cache)
    return path


def log_file() -> Path:
    """Where an unexpected error's traceback goes: the cache folder, else /tmp."""
    try:
        d = cache_dir()
        d.mkdir(parents=True, exist_ok=True)
        return d / "patchkit.log"
    except OSError:
        return Path("/tmp/patchkit.log")


IN_USE = "in-use.lock"
PRUNE_WAIT = 60.0          # seconds a run waits for a prune to finish before going on
_held: int | None = None   # this process's descriptor of the in-use lock
_marking = False           # a run of the command line: mark the cache in use at first touch


def mark_when_used() -> None:
    """From now on, the first use of the cache marks it in use until this process ends."""
    global _marking
    _marking = True


def hold_shared(cache: Path | None = None) -> None:
    """Mark the cache as in use by this process until it ends.  A cache that cannot be
    written is left unmarked: the run will say so when it needs the cache."""
    global _held
    if _held is not None:
        return
    try:
        d = cache or cache_dir()
        d.mkdir(parents=True, exist_ok=True)
        fd = os.open(d / IN_USE, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return
    deadline = time.monotonic() + PRUNE_WAIT
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:   # go on: what it uses has its own locks too
                os.close(fd)
                return
            time.sleep(0.05)   # a prune is removing entries: that is brief
        except OSError:
            os.close(fd)
            return
    _held = fd


def hold_exclusive(cache: Path, wait: float) -> bool:
    """Take the cache for this process alone, waiting at most ``wait`` seconds for the runs
    using it to end; False when they did not.  Held until the process ends."""
    global _held
    from patchkit import interrupt

    cache.mkdir(parents=True, exist_ok=True)
    try:
        fd = _held if _held is not None else os.open(cache / IN_USE, os.O_RDWR | os.O_CREAT,
                                                     0o644)
    except OSError as exc:
        state = "is a folder, not a lock file" if (cache / IN_USE).is_dir() else \
            f"cannot be opened ({exc.strerror})"
        raise UsageError(f"the lock {cache / IN_USE} {state}; remove it when no patchkit run "
                         "is going") from None
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            _held = fd
            return True
        except BlockingIOError:
            pass
        interrupt.check()
        if time.monotonic() >= deadline:
            if fd != _held:
                os.close(fd)
            return False
        time.sleep(0.05)


KEPT_LIMIT = 64 << 20   # bytes of one kept JSON file: a larger one is not ours


def kept_json(path: Path, read: Callable[[Any], T] = lambda value: value,
              limit: int = KEPT_LIMIT) -> T | None:
    """The JSON value kept in the cache at ``path``, as ``read`` takes it (``read`` raises
    KeyError, TypeError, ValueError, AttributeError or IndexError for a value that is not of
    the shape it expects), or None: nothing kept there, or what is there does not read as
    expected.  Such an entry (not JSON, of another shape, too large, a folder in its place)
    is removed, for the caller to make it again, and ``-v`` says so: the one reader of
    every JSON file the cache keeps, so that no damaged entry fails a run, on this run or
    on any later one."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(limit + 1)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:   # a folder in its place, unreadable
        _drop(path, exc.strerror or str(exc))
        return None
    if len(data) > limit:
        _drop(path, f"larger than {limit >> 20} MiB")
        return None
    try:
        return read(json.loads(data))
    except (ValueError, TypeError, KeyError, AttributeError, IndexError, RecursionError) as exc:
        _drop(path, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
        return None


def _drop(path: Path, why: str) -> None:
    from patchkit import progress

    try:
        discard(path)
    except OSError as exc:
        progress.detail(f"the cache entry {path} does not read as expected ({clipped(why)}) "
                        f"and cannot be removed ({exc.strerror}); it is made again each run")
        return
    progress.detail(f"dropped the cache entry {path}: it does not read as expected "
                    f"({clipped(why)}); it is made again")
