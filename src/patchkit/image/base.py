"""A base image's stack: reading what it has installed, and proving a package's files pristine
on it.

:func:`read` reads a base's distributions from their dist-info, without running it;
:func:`check` judges them against the manifest (and the lock); :func:`prove_package` is the one
proof that the files a package's series changes are the base's pristine ones, used by
``build-image``, ``lock`` and the overlay build alike.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from patchkit.errors import ImageError
from patchkit.image import distinfo, labels
from patchkit.engines import registry
from patchkit.image import lockfile
from patchkit.formats.layer import BaseImage
from patchkit.image.distinfo import ListedFiles
from patchkit.imageref import Platform
from patchkit.manifest import Manifest
from patchkit.run import RunSpec
from patchkit.series import checkout

Log = Callable[[str], None]


@dataclass(frozen=True)
class InRegistry:
    """A base as its registry has it, read without pulling a layer: its manifest's digest,
    and the vLLM its config declares (None: only its files would say)."""

    name: str
    digest: str
    vllm: str | None
    said_by: str | None     # the label or variable that says it


def in_registry(name: str, platform: Platform, timeout: float) -> InRegistry | None:
    """``name``'s manifest and config read from its registry (an index followed to
    ``platform``); None when the registry has no such name or tag.  A registry that does not
    answer is a ``registry.UnreachableError``, one that refuses an ``ImageError``."""
    if shutil.which("skopeo") is None:
        raise registry.UnreachableError("skopeo, the registry client, is not on PATH")
    try:
        remote = registry.Registry(timeout=timeout).resolve(name, platform)
    except registry.MissingError:
        return None
    declared = labels.declared_vllm(json.loads(remote.config))
    return InRegistry(name, remote.digest, *(declared or (None, None)))


@dataclass(frozen=True)
class BaseStack:
    """A base image, resolved once, and its files: read through one stopped container while
    the caller holds it open (:func:`opened`), every distribution it has installed read from
    them on first use, once."""

    image: BaseImage
    files: ListedFiles = field(compare=False, repr=False)
    log: Log = field(default=lambda m: None, compare=False, repr=False)

    @property
    def digest(self) -> str:
        return self.image.digest or self.image.image_id

    @cached_property
    def installed(self) -> distinfo.Installed:
        """Every distribution the base has installed, from its dist-info (read once)."""
        installed = distinfo.installed(self.files, self.image.env)
        self.log(f"base {self.image.name}: {len(installed.dists)} distribution(s) installed in "
                 f"{', '.join(installed.sites) or '(no site-packages)'}")
        return installed


@contextmanager
def opened(engine, ref: str, platform: Platform, log: Log = lambda m: None
           ) -> Iterator[BaseStack]:
    """The base ``ref`` (pulled when missing), resolved once, its files readable through one
    stopped container until the caller lets go: every later reader of the base (its
    distributions, vLLM's package, a package's pristine files, the overlay's plan) takes
    this value rather than reading the base again."""
    image = engine.resolve_base(ref, platform, log)
    with engine.files(image.image_id, image.name) as fs:
        yield BaseStack(image, fs, log)


def read(engine, ref: str, platform: Platform, log: Log = lambda m: None) -> BaseStack:
    """The base ``ref`` and what its dist-info say is installed, read at once (its files are
    not kept open)."""
    with opened(engine, ref, platform, log) as held:
        held.installed  # noqa: B018 (read while the files are there)
        return held


def check(manifest: Manifest, base: BaseStack, lock: lockfile.Lock | None) -> None:
    """The base's pins and ``image.requires``; with ``lock``, also the base's digest and
    installed versions against it (each difference named)."""
    lockfile.check_base(manifest, base.installed, base.image.name)
    if lock is not None:
        lockfile.check_locked(manifest, lock, base.digest, base.installed, base.image.name)


def judged(manifest: Manifest, run: RunSpec, engine, lock: lockfile.Lock | None,
           hold: ExitStack, log: Log = lambda m: None) -> BaseStack | None:
    """The run's base, opened once for as long as ``hold`` holds it, and judged before the
    apply: the packages' pins, ``image.requires`` and the lock (when they ask).  None when the
    run has no base or no ``engine`` reads it (the registry path judges them on the base's
    layers)."""
    if lock is not None:
        run.the_base("the lock is compared with the base")
    if engine is None or not run.base:
        return None
    held = hold.enter_context(opened(engine, run.base, run.platform, log))
    if lock is not None or manifest.others or manifest.image.requires:
        check(manifest, held, lock)
    return held


def prove_package(files, installed: distinfo.Installed, base: str, name: str, dist_name: str,
                  tree: checkout.AppliedCheckout, log: Log = lambda m: None
                  ) -> tuple[distinfo.Dist, distinfo.Proof]:
    """Package ``name``'s applied checkout ``tree`` proven on the base's ``files``: the files
    its series changes are the pristine ones where ``dist_name`` is installed (by RECORD where
    it has their hashes).  The dist and the proof."""
    dist = installed.get(dist_name)
    if dist is None:
        raise ImageError(f"base {base} has no {dist_name} installed "
                         f"({installed.missing(dist_name)})")
    proof = distinfo.prove_checkout(files, dist, tree, package=name, image=base)
    log(f"{name}: the files to replace in {dist.site} are pristine ({proof.describe()})")
    return dist, proof


def prove_packages(manifest: Manifest, workdir: Path, base: BaseStack | None,
                   log: Log = lambda m: None) -> dict[str, distinfo.Proof]:
    """Each package's applied checkout beside ``workdir`` (``.patchkit/<name>``) proven on the
    base held open, with :func:`prove_package`.  vLLM's own proof is made by the overlay
    plan."""
    trees = [(p, p.checkout(workdir)) for p in manifest.others]
    trees = [(p, d) for p, d in trees if checkout.is_checkout(d)]
    if not trees or base is None:
        return {}
    return {package.name: prove_package(base.files, base.installed, base.image.name,
                                        package.name, package.dist,
                                        checkout.AppliedCheckout.open(where), log)[1]
            for package, where in trees}
