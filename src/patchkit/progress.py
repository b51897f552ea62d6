"""What long work reports as it goes (bytes of a download), and the commands patchkit runs, for
whoever shows them: the core calls :func:`transfer` and :func:`command`; the command line installs
a :class:`Sink` that draws them (a redrawn line on a terminal, a few plain lines off one,
nothing with ``-q``).  The default sink says nothing, so the core never prints."""

from __future__ import annotations

from collections.abc import Sequence


class Transfer:
    """One download or copy under way.  ``update`` with the bytes done so far and the total
    when known; ``close`` once, when it ends (``ok`` false: it failed or was cut)."""

    def update(self, done: int, total: int | None) -> None:
        pass

    def close(self, ok: bool = True) -> None:
        pass


class Sink:
    """Says nothing: what a library caller, and ``-q``, get."""

    def transfer(self, label: str, verb: str = "downloaded") -> Transfer:
        return Transfer()

    def command(self, argv: Sequence[str]) -> None:
        pass

    def detail(self, text: str) -> None:
        pass


_sink: Sink = Sink()


def install(sink: Sink) -> Sink:
    """Make ``sink`` the one that shows; returns the one it replaces."""
    global _sink
    before, _sink = _sink, sink
    return before


def transfer(label: str, verb: str = "downloaded") -> Transfer:
    """A transfer named ``label`` ("vLLM 0.33.0 wheel") begins; ``verb`` says what was done
    once it ends ("downloaded", "sent")."""
    return _sink.transfer(label, verb)


def command(argv: Sequence[str]) -> None:
    """A command (git, pip, ...) is about to run: ``-v`` shows it."""
    _sink.command(argv)


def detail(text: str) -> None:
    """What a short line left out (why a source is unreachable, where that is remembered):
    ``-v`` shows it, once per run."""
    _sink.detail(text)
