"""A base image's stack: reading what it has installed, and proving a package's files pristine
on it.

:func:`read` reads a base's distributions from their dist-info, without running it;
:func:`check` judges them against the manifest (and the lock); :func:`prove_package` is the one
proof that the files a package's series changes are the base's pristine ones, used by
``build-image``, ``lock`` and the overlay build alike.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from patchkit.errors import ImageError
from patchkit.image import distinfo
from patchkit.image import lockfile as stack
from patchkit.image.layer import BaseImage
from patchkit.imageref import Platform
from patchkit.manifest import Manifest
from patchkit.run import RunSpec
from patchkit.series import checkout

Log = Callable[[str], None]


@dataclass(frozen=True)
class BaseStack:
    """A base image and every distribution it has installed."""

    image: BaseImage
    installed: distinfo.Installed

    @property
    def digest(self) -> str:
        return self.image.digest or self.image.image_id


def read(engine, ref: str, platform: Platform, log: Log = lambda m: None) -> BaseStack:
    """The base ``ref`` (pulled when missing) and what its dist-info say is installed."""
    image = engine.resolve_base(ref, platform, log)
    with engine.files(image.image_id, image.name) as fs:
        installed = distinfo.installed(fs, image.env)
    log(f"base {ref}: {len(installed.dists)} distribution(s) installed in "
        f"{', '.join(installed.sites) or '(no site-packages)'}")
    return BaseStack(image, installed)


def check(manifest: Manifest, base: BaseStack, lock: stack.Lock | None) -> None:
    """The base's pins and ``image.requires``; with ``lock``, also the base's digest and
    installed versions against it (each difference named)."""
    stack.check_base(manifest, base.installed, base.image.name)
    if lock is not None:
        stack.check_locked(manifest, lock, base.digest, base.installed, base.image.name)


def judged(manifest: Manifest, run: RunSpec, engine, lock: stack.Lock | None,
           log: Log = lambda m: None) -> BaseStack | None:
    """The run's base read and judged before the apply: the packages' pins, ``image.requires``
    and the lock.  None when nothing asks (or no ``engine`` reads it: the registry path judges
    them on the base's layers)."""
    if lock is not None:
        run.the_base("the lock is compared with the base")
    if engine is None or not run.base:
        return None
    if lock is None and not manifest.others and not manifest.image.requires:
        return None
    held = read(engine, run.base, run.platform, log)
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


def prove_packages(manifest: Manifest, workdir: Path, engine, base: BaseStack | None,
                   log: Log = lambda m: None) -> dict[str, distinfo.Proof]:
    """Each package's applied checkout beside ``workdir`` (``.patchkit/<name>``) proven on the
    base, with :func:`prove_package`.  vLLM's own proof is made by the overlay plan."""
    trees = [(p, p.checkout(workdir)) for p in manifest.others]
    trees = [(p, d) for p, d in trees if checkout.is_checkout(d)]
    if not trees or base is None or engine is None:
        return {}
    proofs = {}
    with engine.files(base.image.image_id, base.image.name) as fs:
        for package, where in trees:
            proofs[package.name] = prove_package(
                fs, base.installed, base.image.name, package.name, package.dist,
                checkout.AppliedCheckout.open(where), log)[1]
    return proofs
