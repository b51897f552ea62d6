"""The manifest as values: frozen dataclasses that keep their YAML line numbers."""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from packaging.specifiers import SpecifierSet

from patchkit import versions
from patchkit.packageid import VLLM, PackageId
from patchkit.source import WORDS

# `not_contains: TEXT` is read as `not: {contains: TEXT}`: no Assertion carries it.
PREDICATES = ("defines", "calls", "has_key", "contains", "not", "not_contains")


@dataclass(frozen=True)
class Assertion:
    """One AST assertion.  ``predicate`` is one of PREDICATES; for ``not``, ``negated`` holds the
    inner assertion (same file and scope) and ``value`` is ``None``."""

    file: str
    scope: str | None          # the `in:` dotted scope, or None for the whole module
    predicate: str
    value: str | None
    negated: Assertion | None = None
    line: int = 0              # line of the assertion in patchset.yaml

    def describe(self) -> str:
        if self.predicate == "not" and self.negated is not None:
            return "not " + self.negated.describe()
        where = f" in {self.scope}" if self.scope else ""
        return f"{self.predicate} {self.value}{where}"


# A periodic spec-decode metrics line of vLLM, in any wording it has used (the V0 and V1 metrics
# loggers; serving.acceptance reads the figures from it): an acceptance marker's `log`.
ACCEPTANCE_LINE = r"\b(?:SpecDecoding|Speculative) metrics: "


@dataclass(frozen=True)
class Floor:
    """What acceptance must reach: ``min_rate`` (0 to 1) and/or ``min_length`` (1 or more)."""

    min_rate: float | None = None
    min_length: float | None = None

    def describe(self) -> str:
        parts = ([f"rate at least {self.min_rate:g}"] if self.min_rate is not None else []) + \
                ([f"mean length at least {self.min_length:g}"]
                 if self.min_length is not None else [])
        return "acceptance " + (" and ".join(parts) or "measured")


def rate_problem(value: object) -> str | None:
    """Why ``value`` is no minimum rate, or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return "expected a rate from 0 to 1"
    if not 0 <= value <= 1:
        return f"{value:g} is outside 0 to 1 (a rate: 0.25 means a quarter of the draft " \
               "tokens accepted)"
    return None


def length_problem(value: object) -> str | None:
    """Why ``value`` is no minimum mean acceptance length, or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) \
            or math.isinf(value):
        return "expected a mean acceptance length, 1 or more"
    if value < 1:
        return (f"{value:g} is below 1 (the mean acceptance length counts the bonus token: "
                "1 means no draft token accepted)")
    return None


@dataclass(frozen=True)
class Marker:
    """One runtime marker: a line the server's startup log must, or must not, show.

    ``log`` is a Python regular expression searched in each line.  Without ``absent``, ``count``
    or ``min`` a marker needs at least one matching line; ``absent`` needs none; ``count`` exactly
    that many; ``min`` at least that many (several logs judged together: the lines are summed).
    A log with a line matching ``unless`` is left out of this marker's judgment.

    An ``acceptance:`` marker holds the speculative-decoding acceptance that vLLM's periodic
    spec-decode metrics lines report to a floor; its ``log`` is the regular expression of those
    lines (``ACCEPTANCE_LINE``)."""

    log: str
    absent: bool = False
    count: int | None = None
    minimum: int | None = None   # the `min:` key
    unless: str | None = None
    line: int = 0              # line of the entry in patchset.yaml
    acceptance: Floor | None = None
    # `jit_built: MODULE`: ``log`` is the package's own wording for a JIT build of MODULE
    # (series/jit.py), which a module loaded prebuilt never logs
    jit_built: str | None = None

    def describe(self) -> str:
        """What the marker asks for, e.g. ``at least 1 line matching 'X'``."""
        if self.acceptance is not None:
            return self.acceptance.describe() + " in the spec-decode metrics lines"
        if self.jit_built is not None and not self.absent and self.count is None:
            n = self.minimum or 1
            return (f"at least {n} line{'s' if n != 1 else ''} saying that JIT module "
                    f"{self.jit_built} was built from source, not loaded prebuilt "
                    f"(matching {quoted(self.log)})")
        if self.absent:
            want = "no line"
        elif self.count is not None:
            want = f"exactly {self.count} line{'s' if self.count != 1 else ''}"
        else:
            n = self.minimum or 1
            want = f"at least {n} line{'s' if n != 1 else ''}"
        return f"{want} matching {quoted(self.log)}"


def quoted(regex: str) -> str:
    """A regular expression in quotes, as written (no doubled backslashes)."""
    return f'"{regex}"' if "'" in regex else f"'{regex}'"


@dataclass(frozen=True)
class Artifact:
    """`artifact:`: one compiled file of a pinned wheel, placed where the base installed
    `dist` (image/artifact.py)."""

    wheel: str          # a manifest-relative path, or an https URL
    sha256: str
    member: str         # its path inside the wheel
    member_sha256: str
    dist: str           # the distribution whose site it goes into, as the base installed it


@dataclass(frozen=True)
class Retired:
    """`retired: {from: vX, why: "..."}`: from release ``ref`` of its package on, the patch is
    no longer needed, because the code it changes is gone (``series.fates`` proves it)."""

    ref: str                   # a release tag of the patch's package
    why: str
    line: int = 0              # line of `retired:` in patchset.yaml

    @property
    def version(self) -> versions.Version:
        found = versions.release_tag(self.ref)
        assert found is not None   # the loader takes only a release tag
        return found

    def holds_at(self, version: str | None) -> bool:
        """Is ``version`` this release or a later one?"""
        v = versions.parse(version) if version else None
        return v is not None and v >= self.version


@dataclass(frozen=True)
class Patch:
    id: str
    summary: str
    kind: str                  # a name of patchkit.kinds.NAMES
    path: str                  # the diff file, transform file or overlay dir, manifest-relative
    upstream: str | None = None
    package: str = VLLM.name   # the name of the package it patches; its paths are from that root
    # the version ranges it holds on, by package name (any package of the manifest), as written
    ranges: Mapping[str, SpecifierSet] = field(default_factory=dict)
    verify: tuple[Assertion, ...] = ()
    replaces: Mapping[str, str] = field(default_factory=dict)  # overlay: file -> upstream blob
    variants: tuple[str, ...] = ()  # the variants it is in; () = every build
    sha256: str | None = None  # add-pr: the sha256 of the pull request's diff as fetched
    runtime: tuple[Marker, ...] = ()   # lines the server's log shows when the patch is in
    # `rebuild: jit`: a prebuilt module built from a file it changes is left out of the image,
    # so the package compiles the module from the patched sources on first use
    rebuild: str | None = None
    artifact: Artifact | None = None   # the `artifact:` kind's pins
    # `supersedes:` the patches whose fix this one carries on, at releases outside their range
    # (a bump that stops applying one of them needs this patch to take effect instead)
    supersedes: tuple[str, ...] = ()
    retired: Retired | None = None     # `retired:` no longer needed from that release on
    line: int = 0              # line of the entry in patchset.yaml
    index: int = 0             # position in `patches:`
    # line of each key's value (e.g. "vllm", "diff"), so that edits and messages can point at it
    lines: Mapping[str, int] = field(default_factory=dict, compare=False)

    @property
    def label(self) -> str:
        return f"patches[{self.index}] (id={self.id})"

    @property
    def vllm(self) -> SpecifierSet | None:
        """Its range on vLLM (the ``vllm:`` key), or None."""
        return self.ranges.get(VLLM.name)

    def takes_effect(self, found: Mapping[str, str | None]) -> tuple[bool, str]:
        """Does the patch take effect at the versions ``found`` (package name -> version):
        its ranges hold and it is not retired there; the reason when not."""
        ok, why = versions.in_ranges(self.ranges, found)
        if ok and self.retired is not None and self.package in found \
                and self.retired.holds_at(found[self.package]):
            return False, f"retired from {self.retired.ref}: {self.retired.why}"
        return ok, why

    def without_range(self, package: str) -> Patch:
        """The same patch, holding on no range of ``package``."""
        kept = {name: spec for name, spec in self.ranges.items() if name != package}
        return dataclasses.replace(self, ranges=kept)


def identity(name: str, dist: str | None = None) -> PackageId:
    """The identity of the manifest's package ``name`` (``dist``: its distribution, by default
    its name): vLLM's (the ``vllm:`` section, which a patch patches unless it says otherwise)
    as it always was, its cache paths and commit ids unchanged; any other's with its import
    folder read from its release.  A report names packages by name; this reads them back."""
    return VLLM if name == VLLM.name else PackageId(name, dist or name, "", name)


@dataclass(frozen=True)
class Package:
    """One package of the stack the series patches: vLLM (the `vllm:` section) or an entry of
    `packages:`.  Every package has the same four things, so no verb needs to tell them apart."""

    name: str                  # the key in the manifest: `package:` and range keys name it
    dist: str                  # its distribution name, on PyPI and in the installed dist-info
    repos: tuple[str, ...]     # git URLs, local paths, "pypi" or "image", tried in order
    ref: str
    line: int = 0              # line of its key in patchset.yaml
    ref_line: int = 0
    dist_line: int = field(default=0, compare=False)  # line of `dist:` (else of its key)

    @property
    def id(self) -> PackageId:
        """What tells it apart: its label, checkout place, import folder, options."""
        return identity(self.name, self.dist)

    @property
    def label(self) -> str:
        return self.id.label

    def checkout(self, workdir: Path) -> Path:
        """Its checkout in a run whose workdir is ``workdir``."""
        return self.id.checkout(workdir)


def VllmSource(repos: tuple[str, ...], ref: str, line: int = 0,  # noqa: N802 (was a class)
               ref_line: int = 0) -> Package:
    """The vllm package, built the way callers built it before `packages:` existed."""
    return Package(VLLM.name, VLLM.dist, tuple(repos), ref, line, ref_line)


@dataclass(frozen=True)
class ImageDefaults:
    base: str | None = None
    platform: str = "linux/arm64"
    tag: str | None = None     # may hold "{ref}"
    # `requires:` distributions the patches depend on but do not patch, by normalized name
    requires: Mapping[str, SpecifierSet] = field(default_factory=dict)
    requires_lines: Mapping[str, int] = field(default_factory=dict, compare=False)
    # line of each of base, platform and tag, so that an error can point at the one it is about
    lines: Mapping[str, int] = field(default_factory=dict, compare=False)
    # the GPU architecture prebuilt compiled modules are judged for (GB10 by default), unless
    # the base sets FLASHINFER_CUDA_ARCH_LIST
    cuda_arch: str = "121a"
    # the engines `images` and `rollback` reach besides DOCKER_HOST's (engine addresses)
    nodes: tuple[str, ...] = ()
    # `serve:` the image's command and environment (None: build/serve.sh's, else the base's)
    serve: "Serve | None" = None


@dataclass(frozen=True)
class Serve:
    """``image.serve:``: what the image runs (its CMD, the base's ENTRYPOINT cleared; None:
    build/serve.sh when the patchset has one, else the base's), and the environment set in it
    (``NAME: value``, replacing the base's values of those names)."""

    command: tuple[str, ...] | None = None
    env: tuple[tuple[str, str], ...] = ()
    line: int = 0


@dataclass(frozen=True)
class Variant:
    """A named build of the series: the patches naming no variant, plus those naming it."""

    name: str
    description: str
    line: int = 0


@dataclass(frozen=True)
class BumpSettings:
    """``bump:``: commands `patchkit bump` runs in the bumped tree once the assertions hold
    (each must exit 0), and the deadline of each."""

    probes: tuple[str, ...] = ()
    timeout: float = 3600.0


@dataclass(frozen=True)
class Manifest:
    name: str
    root: Path                 # the folder holding patchset.yaml; patch paths are relative to it
    path: Path                 # patchset.yaml itself
    vllm: Package              # the `vllm:` section: always there, always first
    image: ImageDefaults
    patches: tuple[Patch, ...]
    variants: Mapping[str, Variant] = field(default_factory=dict)  # declared, in order
    runtime: tuple[Marker, ...] = ()   # markers of the whole series (they always count)
    others: tuple[Package, ...] = ()   # the entries of `packages:`, as written
    bump: BumpSettings = field(default_factory=BumpSettings)

    @property
    def packages(self) -> tuple[Package, ...]:
        """Every package the series may patch or hold a range on: vllm first, then as written."""
        return (self.vllm, *self.others)

    def package(self, name: str) -> Package:
        for p in self.packages:
            if p.name == name:
                return p
        raise KeyError(name)

    def patch(self, patch_id: str) -> Patch:
        for p in self.patches:
            if p.id == patch_id:
                return p
        raise KeyError(patch_id)

    def sources(self, repos: Sequence[str] | None = None) -> tuple[str, ...]:
        """The sources ``repos`` (default: vllm.repo) name, relative local paths taken from
        the manifest's folder, not the current one (``./x``, ``../x``, or a bare name that is
        there: the loader let it through as a path)."""
        return tuple(str((self.root / r).resolve()) if r.startswith(("./", "../"))
                     or (r not in WORDS and not {"/", ":"} & set(r) and os.path.exists(self.root / r))
                     else r
                     for r in (self.vllm.repos if repos is None else repos))


ID_RE = re.compile(r"[a-z0-9][a-z0-9-]*\Z")
# An id names the file patches/<id>.diff and a commit subject; 100 keeps every file name well
# inside the 255 bytes file systems allow, with room for a "-N" that makes it unique.
ID_MAX = 100


def id_problem(text: str) -> str | None:
    """Why ``text`` cannot be a patch id, or None when it can."""
    if not ID_RE.match(text):
        return "not a valid id (lowercase letters, digits and '-', starting with a letter or digit)"
    if len(text) > ID_MAX:
        return f"{len(text)} characters long; an id has at most {ID_MAX}"
    return None


def summary_problem(text: str) -> str | None:
    """Why ``text`` cannot be a patch's summary, or None when it can."""
    if not text.strip():
        return "must not be empty"
    if "\n" in text.strip():
        return "must be one line"
    return None


def shown_id(text: str) -> str:
    """An id as an error message quotes it: a long one by its start, so the line stays short."""
    return text if len(text) <= 40 else text[:37] + "..."


def capped_id(text: str, room: int = 0) -> str:
    """``text`` cut to leave ``room`` characters of the id limit for a suffix, never ending in
    '-': the same text gives the same id on every run."""
    return text[:ID_MAX - room].rstrip("-")
