"""The releases of a package after its pin: what rebase-check's ``--releases`` and bump's
newest release are made of."""

from __future__ import annotations

from pathlib import Path

from patchkit import source, versions
from patchkit.errors import SourceError
from patchkit.manifest import VLLM, Manifest
from patchkit.run import RunSpec


def pin_version(run: RunSpec, cache: Path, log=lambda m: None,
                base: source.Base | None = None, package: str = VLLM.name) -> versions.Version:
    """The release the pin of ``package`` in ``run`` is, or the one its commit lies after."""
    pin = run.pin(package)
    v = versions.release_tag(pin.ref)
    if v is not None:
        return v
    resolved = source.resolve(pin.sources, pin.ref, cache, log, base=base,
                              package=pin.id)
    try:
        return versions.sort_key(resolved.version)
    except versions.InvalidVersion:
        raise SourceError(f"cannot tell which releases come after the pin {pin.ref!r}: "
                          "it is no release and has none below it; name targets with --to"
                          ) from None


def release_targets(manifest: Manifest, run: RunSpec, *, pre: bool = False,
                    log=lambda m: None, base: source.Base | None = None,
                    package: str = VLLM.name) -> list[str]:
    """The release tags of ``package`` after its pin in ``run``, oldest first (the run's cache
    holds what is fetched); pre-releases only with ``pre``."""
    cache = run.cache
    at = run.pin(package)
    # the releases first: a source with none to list (image) says so before the base's
    # files are read for the pin
    _, tags = source.list_tags(at.sources, cache, log,
                               package=at.id)
    pin = pin_version(run, cache, log, base, package)
    found: dict[versions.Version, str] = {}
    for tag in tags:
        v = versions.release_tag(tag)
        if v is None or v <= pin or (v.is_prerelease and not pre):
            continue
        found.setdefault(v, tag)
    return [found[v] for v in sorted(found)]
