"""``patchkit lock``: write ``patchset.lock``, the stack the series is proven on.

Also the base's side of ``build-image`` and ``--locked``: :func:`read_base` reads what a base
has installed from its dist-info, without running it, and :func:`check_locked` compares a
base with the lock.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from patchkit import files
from patchkit.errors import ImageError, UsageError
from patchkit.image import distinfo
from patchkit.image import lockfile as stack
from patchkit.image.layer import BaseImage
from patchkit.imageref import Platform, check_reference
from patchkit.manifest import Manifest
from patchkit.manifest.runspec import run_spec
from patchkit.series import checkout
from patchkit.timeouts import DEFAULT_TIMEOUT


@dataclass(frozen=True)
class BaseStack:
    """A base image and every distribution it has installed."""

    image: BaseImage
    installed: distinfo.Installed

    @property
    def digest(self) -> str:
        return self.image.digest or self.image.image_id


@dataclass
class LockReport:
    path: str
    written: bool          # False: the file already held these bytes
    lock: stack.Lock

    def to_dict(self) -> dict:
        return {"ok": True, "path": self.path, "written": self.written,
                "base": {"name": self.lock.base_name, "digest": self.lock.base_digest},
                "packages": {k: vars(v) for k, v in sorted(self.lock.packages.items())},
                "installed": dict(sorted(self.lock.installed.items()))}


def lock_path(manifest: Manifest) -> Path:
    return manifest.root / stack.LOCK_FILE


def read_lock(manifest: Manifest) -> stack.Lock:
    return stack.Lock.read(lock_path(manifest))


def read_base(engine, ref: str, platform: Platform, log=lambda m: None) -> BaseStack:
    """The base ``ref`` (pulled when missing) and what its dist-info say is installed."""
    image = engine.resolve_base(ref, platform, log)
    with engine.files(image.image_id, image.name) as fs:
        installed = distinfo.installed(fs, image.env)
    log(f"base {ref}: {len(installed.dists)} distribution(s) installed in "
        f"{', '.join(installed.sites) or '(no site-packages)'}")
    return BaseStack(image, installed)


def check_base(manifest: Manifest, base: BaseStack, lock: stack.Lock | None) -> None:
    """The base's pins and ``image.requires``; with ``lock``, also the base's digest and
    installed versions against it (each difference named)."""
    stack.check_base(manifest, base.installed, base.image.name)
    if lock is not None:
        stack.check_locked(manifest, lock, base.digest, base.installed, base.image.name)


def check_packages(manifest: Manifest, lock: stack.Lock, packages: dict[str, stack.Pinned]
                   ) -> None:
    found = stack.package_differences(lock, packages)
    if found:
        raise stack.refused(found, lock_path(manifest), "the applied stack")


def prove_packages(manifest: Manifest, workdir: Path, engine, base: BaseStack | None,
                   log=lambda m: None) -> dict[str, distinfo.Proof]:
    """Each package's applied checkout beside ``workdir`` (``.patchkit/<name>``) proven on the
    base: the files its series changes are the pristine ones there (by RECORD where it has
    their hashes).  vLLM's own proof is made by the overlay plan, with the same function."""
    trees = [(p, p.checkout(workdir)) for p in manifest.others]
    trees = [(p, d) for p, d in trees if checkout.is_checkout(d)]
    if not trees or base is None or engine is None:
        return {}
    proofs = {}
    with engine.files(base.image.image_id, base.image.name) as fs:
        for package, where in trees:
            dist = base.installed.get(package.dist)
            if dist is None:  # check_base refused it already; a checkout made since is not
                raise ImageError(f"base {base.image.name} has no {package.dist} installed "
                                       f"({base.installed.missing(package.dist)})")
            proofs[package.name] = distinfo.prove_checkout(
                fs, dist, checkout.AppliedCheckout.open(where), package=package.name,
                image=base.image.name)
            log(f"{package.name}: the files to replace in {dist.site} are pristine "
                f"({proofs[package.name].describe()})")
    return proofs


def run(manifest: Manifest, *, workdir: Path, base: str | None = None,
        platform: str | None = None, engine=None, log=lambda m: None,
        timeout: float = DEFAULT_TIMEOUT) -> LockReport:
    """Read the base and the applied checkouts, and write ``patchset.lock`` beside the
    manifest (atomically; the same stack gives the same bytes).  ``timeout`` bounds each
    silence of the engine."""
    spec = run_spec(manifest, base=base, platform=platform)
    if not spec.base:
        raise UsageError("patchkit lock needs a base: give --base IMAGE or set image.base in "
                         "patchset.yaml")
    check_reference("--base" if base else "image.base", spec.base)
    plat = Platform.parse(spec.platform)
    if engine is None:
        from patchkit.image.docker import Engine

        engine = Engine.connect(timeout=timeout)
    held = read_base(engine, spec.base, plat, log)
    check_base(manifest, held, None)
    packages = stack.patched_packages(manifest, Path(workdir), held.installed)
    for name, p in sorted(packages.items()):
        log(f"{name} {p.version} ({'commit ' + p.commit[:12] if p.commit else 'no commit'}, "
            f"from {p.source})")
    artifacts = {}
    if checkout.is_checkout(Path(workdir)):
        from patchkit.image.labels import artifacts_of

        report = checkout.AppliedCheckout.open(Path(workdir)).report
        artifacts = {a.pop("patch"): a for a in artifacts_of(manifest, report)}
    lock = stack.Lock(spec.base, held.digest, packages, held.installed.versions(), artifacts)
    path = lock_path(manifest)
    written = files.write_if_changed(path, lock.render())
    return LockReport(str(path), written, lock)
