"""The one subprocess wrapper, for the tools patchkit drives that have no library (``pip``,
``patch``, ``skopeo``)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence

from patchkit import interrupt
from patchkit.errors import CommandError


def run(cmd: Sequence[str], *, cwd: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None, check: bool = True,
        input: str | None = None, text: bool = True) -> subprocess.CompletedProcess:
    """Run ``cmd``; on a non-zero exit (with ``check``) raise CommandError with its output.
    With ``text`` false, stdout and stderr are the bytes the command wrote."""
    full_env = None
    if env is not None:
        full_env = dict(os.environ)
        full_env.update(env)
    try:
        proc = subprocess.run(list(cmd), cwd=cwd, env=full_env, input=input, text=text,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              stdin=None if input is not None else subprocess.DEVNULL)
    except FileNotFoundError as exc:
        raise CommandError(list(cmd), 127, f"{cmd[0]}: not found ({exc})") from exc
    interrupt.check()  # a child stopped by ^C is an interruption, not a failed command
    if check and proc.returncode != 0:
        out, err = ((o.decode(errors="replace") if isinstance(o, bytes) else o or "")
                    for o in (proc.stdout, proc.stderr))
        raise CommandError(list(cmd), proc.returncode, out + err)
    return proc
