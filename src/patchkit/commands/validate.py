"""``patchkit validate``: the manifest and the files it names, and nothing else.

Beyond what the loader checks, everything that can be checked without a tree is: each diff is
parsed, each transform compiled and imported and its ``Transform`` classes found, each
overlay's files listed, and every path rule ``apply`` applies that needs no release (a patch
of a package other than vLLM writes nothing in vLLM's folder or at the root).  A broken patch file is a ManifestError naming the file and its line.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from patchkit import kinds, manifest, syntax
from patchkit.errors import ManifestError
from patchkit.image import artifact
from patchkit.imageref import Platform
from patchkit.series import applier, compiled


@dataclass
class Validated:
    manifest: manifest.Manifest
    compiled: dict[str, str] = field(default_factory=dict)   # patch id -> what was found

    @property
    def kinds(self) -> Counter:
        return Counter(p.kind for p in self.manifest.patches)


def _compiled_code(m: manifest.Manifest) -> None:
    """Parsers the assertions will need, compiled code a wheel source cannot hold, and each
    artifact's wheel beside the manifest (its pins and its ELF header): checked now, not
    halfway through an apply."""
    for name in sorted({a.file for p in m.patches for a in p.verify}):
        syntax.for_file(name).ready()
    pins = [(p.name, p.label, p.repos, compiled.known_tops(p.id)) for p in m.packages]
    found = compiled.first_problem(m, m.patches, pins)
    if found:
        patch, why = found
        raise ManifestError(why, path=m.path.name, line=patch.line, entry=patch.label)
    for patch in m.patches:   # apply's path rules, as far as they need no release
        why = applier.outside_before_release(m, patch)
        if why:
            raise ManifestError(why, path=m.path.name, line=patch.line, entry=patch.label)
    platform = Platform.parse(m.image.platform)
    for patch in m.patches:
        if patch.artifact is not None and not patch.artifact.wheel.startswith("https://"):
            try:
                artifact.checked(patch.artifact, m.root, platform.arch, str(platform))
            except artifact.ArtifactError as exc:
                raise ManifestError(str(exc), path=m.path.name, line=patch.line,
                                    entry=patch.label) from None


def run(manifest_path: Path) -> Validated:
    m = manifest.load(manifest_path)
    _compiled_code(m)
    shown = Path(manifest_path).parent
    out = Validated(m)
    for p in m.patches:
        try:
            out.compiled[p.id] = kinds.get(p.kind).compile(m.root / p.path, p.path)
        except kinds.KindError as exc:
            raise ManifestError(str(exc), path=str(shown / p.path) if str(shown) != "." else
                                p.path, line=exc.line, entry=p.label) from None
    return out


def summary(v: Validated) -> dict:
    """The ``--format json`` shape: what a CI job needs to fan out over the packages."""
    m = v.manifest
    return {"ok": True, "name": m.name, "patches": len(m.patches),
            "packages": [{"name": p.name, "dist": p.dist, "ref": p.ref,
                          "patches": sum(1 for x in m.patches if x.package == p.name)}
                         for p in m.packages],
            "compiled": [{"id": p.id, "kind": p.kind, "path": p.path,
                          "found": v.compiled.get(p.id)} for p in m.patches]}
