"""An engine behind ssh: the system's ssh client, one session kept open for every request.

The far side runs ``docker system dial-stdio``; the HTTP connections of the SDK run over that
byte stream (:class:`SshStream`), request after request, where the SDK's own ssh transport
opens a session per request.  The system's ssh is used so that ``~/.ssh/config`` and agents
apply.

Every session patchkit opens on one node goes over one ssh connection (:class:`SshLink`): the
API's session is its master (OpenSSH's ``ControlMaster``, on a socket in a private folder), and
the sessions after it (a ``docker load``, a ``docker save``) open over it, without a connection,
key exchange and authentication of their own.  The link starts as soon as the node is named,
beside whatever else the run does first.  Where the node refuses a second session on the
connection (sshd's ``MaxSessions``), or the master is gone, ssh opens a connection of its own.
Nothing outlives the link: its master is the API's session, which ends when the engine is let
go (or when patchkit ends, as its input closes), and the folder goes with it.
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
import tempfile
import threading
import weakref
from urllib.parse import urlsplit

from patchkit.errors import CommandError, ImageError
from patchkit.process import run, spawn


def _ssh_dest(url) -> str:
    return f"{url.username}@{url.hostname}" if url.username else url.hostname


def ssh_port(host: str, timeout: float) -> tuple[str, int]:
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


def ssh_argv(dest: str, port: int, timeout: float, options: list[str] = ()) -> list[str]:
    """The system's ssh to ``dest``, ready for the command to run there; it gives up
    connecting after ``timeout`` seconds (the engine's)."""
    wait = max(1, math.ceil(timeout))  # ssh takes whole seconds
    return ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={wait}",
            "-o", "ServerAliveInterval=15", *options, "-p", str(port), "--", dest]


# ssh makes the master's socket as PATH plus a suffix of 17 characters first, and a unix
# socket's path holds 107 bytes
_SOCKET_ROOM = 80


class SshLink:
    """One ssh connection to a node, shared by every session patchkit opens there: the first
    API session (:meth:`session`) is its master, started at once; :meth:`argv` is ssh for the
    sessions after it (``docker load``, ``docker save``).  :meth:`close` ends the sessions
    and removes the socket's folder."""

    def __init__(self, dest: str, port: int, timeout: float) -> None:
        self.dest, self.port, self.timeout = dest, port, timeout
        self._folder = _private_folder()
        self._socket = os.path.join(self._folder, "master") if self._folder else None
        if self._folder is not None:   # an engine never let go: its folder goes at the end
            weakref.finalize(self, shutil.rmtree, self._folder, True)
        self._lock = threading.Lock()
        self._streams: list[SshStream] = []
        self._first: SshStream | None = self._open()

    def _options(self, master: bool) -> list[str]:
        if self._socket is None:   # no folder fit for a socket: each session connects
            return []
        # the user's own ControlMaster or ControlPersist would leave a master running
        return ["-o", f"ControlMaster={'auto' if master else 'no'}",
                "-o", f"ControlPath={self._socket}", "-o", "ControlPersist=no"]

    def _open(self) -> SshStream:
        stream = SshStream(self.dest, self.port, self.timeout, self._options(master=True))
        with self._lock:
            self._streams.append(stream)
        return stream

    def session(self, timeout: float | None) -> SshStream:
        """A session running ``docker system dial-stdio``: the master, started when the link
        was made, the first time; a session over it after that."""
        with self._lock:
            first, self._first = self._first, None
        if first is not None:
            first.settimeout(timeout)
            return first
        stream = self._open()
        stream.settimeout(timeout)
        return stream

    def argv(self) -> list[str]:
        """ssh for a session over the master (its own connection when the master is gone)."""
        return ssh_argv(self.dest, self.port, self.timeout, self._options(master=False))

    def complaint(self, wait: float = 2.0) -> str:
        """What ssh said last on a session of the API, once it has ended (its master's words
        are those of the connection: a session over it that broke says nothing itself)."""
        with self._lock:
            streams = list(self._streams)
        return next((c for c in (s.complaint(wait) for s in reversed(streams)) if c), "")

    def close(self) -> None:
        with self._lock:
            streams, self._streams, self._first = self._streams, [], None
        for stream in reversed(streams):   # the master last: sessions over it end first
            stream.close()
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)


def _private_folder() -> str | None:
    """A folder only this user reaches, short enough for the master's socket; None when the
    temporary folders are not."""
    for where in (None, "/tmp"):
        try:
            folder = tempfile.mkdtemp(prefix="pk-ssh-", dir=where)
        except OSError:
            continue
        if len(folder.encode()) < _SOCKET_ROOM and not any(c in folder for c in ' \t"%\\'):
            return folder   # ssh reads % as a token and a blank or quote as the value's end
        shutil.rmtree(folder, ignore_errors=True)
    return None


class SshStream:
    """One ssh session to a node running ``docker system dial-stdio`` there: the byte stream
    an HTTP connection to the node's engine runs over, kept open for request after request
    (the SDK's own ssh transport opens a session per request: a key exchange, some 4 KB and a
    round trip or more each).  Every read and write waits at most the timeout urllib3 sets;
    what ssh says on stderr is kept, for the one line of an error."""

    def __init__(self, dest: str, port: int, timeout: float,
                 options: list[str] = ()) -> None:
        self.proc = spawn([*ssh_argv(dest, port, timeout, options),
                           "docker", "system", "dial-stdio"])
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

    def complaint(self, wait: float = 2.0) -> str:
        """The last line ssh (or the node's shell) wrote on stderr, once it has ended (within
        ``wait`` seconds)."""
        try:
            self.proc.wait(timeout=wait)
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
