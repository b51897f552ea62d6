"""The one subprocess wrapper, and the cache location."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from patchkit import interrupt
from patchkit.errors import CommandError


def run(cmd: Sequence[str], *, cwd: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None, check: bool = True,
        input: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``cmd``; on a non-zero exit (with ``check``) raise CommandError with its output."""
    full_env = None
    if env is not None:
        full_env = dict(os.environ)
        full_env.update(env)
    try:
        proc = subprocess.run(list(cmd), cwd=cwd, env=full_env, input=input, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              stdin=None if input is not None else subprocess.DEVNULL)
    except FileNotFoundError as exc:
        raise CommandError(list(cmd), 127, f"{cmd[0]}: not found ({exc})") from exc
    interrupt.check()  # a child stopped by ^C is an interruption, not a failed command
    if check and proc.returncode != 0:
        raise CommandError(list(cmd), proc.returncode, (proc.stdout or "") + (proc.stderr or ""))
    return proc


def cache_dir() -> Path:
    """``$PATCHKIT_CACHE_DIR``, else the user cache dir (``~/.cache/patchkit``)."""
    env = os.environ.get("PATCHKIT_CACHE_DIR")
    if env:
        return Path(env).expanduser().absolute()
    import platformdirs

    return Path(platformdirs.user_cache_dir("patchkit", appauthor=False))
