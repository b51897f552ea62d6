"""Prebuilt compiled modules that would shadow a patched source in the image.

FlashInfer loads a module from ``flashinfer_jit_cache`` when that distribution is installed and
holds it, and then never reads the module's sources: a patched header would be shipped and
never compiled.  For each file a package's patches changed, the apply report names the JIT
modules built from it (:mod:`patchkit.series.jit`); a module the base ships prebuilt is
refused, in one line naming the module and the file, unless the patch says ``rebuild: jit``.
Then the image leaves the prebuilt module out (a whiteout of its folder in the one overlay
layer), and the package compiles it from the patched sources on first use.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from patchkit.errors import ImageError
from patchkit.image import layer
from patchkit.image.distinfo import Installed
from patchkit.series import jit


@dataclass(frozen=True)
class Shadow:
    package: str
    file: str            # the patched file
    module: str          # the module built from it
    dist: str            # the distribution that ships the module prebuilt
    version: str
    folder: str          # the module's folder in the image
    member: str          # the module's folder in its distribution


def shadows(installed: Installed, packages: Sequence) -> list[Shadow]:
    """Every prebuilt module in the base built from a file that ``packages`` (build.PackageTree
    values) patched, in the order of the reports."""
    out: list[Shadow] = []
    for p in packages:
        rules = jit.rules_for(p.dist)
        if rules is None or rules.prebuilt_dist is None:
            continue
        dist = installed.get(rules.prebuilt_dist)
        if dist is None:
            continue
        prefix = rules.prebuilt_folder.split("{", 1)[0]
        held = {row[len(prefix):].split("/", 1)[0] for row in (dist.record or {})
                if row.startswith(prefix) and "/" in row[len(prefix):]}
        for file, modules in p.tree.report.jit_modules.get(p.name, {}).items():
            for module in modules:
                if module in held:
                    folder = rules.prebuilt_folder.format(name=module)
                    out.append(Shadow(p.name, file, module, dist.name, dist.version,
                                      f"{dist.site.rstrip('/')}/{folder}", folder))
    return out


def leave_out(installed: Installed, packages: Sequence, base: str,
              log=lambda m: None, shipped: set[tuple[str, str]] = frozenset()  # type: ignore[assignment]
              ) -> list[layer.LayerEntry]:
    """The layer's whiteouts for the prebuilt modules that patches with ``rebuild: jit`` leave
    out; :class:`ImageError` for one that no patch says what to do with.  A module an
    artifact ships (``shipped``: (dist, member) pairs) counts as rebuilt."""
    entries: list[layer.LayerEntry] = []
    done: set[str] = set()
    for s in shadows(installed, packages):
        if any(d == s.dist and m.startswith(s.member + "/") for d, m in shipped):
            log(f"{s.package}: {s.module} is shipped rebuilt by an artifact")
            continue
        allowed = next(p for p in packages if p.name == s.package).rebuild_jit
        if s.file not in allowed:
            raise ImageError(
                f"base {base} ships the prebuilt JIT module {s.module} ({s.dist} {s.version}, "
                f"{s.folder}), which {s.package} loads instead of compiling the patched "
                f"{s.file}; say `rebuild: jit` on the patch to leave it out of the image, or "
                "ship the rebuilt module as an artifact")
        if s.folder not in done:
            done.add(s.folder)
            entries.append(layer.LayerEntry(s.folder.lstrip("/"), "whiteout"))
            log(f"{s.package}: prebuilt {s.module} left out ({s.dist} {s.version}); it is "
                f"compiled from the patched {s.file} on first use")
    return entries


# --------------------------------------------------------------------------- the mounted cache

WORKSPACE_ENV = "FLASHINFER_WORKSPACE_BASE"


def workspace(packages: Sequence, user: str | None) -> dict[str, str]:
    """The environment that gives the package's JIT cache a place of its own for these
    patched sources: ``{FLASHINFER_WORKSPACE_BASE: <home>/.cache/patchkit-jit/<digest>}``, the
    digest that of every patched file a JIT module is built from (path and blob).  A cache a
    container mounts at FlashInfer's default place (``~/.cache/flashinfer``), which may hold
    modules built from the pristine sources, is then never read; a cache mounted at the new
    place only ever holds modules built from these sources.  {} when no JIT module is fed."""
    fed: list[str] = []
    for p in packages:
        rules = jit.rules_for(p.dist)
        modules = p.tree.report.jit_modules.get(p.name, {})
        if rules is None or not modules:
            continue
        fed += [f"{p.name}:{c.path}:{c.blob}" for c in p.shipped if modules.get(c.path)]
    if not fed:
        return {}
    digest = hashlib.sha256("\n".join(sorted(fed)).encode()).hexdigest()[:16]
    home = "/root" if (user or "root").split(":")[0] in ("root", "0") else "/tmp"
    return {WORKSPACE_ENV: f"{home}/.cache/patchkit-jit/{digest}"}
