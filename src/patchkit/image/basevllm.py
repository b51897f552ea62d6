"""The vLLM a base image holds, read without running it: its version and its package files.

vLLM's ref ``base`` pins from the installed version, its source ``image`` takes its pristine
tree from the package files; both are served by :class:`BaseVllm`, the
:class:`patchkit.source.Base` of an image on an engine.  :func:`for_run` decides whether a run
needs one, and says in one line why it cannot have one.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass

from patchkit import git
from patchkit import source
from patchkit.errors import ImageError
from patchkit.image import distinfo, package
from patchkit.image import base
from patchkit.engines.docker import Log
from patchkit.formats.layer import BaseImage
from patchkit.run import RunSpec, reading_base

SYMLINK, EXECUTABLE, REGULAR = 0o120000, 0o100755, 0o100644


@dataclass(frozen=True)
class BaseVllm:
    """A base image held open on an engine, and the vllm package found in it."""

    held: base.BaseStack
    package: package.Package
    version: str | None

    @property
    def image(self) -> BaseImage:
        return self.held.image

    @property
    def name(self) -> str:
        return self.image.name

    @property
    def key(self) -> str:
        return self.image.digest or self.image.image_id

    @property
    def platform(self) -> str:
        return str(self.image.platform)

    @property
    def package_dir(self) -> str:
        return self.package.dir

    def package_files(self) -> Iterator[git.TreeFile]:
        """Every file under the package folder as ``vllm/...``, streamed from one archive of
        the base held open."""
        yield from _folder_files(self.held.files, self.package.dir, source.VLLM.top)


@dataclass(frozen=True)
class BaseDist:
    """A base image on an engine, and another package's distribution installed in it (its
    dist-info): ``ref: base`` pins its installed version, ``repo: image`` takes its files."""

    held: base.BaseStack
    dist: distinfo.Dist
    tops: tuple[str, ...]      # its import folders (flashinfer), from RECORD

    image = BaseVllm.image
    name = BaseVllm.name
    key = BaseVllm.key
    platform = BaseVllm.platform

    @property
    def version(self) -> str:
        return self.dist.version

    @property
    def package_dir(self) -> str:
        return ", ".join(self.dist.path_of(t) for t in self.tops)

    def package_files(self) -> Iterator[git.TreeFile]:
        """Every file of its import folders, paths from the site (``flashinfer/...``)."""
        for top in self.tops:
            yield from _folder_files(self.held.files, self.dist.path_of(top), top)


def _folder_files(files, folder: str, top: str) -> Iterator[git.TreeFile]:
    """The files under ``folder`` of an image as ``TOP/...``, from one archive of it."""
    first = None
    for info, data in files.walk(folder):
        head, _, rest = info.name.partition("/")
        first = first or head
        if head != first or not rest:
            continue  # the folder itself
        rel = f"{top}/{rest.rstrip('/')}"
        if info.issym():
            yield git.TreeFile(rel, SYMLINK, info.linkname.encode("utf-8", "surrogateescape"))
        elif info.islnk():
            _, _, linked = info.linkname.partition("/")
            yield git.TreeFile(rel, REGULAR, same_as=f"{top}/{linked}")
        elif info.isreg():
            yield git.TreeFile(rel, EXECUTABLE if info.mode & 0o111 else REGULAR, data)


def _tops(dist: distinfo.Dist, base: str) -> tuple[str, ...]:
    """The import folders a distribution installed: RECORD's top folders holding __init__.py."""
    record = dist.record or {}
    tops = sorted({path.split("/", 1)[0] for path in record
                   if path.count("/") == 1 and path.endswith("/__init__.py")})
    if not tops:
        raise ImageError(f"base {base}: {dist.info} has no RECORD naming a package folder; "
                         f"cannot read {dist.name}'s files from it")
    return tuple(tops)


def vllm_of(held: base.BaseStack, log: Log = lambda m: None) -> BaseVllm:
    """The vLLM installed in the base held open."""
    files, image = held.files, held.image
    pkg = package.find_package(files, image.env)
    version = package.installed_version(files, pkg, None)
    log(f"base {image.name} holds vLLM {version or '(version unknown)'} in {pkg.dir}")
    return BaseVllm(held, pkg, version)


def held(run: RunSpec, hold: ExitStack, *, refs: Mapping[str, Sequence[str]] | None = None,
         log: Log = lambda m: None) -> base.BaseStack | None:
    """The run's base, opened once on the run's engine for as long as ``hold`` holds it, when
    a package of the run reads it (its ref ``base`` among ``refs``, by name, default its pin;
    or its source ``image``); None when none does."""
    why = reading_base(run.pins, run.only, refs)
    if why is None:
        return None
    return hold.enter_context(base.opened(run.the_engine(why), run.the_base(why),
                                          run.platform, log))


def for_packages(run: RunSpec, held: base.BaseStack | None, *,
                 refs: Mapping[str, Sequence[str]] | None = None,
                 log: Log = lambda m: None) -> dict[str, BaseDist]:
    """The base each other package of ``run`` reads (its ref ``base`` or its source
    ``image``), by package name: ``held``, the run's base held open; empty when none does.
    ``refs`` are the refs a package is taken at, by name (default: its pin)."""
    wanted = [pin for pin in run.others if run.in_run(pin.name) and pin.reads_base(
        (refs or {}).get(pin.name))]
    if not wanted:
        return {}
    held = held or _missing(run, f"{wanted[0].name}: a pin read from a base image (ref "
                                 "'base', source 'image')")
    installed, name = held.installed, held.image.name
    out = {}
    for pin in wanted:
        dist = installed.get(pin.dist)
        if dist is None:
            raise ImageError(f"base {name} has no {pin.dist} installed "
                             f"({installed.missing(pin.dist)})")
        out[pin.name] = BaseDist(held, dist, _tops(dist, name))
        log(f"base {name} holds {pin.dist} {dist.version} in {dist.site}")
    return out


def _missing(run: RunSpec, why: str):
    """No base was held for ``why``: the run names none, or has no engine to read it."""
    run.the_base(why)
    run.the_engine(why)
    raise AssertionError("a run with a base and an engine holds its base open")


def needed(run: RunSpec, refs: Sequence[str] | None = None) -> str | None:
    """Why ``run``'s vLLM (on ``refs``, default its ref) reads a base image, or None."""
    vllm = run.pin(source.VLLM.name)
    return reading_base((vllm,), None, None if refs is None else {vllm.name: refs})


def for_run(run: RunSpec, held: base.BaseStack | None, *, refs: Sequence[str] | None = None,
            log: Log = lambda m: None) -> BaseVllm | None:
    """The base ``run`` reads vLLM from (``held``, the run's base held open), when its
    sources or ``refs`` (default: its ref) need one; None when they do not."""
    why = needed(run, refs)
    if why is None:
        return None
    return vllm_of(held or _missing(run, why), log)
