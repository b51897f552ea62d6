"""The one subprocess wrapper, for the tools patchkit drives that have no library (``pip``,
``patch``, ``skopeo``, ``ssh``, ``docker buildx``)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Mapping, Sequence

from patchkit import interrupt
from patchkit.errors import CommandError


def run(cmd: Sequence[str], *, cwd: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None, check: bool = True,
        input: str | None = None, text: bool = True, timeout: float | None = None,
        on_line: Callable[[str], None] | None = None) -> subprocess.CompletedProcess:
    """Run ``cmd``; on a non-zero exit (with ``check``) raise CommandError with its output.
    With ``text`` false, stdout and stderr are the bytes the command wrote.  A command that
    runs past ``timeout`` seconds, or is interrupted, is killed; the timeout is a CommandError
    whose ``timeout`` is set.  With ``on_line``, stderr joins stdout and each line goes to
    ``on_line`` as it comes; the error's output is then the last lines only."""
    full_env = None
    if env is not None:
        full_env = dict(os.environ)
        full_env.update(env)
    try:
        if on_line is not None:
            proc = _streamed(cmd, cwd, full_env, on_line)
        else:
            proc = subprocess.run(list(cmd), cwd=cwd, env=full_env, input=input, text=text,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  stdin=None if input is not None else subprocess.DEVNULL,
                                  timeout=timeout)  # run() kills the child on any exception
    except FileNotFoundError as exc:
        raise CommandError(list(cmd), 127, f"{cmd[0]}: not found ({exc})") from exc
    except subprocess.TimeoutExpired as exc:
        out = b"".join(o if isinstance(o, bytes) else (o or "").encode()
                       for o in (exc.stdout, exc.stderr))
        raise CommandError(list(cmd), -9, out.decode(errors="replace"), timeout) from None
    interrupt.check()  # a child stopped by ^C is an interruption, not a failed command
    if check and proc.returncode != 0:
        out, err = ((o.decode(errors="replace") if isinstance(o, bytes) else o or "")
                    for o in (proc.stdout, proc.stderr))
        raise CommandError(list(cmd), proc.returncode, out + err)
    return proc


def _streamed(cmd: Sequence[str], cwd, env, on_line: Callable[[str], None],
              keep: int = 20) -> subprocess.CompletedProcess:
    """``cmd`` with its lines handed on as they come; the last ``keep`` lines kept."""
    tail: list[str] = []
    with subprocess.Popen(list(cmd), cwd=cwd, env=env, text=True, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as proc:
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                on_line(line.rstrip("\n"))
                tail = (tail + [line])[-keep:]
        except BaseException:
            proc.kill()  # an interrupted build must not go on behind patchkit's back
            raise
    return subprocess.CompletedProcess(list(cmd), proc.returncode, "".join(tail), "")
