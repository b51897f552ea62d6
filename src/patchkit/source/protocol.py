"""What every kind of source is: the ``Source`` protocol, and the package a source is asked for.

A source answers for one package at a time (:class:`PackageId`), so that the same kinds serve
vLLM and any other package a patchset names; vLLM's own identity is :data:`VLLM`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from collections.abc import Iterator
from typing import ClassVar, Protocol

from patchkit import git as g
from patchkit.source.resolved import Log, Resolved


@dataclass(frozen=True)
class PackageId:
    """A package a source is asked for: its name in the patchset, its distribution on PyPI and
    in an image's dist-info, the import package its wheel holds, and how messages name it.

    What sets the patchset's main package (vLLM, the ``vllm:`` section) apart is data of this
    value, ``primary``, and the methods below read it: its checkout is the workdir itself, its
    pin is moved by options of its own (``--vllm-ref``, ``--vllm-repo``), and its source is the
    whole repository, so its patches may touch any path.  The manifest loader makes every
    package's identity (:data:`VLLM` is vLLM's); no caller asks for a package by its name."""

    name: str
    dist: str
    # the folder of the wheel (and of site-packages) holding its files; "" when it is read from
    # the release itself (a wheel's top_level.txt, or its root folders holding __init__.py)
    top: str = ""
    label: str = ""
    primary: bool = False

    @property
    def section(self) -> str:
        """Where patchset.yaml pins it: ``vllm`` or ``packages.NAME``."""
        return self.name if self.primary else f"packages.{self.name}"

    def key(self, field: str) -> str:
        """Its manifest key ``field``: ``vllm.repo``, ``packages.flashinfer.repo``."""
        return f"{self.section}.{field}"

    def option(self, field: str, value: str) -> str:
        """How a user sets its ``field`` (ref, repo) to ``value``: vLLM's command-line option
        (``--vllm-repo image``), another's manifest key (``packages.NAME.repo: image``)."""
        return f"--{self.name}-{field} {value}" if self.primary else f"{self.key(field)}: {value}"

    def checkout(self, workdir: Path) -> Path:
        """Where its checkout goes in a run whose workdir is ``workdir``: vLLM's at the workdir,
        every other package's beside it under its own name."""
        return workdir if self.primary else workdir.parent / self.name

    def beside(self, folder: str) -> str:
        """Its part of a folder the packages share (``patches``): vLLM's is the folder itself,
        another package's the subfolder of its name (``patches/flashinfer``)."""
        return folder if self.primary else f"{folder}/{self.name}"

    def aside(self, template: str) -> str:
        """``template`` (``" ({})"``) filled with its name where a line of the series says
        which package a patch is of; "" for vLLM's, which goes without saying."""
        return "" if self.primary else template.format(self.name)

    @property
    def confined(self) -> bool:
        """Its patches stay inside its import folders: true of a package whose source is an
        installed wheel's folders, not of vLLM's whole repository (csrc, CMakeLists)."""
        return not self.primary


VLLM = PackageId("vllm", "vllm", "vllm", "vLLM", primary=True)


class Base(Protocol):
    """What the ``image`` source (and the ref ``base``) needs of a base image."""

    name: str            # as the user gave it
    key: str             # what pins its content: registry digest, else image id (sha256:...)
    platform: str        # linux/arm64
    version: str | None  # the vLLM version it has installed
    package_dir: str     # where the package lives in the image, for messages

    def package_files(self) -> Iterator[g.TreeFile]:
        """Every file of the package folder, paths relative to its parent (``vllm/...``)."""
        ...


class Source(Protocol):
    """One kind of source (a git repository, PyPI, a base image).  ``text`` is the source as the
    user named it (a URL, a path or a word), passed back to each call."""

    name: ClassVar[str]           # how reports and image labels name the kind: git, pypi, image
    holds_commits: ClassVar[bool]  # any upstream commit can be pinned (not only releases)
    reads_base: ClassVar[bool]    # its tree is what a base image holds
    # its tree holds what the package is built from (csrc, CMakeLists), not only what a wheel
    # installs: a patch to compiled code that only the build uses needs such a source
    holds_build_sources: ClassVar[bool]
    has_history: ClassVar[bool]   # it holds the commits between its releases (bisect needs them)
    # why it has no history, said where a merge base is missing (None when it has one)
    no_history_why: ClassVar[str | None]

    def resolve(self, text: str, ref: str, cache: Path, log: Log, *,
                package: PackageId = VLLM, base: Base | None = None) -> Resolved:
        """``ref`` pinned to a commit in a local repository, fetched or made as needed."""
        ...

    def tags(self, text: str, cache: Path, log: Log, *, package: PackageId = VLLM) -> list[str]:
        """Every tag (release) the source has now."""
        ...

    def label(self, text: str, version: str, package: PackageId = VLLM) -> str:
        """The source as an image's ``org.opencontainers.image.source`` label names it, for a
        build of ``version``."""
        ...
