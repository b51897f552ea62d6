"""The Docker SDK, imported when an engine is asked, and its failures in one line.

Every call patchkit makes of the SDK runs inside :func:`border`, which turns an SDK or transport
failure into an :class:`~patchkit.errors.ImageError` naming what was being done, in the words
of the engine or of the operating system ("no such socket", "no answer within 30 s").
"""

from __future__ import annotations

import errno as errno_
import functools
import re
import socket
from contextlib import contextmanager
from typing import Iterator

from patchkit.engines.sshlink import SshLink
from patchkit.errors import ImageError
from patchkit.timeouts import shown as shown_seconds


def sdk():
    """The ``docker`` package, imported at the first call: a run that asks no engine never
    imports it."""
    try:
        import docker
        import docker.errors
    except ImportError as exc:  # pragma: no cover - a dependency of the package
        raise ImageError(f"the docker SDK is not installed ({exc})") from exc
    return docker


def explain(exc: BaseException) -> str:
    """An SDK or transport failure in one line: the engine's own words, else the system's."""
    docker = sdk()
    if isinstance(exc, docker.errors.APIError):
        text = exc.explanation or str(exc)
        if isinstance(text, bytes):
            text = text.decode(errors="replace")
        return " ".join(str(text).split())
    return _reason(exc) or " ".join(str(exc).split()) or type(exc).__name__


_OS_WORDS = {errno_.ENOENT: "no such socket", errno_.ECONNREFUSED: "connection refused",
             errno_.EACCES: "permission denied", errno_.ECONNRESET: "the connection was reset",
             errno_.EPIPE: "the connection was cut", errno_.EHOSTUNREACH: "host unreachable",
             errno_.ENETUNREACH: "network unreachable", errno_.ENOTSOCK: "not a socket"}


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and what it wraps: causes, contexts, and exceptions among its args (requests and
    urllib3 carry the OS error there, inside a tuple's repr otherwise)."""
    seen: set[int] = set()
    todo: list[object] = [exc]
    while todo:
        e = todo.pop(0)
        if not isinstance(e, BaseException) or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [e.__cause__, e.__context__, getattr(e, "reason", None), *e.args]


def _reason(exc: BaseException) -> str:
    """A transport failure in plain words ("no such socket", "no answer within 30 s"), or ""
    when it is none patchkit knows."""
    import requests
    import urllib3.exceptions

    found = list(_causes(exc))
    for e in found:  # first: urllib3 words a refused connection as a kind of timeout
        if isinstance(e, socket.gaierror):
            return "cannot resolve the host name"
        if isinstance(e, OSError) and e.errno in _OS_WORDS:
            return _OS_WORDS[e.errno]
    for e in found:
        if isinstance(e, (requests.exceptions.Timeout, urllib3.exceptions.TimeoutError,
                          socket.timeout, TimeoutError)):
            said = re.search(r"timeout=([0-9.]+)", str(e))
            return (f"no answer within {shown_seconds(float(said.group(1)))}" if said
                    else "no answer in time")
    for e in found:
        if isinstance(e, OSError) and e.strerror:
            return e.strerror[:1].lower() + e.strerror[1:]
    return ""


@contextmanager
def border(what: str) -> Iterator[None]:
    """SDK and transport failures -> one-line ImageError naming what was being done."""
    docker = sdk()
    import requests

    try:
        yield
    except ImageError:
        raise
    except docker.errors.NotFound as exc:
        raise ImageError(f"{what}: not found ({explain(exc)})") from exc
    except (docker.errors.DockerException, requests.exceptions.RequestException, OSError) as exc:
        raise ImageError(f"{what}: {explain(exc)}") from exc


@functools.cache
def ssh_adapter_class():
    """The SDK's ssh adapter, made to keep its connections: one pool for the engine, whose
    connections run over the sessions of one :class:`SshLink` (the first of them started
    before the SDK asked for it) and are used again request after request (HTTP keep-alive
    through ``dial-stdio``)."""
    from docker.transport.sshconn import SSHConnection, SSHConnectionPool, SSHHTTPAdapter

    class Connection(SSHConnection):
        def connect(self) -> None:
            self.sock = self.link.session(self.timeout)

    class Pool(SSHConnectionPool):
        def _get_conn(self, timeout=None):
            conn = super()._get_conn(timeout)
            if conn.sock is not None and not conn.is_connected:
                conn.close()   # its ssh has ended: the request opens a new session
            return conn

        def _new_conn(self):
            conn = Connection(None, self.timeout, self.ssh_host)
            conn.link = self.link
            return conn

    class Adapter(SSHHTTPAdapter):
        def __init__(self, link: SshLink, timeout: float) -> None:
            super().__init__(f"ssh://{link.dest}:{link.port}", timeout, shell_out=True)
            self.link = link
            self.pool = Pool(None, timeout, self.max_pool_size, (link.dest, link.port))
            self.pool.link = link

        def get_connection(self, url, proxies=None):
            return self.pool

        def complaint(self) -> str:
            return self.link.complaint()

        def close(self) -> None:
            super().close()
            self.pool.close()
            self.link.close()

    return Adapter
