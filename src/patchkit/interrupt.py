"""Cooperative handling of SIGINT and SIGTERM.

A signal raised as an exception at an arbitrary bytecode can land inside an import, a
``finally`` or the middle of a rename.  Instead, the CLI installs ``install()``: the first
signal only records itself, and the engine calls ``check()`` at points where stopping is clean
(between patches, before the swap).  Child processes in the same process group get ^C from the
terminal themselves and stop; a second signal interrupts at once.  Without ``install()``
(library use) nothing changes and ``check()`` is a no-op.
"""

from __future__ import annotations

import signal

_received: int | None = None
_installed = False


class Interrupted(BaseException):
    """Raised by ``check()`` once a signal has arrived.  BaseException: never swallowed by an
    ``except Exception``."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(signal.Signals(signum).name)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def _handler(signum, frame) -> None:
    global _received
    if _received is not None:
        raise Interrupted(signum)
    _received = signum


def install() -> None:
    global _installed
    signal.signal(signal.SIGINT, _handler)
    signal.signal(signal.SIGTERM, _handler)
    _installed = True


def check() -> None:
    if _received is not None:
        raise Interrupted(_received)
