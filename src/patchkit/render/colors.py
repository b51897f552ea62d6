"""The one colour table: a status word looks the same in every report on a terminal."""

from __future__ import annotations

from patchkit.report import Status

ANSI: dict[Status | str, str] = {Status.APPLIED: "32", Status.UPSTREAM: "36",
                                 Status.SKIPPED: "2", Status.FAILED: "1;31", "offset": "33"}


def paint(word: str, key: Status | str, color: bool) -> str:
    """``word`` in the colour of ``key`` (a status, or ``offset``) when ``color``."""
    code = ANSI.get(key)
    if not color or code is None:
        return word
    return f"\033[{code}m{word}\033[0m"
