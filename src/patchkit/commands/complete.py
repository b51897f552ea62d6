"""What shell completion offers, read from the project found from the current folder and from
the cache alone (no network, nothing written): patch ids, variants, release tags."""

from __future__ import annotations

from pathlib import Path

from patchkit import manifest as manifest_
from patchkit import versions
from patchkit.cache import cache_dir
from patchkit.errors import PatchkitError
from patchkit.manifest import Manifest, discovery


def _manifest(given: str | None) -> Manifest | None:
    path = Path(given) if given else discovery.find()
    if path is None:
        return None
    try:
        return manifest_.load(path)
    except PatchkitError:
        return None


def patch_ids(manifest_path: str | None = None) -> list[str]:
    m = _manifest(manifest_path)
    return [p.id for p in m.patches] if m else []


def variant_names(manifest_path: str | None = None) -> list[str]:
    m = _manifest(manifest_path)
    return list(m.variants) if m else []


def tags(manifest_path: str | None = None) -> list[str]:
    """Every tag the cached copies of the manifest's sources hold, newest release first."""
    from patchkit import git
    from patchkit.source import mirror, pypi

    m = _manifest(manifest_path)
    if m is None:
        return []
    cache = cache_dir()
    found: set[str] = set()
    for pkg in m.packages:
        for src in m.sources(pkg.repos):
            if src == pypi.WORD:
                repo = cache / pypi.WORD / f"{pkg.dist}.git"
            elif src in ("image",):
                continue
            else:
                try:
                    repo = cache / "repos" / f"{mirror._slug(mirror._url_of(src))}.git"
                except PatchkitError:
                    continue
            if (repo / "HEAD").is_file():
                try:
                    found.update(git.tags(repo))
                except PatchkitError:
                    continue
    releases, others = [], []
    for t in sorted(found):
        if t.startswith("patchkit/"):
            continue
        try:
            releases.append((versions.sort_key(versions.tag_version(t)), t))
        except versions.InvalidVersion:
            others.append(t)
    return [t for _, t in sorted(releases, reverse=True)] + others
