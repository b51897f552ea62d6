"""``patchkit lock``: write ``patchset.lock``, the stack the series is proven on."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from patchkit import files
from patchkit.image import base as base_
from patchkit.image import lockfile
from patchkit.engines.docker import Engine
from patchkit.manifest import Manifest
from patchkit.run import run_spec
from patchkit.series import checkout
from patchkit.timeouts import DEFAULT_TIMEOUT


@dataclass(frozen=True)
class LockReport:
    path: str
    written: bool          # False: the file already held these bytes
    lock: lockfile.Lock

    def to_dict(self) -> dict:
        return {"ok": True, "path": self.path, "written": self.written,
                "base": {"name": self.lock.base_name, "digest": self.lock.base_digest},
                "packages": {k: vars(v) for k, v in sorted(self.lock.packages.items())},
                "installed": dict(sorted(self.lock.installed.items()))}


def run(manifest: Manifest, *, workdir: Path, base: str | None = None,
        platform: str | None = None, engine: Engine | None = None, log=lambda m: None,
        timeout: float = DEFAULT_TIMEOUT) -> LockReport:
    """Read the base and the applied checkouts, and write ``patchset.lock`` beside the
    manifest (atomically; the same stack gives the same bytes).  ``timeout`` bounds each
    silence of the engine."""
    spec = run_spec(manifest, base=base, platform=platform, workdir=workdir, timeout=timeout)
    name = spec.the_base("the lock")   # the run decides the base, before an engine is asked
    held = base_.read(engine or Engine.connect(timeout=timeout), name, spec.platform, log)
    base_.check(manifest, held, None)
    packages = lockfile.patched_packages(manifest, Path(workdir), held.installed)
    for name, p in sorted(packages.items()):
        log(f"{name} {p.version} ({'commit ' + p.commit[:12] if p.commit else 'no commit'}, "
            f"from {p.source})")
    artifacts = {}
    if checkout.is_checkout(Path(workdir)):
        from patchkit.image.labels import artifacts_of

        report = checkout.AppliedCheckout.open(Path(workdir)).report
        artifacts = {a.pop("patch"): a for a in artifacts_of(manifest, report)}
    lock = lockfile.Lock(spec.base, held.digest, packages, held.installed.versions(), artifacts)
    path = lockfile.lock_path(manifest)
    written = files.write_if_changed(path, lock.render())
    return LockReport(str(path), written, lock)
