"""vLLM versions and release tags: the one place that parses them.

Three readings of a tag, on purpose of different strictness:

* :func:`release_tag` is strict: ``vX.Y.Z`` exactly as PEP 440 normalises it, no local part.
  rebase-check lists releases with it, so ``v0.27.1+cu130`` or ``v0.27`` never pass for one.
* :func:`tag_version` is lenient: the version a tag or ``__version__`` string names, for telling
  which release a commit is.
* :func:`pypi_release` is what ``--vllm-repo pypi`` accepts, and says so when it is not one.

And two readings of an installed version (what a base image holds): :func:`named_commit`, the
commit a dev build's local part names, and :func:`base_pin`, what ``--vllm-ref base`` pins.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from patchkit.errors import UsageError
from patchkit.packageid import VLLM

__all__ = ["InvalidVersion", "Version", "parse", "release_tag", "tag_version", "pypi_release",
           "in_range", "in_ranges", "expected", "same_release", "sort_key", "named_commit", "Pin",
           "base_pin"]

# A local part that names the commit a build was made from: setuptools-scm's ``g<sha>``,
# optionally dated (``.d20260714``, a dirty tree), optionally with one of vLLM's own build
# labels (``.cu130``), which its setup.py appends to a dev version.
_BUILD_LABEL = r"(?:cu\d+|cpu|rocm\d*|xpu|tpu|hpu|neuron)"
_COMMIT_LOCAL = re.compile(rf"g([0-9a-f]{{7,40}})(?:\.d\d{{8}})?(?:\.{_BUILD_LABEL})?")
_RELEASE_LOCAL = re.compile(_BUILD_LABEL)


def parse(text: str | None) -> Version | None:
    """``text`` as a PEP 440 version, or None."""
    if not text:
        return None
    try:
        return Version(text)
    except InvalidVersion:
        return None


def release_tag(tag: str) -> Version | None:
    """The version a release tag ``vX.Y.Z`` (also ``vX.Y.ZrcN``, ``.postN``) names, else None."""
    if not tag.startswith("v"):
        return None
    v = parse(tag[1:])
    return v if v is not None and str(v) == tag[1:] and not v.local else None


def tag_version(tag: str) -> str | None:
    """The normalised version a tag or version string names (``v`` prefix optional), else None."""
    text = tag.removeprefix("v")
    if not re.match(r"^[0-9]", text):
        return None
    v = parse(text)
    return str(v) if v is not None else None


def pypi_release(ref: str, where: str = "the vLLM source pypi") -> str:
    """``v0.27.1`` or ``0.27.1`` -> ``0.27.1``; anything else is a usage error, naming the
    source (``where``).  A commit sha is none, even one of digits alone (a version to PEP 440):
    PyPI is not asked for it."""
    text = ref.removeprefix("v")
    if parse(text) is None or not re.fullmatch(r"[0-9][0-9A-Za-z.+\-]*", text) or \
            re.fullmatch(r"[0-9a-f]{40}", ref):
        raise UsageError(f"{where} takes a release tag such as v0.27.1, not {ref!r}")
    return text


def _shown(package: str | None) -> str:
    """How messages spell a package's name (None: vLLM's): vLLM by its label, the others as
    the manifest does."""
    return {VLLM.name: VLLM.label}.get(package or VLLM.name, package or "")


def in_ranges(ranges: Mapping[str, SpecifierSet | None],
              found: Mapping[str, str | None]) -> tuple[bool, str]:
    """Do a patch's ``ranges`` (package name -> specifier) hold for the versions ``found``
    (package name -> version, None when unknown)?  The reason of the first that does not, naming
    the package and its version.  A package ``found`` leaves out is not judged: the caller has
    no version of it to give."""
    for package, spec in ranges.items():
        if package in found:
            ok, why = in_range(spec, found[package], package)
            if not ok:
                return False, why
    return True, ""


def in_range(spec: SpecifierSet | None, version: str | None,
             package: str | None = None) -> tuple[bool, str]:
    """Is ``version`` of ``package`` inside ``spec`` (no spec: always); the reason when not."""
    if spec is None:
        return True, ""
    name = _shown(package)
    if version is None:
        return False, f"the {name} version is unknown, so the range {spec} cannot be checked"
    v = parse(version)
    if v is None:
        return False, f"{name} version {version!r} is not PEP 440"
    if spec.contains(v, prereleases=True):
        return True, ""
    return False, f"{name} {version} is outside {spec}"


def expected(version: str | None, ref: str | None) -> str | None:
    """The release a checkout holds: its version, else what a release-like ref names."""
    if version:
        return str(version)
    m = re.fullmatch(r"v?(\d+\.\d+(?:\.\d+)?(?:[.\-]?(?:rc|post|dev)\d+)?)", ref or "")
    return m.group(1) if m else None


def same_release(installed: str, wanted: str) -> bool:
    """Do two version strings name one release?  A local label (``+cu130``) names a build of it."""
    a, b = parse(installed), parse(wanted)
    if a is None or b is None:
        return installed == wanted
    return a.public == b.public


def sort_key(version: str | None) -> Version:
    """For sorting by release; raises InvalidVersion for what is none."""
    return Version(version or "")


def named_commit(version: str | None) -> str | None:
    """The (short) commit id a version's local part names, else None.

    ``0.26.1rc1.dev1257+g94d96e244`` -> ``94d96e244``; ``0.25.2.dev0+g752a3a504.d20260714`` ->
    ``752a3a504``; ``0.33.0``, ``0.31.0+nv25.11`` -> None.
    """
    v = parse(version)
    if v is None or not v.local:
        return None
    m = _COMMIT_LOCAL.fullmatch(v.local)
    return m.group(1) if m else None


@dataclass(frozen=True)
class Pin:
    """What an installed version pins in a git source: a commit, or a release tag."""

    ref: str        # ``94d96e244`` or ``v0.33.0``
    commit: bool    # True when ``ref`` is a commit id


def base_pin(version: str | None) -> Pin | None:
    """What ``--vllm-ref base`` pins for a base holding ``version``: the commit its local part
    names, else the tag of a plain release (``0.33.0`` -> ``v0.33.0``; upstream's own build
    labels such as ``+cu130`` name the same release); None for anything else (a vendor's
    ``0.31.0+nv25.11``, a dev version that names no commit)."""
    commit = named_commit(version)
    if commit:
        return Pin(commit, True)
    v = parse(version)
    if v is None or v.is_devrelease or (v.local and not _RELEASE_LOCAL.fullmatch(v.local)):
        return None
    return Pin(f"v{v.public}", False)
