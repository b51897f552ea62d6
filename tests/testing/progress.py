"""A run's progress kept for the test to read."""

from __future__ import annotations

from patchkit.series.applier import Progress


class Said(Progress):
    """Every line the run told, in order."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, message: str) -> None:
        self.lines.append(message)
