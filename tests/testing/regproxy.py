"""A byte-counting TCP relay in front of a plain-http registry, on 127.0.0.1.

Clients that talk to the relay's address talk to the registry; the relay reads the HTTP
requests going in and counts them: each request's method, path and body bytes, the bytes of
request heads, everything sent.  Tests use it to see that a run uploaded nothing; the push
benchmark uses it to weigh what a push sent against what it had to send.

Given ``refuse`` (``(method, path) -> HTTP status or None``), the relay answers a matching
request itself, with that status and a registry error body (``DENIED`` for 401 and 403,
``UNKNOWN`` otherwise), and closes the connection: a registry that refuses blob uploads, say.
"""

from __future__ import annotations

import socket
import socketserver
import threading
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class Request:
    method: str
    path: str
    body: int = 0


@dataclass
class Traffic:
    requests: list[Request] = field(default_factory=list)
    heads: int = 0      # bytes of request lines, headers and chunk framing
    sent: int = 0       # every byte the clients sent

    @property
    def body(self) -> int:
        return sum(r.body for r in self.requests)

    def writes(self) -> list[Request]:
        return [r for r in self.requests if r.method in ("POST", "PUT", "PATCH", "DELETE")]


class _Meter:
    """Follows one connection's request stream (Content-Length and chunked bodies)."""

    def __init__(self, proxy: RegistryProxy) -> None:
        self.proxy = proxy
        self.t = proxy.traffic
        self.buf = b""
        self.state = "head"
        self.left = 0
        self.current: Request | None = None

    def feed(self, data: bytes) -> None:
        with self.proxy.lock:
            if self.state == "head":
                self.t = self.proxy.traffic  # a request on a kept connection counts as new
            self.t.sent += len(data)
            self.buf += data
            while self._step():
                pass

    def _body(self) -> bool:
        n = min(len(self.buf), self.left)
        if n == 0:
            return False
        self.buf = self.buf[n:]
        self.left -= n
        assert self.current is not None
        self.current.body += n
        return True

    def _step(self) -> bool:
        if self.state == "head":
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return False
            head, self.buf = self.buf[: end + 4], self.buf[end + 4:]
            self.t.heads += len(head)
            lines = head.decode("latin-1").split("\r\n")
            method, path = (lines[0].split(" ") + ["", ""])[:2]
            headers = {k.strip().lower(): v.strip() for k, _, v in
                       (line.partition(":") for line in lines[1:] if line)}
            self.current = Request(method, path)
            self.t.requests.append(self.current)
            status = self.proxy.refuse(method, path) if self.proxy.refuse else None
            if status:
                raise _Refused(status)
            if "chunked" in headers.get("transfer-encoding", "").lower():
                self.state = "size"
            elif int(headers.get("content-length") or 0) > 0:
                self.state, self.left = "body", int(headers["content-length"])
            return True
        if self.state == "body":
            moved = self._body()
            if self.left == 0:
                self.state = "head"
                return True
            return moved
        if self.state == "size":
            end = self.buf.find(b"\r\n")
            if end < 0:
                return False
            size = int(self.buf[:end].split(b";")[0].strip() or b"0", 16)
            self.t.heads += end + 2
            self.buf = self.buf[end + 2:]
            self.state, self.left = ("trailer", 0) if size == 0 else ("chunk", size)
            return True
        if self.state == "chunk":
            moved = self._body()
            if self.left == 0:
                self.state = "chunk-end"
                return True
            return moved
        if self.state == "chunk-end":
            if len(self.buf) < 2:
                return False
            self.t.heads += 2
            self.buf = self.buf[2:]
            self.state = "size"
            return True
        # trailer: lines until an empty one
        end = self.buf.find(b"\r\n")
        if end < 0:
            return False
        line, self.buf = self.buf[:end], self.buf[end + 2:]
        self.t.heads += end + 2
        if not line:
            self.state = "head"
        return True


class RegistryProxy:
    """``with RegistryProxy("127.0.0.1:5055") as p: ... p.addr ... p.traffic``."""

    def __init__(self, upstream: str,
                 refuse: Callable[[str, str], int | None] | None = None) -> None:
        host, _, port = upstream.rpartition(":")
        self.upstream = (host, int(port))
        self.refuse = refuse
        self.lock = threading.Lock()
        self.traffic = Traffic()
        proxy = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                try:
                    up = socket.create_connection(proxy.upstream)
                except OSError:
                    return
                meter = _Meter(proxy)
                back = threading.Thread(target=_pipe, args=(up, self.request, None), daemon=True)
                back.start()
                _pipe(self.request, up, meter)
                back.join()
                up.close()

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.addr = f"127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def reset(self) -> Traffic:
        """Starts a new count; returns the one that ends."""
        with self.lock:
            old, self.traffic = self.traffic, Traffic()
        return old

    def __enter__(self) -> RegistryProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


class _Refused(Exception):
    def __init__(self, status: int) -> None:
        self.status = status


def _refusal(status: int) -> bytes:
    code = "DENIED" if status in (401, 403) else "UNKNOWN"
    body = ('{"errors":[{"code":"%s","message":"refused by the test relay"}]}' % code).encode()
    return (f"HTTP/1.1 {status} Refused\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body


def _pipe(src: socket.socket, dst: socket.socket, meter: _Meter | None) -> None:
    try:
        while True:
            data = src.recv(1 << 16)
            if not data:
                break
            if meter is not None:
                meter.feed(data)
            dst.sendall(data)
    except _Refused as refused:
        try:
            src.sendall(_refusal(refused.status))
            src.shutdown(socket.SHUT_RDWR)
            dst.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass
