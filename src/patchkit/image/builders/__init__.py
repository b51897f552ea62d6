"""The build paths: one module each, chosen here once per run.

A path turns an applied checkout into an image and hands back one
:class:`~patchkit.image.build.Built`.  What differs between paths (which options it cannot
honour, which series it can ship, how it reaches the image's home) is the path's to say; the
command asks :func:`refuse` before any work, :func:`choose` once the series is applied, and
never asks which path it got.  A new path is a new module with a ``BUILDER`` object (see
:class:`Builder`) and one line in ``REGISTRY``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Protocol, Sequence

from patchkit.errors import ImageError, UsageError
from patchkit.image.build import Built, ModeChoice, PackageTree
from patchkit.imageref import Platform
from patchkit.manifest import Manifest
from patchkit.series.checkout import AppliedCheckout

if TYPE_CHECKING:   # imported by the path that uses it, when chosen
    from patchkit.image.docker import Engine
    from patchkit.image.registry import Registry

# Each path is imported only when chosen: the registry path never imports the Docker SDK.
REGISTRY = {
    "engine-overlay": "patchkit.image.builders.engine_overlay",
    "engine-source": "patchkit.image.builders.engine_source",
    "registry-overlay": "patchkit.image.builders.registry_overlay",
}


@dataclass(frozen=True)
class Asked:
    """The options of a build-image run that a path may refuse."""

    push: bool
    save: Path | None
    mode: str                      # auto | overlay | source
    copy_to: Sequence[str] = ()


@dataclass(frozen=True)
class Job:
    """One build: the applied tree, what to make of it, and where the image goes."""

    manifest: Manifest
    tree: AppliedCheckout
    choice: ModeChoice
    platform: Platform
    tag: str
    base: str | None               # --base, else image.base of the manifest
    push: bool
    log: Callable[[str], None]
    engine: Engine | None = None   # for the paths through an engine
    registry: Registry | None = None  # for the path without one
    max_jobs: int | None = None
    nvcc_threads: int | None = None
    packages: tuple[PackageTree, ...] = ()  # the other packages' changes the image ships
    artifacts: tuple = ()          # build.PlacedArtifact: compiled files from pinned wheels
    lock: object | None = None     # image.stack.Lock of --locked, for a path that reads the
                                   # base itself (no engine read it before the apply)

    def base_ref(self) -> str:
        ref = self.base or self.manifest.image.base
        if not ref:
            raise UsageError("no base image: give --base or set image.base in patchset.yaml")
        return ref


class Builder(Protocol):
    name: str                  # how REGISTRY names it
    mode: str                  # the build mode it makes: overlay | source
    needs_engine: bool         # False: it builds straight in a registry (--no-daemon)

    def refuse(self, asked: Asked) -> None:
        """A one-line UsageError for the first option this path cannot honour."""

    def unfit(self, choice: ModeChoice) -> str | None:
        """Why this path cannot ship the series ``choice`` was made for; None when it can."""

    def build(self, job: Job) -> Built:
        """Make the image and leave ``job.tag`` naming it (in the engine, or the registry)."""


class EnginePath:
    """What the paths through an engine share: an engine takes every option, and each path
    ships a series of its own mode (a path may say more in its ``unfit``)."""

    mode: str
    needs_engine = True

    def refuse(self, asked: Asked) -> None:
        pass

    def unfit(self, choice: ModeChoice) -> str | None:
        return None if choice.mode == self.mode else f"the series needs {choice.mode} mode"


def get(name: str) -> Builder:
    return importlib.import_module(REGISTRY[name]).BUILDER


def family(no_daemon: bool) -> list[Builder]:
    """The paths open to a run: straight in a registry with ``--no-daemon``, else through an
    engine."""
    return [b for b in map(get, REGISTRY) if b.needs_engine != no_daemon]


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


__all__ = ["Asked", "Builder", "EnginePath", "Job", "REGISTRY", "choose", "family", "get", "refuse"]
