"""What every build path shares: the build mode, the overlay's plan and image, the result.

Two ways to make the image, chosen from what the series changed:

* overlay (when every shipped change is a file of the installed ``vllm`` package that is not
  native source): the base image plus one layer holding exactly the patched files, after
  proving that the base holds the very release the patches were applied to;
* source (when a change feeds vLLM's own build, e.g. ``csrc/``): vLLM's ``docker/Dockerfile``
  run on the patched checkout with GB10's build arguments.

Changes outside the package that no build reads (``tests/``, ``docs/`` ...) ship in neither.
The paths that build them (through an engine, or straight in a registry) are ``builders/``.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import PurePosixPath
from typing import Callable, Sequence

from patchkit import source, versions
from patchkit.errors import ImageError, UsageError
from patchkit.git import Provenance
from patchkit.image import base as base_
from patchkit.image import prebuilt
from patchkit.image import labels as image_labels
from patchkit.image import distinfo, lockfile, package
from patchkit.formats import layer
from patchkit.manifest import VLLM, Manifest
from patchkit.manifest.model import ImageDefaults
from patchkit.series.checkout import AppliedCheckout, Change

LAYER_FORMAT = "3"  # bump when the layer or config layout changes: it is part of the inputs key
# 3: prebuilt modules found as FlashInfer 0.7 finds them, and FLASHINFER_CUBIN_DIR kept
SERVE_SCRIPT = "build/serve.sh"
SERVE_PATH = "usr/local/bin/patchkit-serve"
NATIVE_SUFFIXES = {".c", ".cc", ".cpp", ".cxx", ".cu", ".cuh", ".h", ".hh", ".hpp", ".inl",
                   ".pyx", ".pxd", ".so", ".cmake"}
# Top-level folders and files of a vLLM checkout that no image is built from.
NOT_SHIPPED_TOPS = {"tests", "docs", "examples", "benchmarks", ".github", ".buildkite"}
NOT_SHIPPED_SUFFIXES = {".md", ".rst"}
# The two build modes (not patch kinds: a series of any kinds builds either way).
OVERLAY_MODE = "overlay"
SOURCE_MODE = "source"


@dataclass(frozen=True)
class LayerInfo:
    files: int
    bytes: int
    whiteouts: int
    diff_id: str | None = None  # unknown for a reused image

    def to_dict(self) -> dict:
        data = {"files": self.files, "bytes": self.bytes, "whiteouts": self.whiteouts}
        if self.diff_id is not None:
            data["diff_id"] = self.diff_id
        return data


@dataclass(frozen=True)
class Built:
    """What a build path made."""

    image_id: str | None
    base: layer.BaseImage | None = None
    reused: bool = False
    layer: LayerInfo | None = None
    vllm_dir: str | None = None
    installed: str | None = None
    buildargs: dict[str, str] | None = None
    pushed_by_build: bool = False
    config_digest: str | None = None   # overlay: the config made here (its image id where
                                       # ids are config digests)
    load: str | None = None            # overlay: "partial" or "complete", None when reused
    digest: str | None = None          # the manifest digest the tag names, when the build
                                       # pushed it and the registry said


# ------------------------------------------------------------------------------ the mode

@dataclass(frozen=True)
class ModeChoice:
    mode: str                      # overlay | source
    reason: str
    shipped: tuple[Change, ...]    # the changes that go into the image (overlay)
    not_shipped: tuple[str, ...]   # changed paths no image is built from
    packages: tuple[str, ...] = ()  # the other packages whose changed files the image ships


def choose_mode(changes: Sequence[Change], forced: str = "auto") -> ModeChoice:
    shipped: list[Change] = []
    not_shipped: list[str] = []
    needs_source: str | None = None
    for c in changes:
        p = PurePosixPath(c.path)
        if p.parts[0] != VLLM.top:   # outside vLLM's import folder
            if p.parts[0] in NOT_SHIPPED_TOPS or (len(p.parts) > 1 and p.suffix in NOT_SHIPPED_SUFFIXES) \
                    or (len(p.parts) == 1 and p.suffix in NOT_SHIPPED_SUFFIXES):
                not_shipped.append(c.path)
                continue
            needs_source = needs_source or (
                f"{c.path} is outside the vllm package and feeds vLLM's build")
            continue
        if p.suffix in NATIVE_SUFFIXES:
            needs_source = needs_source or f"{c.path} is not Python: it is compiled into vLLM"
            continue
        if c.status == "T" or c.mode == 0o120000:
            raise ImageError(f"{c.path} became a symlink or changed type; the image lays "
                             "regular files only")
        shipped.append(c)
    if forced == SOURCE_MODE:
        return ModeChoice(SOURCE_MODE, "--mode source was asked for", tuple(shipped),
                          tuple(not_shipped))
    if needs_source:
        if forced == OVERLAY_MODE:
            raise ImageError(f"--mode overlay cannot ship this series: {needs_source}")
        return ModeChoice(SOURCE_MODE, needs_source, tuple(shipped), tuple(not_shipped))
    n = len(shipped)
    reason = (f"all {n} patched file{'s' if n != 1 else ''} of the image are Python files of the "
              f"vllm package" if n else "the series changes no file of the vllm package")
    if forced == OVERLAY_MODE:
        reason = "--mode overlay was asked for; " + reason
    return ModeChoice(OVERLAY_MODE, reason, tuple(shipped), tuple(not_shipped))


# ---------------------------------------------------------------------------- the inputs

def patchset_digest(manifest: Manifest) -> str:
    """sha256 over patchset.yaml and every file it names, plus the serve script."""
    h = hashlib.sha256()
    files = [manifest.path]
    for patch in manifest.patches:
        target = manifest.root / patch.path
        if patch.artifact is not None:
            # a wheel of modules is named by its pinned sha256 (in patchset.yaml): not read
            continue
        if target.is_dir():
            files.extend(sorted(p for p in target.rglob("*") if p.is_file()))
        else:
            files.append(target)
    serve = manifest.root / SERVE_SCRIPT
    if serve.is_file():
        files.append(serve)
    for f in files:
        rel = os.path.relpath(f, manifest.root)
        h.update(rel.encode() + b"\0")
        try:
            h.update(f.read_bytes())
        except OSError:
            h.update(b"<missing>")
        h.update(b"\0")
    return "sha256:" + h.hexdigest()


def source_date(tree: AppliedCheckout) -> int:
    env = os.environ.get("SOURCE_DATE_EPOCH")
    if env:
        try:
            return int(env)
        except ValueError:
            raise UsageError(f"SOURCE_DATE_EPOCH={env!r} is not a number of seconds") from None
    return tree.commit_time(tree.base)


# ------------------------------------------------------------------------------ overlay

@dataclass(frozen=True)
class PackageTree:
    """A package other than vLLM whose changed files the image ships."""

    name: str
    dist: str                      # its distribution name, as the base installed it
    tree: AppliedCheckout
    shipped: tuple[Change, ...]    # its changes that go into the image
    site: str | None = None        # the folder holding its dist-info in the base; None: not
                                   # read yet (found on the base's files by the plan)
    # the patched files whose patches say `rebuild: jit`: a prebuilt module built from one is
    # left out of the image (image/prebuilt.py)
    rebuild_jit: tuple[str, ...] = ()
    # the GPU architecture its prebuilt modules are judged for (image.cuda_arch), unless the
    # base sets FlashInfer's own list
    cuda_arch: str = ImageDefaults.cuda_arch


def package_shipped(changes: Sequence[Change]) -> tuple[Change, ...]:
    """The changes of a package other than vLLM that the image ships: all but the files no
    install holds (tests, docs); a change of type is refused, as for vLLM's files."""
    out = []
    for c in changes:
        p = PurePosixPath(c.path)
        if p.parts[0] in NOT_SHIPPED_TOPS or p.suffix in NOT_SHIPPED_SUFFIXES:
            continue
        if c.status == "T" or c.mode == 0o120000:
            raise ImageError(f"{c.path} became a symlink or changed type; the image lays "
                             "regular files only")
        out.append(c)
    return tuple(out)


@dataclass(frozen=True)
class PlacedArtifact:
    """An artifact's member, checked (image/artifact.py), to place where ``dist`` is."""

    patch: str
    dist: str
    member: str
    data: bytes


@dataclass
class OverlayPlan:
    package: package.Package
    installed: str | None
    entries: list[layer.LayerEntry]
    env: dict[str, str] = field(default_factory=dict)   # set in the image's config


def _rel_in_image(path: str) -> str:
    return path.lstrip("/")


def plan_overlay(files: package.Files, base: layer.BaseImage, tree: AppliedCheckout,
                 shipped: Sequence[Change], serve: bytes | None, log: Callable[[str], None],
                 packages: Sequence[PackageTree] = (),
                 artifacts: Sequence[PlacedArtifact] = (),
                 dists: Callable[[], distinfo.Installed] | None = None) -> OverlayPlan:
    """Check that the base holds the pristine release, and list the layer's entries: vLLM's
    changed files, then each other package's where the base installed its ``dist``.
    ``dists`` gives the base's installed distributions, read once, when artifacts or JIT
    modules ask (default: read here from ``files``)."""
    pkg = package.find_package(files, base.env)
    log(f"vllm package in the base: {pkg.dir}"
        + (f" (also found, not used: {', '.join(pkg.others)})" if pkg.others else ""))
    vllm = tree.vllm
    expected = versions.expected(vllm.version, vllm.ref)
    installed = package.installed_version(files, pkg, expected)
    ref = vllm.ref or tree.base[:12]
    problem = installed_problem(base.name, installed, tree, pkg.dir)
    if problem:
        raise ImageError(problem)
    named = versions.named_commit(installed)
    if named and not (vllm.source and source.kind_of(vllm.source).reads_base):
        log(f"base {base.name} was built from commit {named}, the pinned one")
    pristine = tree.pristine([c.path for c in shipped if c.status != "A"])
    where = f"vLLM {ref} (commit {tree.base[:12]})"
    dist = _vllm_dist(files, pkg, installed)
    proof = distinfo.prove_pristine(
        files, dist, [c.path for c in shipped if c.status != "A"], pristine, image=base.name,
        what=where, added=[c.path for c in shipped if c.status == "A"], to_image=pkg.path_of)
    log(f"base holds vLLM {installed or '(version unknown)'}; "
        f"{sum(c.status != 'A' for c in shipped)} file(s) to replace are pristine"
        + (f" ({proof.describe()})" if proof.by_record or proof.by_reading else ""))

    entries: list[layer.LayerEntry] = []
    made_dirs: set[str] = set()
    stale = _entries(files, pkg, tree, shipped, pkg.path_of, entries, made_dirs)
    others = placed(files, base, packages, log)
    for other in others:
        stale += _entries(files, pkg, other.tree, other.shipped,
                          lambda rel, site=other.site: site.rstrip("/") + "/" + rel,
                          entries, made_dirs)
        log(f"{other.name}: {len(other.shipped)} changed file(s) into {other.site}")
    jit_env: dict[str, str] = {}
    fed = any(o.tree.report.jit_modules for o in others)
    # the base's distributions, read once for what needs them (given when read already)
    have = None
    if artifacts or fed:
        have = dists() if dists is not None else distinfo.installed(
            files, base.env)  # type: ignore[arg-type]
    if artifacts:
        _place_artifacts(have, files, base.name, artifacts, entries, made_dirs, log)
    if fed:
        shipped_members = {(a.dist, a.member) for a in artifacts}
        entries += prebuilt.leave_out(files, have, base.env, others, base.name, log,
                                      shipped_members)
        jit_env = prebuilt.cache_env(files, have, base.env, base.config.get("User"), others)
        for name, value in jit_env.items():
            log(f"JIT cache of the patched sources: {name}={value}")
    if serve is not None:
        entries.append(layer.LayerEntry(SERVE_PATH, "file", serve, 0o755))
    if stale:
        log(f"{stale} byte-code cache(s) of patched modules removed in the layer")
    return OverlayPlan(pkg, installed, entries, jit_env)


def _place_artifacts(installed: distinfo.Installed, files: package.Files, base: str,
                     artifacts: Sequence[PlacedArtifact], entries: list[layer.LayerEntry],
                     made_dirs: set[str], log: Callable[[str], None]) -> None:
    """Each artifact's member where the base installed its dist, with the folders it needs."""
    from patchkit.image.artifact import ArtifactError

    for a in artifacts:
        dist = installed.get(a.dist)
        if dist is None:
            raise ArtifactError(f"patch {a.patch}: artifact for {a.dist}, which base {base} "
                                f"does not have installed ({installed.missing(a.dist)})")
        target = f"{dist.site.rstrip('/')}/{a.member}"
        parent = PurePosixPath(target).parent
        missing_dirs = []
        while str(parent) not in made_dirs and not files.exists(str(parent)):
            missing_dirs.append(str(parent))
            parent = parent.parent
        for d in reversed(missing_dirs):
            made_dirs.add(d)
            entries.append(layer.LayerEntry(_rel_in_image(d), "dir", mode=0o755))
        entries.append(layer.LayerEntry(_rel_in_image(target), "file", a.data, 0o755))
        log(f"{a.patch}: {a.member} ({len(a.data)} bytes) into {dist.site} ({a.dist} "
            f"{dist.version})")


def _entries(files: package.Files, pkg: package.Package, tree: AppliedCheckout,
             shipped: Sequence[Change], to_image: Callable[[str], str],
             entries: list[layer.LayerEntry], made_dirs: set[str]) -> int:
    """Append the layer entries of one package's changes (``to_image`` maps a checkout path
    into the image): new folders, files, deletions and stale byte-code caches as whiteouts.
    Returns how many caches were whited out."""
    contents = tree.blobs([c.blob for c in shipped if c.status != "D"])
    stale = 0
    for c in shipped:
        target = to_image(c.path)
        if c.path.endswith(".py"):
            for cache in package.stale_caches(files, pkg, target):
                stale += 1
                entries.append(layer.LayerEntry(_rel_in_image(cache), "whiteout"))
        if c.status == "D":
            entries.append(layer.LayerEntry(_rel_in_image(target), "whiteout"))
            continue
        data = contents[c.blob]
        if data is None:
            raise ImageError(f"{c.path}: blob {c.blob[:12]} is missing from {tree.root}")
        parent = PurePosixPath(target).parent
        missing_dirs = []
        while str(parent) not in made_dirs and not files.exists(str(parent)):
            missing_dirs.append(str(parent))
            parent = parent.parent
        for d in missing_dirs:
            made_dirs.add(d)
            entries.append(layer.LayerEntry(_rel_in_image(d), "dir", mode=0o755))
        entries.append(layer.LayerEntry(_rel_in_image(target), "file", data,
                                        0o755 if c.mode & 0o111 else 0o644))
    return stale


def placed(files: package.Files, base: layer.BaseImage, packages: Sequence[PackageTree],
           log: Callable[[str], None]) -> list[PackageTree]:
    """``packages`` each with the site its ``dist`` is installed in.  A package whose site is
    not known yet (the base was not read before the build) is found and proven pristine here,
    on the base's files."""
    if all(p.site is not None for p in packages):
        return list(packages)
    installed = distinfo.installed(files, base.env)  # type: ignore[arg-type]
    out = []
    for p in packages:
        if p.site is None:
            dist, _ = base_.prove_package(files, installed, base.name, p.name, p.dist, p.tree,
                                          log)
            p = replace(p, site=dist.site)
        out.append(p)
    return out


def _vllm_dist(files: package.Files, pkg: package.Package, installed: str | None
               ) -> distinfo.Dist:
    """vLLM's dist-info, for its RECORD; without one, a dist whose files are all read."""
    found = distinfo.read_dist(files, pkg.site, f"{VLLM.dist}-{installed}{distinfo.INFO_SUFFIX}") \
        if installed else None
    return found or distinfo.Dist(VLLM.dist, installed or "", pkg.site, "")


def installed_problem(base_name: str, installed: str | None, tree: AppliedCheckout,
                      package_dir: str) -> str | None:
    """Why a base holding vLLM ``installed`` is not what the tree was applied to, or None.

    Commits before release strings: a base whose version names the pinned commit (a dev build,
    ``0.31.1.dev7+g<sha>``) holds that commit whatever its release says.  A tree read from a
    base image (the source ``image``) fits a base holding the very version it was read from.
    Otherwise the installed release must be the pinned one.  The pristine bytes of every file
    to replace are compared after this, whichever way it went.
    """
    vllm = tree.vllm
    ref = vllm.ref or tree.base[:12]
    if vllm.source and source.kind_of(vllm.source).reads_base:
        if installed != vllm.version:
            return (f"base {base_name} holds vLLM {installed or '(version unknown)'}, and the tree "
                    f"was read from a base holding vLLM {vllm.version or '(version unknown)'}: "
                    "build on the base it was applied from")
        return None
    named = versions.named_commit(installed)
    if named:
        if (vllm.commit or tree.base).startswith(named) or tree.base.startswith(named):
            return None
        return (f"base {base_name} holds vLLM {installed}, built from commit {named}, not from "
                f"the pinned commit {tree.base[:12]} (vLLM {ref}); use a base built from it, or "
                "pin it with --vllm-ref base")
    expected = versions.expected(vllm.version, vllm.ref)
    if expected and installed and not versions.same_release(installed, expected):
        return (f"base {base_name} holds vLLM {installed}, not {expected}: the patches were "
                f"applied to vLLM {ref}; use a base of that release")
    if expected and installed is None:
        return (f"base {base_name}: cannot tell its vLLM version (no {package_dir}/_version.py "
                f"nor vllm-{expected}.dist-info); refusing to lay vLLM {ref} files on it")
    return None


def inputs_key(base: layer.BaseImage, labels: dict, shipped: Sequence[Change], serve: bytes | None,
               mtime: int, packages: Sequence[PackageTree] = (),
               serving: dict | None = None) -> str:
    """What the overlay image is a function of.  An image carrying the same key was made from
    the same base (by what the image takes from it, the same on every store) and the same
    files, so it is the same image."""
    doc = {"format": LAYER_FORMAT, "base": base.identity, "platform": str(base.platform),
           "labels": labels, "mtime": mtime,
           "changes": [[c.status, c.path, c.mode, c.blob] for c in shipped],
           # the site is the base's (in the key already): the same key on every path
           "packages": {p.name: [[c.status, c.path, c.mode, c.blob] for c in p.shipped]
                        for p in packages},
           "serve": hashlib.sha256(serve).hexdigest() if serve is not None else None}
    if serving is not None:   # image.serve: only then, so that every other key stays as it was
        doc["serving"] = serving
    return "sha256:" + hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class OverlayInputs:
    """What an overlay image is made of besides the base's files: the same on every path."""

    serve: bytes | None
    created: int
    labels: dict[str, str]
    key: str
    command: tuple[str, ...] | None = None   # the image's CMD (None: the base's)
    env: tuple[tuple[str, str], ...] = ()     # image.serve.env


def overlay_inputs(manifest: Manifest, tree: AppliedCheckout, choice: ModeChoice,
                   base: layer.BaseImage, packages: Sequence[PackageTree] = (),
                   project: Provenance = Provenance()) -> OverlayInputs:
    serve_file = manifest.root / SERVE_SCRIPT
    serve = serve_file.read_bytes() if serve_file.is_file() else None
    created = source_date(tree)
    labels = image_labels.run_labels(manifest, tree, mode=OVERLAY_MODE, created=created,
                                     digest=patchset_digest(manifest),
                                     packages=packages_of(manifest, tree), project=project)
    labels.update(image_labels.base_labels(base))
    asked = manifest.image.serve
    command = serve_command(manifest)
    serving = ({"command": list(asked.command) if asked.command else None,
                "env": [list(kv) for kv in asked.env]} if asked is not None else None)
    return OverlayInputs(serve, created, labels,
                         inputs_key(base, labels, choice.shipped, serve, created, packages,
                                    serving),
                         command, asked.env if asked is not None else ())


def serve_command(manifest: Manifest) -> tuple[str, ...] | None:
    """What an overlay image of ``manifest`` runs: ``image.serve.command``, else
    build/serve.sh (laid in as ``/usr/local/bin/patchkit-serve``), else None: the base's."""
    asked = manifest.image.serve
    if asked is not None and asked.command:
        return asked.command
    if (manifest.root / SERVE_SCRIPT).is_file():
        return ("/" + SERVE_PATH,)
    return None


def packages_of(manifest: Manifest, tree: AppliedCheckout) -> dict[str, dict[str, str]]:
    """Each package's version, commit and source, as the labels record them."""
    return {name: {"version": p.version, "commit": p.commit, "source": p.source}
            for name, p in lockfile.patched_packages(manifest, tree.root).items()}


def overlay_image(base: layer.BaseImage, plan: OverlayPlan, inputs: OverlayInputs
                  ) -> tuple[layer.Layer, bytes]:
    """The overlay layer and the new image's config, byte for byte, from the plan."""
    made = layer.layer_tar(plan.entries, inputs.created)
    labels = dict(inputs.labels)
    labels.update(image_labels.overlay_labels(inputs.key, plan.package.dir, plan.installed,
                                              made))
    if plan.env:
        labels.update(image_labels.jit_labels(plan.env))
    # the JIT places the plan sets win over image.serve.env: the labels say where they are
    env = {**dict(inputs.env), **(plan.env or {})}
    config = layer.image_config(
        base, made, labels=labels, created=inputs.created, env=env,
        created_by=f"patchkit build-image: {made.files} file(s) into {plan.package.dir}",
        cmd=list(inputs.command) if inputs.command is not None else None,
        reset_entrypoint=inputs.command is not None)
    return made, config


@dataclass(frozen=True)
class Holds:
    """What an image really holds, as build-image's summary and ``verify --image`` tell it."""

    installed: str | None     # the vLLM version installed in it
    commit: str | None        # the commit that version names (a dev build), else None
    source: str | None        # where the pristine tree came from: git, pypi, image (None: unknown)
    fingerprint: str | None   # its content: config digest + layer diff_ids (engines.facts.fingerprint)
    patchset_commit: str | None = None   # the patchset's commit it was built from, -dirty marked
    created: str | None = None           # its creation time, when real (labels.real_time)

    @classmethod
    def of(cls, installed: str | None, source_kind: str | None, fingerprint: str | None,
           patchset_commit: str | None = None, created: str | None = None) -> Holds:
        return cls(installed, versions.named_commit(installed), source_kind, fingerprint,
                   patchset_commit, created)

    def to_dict(self) -> dict:
        return asdict(self)
