"""What one run builds: the manifest's defaults and the command line's choices, settled once.

Every verb makes its :class:`RunSpec` once, with :func:`run_spec`, and passes it down; what runs
below the verb takes the values of it (a ref, the sources, a base name, the tag template, the
workdir, the cache, the timeout, the engine) rather than picking a default again.  The engine is
the verb's to give: an engine already connected, or the way to open one (``open_engine``, the
engine border's ``Engine.connect``), which :meth:`RunSpec.connect` calls once, on first use.  The
run never reaches for the engine border itself.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from patchkit.cache import cache_dir
from patchkit.errors import UsageError
from patchkit.manifest.model import VLLM, Manifest
from patchkit.packageid import PackageId
from patchkit.source.refs import BASE_REF
from patchkit.timeouts import DEFAULT_TIMEOUT


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
    tag: str = ""              # the tag template: --tag, else image.tag, else NAME:{ref}
    tag_given: bool = False    # the template is --tag's (not the manifest's)
    workdir: Path | None = None          # --workdir: where vLLM's checkout is applied
    cache: Path = field(default_factory=cache_dir)  # the cache of sources and builds
    timeout: float = DEFAULT_TIMEOUT     # --timeout: the longest silence of the engine
    engine: object = field(default=None, compare=False, repr=False)  # the engine (given, or
                                                                      # opened once)
    # how the verb opens an engine, given its timeout (None: the verb gives no engine)
    open_engine: Callable[..., object] | None = field(default=None, compare=False, repr=False)

    @property
    def tag_option(self) -> str:
        """Where the tag template comes from, as an error names it."""
        return "--tag" if self.tag_given else "image.tag"

    def connect(self):
        """The run's engine: the one given, else the one the verb's ``open_engine`` opens on
        first use (once for the whole run), whose silences ``timeout`` bounds."""
        if self.engine is None:
            if self.open_engine is None:
                raise RuntimeError("this run was given no engine and no way to open one")
            object.__setattr__(self, "engine", self.open_engine(timeout=self.timeout))
        return self.engine

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
             only: Sequence[str] = (), tag: str | None = None, workdir: Path | None = None,
             cache: Path | None = None, timeout: float = DEFAULT_TIMEOUT,
             engine=None, open_engine: Callable[..., object] | None = None) -> RunSpec:
    """The run ``manifest`` and the options given make.  An option left out (None; no
    ``repos``) takes the manifest's value; an empty ``ref`` stays, to be refused as a ref.
    ``refs`` are ``--ref NAME=REF`` texts, ``only`` the ``--package`` names.  ``engine``: an
    engine already connected; else ``open_engine(timeout=...)`` opens one when the run first
    needs it."""
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
                   only=tuple(dict.fromkeys(only)) if only else None,
                   tag=tag_template(manifest, tag), tag_given=tag is not None,
                   workdir=Path(workdir) if workdir is not None else None,
                   cache=cache or cache_dir(), timeout=timeout, engine=engine,
                   open_engine=open_engine)


def tag_template(manifest: Manifest, tag: str | None) -> str:
    """The image tag's template: ``tag`` (``--tag``), else ``image.tag``, else
    ``NAME:{ref}``."""
    return tag if tag is not None else manifest.image.tag or f"{manifest.name}:{{ref}}"


def built_tag(manifest: Manifest) -> str:
    """The tag build-image gives the manifest's default build at its pin (image.tag, else
    NAME:{ref}): the moving tag copy-image, images and rollback take by default."""
    from patchkit.manifest import variants

    return variants.default_tag(manifest, manifest.vllm.ref, None, tag_template(manifest, None))


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
