"""The JIT rules of a package that compiles its own sources at first use, as data: where its
module definitions and source folders are named, how each release series finds a module
prebuilt instead of compiling it (the AOT folder, a shim, provider distributions, their version
and architecture checks, the cubins' place), and the CUDA architectures those checks speak of.

Read from the packages' own code (FlashInfer's ``jit/env.py``, ``jit/core.py`` and
``jit/_cuda_architecture.py`` of each series).  It sits low so that the manifest can judge
``rebuild: jit``, ``image.cuda_arch`` and ``jit_built`` markers against it;
:mod:`patchkit.series.jit` reads a checkout with these rules, :mod:`patchkit.image.prebuilt` an
image.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version


@dataclass(frozen=True)
class JitRules:
    """How one package defines the modules it compiles at run time."""

    package_dir: str                 # its import folder: "flashinfer"
    spec_functions: tuple[str, ...]  # calls that define one module: (name, sources, ...)
    env_module: str                  # where the source folders are named, in package_dir
    package_root: str                # the env module's name for package_dir
    include_roots: tuple[str, ...]   # env names of the folders every module includes from
    # how each release series finds a module prebuilt instead of compiling it, newest first
    prebuilt: tuple[PrebuiltRule, ...] = ()
    name_keyword: str = "name"

    def series(self, version: str | None) -> PrebuiltRule | None:
        """The prebuilt rule of the series ``version`` belongs to (None: no rule holds)."""
        if not version:
            return None
        try:
            parsed = Version(version)
        except InvalidVersion:
            return None
        return next((r for r in self.prebuilt
                     if SpecifierSet(r.releases).contains(parsed, prereleases=True)), None)


@dataclass(frozen=True)
class PrebuiltRule:
    """How one release series of a package finds a module prebuilt, so that it never compiles
    the module's sources: read from that series' own code (FlashInfer's ``jit/env.py``,
    ``jit/core.py``, ``jit/_cuda_architecture.py``).  Folders are relative to the site the
    distribution is installed in; ``{name}`` is the module's name.  A module is loaded
    prebuilt from a folder F when ``F/{name}/{name}.so`` exists."""

    series: str                    # how messages name it: "0.7"
    releases: str                  # a PEP 440 specifier on the package's version
    aot_folder: str                # the package's own folder of prebuilt modules
    aot_only_without_shim: bool    # the AOT folder is read only when no shim is installed
    shim_dist: str                 # the shim distribution (flashinfer-jit-cache)
    shim_match: str                # how its version must match the package's (VERSION_RULES)
    shim_folder: str | None        # the shim's own folder of modules, when it is read
    provider_group: str | None     # the entry point group of provider distributions
    provider_match: str = "exact"  # how a provider's version must match the package's
    provider_equals_shim: bool = False   # ... and equal the shim's
    provider_manifest: str = "manifest.json"   # beside the entry point's module
    provider_folder: str = "jit_cache"  # a manifest's jit_cache_dir when it gives none
    provider_schema: int = 1
    checks_arch: bool = False      # a provider counts only for a compatible target
    version_check_env: str = ""    # set to anything in the environment: versions not checked
    arch_env: str = ""             # the target architectures, when set (else the device's)
    # the cubins downloaded at run time: the variable that places them, the distribution that
    # ships them (version rule), its folder, and their place under the workspace otherwise
    cubin_env: str = ""
    cubin_dist: str = ""
    cubin_match: str = "exact"
    cubin_folder: str = ""
    cubin_default: str = ""
    cubin_env_first: bool = True   # the variable wins over the distribution
    workspace_env: str = ""
    # log lines that say module {name} went through the JIT (built, or judged current by ninja)
    # rather than being loaded prebuilt: regular expressions, {name} escaped
    built_lines: tuple[str, ...] = ()


# how a version must match the package's (``want``): as the series' own check compares them
VERSION_RULES = {
    "exact": lambda got, want: got == want,
    "prefix": lambda got, want: got.startswith(want),
    # the version, or the version with a local part (0.7.4+cu130)
    "local": lambda got, want: got == want or got.startswith(want + "+"),
}

# FlashInfer's JIT: ninja -v -C <cached_ops/NAME> (FLASHINFER_JIT_VERBOSE=1 prints its lines)
_NINJA_LINES = (r"ninja: Entering directory .\S*/cached_ops/{name}'",
                r"-o \S*/cached_ops/{name}/{name}\.so\b")
_FLASHINFER_COMMON = dict(
    shim_dist="flashinfer-jit-cache", version_check_env="FLASHINFER_DISABLE_VERSION_CHECK",
    arch_env="FLASHINFER_CUDA_ARCH_LIST", cubin_env="FLASHINFER_CUBIN_DIR",
    cubin_dist="flashinfer-cubin", cubin_folder="flashinfer_cubin/cubins",
    cubin_default=".cache/flashinfer/cubins", workspace_env="FLASHINFER_WORKSPACE_BASE")

FLASHINFER_SERIES = (
    # 0.7 (jit/env.py get_aot_artifacts): flashinfer/data/aot first, with no architecture
    # check; then each provider the flashinfer_jit_cache shim lists from its entry points
    # whose version passes, for a target its architectures are compatible with
    PrebuiltRule(
        series="0.7", releases=">=0.7.0.dev0", aot_folder="flashinfer/data/aot",
        aot_only_without_shim=False, shim_match="local", shim_folder=None,
        provider_group="flashinfer.jit_cache.providers", provider_match="local",
        provider_equals_shim=True, checks_arch=True, cubin_env_first=True,
        # jit/core.py JitSpec.build: a cold build says so at INFO (FLASHINFER_LOGGING_LEVEL)
        built_lines=(r"Building JIT module {name}; ", *_NINJA_LINES), **_FLASHINFER_COMMON),
    # 0.6 (jit/env.py _get_aot_dir): the shim's jit_cache folder when the shim is installed
    # (a version that does not start with flashinfer's stops the import), else data/aot
    PrebuiltRule(
        series="0.6", releases="<0.7.0.dev0", aot_folder="flashinfer/data/aot",
        aot_only_without_shim=True, shim_match="prefix",
        shim_folder="flashinfer_jit_cache/jit_cache", provider_group=None,
        cubin_env_first=False, built_lines=_NINJA_LINES, **_FLASHINFER_COMMON),
)

RULES: dict[str, JitRules] = {
    "flashinfer-python": JitRules(
        package_dir="flashinfer", spec_functions=("gen_jit_spec",),
        env_module="jit/env.py", package_root="_package_root",
        include_roots=("FLASHINFER_INCLUDE_DIR", "FLASHINFER_CSRC_DIR", "CUTLASS_INCLUDE_DIRS",
                       "SPDLOG_INCLUDE_DIR", "CCCL_INCLUDE_DIRS"),
        prebuilt=FLASHINFER_SERIES),
}


def rules_for(dist: str) -> JitRules | None:
    return RULES.get(canonicalize_name(dist))


def built_pattern(module: str) -> str:
    """One regular expression for a log line that says ``module`` went through a package's
    JIT rather than being loaded prebuilt, in the wording of every series that has one."""
    lines = dict.fromkeys(line.format(name=re.escape(module)) for rules in RULES.values()
                          for rule in rules.prebuilt for line in rule.built_lines)
    return "|".join(lines)


# ------------------------------------------------------------------ CUDA architectures

# The compute capabilities FlashInfer builds for or recognises (compilation_context.py,
# jit/core.py's sm*_nvcc_flags): (major, minor)
KNOWN_CAPABILITIES = frozenset({(7, 5), (8, 0), (8, 6), (8, 7), (8, 9), (9, 0), (10, 0),
                                (10, 3), (10, 7), (11, 0), (12, 0), (12, 1)})
_ARCH_RE = re.compile(r"(?:compute_|sm_?)?(\d{1,2})\.?(\d)([af]?)")
_ARCH_LIST_RE = re.compile(r"(\d{1,2})\.(\d)([af]?)")


@dataclass(frozen=True, order=True)
class CudaArch:
    """A CUDA binary target or device architecture: sm121a is (12, 1, "a")."""

    major: int
    minor: int
    suffix: str = ""

    def __str__(self) -> str:
        return f"sm{self.major}{self.minor}{self.suffix}"

    def runs_on(self, device: CudaArch) -> bool:
        """Whether a binary built for this target runs on ``device`` (FlashInfer 0.7's
        ``cuda_binary_target_compatibility_score``): an ``a`` target needs the very compute
        capability; a plain or ``f`` one runs on the same major at the same or a later minor."""
        if self == device:
            return True
        if self.suffix == "a":
            return (self.major, self.minor) == (device.major, device.minor)
        return self.major == device.major and self.minor <= device.minor


def parse_arch(text: str, known_only: bool = True) -> CudaArch | None:
    """``121a``, ``sm121a``, ``sm_121a``, ``compute_121a`` or ``12.1a``; None when it is no
    architecture (with ``known_only``: none FlashInfer knows)."""
    m = _ARCH_RE.fullmatch(text.strip().lower())
    if m is None:
        return None
    arch = CudaArch(int(m.group(1)), int(m.group(2)), m.group(3))
    return arch if not known_only or (arch.major, arch.minor) in KNOWN_CAPABILITIES else None


def arch_list_targets(text: str) -> tuple[CudaArch, ...] | None:
    """The targets a ``FLASHINFER_CUDA_ARCH_LIST`` value names ("12.1a 9.0"), each as
    FlashInfer's compilation context normalises one without a suffix (9.x and 10+ take ``a``,
    12.0 ``f``); None when a word is not ``MAJOR.MINOR[a|f]``."""
    out = []
    for word in text.split():
        m = _ARCH_LIST_RE.fullmatch(word)
        if m is None:
            return None
        major, minor, suffix = int(m.group(1)), int(m.group(2)), m.group(3)
        if not suffix and major >= 9:
            suffix = "f" if (major, minor) == (12, 0) else "a"
        out.append(CudaArch(major, minor, suffix))
    return tuple(sorted(set(out))) or None
