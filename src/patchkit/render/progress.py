"""How long work looks: a redrawn line per download on a terminal (tqdm: bytes, total, rate,
time left), two plain lines off one (its start and its end), nothing with ``-q``; with ``-v``
each git and pip command as it runs."""

from __future__ import annotations

import shlex
import sys
import threading
import time
from collections.abc import Sequence
from typing import TextIO

from patchkit import progress

# a download shorter than this draws nothing: a bar that flashes says nothing
SHOW_AFTER = 0.5


def size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


class _Bar(progress.Transfer):
    """One line that tqdm redraws in place; downloads side by side each have their own line
    (``slots`` hands out the free line numbers)."""

    def __init__(self, label: str, stream: TextIO, slots: _Slots) -> None:
        self.label, self.stream, self.slots = label, stream, slots
        self.started = time.monotonic()
        self.bar = None
        self.slot: int | None = None
        self.lock = threading.Lock()

    def update(self, done: int, total: int | None) -> None:
        with self.lock:
            if self.bar is None:
                if time.monotonic() - self.started < SHOW_AFTER and done != total:
                    return
                from tqdm import tqdm

                self.slot = self.slots.take()
                self.bar = tqdm(total=total, desc=self.label, unit="B", unit_scale=True,
                                unit_divisor=1000, file=self.stream, leave=True,
                                dynamic_ncols=True, mininterval=0.2, position=self.slot)
            if total and self.bar.total != total:
                self.bar.total = total
            self.bar.update(done - self.bar.n)

    def close(self, ok: bool = True) -> None:
        with self.lock:
            if self.bar is not None:
                if not ok:
                    self.bar.set_postfix_str("stopped")
                self.bar.close()
                self.slots.give(self.slot)


class _Slots:
    """The terminal lines free for a progress bar."""

    def __init__(self) -> None:
        self.taken: set[int] = set()
        self.lock = threading.Lock()

    def take(self) -> int:
        with self.lock:
            n = next(i for i in range(len(self.taken) + 1) if i not in self.taken)
            self.taken.add(n)
            return n

    def give(self, n: int | None) -> None:
        with self.lock:
            self.taken.discard(n)


class _Lines(progress.Transfer):
    """Off a terminal: a line when it begins (with its size), a line when it ends."""

    def __init__(self, label: str, say, verb: str) -> None:
        self.label, self.say, self.verb = label, say, verb
        self.started = time.monotonic()
        self.done, self.total, self.begun = 0, None, False

    def update(self, done: int, total: int | None) -> None:
        self.done, self.total = done, total or self.total
        if not self.begun and self.total:
            self.begun = True
            self.say(f"{self.label}: {size(self.total)}")

    def close(self, ok: bool = True) -> None:
        if not self.begun and not (ok and self.done):
            return   # nothing was said of it, and nothing came
        took = max(time.monotonic() - self.started, 1e-3)
        if ok:
            self.say(f"{self.verb} {self.label}: {size(self.done)} in {took:.1f} s "
                     f"({size(self.done / took)}/s)")
        else:
            self.say(f"{self.label}: stopped after {size(self.done)} of "
                     f"{size(self.total or 0)}")


class TerminalSink(progress.Sink):
    """The command line's sink: ``quiet`` draws nothing, ``verbose`` shows commands."""

    def __init__(self, *, quiet: bool = False, verbose: bool = False,
                 stream: TextIO | None = None) -> None:
        self.quiet, self.verbose = quiet, verbose
        self._stream = stream
        self.slots = _Slots()
        self.details: set[str] = set()

    @property
    def stream(self) -> TextIO:
        return self._stream or sys.stderr   # as it is now (a test may swap it)

    def _say(self, line: str) -> None:
        print(line, file=self.stream, flush=True)

    def transfer(self, label: str, verb: str = "downloaded") -> progress.Transfer:
        if self.quiet:
            return progress.Transfer()
        if self.stream.isatty():
            return _Bar(label, self.stream, self.slots)
        return _Lines(label, self._say, verb)

    def command(self, argv: Sequence[str]) -> None:
        if self.verbose:
            self._say("+ " + shlex.join(str(a) for a in argv))

    def detail(self, text: str) -> None:
        if self.verbose and text not in self.details:
            self.details.add(text)
            self._say(text)
