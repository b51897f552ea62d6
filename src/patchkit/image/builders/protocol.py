"""The ``Builder`` protocol every build path implements, and the values a command hands a path.

:class:`Asked` is what a path may refuse before any work, :class:`Job` one build, and
:class:`EnginePath` what the paths through an engine say alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Protocol, Sequence

from patchkit.errors import Origin, SettingError
from patchkit.git import Provenance
from patchkit.image.build import Built, ModeChoice, PackageTree
from patchkit.imageref import Platform
from patchkit.manifest import Manifest
from patchkit.series.checkout import AppliedCheckout

if TYPE_CHECKING:   # imported by the path that uses it, when chosen
    from patchkit.image.base import BaseStack
    from patchkit.engines.docker import Engine
    from patchkit.engines.registry import Registry


@dataclass(frozen=True)
class Asked:
    """The options of a build-image run that a path may refuse."""

    push: bool
    save: Path | None
    mode: str                      # auto | overlay | source
    copy_to: Sequence[str] = ()
    base: str | None = None        # the run's base, and where it came from
    base_from: Origin = Origin("base")


@dataclass(frozen=True)
class Job:
    """One build: the applied tree, what to make of it, and where the image goes."""

    manifest: Manifest
    tree: AppliedCheckout
    choice: ModeChoice
    platform: Platform
    tag: str
    base: str | None               # the run's base (the option, else image.base)
    push: bool
    log: Callable[[str], None]
    cache: Path                    # the run's cache (the registry path keeps the base's blobs)
    engine: Engine | None = None   # for the paths through an engine
    registry: Registry | None = None  # for the path without one
    max_jobs: int | None = None
    nvcc_threads: int | None = None
    packages: tuple[PackageTree, ...] = ()  # the other packages' changes the image ships
    artifacts: tuple = ()          # build.PlacedArtifact: compiled files from pinned wheels
    lock: object | None = None     # image.lockfile.Lock asked for, for a path that reads the
                                   # base itself (no engine read it before the apply)
    base_from: Origin = Origin("base")  # where ``base`` came from, as an error names it
    held: BaseStack | None = None  # the base as the run read it on the engine (None: not read)
    project: Provenance = Provenance()  # the patchset's commit and repository, for the labels

    def base_ref(self) -> str:
        ref = self.base
        if not ref:
            raise SettingError("no base image: give {base} IMAGE", self.base_from)
        return ref


class Builder(Protocol):
    name: str                  # how TABLE names it
    mode: str                  # the build mode it makes: overlay | source
    needs_engine: bool         # False: it builds straight in a registry, with no engine

    def refuse(self, asked: Asked) -> None:
        """A one-line SettingError for the first option this path cannot honour."""

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
