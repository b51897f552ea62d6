"""What every kind of source is: the ``Source`` protocol, and the package a source is asked for.

A source answers for one package at a time (:class:`PackageId`), so that the same kinds serve
vLLM and any other package a patchset names (``patchkit.packageid``).
"""

from __future__ import annotations

from pathlib import Path
from collections.abc import Iterator
from typing import ClassVar, Protocol

from patchkit import git
from patchkit.packageid import VLLM, PackageId
from patchkit.source.resolved import Log, Resolved


class Base(Protocol):
    """What the ``image`` source (and the ref ``base``) needs of a base image."""

    name: str            # as the user gave it
    key: str             # what pins its content: registry digest, else image id (sha256:...)
    platform: str        # linux/arm64
    version: str | None  # the vLLM version it has installed
    package_dir: str     # where the package lives in the image, for messages

    def package_files(self) -> Iterator[git.TreeFile]:
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
