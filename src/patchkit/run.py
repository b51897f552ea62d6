"""What one run builds: the manifest's defaults and the command's options, settled once.

Every verb makes its :class:`RunSpec` once, with :func:`run_spec`, at the top of its command, and
passes it down; what runs below the verb takes the values of it (a ref, the sources, a base
name, the platform, the tag template, the workdir, the cache, the timeout, the engine) rather
than picking a default again.  The fields are parsed (the platform is a :class:`Platform`, the
base and the tag template are checked references) and each remembers where it came from (an
option, or a manifest key at its line), so that an error blames the one the user wrote.  The
engine is given by the verb, which connects it when its run reads a base or builds an image;
the run never connects one.  The run sits above the sources and the images, which take it.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from patchkit import source
from patchkit.cache import cache_dir
from patchkit.errors import Origin, SettingError, UsageError, literal
from patchkit.imageref import Platform, check_reference
from patchkit.manifest import variants
from patchkit.manifest.model import VLLM, Manifest
from patchkit.packageid import PackageId
from patchkit.source.refs import BASE_REF
from patchkit.timeouts import DEFAULT_TIMEOUT

if TYPE_CHECKING:  # the engine border, for its type: the verb gives the engine
    from patchkit.engines.docker import Engine


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

    def reads_base(self, refs: Sequence[str] | None = None) -> bool:
        """Whether this package is read from a base image: its source ``image``, or a ref
        ``base`` among ``refs`` (default: its pin)."""
        return (BASE_REF in ((self.ref,) if refs is None else refs)
                or any(source.kind_of(s).reads_base for s in self.sources))


@dataclass(frozen=True)
class RunSpec:
    # every package's pin, vLLM first: vLLM's from the ref and repos options, else its section
    # (the ref may be `base`); the others' from `packages:`, a `NAME=REF` pin moving one
    pins: tuple[Pin, ...]
    base: str | None           # the base image (a checked reference): the option, else image.base
    platform: Platform         # the option, else image.platform
    cache: Path                # the cache of sources, builds and transforms' results
    variant: str | None = None  # the build of the series (None: the default build)
    only: tuple[str, ...] | None = None  # the packages the run is limited to (None: all)
    tag: str = ""              # the tag template: the option, else image.tag, else NAME:{ref}
    workdir: Path | None = None          # where vLLM's checkout is applied (None: no checkout)
    timeout: float = DEFAULT_TIMEOUT     # the longest silence of an engine, node or registry
    # the engine the verb connected (or a test handed in); None: the run has none
    engine: Engine | None = field(default=None, compare=False, repr=False)
    # where base, platform and tag came from, as errors name them
    base_from: Origin = Origin("base")
    platform_from: Origin = Origin("platform")
    tag_from: Origin = Origin("tag")

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

    def the_engine(self, why: str) -> Engine:
        """The run's engine, which ``why`` needs; a run without one is a usage error."""
        if self.engine is None:
            raise UsageError(f"{why}, read through an engine, and this run has none")
        return self.engine

    def the_base(self, why: str) -> str:
        """The base image name, which ``why`` needs: the option, else image.base."""
        if not self.base:
            raise SettingError(f"{literal(why)}: {NO_BASE}", self.base_from)
        return self.base

    def final_tag(self, manifest: Manifest, ref: str | None, version: str | None,
                  variant: str | None) -> str:
        """The tag of an image of ``ref`` (``version``; None before it is known: the ref
        stands in) and ``variant``: the template filled, checked as a reference (an error
        names where the template came from)."""
        return _filled(manifest, self.tag, self.tag_from, ref, version, variant)


@dataclass(frozen=True)
class Asked:
    """The options of a verb that its run is made of, as given (None, or empty: left to the
    manifest).  The verb makes its run of them once, with :meth:`spec`."""

    ref: str | None = None
    repos: tuple[str, ...] | None = None
    refs: tuple[str, ...] = ()       # NAME=REF pins
    only: tuple[str, ...] = ()       # the packages the run is limited to
    base: str | None = None
    platform: str | None = None
    variant: str | None = None
    tag: str | None = None
    workdir: Path | None = None
    cache: Path | None = None
    timeout: float = DEFAULT_TIMEOUT
    engine: Engine | None = field(default=None, compare=False, repr=False)  # one handed in

    def reads_base(self, manifest: Manifest,
                   wanted: Mapping[str, Sequence[str]] | None = None) -> bool:
        """Whether the run reads a base image (see :func:`reading_base`); one that does with no
        base named is refused here, before an engine is connected for it."""
        why = reading_base(pins(manifest, ref=self.ref, repos=self.repos, refs=self.refs),
                           self.only, wanted)
        if why and not (self.base or manifest.image.base):
            raise SettingError(f"{literal(why)}: {NO_BASE}", Origin("base"))
        return why is not None

    def spec(self, manifest: Manifest, engine: Engine | None = None) -> RunSpec:
        """The run: these options, else the manifest's values; ``engine`` the verb's (else
        the one handed in)."""
        return run_spec(manifest, ref=self.ref, repos=self.repos, base=self.base,
                        platform=self.platform, variant=self.variant, refs=self.refs,
                        only=self.only, tag=self.tag, workdir=self.workdir, cache=self.cache,
                        timeout=self.timeout, engine=engine or self.engine)


NO_BASE = "give {base} IMAGE or set image.base in patchset.yaml"


def reading_base(pins: Sequence[Pin], only: Sequence[str] | None = None,
                 wanted: Mapping[str, Sequence[str]] | None = None) -> str | None:
    """Why a run of ``pins`` (limited to ``only``) reads a base image, or None: a package
    whose source is ``image``, or whose refs (``wanted``, by name; default its pin) hold
    ``base``.  A verb connects an engine for its run when this says so."""
    for p in pins:
        if only and not p.id.primary and p.name not in only:
            continue
        if p.id.primary and any(source.kind_of(s).reads_base for s in p.sources):
            return "the vLLM source 'image' is the vllm package of a base image"
        if p.id.primary and p.reads_base((wanted or {}).get(p.name)):
            return f"vLLM's ref {BASE_REF} reads the pin from a base image"
        if p.reads_base((wanted or {}).get(p.name)):
            return f"{p.name}: a pin read from a base image (ref 'base', source 'image')"
    return None


def run_spec(manifest: Manifest, *, ref: str | None = None, repos: Sequence[str] | None = None,
             base: str | None = None, platform: str | None = None,
             variant: str | None = None, refs: Sequence[str] = (),
             only: Sequence[str] = (), tag: str | None = None, workdir: Path | None = None,
             cache: Path | None = None, timeout: float = DEFAULT_TIMEOUT,
             engine: Engine | None = None) -> RunSpec:
    """The run ``manifest`` and the options given make.  An option left out (None; no
    ``repos``) takes the manifest's value; an empty ``ref`` stays, to be refused as a ref.
    ``refs`` are ``NAME=REF`` texts, ``only`` package names.  ``engine``: the engine the
    verb connected (None: the run has none)."""
    for name in only:
        _known(manifest, name, Origin("only"))
    image, at = manifest.image, manifest.image.lines
    base_from = _origin(manifest, "base", base is None and image.base is not None)
    platform_from = _origin(manifest, "platform", platform is None and "platform" in at)
    tag_from = _origin(manifest, "tag", tag is None)
    if base is not None:   # the manifest's base and tag were checked by its loader, at their line
        check_reference(base_from, base)
    if tag is not None:
        _filled(manifest, tag, tag_from, "x", "x", variant)
    base, template = base or image.base, tag_template(manifest, tag)
    return RunSpec(pins=pins(manifest, ref=ref, repos=repos, refs=refs), base=base,
                   platform=Platform.parse(platform or image.platform, platform_from),
                   variant=variant, only=tuple(dict.fromkeys(only)) if only else None,
                   tag=template, workdir=Path(workdir) if workdir is not None else None,
                   cache=cache or cache_dir(), timeout=timeout, engine=engine,
                   base_from=base_from, platform_from=platform_from, tag_from=tag_from)


def pins(manifest: Manifest, *, ref: str | None = None, repos: Sequence[str] | None = None,
         refs: Sequence[str] = ()) -> tuple[Pin, ...]:
    """Every package's pin, vLLM first: ``ref`` and ``repos`` (vLLM's), ``refs`` (``NAME=REF``
    each), else the manifest's."""
    moved = _moved_pins(manifest, refs)
    if VLLM.name in moved:
        given = moved[VLLM.name]
        if ref is not None and ref != given:
            raise SettingError(f"{{ref}} {literal(ref)} and {{refs}} {VLLM.name}="
                               f"{literal(given)} disagree; give one", Origin("ref"),
                               Origin("refs"))
        ref = given
    vllm = Pin(manifest.vllm.id, _ref(manifest, ref, repos),
               tuple(repos) if repos else manifest.sources())
    others = tuple(Pin(p.id, moved.get(p.name, p.ref), manifest.sources(p.repos))
                   for p in manifest.others)
    return (vllm, *others)


def _filled(manifest: Manifest, template: str, origin: Origin, ref: str | None,
            version: str | None, variant: str | None) -> str:
    """The one filling of a tag template: ``{ref}``, ``{version}``, ``{name}`` and
    ``{variant}`` put in, the tag checked as a reference that blames ``origin``."""
    tag = variants.default_tag(manifest, ref, version, template, variant)
    check_reference(origin, tag, digest_ok=False)
    return tag


def tag_template(manifest: Manifest, tag: str | None) -> str:
    """The image tag's template: ``tag`` (the option), else ``image.tag``, else
    ``NAME:{ref}``."""
    return tag if tag is not None else manifest.image.tag or f"{manifest.name}:{{ref}}"


def built_tag(manifest: Manifest) -> str:
    """The tag build-image gives the manifest's default build at its pin (image.tag, else
    NAME:{ref}): the moving tag copy-image, images and rollback take by default."""
    return variants.default_tag(manifest, manifest.vllm.ref, None, tag_template(manifest, None))


def _origin(manifest: Manifest, setting: str, from_manifest: bool) -> Origin:
    """Where ``setting`` came from: the option, else ``image.SETTING`` at its line."""
    line = manifest.image.lines.get(setting)
    if not from_manifest:
        return Origin(setting)
    return Origin(setting, f"image.{setting}", str(manifest.path), line)


def _moved_pins(manifest: Manifest, refs: Sequence[str]) -> dict[str, str]:
    moved: dict[str, str] = {}
    origin = Origin("refs")
    for text in refs:
        name, eq, value = text.partition("=")
        if not eq or not name.strip() or not value.strip():
            raise SettingError(f"{{refs}} {literal(repr(text))}: give NAME=REF, e.g. "
                               "{refs} flashinfer=v0.6.16", origin)
        name, value = name.strip(), value.strip()
        _known(manifest, name, origin)
        if moved.get(name, value) != value:
            raise SettingError(f"{{refs}} {literal(name)}= is given twice "
                               f"({literal(moved[name])}, {literal(value)}); give it once",
                               origin)
        moved[name] = value
    return moved


def _known(manifest: Manifest, name: str, origin: Origin) -> None:
    names = [p.name for p in manifest.packages]
    if name not in names:
        close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise SettingError(f"{{{origin.setting}}} {literal(name)}: the manifest has no package "
                           f"{literal(repr(name))} (packages: {literal(', '.join(names))})"
                           f"{literal(hint)}", origin)


def _ref(manifest: Manifest, ref: str | None, repos: Sequence[str] | None) -> str:
    """The ref option, else ``base`` when the command line's only source reads the base image
    (the source ``image``: patch what the image holds, one option says it), else the
    manifest's ref."""
    if ref is not None:
        return ref
    if repos and all(source.kind_of(r).reads_base for r in repos):
        return BASE_REF
    return manifest.vllm.ref
