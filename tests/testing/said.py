"""An error as the command line says it: a setting worded as its option, or as the manifest
key at its line."""

from __future__ import annotations

from patchkit.cli import worded
from patchkit.errors import SettingError


def said(exc: BaseException) -> str:
    return exc.worded(worded) if isinstance(exc, SettingError) else str(exc)
