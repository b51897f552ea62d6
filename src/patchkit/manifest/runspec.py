"""What one run builds: the manifest's defaults and the command line's choices, settled once.

Every verb makes its :class:`RunSpec` with :func:`run_spec`; what runs below the verb takes the
values of it (a ref, the sources, a base name) rather than the manifest's defaults again.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass

from patchkit.errors import UsageError
from patchkit.manifest.model import VLLM, Manifest
from patchkit.source.protocol import PackageId
from patchkit.source.refs import BASE_REF


@dataclass(frozen=True)
class Pin:
    """One package's pin for the run: its ref and the sources to take it from."""

    id: PackageId
    ref: str
    sources: tuple[str, ...]   # local paths from the manifest's folder

    @property
    def name(self) -> str:
        return self.id.name

    @property
    def dist(self) -> str:
        return self.id.dist


@dataclass(frozen=True)
class RunSpec:
    # every package's pin, vLLM first: vLLM's from --vllm-ref and --vllm-repo, else its
    # section (the ref may be `base`); the others' from `packages:`, --ref NAME=REF moving one
    pins: tuple[Pin, ...]
    base: str | None           # the base image name: --base, else image.base
    platform: str              # OS/ARCH: --platform, else image.platform
    variant: str | None = None  # the build of the series (None: the default build)
    only: tuple[str, ...] | None = None  # --package: the packages the run is limited to

    @property
    def ref(self) -> str:
        """vLLM's ref."""
        return self.pin(VLLM.name).ref

    @property
    def sources(self) -> tuple[str, ...]:
        """vLLM's sources (local paths from the manifest's folder)."""
        return self.pin(VLLM.name).sources

    @property
    def others(self) -> tuple[Pin, ...]:
        """The pins of the packages other than vLLM, as `packages:` lists them."""
        return tuple(p for p in self.pins if not p.id.primary)

    def in_run(self, name: str) -> bool:
        return self.only is None or name in self.only

    def pin(self, name: str) -> Pin:
        return next(p for p in self.pins if p.name == name)


def run_spec(manifest: Manifest, *, ref: str | None = None, repos: Sequence[str] | None = None,
             base: str | None = None, platform: str | None = None,
             variant: str | None = None, refs: Sequence[str] = (),
             only: Sequence[str] = ()) -> RunSpec:
    """The run ``manifest`` and the options given make.  An option left out (None; no
    ``repos``) takes the manifest's value; an empty ``ref`` stays, to be refused as a ref.
    ``refs`` are ``--ref NAME=REF`` texts, ``only`` the ``--package`` names."""
    moved = _moved_pins(manifest, refs)
    if VLLM.name in moved:
        given = moved[VLLM.name]
        if ref is not None and ref != given:
            raise UsageError(f"{VLLM.option('ref', ref)} and --ref {VLLM.name}={given} disagree; "
                             "give one")
        ref = given
    for name in only:
        _known(manifest, name, "--package")
    vllm = Pin(manifest.vllm.id, _ref(manifest, ref, repos),
               tuple(repos) if repos else manifest.sources())
    others = tuple(Pin(p.id, moved.get(p.name, p.ref), manifest.sources(p.repos))
                   for p in manifest.others)
    return RunSpec(pins=(vllm, *others), base=base or manifest.image.base,
                   platform=platform or manifest.image.platform, variant=variant,
                   only=tuple(dict.fromkeys(only)) if only else None)


def _moved_pins(manifest: Manifest, refs: Sequence[str]) -> dict[str, str]:
    moved: dict[str, str] = {}
    for text in refs:
        name, eq, value = text.partition("=")
        if not eq or not name.strip() or not value.strip():
            raise UsageError(f"--ref {text!r}: give NAME=REF, e.g. --ref flashinfer=v0.6.16")
        name, value = name.strip(), value.strip()
        _known(manifest, name, "--ref")
        if moved.get(name, value) != value:
            raise UsageError(f"--ref {name}= is given twice ({moved[name]}, {value}); give it once")
        moved[name] = value
    return moved


def _known(manifest: Manifest, name: str, flag: str) -> None:
    names = [p.name for p in manifest.packages]
    if name not in names:
        close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise UsageError(f"{flag} {name}: the manifest has no package {name!r} (packages: "
                         f"{', '.join(names)}){hint}")


def _ref(manifest: Manifest, ref: str | None, repos: Sequence[str] | None) -> str:
    """``--vllm-ref``, else ``base`` when the command line's only source reads the base image
    (``--vllm-repo image``: patch what the image holds, one flag says it), else the manifest's
    ref."""
    from patchkit import source   # the source registry (git); the manifest's loader needs none

    if ref is not None:
        return ref
    if repos and all(source.kind_of(r).reads_base for r in repos):
        return BASE_REF
    return manifest.vllm.ref
