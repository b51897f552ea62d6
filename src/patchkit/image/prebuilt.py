"""Prebuilt compiled modules that would shadow a patched source in the image.

FlashInfer loads a module prebuilt when it finds one, and then never reads the module's
sources: a patched header would be shipped and never compiled.  Where it looks differs by
release series, and :data:`patchkit.series.jitrules.FLASHINFER_SERIES` holds each series' rule as
data: 0.6 reads the ``flashinfer_jit_cache`` shim's own folder (else ``flashinfer/data/aot``);
0.7 reads ``flashinfer/data/aot`` first, then every provider distribution the shim lists from
the entry point group ``flashinfer.jit_cache.providers`` whose version passes FlashInfer's
check (unless the environment sets ``FLASHINFER_DISABLE_VERSION_CHECK``) and one of whose
architectures runs on a target (the base's ``FLASHINFER_CUDA_ARCH_LIST``, else
``image.cuda_arch``).  Everything is read statically from the image's files: dist-info,
``entry_points.txt``, the provider's ``manifest.json``.

For each file a package's patches changed, the apply report names the JIT modules built from
it (:mod:`patchkit.series.jit`); a module the image would load prebuilt is refused, in one line
naming the module, the file and where it would be loaded from, unless the patch says
``rebuild: jit``.  Then the image leaves the prebuilt module out (a whiteout of its folder in
the one overlay layer), and the package compiles it from the patched sources on first use.
"""

from __future__ import annotations

import ast
import configparser
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from packaging.utils import canonicalize_name

from patchkit.errors import ImageError, UsageError
from patchkit.formats import layer
from patchkit.image.distinfo import Dist, Installed
from patchkit import jitrules
from patchkit.series import jit
from patchkit.jitrules import VERSION_RULES, CudaArch, PrebuiltRule


class ProviderError(UsageError):
    """A provider of prebuilt modules whose manifest cannot be read: exit 2."""


@dataclass(frozen=True)
class Holder:
    """A place a package loads modules prebuilt from: ``folder/<X>/<X>.so``."""

    kind: str                      # "aot" (the package's own folder), "shim", "provider"
    dist: str                      # the distribution that installed it
    version: str
    site: str                      # where that distribution is installed
    folder: str                    # absolute, in the image
    modules: frozenset[str] | None = None  # a provider's manifest; None: whatever is there
    architectures: tuple[str, ...] = ()
    provider: str | None = None    # the entry point's name

    def describe(self) -> str:
        if self.kind == "provider":
            return (f"provider {self.provider} of {self.dist} {self.version} for "
                    f"{', '.join(self.architectures)}")
        if self.kind == "aot":
            return f"the AOT folder of {self.dist} {self.version}"
        return f"{self.dist} {self.version}"

    def module_folder(self, module: str) -> str:
        return f"{self.folder.rstrip('/')}/{module}"

    def holds(self, files, module: str) -> bool:
        if self.modules is not None and module not in self.modules:
            return False
        return files.exists(f"{self.module_folder(module)}/{module}.so")


@dataclass(frozen=True)
class Targets:
    """The GPU architectures a package's prebuilt modules are judged for, and where they came
    from (for the log)."""

    archs: tuple[CudaArch, ...]
    source: str

    def describe(self) -> str:
        return f"{', '.join(map(str, self.archs))} ({self.source})"


@dataclass(frozen=True)
class Found:
    """Where one package in an image would load modules prebuilt from."""

    rule: PrebuiltRule | None
    holders: tuple[Holder, ...]
    targets: Targets | None = None
    notes: tuple[str, ...] = ()    # what was looked at and not counted, and why


def targets_for(rule: PrebuiltRule, env: Mapping[str, str], cuda_arch: str,
                where: str) -> Targets | None:
    """The targets a series judges providers for: the image's architecture list variable
    when set (FlashInfer reads it before the device), else ``cuda_arch`` (the manifest's
    ``image.cuda_arch``, the device)."""
    if not rule.checks_arch:
        return None
    listed = env.get(rule.arch_env)
    if listed:
        archs = jitrules.arch_list_targets(listed)
        if archs is None:
            raise UsageError(f"{where} sets {rule.arch_env}={listed!r}, which FlashInfer cannot "
                             "read (words like 12.1a or 9.0, separated by spaces)")
        return Targets(archs, f"{rule.arch_env} of {where}")
    arch = jitrules.parse_arch(cuda_arch)
    if arch is None:
        raise UsageError(f"image.cuda_arch: {cuda_arch!r} is not a CUDA architecture FlashInfer "
                         "knows (like 121a, 120f, 100a, 90a)")
    return Targets((arch,), "image.cuda_arch")


def find(files, installed: Installed, env: Mapping[str, str], dist: str, cuda_arch: str,
         where: str) -> Found:
    """Where the package ``dist`` installed in an image (``files``, ``installed``, the image's
    environment ``env``) would load modules prebuilt from, by its series' rule."""
    rules = jitrules.rules_for(dist)
    own = installed.get(dist)
    rule = rules.series(own.version) if rules is not None and own is not None else None
    if rule is None or own is None:
        return Found(None, ())
    targets = targets_for(rule, env, cuda_arch, where)
    unchecked = bool(env.get(rule.version_check_env))
    notes: list[str] = []
    aot = Holder("aot", own.name, own.version, own.site, f"{own.site.rstrip('/')}/"
                 f"{rule.aot_folder}")
    shim = installed.get(rule.shim_dist)
    shim_ok = shim is not None and (unchecked or VERSION_RULES[rule.shim_match](
        shim.version, own.version))
    if shim is not None and not shim_ok:
        notes.append(f"{shim.name} {shim.version} does not match {own.name} {own.version}: "
                     f"FlashInfer {rule.series} does not read it")
    holders: list[Holder] = []
    if shim is None or not rule.aot_only_without_shim:
        holders.append(aot)
    if shim_ok and rule.shim_folder:
        holders.append(Holder("shim", shim.name, shim.version, shim.site,
                              f"{shim.site.rstrip('/')}/{rule.shim_folder}"))
    if shim_ok and rule.provider_group:
        for holder in _providers(files, installed, rule, where):
            problem = _provider_problem(holder, rule, own, shim, unchecked, targets)
            if problem:
                notes.append(f"{holder.describe()}: {problem}")
            else:
                holders.append(holder)
    return Found(rule, tuple(holders), targets, tuple(notes))


def _provider_problem(holder: Holder, rule: PrebuiltRule, own: Dist, shim: Dist | None,
                      unchecked: bool, targets: Targets | None) -> str | None:
    """Why FlashInfer would not load from this provider, or None."""
    if not unchecked:
        if not VERSION_RULES[rule.provider_match](holder.version, own.version):
            return (f"its version does not match {own.name} {own.version}, so FlashInfer "
                    f"{rule.series} ignores it ({rule.version_check_env} is not set)")
        if rule.provider_equals_shim and shim is not None and holder.version != shim.version:
            return (f"its version is not the one of {shim.name} {shim.version}, so FlashInfer "
                    f"{rule.series} ignores it ({rule.version_check_env} is not set)")
    if targets is not None:
        archs = [jitrules.parse_arch(a, known_only=False) for a in holder.architectures]
        if not any(a is not None and a.runs_on(t) for a in archs for t in targets.archs):
            return f"none of its architectures runs on {targets.describe()}"
    return None


def _providers(files, installed: Installed, rule: PrebuiltRule, where: str) -> list[Holder]:
    """Every provider an installed distribution declares in the rule's entry point group."""
    out = []
    for dist in installed.dists.values():
        info = dist.info.rstrip("/")
        row = f"{info.rsplit('/', 1)[-1]}/entry_points.txt"
        if dist.record is not None and row not in dist.record:
            continue
        data = files.read(f"{info}/entry_points.txt")
        if data is None:
            continue
        for name, value in _entry_points(data, rule.provider_group or ""):
            holder = _provider(files, dist, name, value, rule, where)
            if holder is not None:
                out.append(holder)
    return sorted(out, key=lambda h: h.provider or "")


def _entry_points(data: bytes, group: str) -> list[tuple[str, str]]:
    parser = configparser.ConfigParser(delimiters=("=",), interpolation=None, strict=False)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    try:
        parser.read_string(data.decode("utf-8", "replace"))
    except configparser.Error:
        return []
    return list(parser.items(group)) if parser.has_section(group) else []


def _provider(files, dist: Dist, name: str, value: str, rule: PrebuiltRule,
              where: str) -> Holder | None:
    """One provider, its manifest read from its files: ``manifest.json`` beside the entry
    point's module, else the mapping literal its entry point function returns.  None when
    its module is not in the image (FlashInfer cannot load it either)."""
    module, _, attr = value.split("[", 1)[0].strip().partition(":")
    rel = module.strip().replace(".", "/")
    site = dist.site.rstrip("/")
    if files.exists(f"{site}/{rel}/__init__.py"):
        folder, source = f"{site}/{rel}", f"{site}/{rel}/__init__.py"
    elif files.exists(f"{site}/{rel}.py"):
        folder, source = f"{site}/{rel}".rsplit("/", 1)[0], f"{site}/{rel}.py"
    else:
        return None
    said = f"provider {name} of {dist.name} {dist.version} ({where})"
    path = f"{folder}/{rule.provider_manifest}"
    data = files.read(path)
    if data is not None:
        try:
            manifest = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise ProviderError(f"{said}: {path} does not parse: {exc}") from None
    else:
        manifest = _returned_literal(files.read(source) or b"", attr.strip())
        if manifest is None:
            raise ProviderError(f"{said}: no {rule.provider_manifest} in {folder}, and "
                                f"{module}:{attr} returns no mapping written out in {source}; "
                                "which modules it holds cannot be read")
        path = f"{source} ({attr.strip()})"
    return _holder(manifest, dist, name, folder, rule, f"{said}: {path}")


def _returned_literal(source: bytes, function: str) -> dict | None:
    """The manifest a provider's entry point function writes out: the first mapping in it with
    a ``modules`` key, its values that are literals taken as written.  A value computed at run
    time is left out, but for ``jit_cache_dir``, where a path built from the module's own place
    (``Path(__file__).parent / "jit_cache"``) is taken as the folder its last part names."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    for node in tree.body:
        if not (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                and node.name == function):
            continue
        for inner in ast.walk(node):
            if not isinstance(inner, ast.Dict):
                continue
            out: dict = {}
            for key, value in zip(inner.keys, inner.values):
                if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
                    continue
                try:
                    out[key.value] = ast.literal_eval(value)
                except ValueError:
                    parts = [n.value for n in ast.walk(value)
                             if isinstance(n, ast.Constant) and isinstance(n.value, str)]
                    if key.value == "jit_cache_dir" and parts and "__file__" in ast.unparse(value):
                        out[key.value] = parts[-1].strip("/")
            if "modules" in out:
                return out
    return None


def _holder(manifest: object, dist: Dist, name: str, folder: str, rule: PrebuiltRule,
            said: str) -> Holder:
    """The provider a manifest describes (the fields FlashInfer's shim requires)."""
    if not isinstance(manifest, dict):
        raise ProviderError(f"{said} does not parse: a JSON object is expected, got "
                            f"{type(manifest).__name__}")
    if manifest.get("schema_version") != rule.provider_schema:
        raise ProviderError(f"{said} does not parse: schema_version is "
                            f"{manifest.get('schema_version')!r}; FlashInfer {rule.series} "
                            f"reads {rule.provider_schema}")
    missing = [k for k in ("distribution", "version", "cuda_architectures", "modules")
               if k not in manifest]
    if missing:
        raise ProviderError(f"{said} does not parse: no {', '.join(missing)}")
    lists = {k: manifest[k] for k in ("cuda_architectures", "modules")}
    for key, items in lists.items():
        if not isinstance(items, list) or not items or not all(isinstance(i, str) for i in items):
            raise ProviderError(f"{said} does not parse: {key} is not a list of names")
    bad = [a for a in lists["cuda_architectures"] if jitrules.parse_arch(a, known_only=False) is None]
    if bad:
        raise ProviderError(f"{said} does not parse: {bad[0]!r} is not a CUDA architecture")
    cache = manifest.get("jit_cache_dir") or rule.provider_folder
    if not isinstance(cache, str):
        raise ProviderError(f"{said} does not parse: jit_cache_dir is not a path")
    cache = cache if cache.startswith("/") else f"{folder}/{cache}"
    archs = tuple(str(jitrules.parse_arch(a, known_only=False)) for a in lists["cuda_architectures"])
    return Holder("provider", str(manifest["distribution"]), str(manifest["version"]),
                  dist.site, cache.rstrip("/"), frozenset(lists["modules"]), archs, name)


# ------------------------------------------------------------------------------ the shadows

@dataclass(frozen=True)
class Shadow:
    package: str
    file: str            # the patched file
    module: str          # the module built from it
    holder: Holder       # where it would be loaded prebuilt from
    folder: str          # the module's folder in the image

    @property
    def dist(self) -> str:
        return self.holder.dist

    @property
    def member(self) -> str:
        """The module's folder, relative to the site of the distribution that installed it."""
        return self.folder[len(self.holder.site.rstrip("/")) + 1:]

    def describe(self) -> str:
        return f"{self.holder.describe()}, {self.folder}"

    def shipped_in(self, shipped) -> bool:
        """Whether an artifact ships the module in its place (``shipped``: (dist, member)
        pairs): then it is the rebuilt one, and counts as such."""
        return any(canonicalize_name(d) == canonicalize_name(self.dist) and
                   m.startswith(self.member + "/") for d, m in shipped)


@dataclass(frozen=True)
class Reading:
    """What an image says of the packages' prebuilt modules, read once: per package, where it
    would load them from."""

    found: Mapping[str, Found] = field(default_factory=dict)

    def notes(self) -> list[str]:
        out = []
        for name, f in self.found.items():
            if f.targets is not None:
                out.append(f"{name}: FlashInfer {f.rule.series if f.rule else '?'} judges "
                           f"prebuilt modules for {f.targets.describe()}")
            out += [f"{name}: not counted: {n}" for n in f.notes]
        return out


def read(files, installed: Installed, env: Mapping[str, str],
         wanted: Mapping[str, tuple[str, str]], where: str) -> Reading:
    """Where each package in the image would load modules prebuilt from (``wanted``: package
    name -> its distribution and ``image.cuda_arch``)."""
    return Reading({name: find(files, installed, env, dist, arch, where)
                    for name, (dist, arch) in wanted.items()})


def _wanted(packages: Sequence) -> dict[str, tuple[str, str]]:
    """The packages (build.PackageTree values) whose patches feed a JIT module."""
    return {p.name: (p.dist, p.cuda_arch) for p in packages
            if p.tree.report.jit_modules.get(p.name)}


def shadows_in(files, reading: Reading, jit_modules: Mapping[str, Mapping[str, Sequence[str]]]
               ) -> list[Shadow]:
    """Every prebuilt module that would load in place of one built from a patched file
    (``jit_modules``: package -> file -> modules), in the order of the reports; a module
    two places hold is named once per place (FlashInfer takes the first that holds it, and
    the next once that one is left out)."""
    out: list[Shadow] = []
    for name, found in reading.found.items():
        for file, modules in jit_modules.get(name, {}).items():
            for module in modules:
                out += [Shadow(name, file, module, h, h.module_folder(module))
                        for h in found.holders if h.holds(files, module)]
    return out


def shadows(files, installed: Installed, env: Mapping[str, str], packages: Sequence,
            where: str) -> list[Shadow]:
    reading = read(files, installed, env, _wanted(packages), where)
    return shadows_in(files, reading,
                      {p.name: p.tree.report.jit_modules.get(p.name, {}) for p in packages})


def leave_out(files, installed: Installed, env: Mapping[str, str], packages: Sequence,
              base: str, log=lambda m: None,
              shipped: set[tuple[str, str]] = frozenset()  # type: ignore[assignment]
              ) -> list[layer.LayerEntry]:
    """The layer's whiteouts for the prebuilt modules that patches with ``rebuild: jit`` leave
    out; :class:`ImageError` for one that no patch says what to do with.  A module an
    artifact ships (``shipped``: (dist, member) pairs) counts as rebuilt."""
    reading = read(files, installed, env, _wanted(packages), f"base {base}")
    for note in reading.notes():
        log(note)
    entries: list[layer.LayerEntry] = []
    done: set[str] = set()
    jit_modules = {p.name: p.tree.report.jit_modules.get(p.name, {}) for p in packages}
    for s in shadows_in(files, reading, jit_modules):
        if s.shipped_in(shipped):
            log(f"{s.package}: {s.module} is shipped rebuilt by an artifact")
            continue
        allowed = next(p for p in packages if p.name == s.package).rebuild_jit
        if s.file not in allowed:
            raise ImageError(
                f"base {base} ships the prebuilt JIT module {s.module} ({s.describe()}), "
                f"which {s.package} loads instead of compiling the patched {s.file}; say "
                "`rebuild: jit` on the patch to leave it out of the image, or ship the "
                "rebuilt module as an artifact")
        if s.folder not in done:
            done.add(s.folder)
            entries.append(layer.LayerEntry(s.folder.lstrip("/"), "whiteout"))
            log(f"{s.package}: prebuilt {s.module} left out ({s.holder.describe()}); it is "
                f"compiled from the patched {s.file} on first use")
    return entries


# ------------------------------------------------------------------------ proof in an image

@dataclass(frozen=True)
class Proof:
    """One module built from a patched file, judged in an image: the prebuilt modules that
    would still load in its place (none: FlashInfer compiles it from the patched sources)."""

    package: str
    file: str
    module: str
    shadows: tuple[Shadow, ...]

    @property
    def ok(self) -> bool:
        return not self.shadows

    def message(self, image: str) -> str:
        if self.shadows:
            where = "; ".join(s.describe() for s in self.shadows)
            return (f"the patched {self.file} feeds JIT module {self.module}, and image {image} "
                    f"still holds it prebuilt ({where}), which {self.package} loads instead "
                    "of compiling the patched source")
        return (f"the patched {self.file} feeds JIT module {self.module}; no prebuilt "
                f"{self.module} would load in image {image}: it is compiled from the patched "
                "source")


def prove(files, installed: Installed, env: Mapping[str, str],
          wanted: Mapping[str, tuple[str, str]],
          jit_modules: Mapping[str, Mapping[str, Sequence[str]]], image: str,
          shipped: set[tuple[str, str]] = frozenset()  # type: ignore[assignment]
          ) -> tuple[list[Proof], list[str]]:
    """Each module a patched file feeds in ``image``, judged (a module an artifact ships,
    ``shipped``, is the rebuilt one: its bytes are proven by the artifact's own result); and
    the notes of the reading."""
    reading = read(files, installed, env, wanted, f"image {image}")
    found = [s for s in shadows_in(files, reading, jit_modules) if not s.shipped_in(shipped)]
    out = []
    for name in wanted:
        for file, modules in jit_modules.get(name, {}).items():
            for module in modules:
                out.append(Proof(name, file, module, tuple(
                    s for s in found if (s.package, s.file, s.module) == (name, file, module))))
    return out, reading.notes()


def modules_in_image(files, site: str, dist: str, paths: Sequence[str], scratch) -> dict:
    """The JIT modules built from ``paths`` by the package ``dist`` as an image holds it at
    ``site`` (for an image with no record of them): its folder copied out of the image in one
    stream into ``scratch``, and read as a checkout is."""
    rules = jitrules.rules_for(dist)
    if rules is None or not hasattr(files, "walk"):
        return {}
    import os
    from pathlib import Path

    root = Path(scratch)
    for info, data in files.walk(f"{site.rstrip('/')}/{rules.package_dir}"):
        name = info.name.lstrip("/")
        if data is None or ".." in name.split("/") or name.endswith(".so"):
            continue
        target = root / name
        os.makedirs(target.parent, exist_ok=True)
        target.write_bytes(data)
    return jit.modules_for(root, dist, paths)


# --------------------------------------------------------------------------- the mounted cache

WORKSPACE_ENV = "FLASHINFER_WORKSPACE_BASE"
CUBIN_ENV = "FLASHINFER_CUBIN_DIR"


def workspace(packages: Sequence, user: str | None) -> dict[str, str]:
    """The environment that gives the package's JIT cache a place of its own for these
    patched sources: ``{FLASHINFER_WORKSPACE_BASE: <home>/.cache/patchkit-jit/<digest>}``, the
    digest that of every patched file a JIT module is built from (path and blob).  A cache a
    container mounts at FlashInfer's default place (``~/.cache/flashinfer``), which may hold
    modules built from the pristine sources, is then never read; a cache mounted at the new
    place only ever holds modules built from these sources.  {} when no JIT module is fed."""
    fed: list[str] = []
    for p in packages:
        rules = jitrules.rules_for(p.dist)
        modules = p.tree.report.jit_modules.get(p.name, {})
        if rules is None or not modules:
            continue
        fed += [f"{p.name}:{c.path}:{c.blob}" for c in p.shipped if modules.get(c.path)]
    if not fed:
        return {}
    digest = hashlib.sha256("\n".join(sorted(fed)).encode()).hexdigest()[:16]
    home = "/root" if _is_root(user) else "/tmp"
    return {WORKSPACE_ENV: f"{home}/.cache/patchkit-jit/{digest}"}


def _is_root(user: str | None) -> bool:
    return (user or "root").split(":")[0] in ("root", "0")


@dataclass(frozen=True)
class Places:
    """Where a package keeps its JIT cache and the cubins it downloads at run time, as the
    image's environment and files decide."""

    jit_cache: str
    cubins: str
    cubins_from: str     # how: the variable, the cubin distribution, or the workspace default

    def to_dict(self) -> dict[str, str]:
        return {"jit_cache": self.jit_cache, "cubins": self.cubins,
                "cubins_from": self.cubins_from}


def places(files, installed: Installed, env: Mapping[str, str], user: str | None,
           dist: str) -> Places | None:
    """The places the package ``dist`` uses in an image with environment ``env`` (None when
    it is not installed or has no JIT rules)."""
    rules = jitrules.rules_for(dist)
    own = installed.get(dist)
    rule = rules.series(own.version) if rules is not None and own is not None else None
    if rule is None or own is None:
        return None
    base = env.get(rule.workspace_env) or _home(files, env, user)
    cache = f"{base.rstrip('/')}/{rule.cubin_default.rsplit('/', 1)[0]}"
    given = env.get(rule.cubin_env)
    cubin = installed.get(rule.cubin_dist) if rule.cubin_dist else None
    if cubin is not None and not (env.get(rule.version_check_env) or VERSION_RULES[
            rule.cubin_match](cubin.version, own.version)):
        cubin = None      # FlashInfer ignores (0.7) or refuses (0.6) a mismatched one
    packaged = (f"{cubin.site.rstrip('/')}/{rule.cubin_folder}", f"{cubin.name} {cubin.version}") \
        if cubin is not None else None
    if given and (rule.cubin_env_first or packaged is None):
        return Places(cache, given, rule.cubin_env)
    if packaged is not None:
        return Places(cache, packaged[0], packaged[1])
    return Places(cache, f"{base.rstrip('/')}/{rule.cubin_default}",
                  f"{rule.workspace_env} default")


def _home(files, env: Mapping[str, str], user: str | None) -> str:
    """The home folder of the image's user: HOME, else /etc/passwd's entry, else /root."""
    if env.get("HOME"):
        return env["HOME"]
    if _is_root(user):
        return "/root"
    name = (user or "").split(":")[0]
    data = files.read("/etc/passwd") or b""
    for line in data.decode("utf-8", "replace").splitlines():
        fields = line.split(":")
        if len(fields) >= 6 and name in (fields[0], fields[2]):
            return fields[5]
    return "/"


def cache_env(files, installed: Installed, env: Mapping[str, str], user: str | None,
              packages: Sequence) -> dict[str, str]:
    """The environment the image sets for the patched packages' JIT: its own JIT cache place
    (:func:`workspace`) and, since that place also moves where FlashInfer keeps the cubins it
    downloads, the cubin place the base used, so that nothing is downloaded again."""
    out = workspace(packages, user)
    if not out:
        return {}
    for p in packages:
        if not p.tree.report.jit_modules.get(p.name):
            continue
        was = places(files, installed, env, user, p.dist)
        if was is not None:
            out.setdefault(CUBIN_ENV, was.cubins)
    return out
