"""``patchkit validate``: the manifest and the files it names, and nothing else."""

from __future__ import annotations

from pathlib import Path

from patchkit import manifest, source
from patchkit.errors import ManifestError
from patchkit.image import artifact
from patchkit.series import compiled, languages


def run(manifest_path: Path) -> manifest.Manifest:
    m = manifest.load(manifest_path)
    # A parser the assertions will need must load now, not halfway through an apply.
    for name in sorted({a.file for p in m.patches for a in p.verify}):
        languages.for_file(name).ready()
    pins = [(p.name, source.package_id(p.name, p.dist).label, p.repos,
             compiled.known_tops(p.name, p.dist)) for p in m.packages]
    found = compiled.first_problem(m, m.patches, pins)
    if found:
        patch, why = found
        raise ManifestError(why, path=m.path.name, line=patch.line, entry=patch.label)
    # an artifact's wheel beside the manifest is proven now: its pins and its ELF header
    platform = m.image.platform
    for patch in m.patches:
        if patch.artifact is not None and not patch.artifact.wheel.startswith("https://"):
            try:
                artifact.checked(patch.artifact, m.root, platform.split("/")[1], platform)
            except artifact.ArtifactError as exc:
                raise ManifestError(str(exc), path=m.path.name, line=patch.line,
                                    entry=patch.label) from None
    return m


def summary(m: manifest.Manifest) -> dict:
    """The ``--format json`` shape: what a CI job needs to fan out over the packages."""
    return {"ok": True, "name": m.name, "patches": len(m.patches),
            "packages": [{"name": p.name, "dist": p.dist, "ref": p.ref,
                          "patches": sum(1 for x in m.patches if x.package == p.name)}
                         for p in m.packages]}
