"""The vLLM a base image holds, as a source: ``vllm.repo: image`` / ``--vllm-repo image``.

The pristine tree is the ``vllm`` package installed in the base, every file of its folder but
byte-code caches and native objects (as for ``pypi``: what a patch can change), laid out
checkout-relative (``vllm/...``) so that diffs and transforms written against upstream apply to
the vendor's own files.  It is committed once as an orphan commit in ``<cache>/image/<dist>.git``
under a ref named by the base's digest (its image id when it has none) and platform, and reused
from then on; its version is the one the base has installed.

This module never reaches an engine: the caller hands it a :class:`Base`, which reads the
image (``patchkit.image.basevllm``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from patchkit import filelocks

from patchkit import git
from patchkit import versions
from patchkit.errors import SourceError, UsageError
from patchkit.packageid import VLLM, PackageId
from patchkit.source.protocol import Base
from patchkit.source.refs import BASE_REF, IMAGE_SOURCE
from patchkit.source.resolved import Log, Resolved, bare_repository
from patchkit.cache import cache_subdir

WORD = IMAGE_SOURCE



def no_base(package: PackageId) -> str:
    """Why the source ``image`` of ``package`` cannot be read without a base image."""
    return (f"the {package.label} source 'image' is the {package.dist} package of a base image: "
            "give --base IMAGE or set image.base in patchset.yaml")


NO_BASE = no_base(VLLM)
_SHA = re.compile(r"[0-9a-f]{7,40}")
_REF_PART = re.compile(r"[A-Za-z0-9._-]+")


class ImageSource:
    """The word ``image``: the package a base image has installed, as one orphan commit."""

    name = WORD
    holds_commits = False  # one tree per base, of patchkit's making
    reads_base = True
    holds_build_sources = False  # an image holds the installed package, not its build tree
    has_history = False    # one orphan commit per base: nothing to bisect
    no_history_why = "one commit per base, no history"

    def resolve(self, text: str, ref: str, cache: Path, log: Log, *,
                package: PackageId = VLLM, base: Base | None = None) -> Resolved:
        if base is None:
            raise UsageError(no_base(package))
        _check_ref(ref, base, package)
        repo, commit = ensure_tree(cache, base, log, package)
        return Resolved(text, repo, ref, commit, base.version)

    def tags(self, text: str, cache: Path, log: Log, *, package: PackageId = VLLM) -> list[str]:
        raise SourceError(f"the {package.label} source 'image' is one base's package and has no "
                          "releases to list; name the targets with --to, or list pypi among "
                          f"{package.key('repo')}", source=WORD)

    def label(self, text: str, version: str, package: PackageId = VLLM) -> str:
        return text


SOURCE = ImageSource()


def repo_path(cache: Path, package: PackageId = VLLM) -> Path:
    return cache / WORD / f"{package.dist}.git"


def ref_of(base: Base) -> str:
    """The cache's ref for the tree of ``base``."""
    parts = [base.key.replace(":", "-"), base.platform.replace("/", "-")]
    if not all(_REF_PART.fullmatch(p) for p in parts):
        raise SourceError(f"base {base.name}: cannot key the cache by {base.key!r} "
                          f"({base.platform})")
    return "refs/patchkit/bases/" + "/".join(parts)


def ensure_tree(cache: Path, base: Base, log: Log = lambda m: None,
                package: PackageId = VLLM) -> tuple[Path, str]:
    """The cached repository and the commit of ``base``'s package, made on first use."""
    repo = repo_path(cache, package)
    folder = cache_subdir(cache, WORD)
    ref = ref_of(base)
    with filelocks.held(folder / f"{package.dist}.lock", f"the cached {package.dist} of bases",
                        log):
        bare_repository(repo, log)
        commit = git.resolve_commit(repo, ref)
        if commit:
            log(f"{package.label} {base.version or '(version unknown)'} of {base.name}: cached as "
                f"{commit[:12]}")
            return repo, commit
        log(f"reading {base.package_dir} of {base.name} (once; cached by {base.key[:19]})")
        message = (f"{package.label} {base.version or '(version unknown)'} installed in "
                   f"{base.key}\n\n"
                   f"{base.package_dir} on {base.platform}, byte-code and native objects left out")
        try:
            commit, count = git.commit_files(repo, ref, _sources(base), message)
        except ValueError as exc:
            raise SourceError(f"base {base.name}: {exc}") from None
        log(f"{count} files of {base.package_dir} committed as {commit[:12]}")
        return repo, commit


def is_source(path: str, head: bytes) -> bool:
    """Whether a file of the package belongs in the pristine tree: not a byte-code cache, not a
    native object (by name or by its ELF header)."""
    p = PurePosixPath(path)
    if "__pycache__" in p.parts or p.suffix in (".pyc", ".pyo"):
        return False
    if p.suffix == ".so" or ".so." in p.name:
        return False
    return not head.startswith(b"\x7fELF")


def _sources(base: Base) -> Iterator[git.TreeFile]:
    kept: set[str] = set()
    for f in base.package_files():
        if f.same_as is not None:
            if f.same_as in kept:
                kept.add(f.path)
                yield f
            continue
        head = b"" if f.mode == 0o120000 else (f.data or b"")[:4]
        if not is_source(f.path, head):
            continue
        kept.add(f.path)
        yield f
    if not kept:
        raise SourceError(f"base {base.name}: {base.package_dir} holds no source files")


def _check_ref(ref: str, base: Base, package: PackageId = VLLM) -> None:
    """The tree is what the base holds: a ref other than ``base`` must name that."""
    if ref == BASE_REF:
        return
    installed = base.version
    wanted = versions.tag_version(ref)
    if installed and wanted and versions.same_release(installed, wanted):
        return
    named = versions.named_commit(installed)
    if named and _SHA.fullmatch(ref) and (ref.startswith(named) or named.startswith(ref)):
        return
    raise SourceError(f"the {package.label} source 'image' is what base {base.name} holds "
                      f"({package.label} {installed or 'of unknown version'}), and the pin {ref} "
                      f"names something else; give {package.option('ref', BASE_REF)}"
                      + (f" (or v{installed})" if installed else "")
                      + f", or list pypi among {package.key('repo')}", source=WORD)
