"""The cache folder (``$PATCHKIT_CACHE_DIR``, else ``~/.cache/patchkit``), its sub-folders, and
the log file an unexpected error's traceback goes to."""

from __future__ import annotations

import os
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
    return path


def log_file() -> Path:
    """Where an unexpected error's traceback goes: the cache folder, else /tmp."""
    try:
        d = cache_dir()
        d.mkdir(parents=True, exist_ok=True)
        return d / "patchkit.log"
    except OSError:
        return Path("/tmp/patchkit.log")
