"""SIGINT and SIGTERM: a run stops at once, except inside a critical section.

Once the CLI has called ``install()``, a signal raises :class:`Interrupted` in the main thread
wherever it is, so every wait (a socket, a subprocess, a sleep) ends at once: a user's one ^C,
``timeout`` or a service manager's single SIGTERM is heard within moments.  Python retries a
system call that a signal interrupted only when the handler returns; this one raises.

What must not be left half-made runs inside ``deferred()``: a signal that arrives there is
recorded and raised when the outermost section ends.  Everything else is undone by the
``finally`` blocks it passes through on the way out (scratch folders, tags put back).

Forked worker processes (rebase-check's) keep the earlier, cooperative rule: the first signal is
recorded and raised at their next ``check()``, a clean point between patches; a second raises
at once.  Without ``install()`` (library use) nothing changes and ``check()`` is a no-op.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager

_received: int | None = None
_installed_pid: int | None = None
_deferring = 0


class Interrupted(BaseException):
    """A signal arrived.  BaseException: never swallowed by an ``except Exception``."""

    def __init__(self, signum: int, done: str | None = None) -> None:
        self.signum = signum
        self.done = done  # what a critical section completed before the signal was raised
        super().__init__(signal.Signals(signum).name)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def _handler(signum, frame) -> None:
    global _received
    if _deferring:
        _received = _received or signum
        return
    if os.getpid() != _installed_pid and _received is None:
        _received = signum  # a forked worker: stop at its next check()
        return
    raise Interrupted(signum)


def install() -> None:
    global _installed_pid
    signal.signal(signal.SIGINT, _handler)
    signal.signal(signal.SIGTERM, _handler)
    _installed_pid = os.getpid()


def check() -> None:
    if _received is not None:
        raise Interrupted(_received)


@contextmanager
def deferred(done: str | None = None) -> Iterator[None]:
    """A critical section: a signal inside it is raised when the outermost section ends (also
    when the section ends by an error: the interruption is what the user asked for).  ``done``
    says what the section has changed once it completes, for the interruption's message."""
    global _deferring, _received
    _deferring += 1
    completed = False
    try:
        yield
        completed = True
    finally:
        _deferring -= 1
        if not _deferring and _received is not None and os.getpid() == _installed_pid:
            signum, _received = _received, None
            raise Interrupted(signum, done if completed else None)
