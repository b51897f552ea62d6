"""The one family of expected errors.

Every error a user can cause (bad manifest, bad flag, unknown ref, unreachable engine) is a
``PatchkitError``; the CLI prints its message on one line and exits with ``exit_code``.
Anything else is a bug: the CLI logs the traceback and exits 3.
"""

from __future__ import annotations


class PatchkitError(Exception):
    """An expected failure, reported as one line."""

    exit_code = 1


class UsageError(PatchkitError):
    """A bad flag, ref or argument."""

    exit_code = 2


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


class SourceError(PatchkitError):
    """The vLLM source could not be had: unknown ref, unreachable repo, missing release."""

    exit_code = 2


class CommandError(PatchkitError):
    """A subprocess failed: says the command, its exit code and its indented output."""

    def __init__(self, cmd: list[str], returncode: int, output: str) -> None:
        self.cmd = cmd
        self.returncode = returncode
        self.output = output
        shown = " ".join(cmd)
        body = "\n".join("    " + line for line in output.rstrip().splitlines())
        msg = f"command failed (exit {returncode}): {shown}"
        if body:
            msg += "\n" + body
        super().__init__(msg)


class ImageError(PatchkitError):
    """The Docker Engine refused, or the base image does not fit."""

    exit_code = 1
