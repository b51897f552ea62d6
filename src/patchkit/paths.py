"""Path safety: every path a patch names is checked before anything is written."""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from patchkit.errors import clipped


class UnsafePathError(Exception):
    """A path that is absolute, climbs out with ``..``, touches ``.git`` or goes through a link."""


NAME_MAX = 255    # bytes in one name of a path (Linux's NAME_MAX)
PATH_MAX = 4096   # bytes in a whole path (Linux's PATH_MAX)


def check_relative(rel: str) -> PurePosixPath:
    """Validate a patch-relative path lexically; return it normalised."""
    if not rel or "\0" in rel:
        raise UnsafePathError(f"empty or NUL-bearing path {clipped(rel)!r}")
    if len(rel.encode("utf-8", "surrogateescape")) > PATH_MAX:
        raise UnsafePathError(f"path {clipped(rel)!r} is longer than {PATH_MAX} bytes")
    long = next((part for part in rel.split("/")
                 if len(part.encode("utf-8", "surrogateescape")) > NAME_MAX), None)
    if long is not None:
        raise UnsafePathError(f"path {clipped(rel)!r} has a name longer than {NAME_MAX} bytes "
                              f"({clipped(long)!r})")
    if rel.startswith("/") or (len(rel) > 1 and rel[1] == ":"):
        raise UnsafePathError(f"absolute path {rel!r}")
    pure = PurePosixPath(rel)
    if any(part == ".." for part in pure.parts):
        raise UnsafePathError(f"path {rel!r} climbs out of the tree with '..'")
    if pure.parts and pure.parts[0] == ".git":
        raise UnsafePathError(f"path {rel!r} is inside .git")
    return pure


def safe_join(root: Path, rel: str) -> Path:
    """``root / rel`` after checking that no existing component of it is a symlink."""
    pure = check_relative(rel)
    current = root
    for part in pure.parts:
        if part in ("", "."):
            continue
        current = current / part
        if current.is_symlink():
            raise UnsafePathError(f"path {rel!r} goes through the symlink {current.relative_to(root)}")
    return current


def is_within(root: Path, target: str | os.PathLike[str]) -> bool:
    root_r = os.path.realpath(root)
    return os.path.commonpath([root_r, os.path.realpath(target)]) == root_r
