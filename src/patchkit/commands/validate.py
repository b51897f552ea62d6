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

from patchkit import kinds, manifest, syntax, versions
from patchkit.errors import ManifestError
from patchkit.image import artifact
from patchkit.imageref import Platform
from patchkit.series import applier, compiled
from patchkit.timeouts import DEFAULT_TIMEOUT


@dataclass
class Validated:
    manifest: manifest.Manifest
    compiled: dict[str, str] = field(default_factory=dict)   # patch id -> what was found
    warnings: list[str] = field(default_factory=list)       # one line each; nothing fails

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
                # a wheel in the project: nothing downloaded, no cache, no wait
                artifact.checked(patch.artifact, m.root, platform.arch, str(platform), None,
                                 DEFAULT_TIMEOUT)
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
    out.warnings = same_changes(m)
    return out


def same_changes(m: manifest.Manifest) -> list[str]:
    """A warning for each patch that makes a change an earlier patch of its package makes too:
    where both take effect, the later one finds the change made, and is reported as made by
    the earlier one, never upstream."""
    seen: dict[tuple[str, tuple[str, ...]], list[manifest.Patch]] = {}
    out = []
    for p in m.patches:
        for change in sorted(kinds.get(p.kind).changes(m.root / p.path)):
            earlier = seen.setdefault((p.package, change), [])
            first = next((q for q in earlier if _together(q, p)), None)
            earlier.append(p)
            if first is not None:
                out.append(f"warning: {m.path.name}:{p.line}: {p.label}: makes the same change as "
                           f"{first.id} (in {change[0]}): where both take effect, {p.id} finds "
                           f"it made by {first.id}")
                break
    return out


def _together(a: manifest.Patch, b: manifest.Patch) -> bool:
    """Can both take effect in one build?  Not a fix and the patch that carries it on
    (``supersedes:``), nor two whose ranges share no release (judged at the versions the
    ranges name, and just below each)."""
    if a.id in b.supersedes or b.id in a.supersedes:
        return False
    for name in set(a.ranges) | set(b.ranges):
        x, y = a.ranges.get(name), b.ranges.get(name)
        if x is None or y is None:
            continue
        bounds = {spec.version for spec in [*x, *y]}
        points = [versions.parse(v) for v in bounds] + [versions.parse(f"{v}.dev0") for v in bounds]
        if not any(v is not None and x.contains(v, prereleases=True)
                   and y.contains(v, prereleases=True) for v in points):
            return False
    return True


def summary(v: Validated) -> dict:
    """The ``--format json`` shape: what a CI job needs to fan out over the packages."""
    m = v.manifest
    return {"ok": True, "name": m.name, "patches": len(m.patches), "warnings": v.warnings,
            "packages": [{"name": p.name, "dist": p.dist, "ref": p.ref,
                          "patches": sum(1 for x in m.patches if x.package == p.name)}
                         for p in m.packages],
            "compiled": [{"id": p.id, "kind": p.kind, "path": p.path,
                          "found": v.compiled.get(p.id)} for p in m.patches]}
