"""The build paths: one module each, looked up in the builder table and chosen here once per run.

A path turns an applied checkout into an image and hands back one
:class:`~patchkit.image.build.Built`.  What differs between paths (which options it cannot
honour, which series it can ship, how it reaches the image's home) is the path's to say; the
command asks :func:`refuse` before any work, :func:`choose` once the series is applied, and
never asks which path it got.  A new path is a new module with a ``BUILDER`` object (see
:class:`~patchkit.image.builders.protocol.Builder`) and one line in ``TABLE``.
"""

from __future__ import annotations

import importlib

from patchkit.errors import ImageError
from patchkit.image.build import ModeChoice
from patchkit.image.builders.protocol import Asked, Builder

# The builder table: a path's name -> its module.  Each path is imported only when chosen: the
# path straight into a registry never imports the Docker SDK.
TABLE = {
    "engine-overlay": "patchkit.image.builders.engine_overlay",
    "engine-source": "patchkit.image.builders.engine_source",
    "registry-overlay": "patchkit.image.builders.registry_overlay",
}


def get(name: str) -> Builder:
    return importlib.import_module(TABLE[name]).BUILDER


def family(no_daemon: bool) -> list[Builder]:
    """The paths open to a run: straight in a registry when it has no engine, else through an
    engine."""
    return [b for b in map(get, TABLE) if b.needs_engine != no_daemon]


def refuse(no_daemon: bool, asked: Asked) -> None:
    """Refuse, before any work, what no path open to the run can honour."""
    for builder in family(no_daemon):
        builder.refuse(asked)


def choose(no_daemon: bool, choice: ModeChoice) -> Builder:
    """The one path that ships the series: the first of the run's family that fits it."""
    paths = family(no_daemon)
    for builder in paths:
        if builder.unfit(choice) is None:
            return builder
    # the path of the series' own mode says best why it cannot ship it
    said = next((b for b in paths if b.mode == choice.mode), paths[0])
    raise ImageError(str(said.unfit(choice)))


__all__ = ["TABLE", "choose", "family", "get", "refuse"]
