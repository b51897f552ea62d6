"""Compiled code in a package's sources: what a source laid out from a wheel cannot hold.

A wheel (the ``pypi`` source) and an installed package (the ``image`` source) hold the files
the package installs: vLLM's wheel ships ``vllm/`` with its extensions already built
(``_C.abi3.so``, ``_moe_C``), and none of ``csrc/``, ``CMakeLists.txt`` or ``setup.py``.  A
patch to such a file can only take effect through a source build, so against a source that
holds no build tree it is refused before anything is fetched or applied, in one line.
FlashInfer is the other case: its wheel ships the CUDA sources it compiles at first use
(``flashinfer/data/csrc``), so a patch to them stays inside the package's folder.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path, PurePosixPath

from patchkit import kinds, source
from patchkit.manifest.model import Manifest, Patch
from patchkit import syntax

# Files and folders a package is built from, beside the compiled sources themselves.
_BUILD_NAMES = frozenset({"CMakeLists.txt", "setup.py", "setup.cfg", "pyproject.toml",
                          "MANIFEST.in", "Makefile"})
_BUILD_FOLDERS = frozenset({"csrc", "cmake", "kernels", "third_party"})
_BUILD_SUFFIXES = frozenset({".cmake"})


def is_compiled(path: str) -> bool:
    """True for a C/C++/CUDA source or a file of the build that compiles them."""
    p = PurePosixPath(path)
    return (syntax.for_file(path).compiled or p.name in _BUILD_NAMES
            or p.suffix in _BUILD_SUFFIXES or (len(p.parts) > 1 and p.parts[0] in _BUILD_FOLDERS))


def holds_build(sources: Iterable[str]) -> bool:
    """Whether any of ``sources`` can give a tree the package is built from."""
    return any(source.kind_of(s).holds_build_sources for s in sources)


def wheel_problem(root: Path, patches: Sequence[Patch], package: str, label: str,
                  sources: Sequence[str], tops: Sequence[str]) -> tuple[Patch, str] | None:
    """The first patch of ``package`` that changes compiled code outside the import folders
    ``tops`` when no source of ``sources`` holds a build tree, with the one-line reason; else
    None.  Any other path outside them fails as that patch applies (unsafe-path, or a diff
    whose file is missing)."""
    if not tops or holds_build(sources):
        return None
    where = ", ".join(f"{t}/" for t in tops)
    for patch in patches:
        if patch.package != package:
            continue
        try:
            touched = kinds.get(patch.kind).touched(root / patch.path)
        except (OSError, kinds.KindError):
            continue  # the kind fails it as it applies, with its own reason
        for path in touched:
            if ("/" in path and path.split("/", 1)[0] in tops) or not is_compiled(path):
                continue
            kind = " or ".join(dict.fromkeys(sources))
            return patch, (f"{path} is compiled code not in {label}'s source ({kind}: it holds {where} "
                           f"as the package installs it, no build tree); a change to it needs a "
                           f"source build of {label} from a git repository")
    return None


def first_problem(manifest: Manifest, patches: Sequence[Patch],
                  pins: Iterable[tuple[str, str, Sequence[str], Sequence[str]]]
                  ) -> tuple[Patch, str] | None:
    """The first patch that needs a source build its package's sources cannot give, with the
    reason.  ``pins``: (package name, label, sources, import folders) each."""
    for name, label, sources, tops in pins:
        found = wheel_problem(manifest.root, patches, name, label, sources, tops)
        if found:
            return found
    return None


def known_tops(package: source.PackageId) -> tuple[str, ...]:
    """A package's import folder when it is known without its release (vLLM's ``vllm``)."""
    return (package.top,) if package.top else ()
