"""The one subprocess wrapper, and the cache location."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from patchkit import interrupt
from patchkit.errors import CommandError, UsageError


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


def log_file() -> Path:
    """Where an unexpected error's traceback goes: the cache folder, else /tmp."""
    try:
        d = cache_dir()
        d.mkdir(parents=True, exist_ok=True)
        return d / "patchkit.log"
    except OSError:
        return Path("/tmp/patchkit.log")
