"""Peers that misbehave on 127.0.0.1, for the deadline tests: one that accepts and never says a
word, and HTTP servers that trickle their answer a byte at a time."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def _serving(handle) -> Iterator[int]:
    """A listener on 127.0.0.1 whose every connection goes to ``handle(conn, stop)`` in a
    thread; yields the port, and on exit stops the handlers and closes everything."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.settimeout(0.1)
    stop = threading.Event()
    conns: list[socket.socket] = []

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            conns.append(conn)
            threading.Thread(target=handle, args=(conn, stop), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        for conn in conns:
            conn.close()
        server.close()


class Silent:
    """A port where every connection is accepted and then nothing is ever sent on it;
    ``accepted`` is set once a client has connected (so a test knows it is waiting)."""

    def __init__(self, port: int, accepted: threading.Event) -> None:
        self.port = port
        self.accepted = accepted

    @property
    def tcp(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextmanager
def silent_port() -> Iterator[Silent]:
    accepted = threading.Event()

    def handle(conn: socket.socket, stop: threading.Event) -> None:
        accepted.set()
        stop.wait()
    with _serving(handle) as port:
        yield Silent(port, accepted)


def _trickle(conn: socket.socket, stop: threading.Event, data: bytes, start: int) -> None:
    """Read the request's head, send ``data[:start]`` at once, then one byte a second."""
    conn.settimeout(5)
    try:
        got = b""
        while b"\r\n\r\n" not in got:
            chunk = conn.recv(4096)
            if not chunk:
                return
            got += chunk
        conn.sendall(data[:start])
        for n in range(start, len(data)):
            if stop.wait(1.0):
                return
            conn.sendall(data[n:n + 1])
    except OSError:
        return


@contextmanager
def trickling_headers() -> Iterator[str]:
    """An HTTP server whose answer's status line and headers come one byte a second."""
    head = b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-Pad-%d: %s\r\n" % (n, b"y" * 40)
                                             for n in range(20)) + b"Content-Length: 2\r\n\r\nok"
    with _serving(lambda c, s: _trickle(c, s, head, 0)) as port:
        yield f"http://127.0.0.1:{port}"


@contextmanager
def trickling_body() -> Iterator[str]:
    """An HTTP server whose headers come at once and whose JSON body then comes a byte a
    second."""
    body = b'{"ok": "' + b"x" * 600 + b'"}'
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" \
        % len(body)
    with _serving(lambda c, s: _trickle(c, s, head + body, len(head) + 1)) as port:
        yield f"http://127.0.0.1:{port}"


def elapsed(since: float) -> float:
    return time.monotonic() - since
