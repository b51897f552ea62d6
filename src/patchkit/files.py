"""Files replaced whole: an atomic write that keeps the mode, a discard by rename."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


def discard(path: Path) -> None:
    """Move ``path`` (a file or a folder) out of the way at once, by a rename; then delete it."""
    trash = Path(tempfile.mkdtemp(prefix=path.name + ".broken.", dir=path.parent))
    os.rename(path, trash / "x")
    shutil.rmtree(trash, ignore_errors=True)


def write_if_changed(path: Path, data: bytes) -> bool:
    """Replace ``path`` with ``data`` atomically, keeping its mode; False when already equal."""
    try:
        if path.read_bytes() == data:
            return False
        mode = path.stat().st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o644
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return True
