"""An engine behind ssh: the system's ssh client, one session kept open for every request.

The far side runs ``docker system dial-stdio``; the HTTP connections of the SDK run over that
byte stream (:class:`SshStream`), request after request, where the SDK's own ssh transport
opens a session per request.  The system's ssh is used so that ``~/.ssh/config`` and agents
apply.
"""

from __future__ import annotations

import errno as errno_
import fcntl
import io
import math
import os
import select
import shutil
import socket
import threading
from urllib.parse import urlsplit

from patchkit.errors import CommandError, ImageError
from patchkit.process import run, spawn
from patchkit.timeouts import DEFAULT_TIMEOUT


def _ssh_dest(url) -> str:
    return f"{url.username}@{url.hostname}" if url.username else url.hostname


def ssh_port(host: str, timeout: float = DEFAULT_TIMEOUT) -> tuple[str, int]:
    """The ssh destination (``[user@]host``) and port of an ssh:// address: the URL's port,
    else the one the system's ssh would take (``ssh -G``, so ~/.ssh/config applies; the SDK
    would pass port 22, overriding it)."""
    if not shutil.which("ssh"):
        raise ImageError(f"{host}: an ssh:// engine needs the ssh client, which is not installed")
    url = urlsplit(host)
    dest = _ssh_dest(url)
    if url.port is not None:
        return dest, url.port
    try:
        shown = run(["ssh", "-G", dest], check=False, timeout=max(1, math.ceil(timeout)))
    except CommandError as exc:
        raise ImageError(f"no Docker Engine answers at {host}: {exc.output.strip()}") from None
    return dest, next((int(line.split()[1]) for line in shown.stdout.splitlines()
                       if line.startswith("port ") and line.split()[1].isdigit()), 22)


def ssh_argv(dest: str, port: int, timeout: float | None) -> list[str]:
    """The system's ssh to ``dest``, ready for the command to run there."""
    wait = max(1, math.ceil(timeout or DEFAULT_TIMEOUT))  # ssh takes whole seconds
    return ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={wait}",
            "-o", "ServerAliveInterval=15", "-p", str(port), "--", dest]


class SshStream:
    """One ssh session to a node running ``docker system dial-stdio`` there: the byte stream
    an HTTP connection to the node's engine runs over, kept open for request after request
    (the SDK's own ssh transport opens a session per request: a key exchange, some 4 KB and a
    round trip or more each).  Every read and write waits at most the timeout urllib3 sets;
    what ssh says on stderr is kept, for the one line of an error."""

    def __init__(self, dest: str, port: int, timeout: float | None) -> None:
        self.proc = spawn([*ssh_argv(dest, port, timeout), "docker", "system", "dial-stdio"])
        self.timeout = timeout
        self._in, self._out = self.proc.stdin.fileno(), self.proc.stdout.fileno()
        for fd in (self._in, self._out):
            os.set_blocking(fd, False)
            try:   # fewer, larger hand-overs between this process and ssh
                fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, 1 << 20)
            except (OSError, AttributeError):
                pass   # a smaller pipe works too
        self._said = bytearray()
        threading.Thread(target=self._drain_stderr, daemon=True).start()
        self._reader = io.BufferedReader(_PipeReader(self), 1 << 16)

    def _drain_stderr(self) -> None:
        try:
            while chunk := self.proc.stderr.read1(4096):
                self._said = (self._said + chunk)[-4096:]
        except (OSError, ValueError):
            pass

    def complaint(self) -> str:
        """The last line ssh (or the node's shell) wrote on stderr, once it has ended."""
        try:
            self.proc.wait(timeout=2)
        except Exception:
            return ""
        lines = [t.strip() for t in self._said.decode(errors="replace").splitlines()]
        said = [t for t in lines if t]
        return said[-1] if said else (f"ssh exited with {self.proc.returncode}"
                                      if self.proc.returncode else "")

    def settimeout(self, timeout: float | None) -> None:
        self.timeout = timeout

    def gettimeout(self) -> float | None:
        return self.timeout

    def fileno(self) -> int:
        return self._out   # readable between responses only when ssh has ended

    def _wait(self, fd: int, writing: bool) -> None:
        ready = select.select([] if writing else [fd], [fd] if writing else [], [], self.timeout)
        if not any(ready):
            raise socket.timeout(f"timed out (timeout={self.timeout})")

    def sendall(self, data) -> None:
        view = memoryview(data).cast("B")
        while view:
            self._wait(self._in, True)
            try:
                view = view[os.write(self._in, view):]
            except BlockingIOError:
                continue
            except BrokenPipeError:
                raise ConnectionResetError(errno_.EPIPE, "ssh to the node has ended") from None

    send = sendall

    def recv_into(self, buf) -> int:
        while True:
            self._wait(self._out, False)
            try:
                return os.readv(self._out, [buf])
            except BlockingIOError:
                continue

    def makefile(self, mode: str = "rb", *args, **kwargs):
        # one buffer for every response, as on one socket, which closing a response leaves
        return _Unclosed(self._reader)

    def close(self) -> None:
        # ssh first: closing its stderr waits for the thread reading it, which waits for ssh
        try:
            self.proc.terminate()
            self.proc.wait(timeout=2)
        except Exception:  # it is gone, or going: nothing of it is needed any more
            self.proc.kill()
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                pipe.close()
            except OSError:
                pass


class _Unclosed:
    """A response's view of the stream's reader: closing it leaves the stream open."""

    def __init__(self, reader: io.BufferedReader) -> None:
        self._reader, self.closed = reader, False

    def __getattr__(self, name: str):
        return getattr(self._reader, name)

    def close(self) -> None:
        self.closed = True


class _PipeReader(io.RawIOBase):
    def __init__(self, stream: SshStream) -> None:
        self.stream = stream

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        return self.stream.recv_into(buf)
