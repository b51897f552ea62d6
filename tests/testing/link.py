"""A TCP relay of our own between ssh and a node's sshd: the link a copy crosses.

``Link(port)`` listens on 127.0.0.1 (a port of its own) and forwards every connection to the
sshd on that port; an engine URL ``ssh://pk-node2:<link.port>`` then goes through it (the
node's Host block in the suite's ssh config still gives the host, user and key; the URL's port
wins).
It counts the bytes that cross it each way, and ``cut_after(n)`` closes every connection once
``n`` more bytes have crossed, and refuses new ones until ``mend()``: a link that drops.
``refuse_after(n)`` closes every connection after the first ``n`` as soon as it comes (a node
that answers its engine's questions and then drops the load's own session).
``slow_after(n, rate)`` instead lets the bytes after those ``n`` through at ``rate`` bytes a
second (each way), and ``stall_after(n)`` lets none through until ``mend()`` or ``close()``
while keeping every connection open: a copy that is sure to be mid-stream when a test
interrupts it, however small the image.  ``changed`` is set once any of these has happened.

The relay's own sockets take small kernel buffers, so that what the relay has not let through
yet waits on the sender's side (a few hundred KB at most), not in megabytes of buffers that a
sender could fill and then take for sent.
"""

from __future__ import annotations

import socket
import threading

BUFFER = 128 * 1024   # the kernel buffers of the relay's sockets, each way


class Link:
    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self.to = (host, port)
        self.up = 0          # bytes from ssh to sshd
        self.down = 0        # bytes from sshd to ssh
        self.connections = 0
        self.streams: list[list[int]] = []   # [up, down] of each connection, in order
        self._budget: int | None = None
        self._then = "cut"         # what happens once the budget is spent: cut | slow
        self._rate = 0             # bytes a second once slowed
        self._cut = False
        self._refuse_after: int | None = None
        self.refused = 0
        self.changed = threading.Event()   # the cut or the slowing happened
        self._released = threading.Event()  # set: a slowed or stalled pump goes on
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._server = socket.socket()
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        _small_buffers(self._server)   # accepted sockets inherit them
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(64)
        self.port = self._server.getsockname()[1]
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def url(self, alias: str) -> str:
        return f"ssh://{alias}:{self.port}"

    @property
    def total(self) -> int:
        return self.up + self.down

    @property
    def busiest(self) -> int:
        """The bytes sent up the connection that sent the most (a load's)."""
        return max((c[0] for c in self.streams), default=0)

    @property
    def was_cut(self) -> bool:
        return self._cut

    def reset(self) -> None:
        with self._lock:
            self.up = self.down = self.connections = 0
            self.streams = []

    def cut_after(self, n: int) -> None:
        with self._lock:
            self._budget, self._then = n, "cut"

    def refuse_after(self, n: int) -> None:
        with self._lock:
            self._refuse_after = n

    def slow_after(self, n: int, rate: int) -> None:
        with self._lock:
            self._budget, self._then, self._rate = n, "slow", rate

    def stall_after(self, n: int) -> None:
        self.slow_after(n, 0)

    def mend(self) -> None:
        with self._lock:
            self._budget = None
            self._cut = False
            self._rate = 0
            self._then = "cut"
            self.changed.clear()
            self._released.set()
            self._released = threading.Event()

    def close(self) -> None:
        self._released.set()
        self._server.close()
        self._drop_all()

    def __enter__(self) -> "Link":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the relay

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            with self._lock:
                refuse = self._cut or (self._refuse_after is not None
                                       and self.connections >= self._refuse_after)
                self.refused += refuse
            if refuse:
                client.close()
                continue
            try:
                server = socket.socket()
                _small_buffers(server)
                server.settimeout(10)
                server.connect(self.to)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            counts = [0, 0]
            with self._lock:
                self.connections += 1
                self.streams.append(counts)
                self._open.update((client, server))
            pair = [client, server, 2]   # the two sockets, and the pumps still running
            for a, b, way in ((client, server, "up"), (server, client, "down")):
                threading.Thread(target=self._pump, args=(a, b, way, pair, counts),
                                 daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, way: str, pair: list,
              counts: list[int]) -> None:
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                with self._lock:
                    if self._cut:
                        break
                    slowed = self._budget is None and self._then == "slow"
                    if self._budget is not None and len(data) >= self._budget:
                        if self._then == "cut":
                            data = data[:self._budget]
                            self._cut = True
                        self._budget = None
                        self.changed.set()
                    elif self._budget is not None:
                        self._budget -= len(data)
                    released, rate = self._released, self._rate
                    setattr(self, way, getattr(self, way) + len(data))
                    counts[way == "down"] += len(data)
                if slowed:   # rate 0: a stall, until mended or closed
                    released.wait(len(data) / rate if rate else None)
                dst.sendall(data)
                if self._cut:
                    break
        except OSError:
            pass
        if self._cut:
            self._drop_all()
            return
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        with self._lock:
            pair[2] -= 1
            done = pair[2] == 0
            if done:
                self._open.difference_update(pair[:2])
        if done:
            for s in pair[:2]:
                s.close()

    def _drop_all(self) -> None:
        with self._lock:
            socks, self._open = list(self._open), set()
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


def _small_buffers(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, BUFFER)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, BUFFER)
