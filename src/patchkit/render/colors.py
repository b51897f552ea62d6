"""The one colour table: a status word looks the same in every report on a terminal."""

from __future__ import annotations

ANSI = {"applied": "32", "upstream": "36", "skipped": "2", "failed": "1;31", "offset": "33"}


def paint(word: str, key: str, color: bool) -> str:
    """``word`` in the colour of ``key`` (a status, or ``offset``) when ``color``."""
    code = ANSI.get(key)
    if not color or code is None:
        return word
    return f"\033[{code}m{word}\033[0m"
