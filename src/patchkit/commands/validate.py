"""``patchkit validate``: the manifest and the files it names, and nothing else.

Beyond what the loader checks, everything that can be checked without a tree is: each diff is
parsed, each transform compiled and imported and its ``Transform`` classes found, each
overlay's files listed.  A broken patch file is a ManifestError naming the file and its line.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from patchkit import kinds, manifest
from patchkit.errors import ManifestError


@dataclass
class Validated:
    manifest: manifest.Manifest
    compiled: dict[str, str] = field(default_factory=dict)   # patch id -> what was found

    @property
    def kinds(self) -> Counter:
        return Counter(p.kind for p in self.manifest.patches)


def run(manifest_path: Path) -> Validated:
    m = manifest.load(manifest_path)
    shown = Path(manifest_path).parent
    out = Validated(m)
    for p in m.patches:
        try:
            out.compiled[p.id] = kinds.get(p.kind).compile(m.root / p.path, p.path)
        except kinds.KindError as exc:
            raise ManifestError(str(exc), path=str(shown / p.path) if str(shown) != "." else
                                p.path, line=exc.line, entry=p.label) from None
    return out


def plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n} {word if n == 1 else many or word + 's'}"


def describe(v: Validated) -> str:
    """The parenthesis of the text report: what was counted and compiled."""
    m = v.manifest
    parts = [plural(len(m.patches), "patch", "patches")]
    done = {"diff": "parsed", "transform": "imported", "overlay": "listed"}
    parts += [f"{plural(n, kind)} {done.get(kind, 'checked')}" for kind, n in v.kinds.items()]
    asserted = sum(len(p.verify) for p in m.patches)
    if asserted:
        parts.append(plural(asserted, "assertion"))
    markers = len(m.runtime) + sum(len(p.runtime) for p in m.patches)
    if markers:
        parts.append(plural(markers, "runtime marker"))
    return ", ".join(parts)


def summary(v: Validated) -> dict:
    """The ``--format json`` shape: what a CI job needs to fan out over the packages."""
    m = v.manifest
    return {"ok": True, "name": m.name, "patches": len(m.patches),
            "packages": [{"name": p.name, "dist": p.dist, "ref": p.ref,
                          "patches": sum(1 for x in m.patches if x.package == p.name)}
                         for p in m.packages],
            "compiled": [{"id": p.id, "kind": p.kind, "path": p.path,
                          "found": v.compiled.get(p.id)} for p in m.patches]}
