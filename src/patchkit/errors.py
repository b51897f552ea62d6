"""The one family of expected errors.

Every error a user can cause (bad manifest, bad flag, unknown ref, unreachable engine) is a
``PatchkitError``; the CLI prints its message on one line and exits with ``exit_code``.
Anything else is a bug: the CLI logs the traceback and exits 3.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


QUOTED = 80   # the most of a value an error quotes


def clipped(value: object, limit: int = QUOTED) -> str:
    """``value`` as an error quotes it: its first line, at most ``limit`` characters, with
    ``…`` where it was cut (a 100,000-character ref is not echoed whole)."""
    text = str(value)
    first, _, rest = text.partition("\n")
    if len(first) > limit:
        return first[:limit] + "…"
    return first + " …" if rest.strip() else first


WORD_MAX = 300   # characters of one word of a message: longer than any path a user types


def bounded(line: str) -> str:
    """``line`` with every word longer than ``WORD_MAX`` cut as a quoted value is
    (:func:`clipped`): the one place a message is bounded before anyone reads it, whatever
    value it quotes."""
    import re

    def cut(match: re.Match[str]) -> str:
        word = match.group()
        close = word[-1] if word[-1] in "'\")]" else ""
        return word[:QUOTED] + "…" + close

    return re.sub(r"\S{%d,}" % (WORD_MAX + 1), cut, line)


class PatchkitError(Exception):
    """An expected failure, reported as one line."""

    exit_code = 1


class UsageError(PatchkitError):
    """A bad flag, ref or argument."""

    exit_code = 2


@dataclass(frozen=True)
class Origin:
    """Where a setting's value came from: given to the command (the command line names the
    option), or a manifest key at its line.  The core names the setting (``base``, ``tag``,
    ``workdir``, ``good``); the command line words it as its option or as the key."""

    setting: str                # the setting, as the core names it
    key: str | None = None      # the manifest key it came from (``image.base``); None: given
    path: str | None = None     # the manifest of ``key``
    line: int | None = None     # the line of ``key``'s value there

    def __str__(self) -> str:
        """The core's own wording: the key and its line, else the setting's name."""
        if self.key is None:
            return self.setting
        return f"{self.key} at {self.path}:{self.line}" if self.line else self.key


def literal(text: object) -> str:
    """``text`` as it stands inside a :class:`SettingError` template."""
    return str(text).replace("{", "{{").replace("}", "}}")


class SettingError(UsageError):
    """A setting's value, or a choice of settings, refused.  ``template`` names each setting
    as ``{setting}`` (other text through :func:`literal`); ``str()`` words them as the core
    does, and the command line words them by :meth:`worded` (``--base`` or ``image.base at
    patchset.yaml:12``)."""

    def __init__(self, template: str, *origins: Origin) -> None:
        self.template = template
        self.origins = origins
        super().__init__(self.worded(str))

    def worded(self, word: Callable[[Origin], str]) -> str:
        return self.template.format_map({o.setting: word(o) for o in self.origins})

    @property
    def origin(self) -> Origin:
        """The setting the error is about (the first it names)."""
        return self.origins[0]


class ManifestError(UsageError):
    """patchset.yaml, or a file it names, is wrong.

    ``str()`` is ``patchset.yaml:LINE: patches[N] (id=X): what is wrong``.
    """

    def __init__(self, message: str, *, path: str = "patchset.yaml", line: int | None = None,
                 entry: str | None = None) -> None:
        self.path = path
        self.line = line
        self.entry = entry
        self.detail = message
        where = f"{path}:{line}" if line else path
        prefix = f"{where}: {entry}: " if entry else f"{where}: "
        super().__init__(prefix + message)


class LogError(UsageError):
    """A log to judge runtime markers against is missing or unreadable, or names no container."""


class SourceError(PatchkitError):
    """A package's source could not be had: unknown ref, unreachable repo, missing release.
    ``source``: the source its message names, as it names it (a git source by its URL), so
    that a list of failures does not name it again; None when it names none."""

    exit_code = 2

    def __init__(self, message: str, *, source: str | None = None) -> None:
        super().__init__(message)
        self.source = source


class ToolMissingError(PatchkitError):
    """A tool patchkit runs (git, pip) is not installed where it looks for it: one line naming
    it, never "no source has ..."."""

    exit_code = 2


class CommandError(PatchkitError):
    """A subprocess failed: says the command, its exit code and its indented output."""

    def __init__(self, cmd: list[str], returncode: int, output: str,
                 timeout: float | None = None) -> None:
        self.cmd = cmd
        self.returncode = returncode
        self.output = output
        self.timeout = timeout  # set when the command was killed for running longer than it
        shown = " ".join(cmd)
        body = "\n".join("    " + line for line in output.rstrip().splitlines())
        msg = (f"command killed after {timeout:g} s: {shown}" if timeout is not None
               else f"command failed (exit {returncode}): {shown}")
        if body:
            msg += "\n" + body
        super().__init__(msg)


class GitError(CommandError):
    """A git command failed, or ran past its deadline (``timeout`` set): the one error of the
    git border, said as any failed command is."""


class ImageError(PatchkitError):
    """The Docker Engine refused, or the base image does not fit."""

    exit_code = 1


def handle(exc: BaseException, command_line: str, version: str,
           log_file: Callable[[], Path], prog: str = "patchkit",
           word: Callable[[Origin], str] = str) -> tuple[int, str, str]:
    """The one handler: an exception the CLI caught -> ``(exit code, stderr line, message)``.
    ``word`` says where a setting came from, as the command line names it.

    Expected errors say what and where in one line, ``patchkit VERB: error: ...`` (``prog``
    is ``patchkit VERB``); an interruption is 130 or 143 (``patchkit: interrupted ...``);
    anything else is a bug: one error line, the traceback in the log file, exit 3.
    """
    import traceback

    from patchkit import interrupt

    if isinstance(exc, PatchkitError):
        said = bounded(exc.worded(word) if isinstance(exc, SettingError) else str(exc))
        return exc.exit_code, f"{prog}: error: {said}", said
    if isinstance(exc, KeyboardInterrupt):
        return 130, "patchkit: interrupted", "interrupted"
    if isinstance(exc, interrupt.Interrupted):
        said = f"interrupted by {exc} after {exc.done}" if exc.done else \
            f"interrupted by {exc}; nothing was changed"
        return exc.exit_code, f"patchkit: {said}", f"interrupted by {exc}"
    log = log_file()
    try:
        with open(log, "a") as fh:
            fh.write(f"patchkit {version} {command_line}\n")
            fh.write("".join(traceback.format_exception(exc)) + "\n")
    except OSError:
        pass
    message = bounded(f"unexpected error: {type(exc).__name__}: {clipped(exc, 400)} "
                      f"(traceback in {log})")
    return 3, f"{prog}: error: {message}", message
