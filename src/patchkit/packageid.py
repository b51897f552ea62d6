"""A package of a patchset as a value: :class:`PackageId`, and vLLM's, :data:`VLLM`.

It sits below the sources, the series and the manifest, which all ask it what sets a package
apart instead of comparing names."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


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
