"""What one run builds: the manifest's defaults and the command line's choices, settled once.

Every verb makes its :class:`RunSpec` with :func:`run_spec`; what runs below the verb takes the
values of it (a ref, the sources, a base name) rather than the manifest's defaults again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from patchkit.manifest.model import Manifest
from patchkit.source.refs import BASE_REF, IMAGE_SOURCE


@dataclass(frozen=True)
class RunSpec:
    ref: str                   # the vLLM ref: --vllm-ref, else vllm.ref (may be `base`)
    sources: tuple[str, ...]   # --vllm-repo, else vllm.repo (local paths from the manifest's folder)
    base: str | None           # the base image name: --base, else image.base
    platform: str              # OS/ARCH: --platform, else image.platform
    variant: str | None = None  # the build of the series (None: the default build)


def run_spec(manifest: Manifest, *, ref: str | None = None, repos: Sequence[str] | None = None,
             base: str | None = None, platform: str | None = None,
             variant: str | None = None) -> RunSpec:
    """The run ``manifest`` and the options given make.  An option left out (None; no
    ``repos``) takes the manifest's value; an empty ``ref`` stays, to be refused as a ref."""
    return RunSpec(ref=_ref(manifest, ref, repos),
                   sources=tuple(repos) if repos else manifest.sources(),
                   base=base or manifest.image.base,
                   platform=platform or manifest.image.platform,
                   variant=variant)


def _ref(manifest: Manifest, ref: str | None, repos: Sequence[str] | None) -> str:
    """``--vllm-ref``, else ``base`` when the command line's only source is ``image`` (patch
    what the image holds: one flag says it), else the manifest's ref."""
    if ref is not None:
        return ref
    if repos and all(r == IMAGE_SOURCE for r in repos):
        return BASE_REF
    return manifest.vllm.ref
