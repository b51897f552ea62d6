"""The cache folder (``$PATCHKIT_CACHE_DIR``, else ``~/.cache/patchkit``), its sub-folders, the
log file an unexpected error's traceback goes to, and the lock that keeps ``cache prune`` off
what a run is using.

Every run of the command line holds ``in-use.lock`` shared for as long as it runs (the kernel
lets go when it ends, ``kill -9`` included); ``cache prune`` takes it exclusive, so it removes
nothing while any run may be using the cache."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from patchkit.errors import UsageError


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
    fd = _held if _held is not None else os.open(cache / IN_USE, os.O_RDWR | os.O_CREAT, 0o644)
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
