"""Building the image from an applied checkout: the build mode, labels, overlay and source builds.

Two ways to make the image, chosen from what the series changed:

* overlay (when every shipped change is a file of the installed ``vllm`` package that is not
  native source): the base image plus one layer holding exactly the patched files, after
  proving that the base holds the very release the patches were applied to;
* source (when a change feeds vLLM's own build, e.g. ``csrc/``): vLLM's ``docker/Dockerfile``
  run on the patched checkout with GB10's build arguments.

Changes outside the package that no build reads (``tests/``, ``docs/`` ...) ship in neither.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import PurePosixPath
from typing import Callable, Sequence

from patchkit import source, versions
from patchkit.errors import ImageError, UsageError
from patchkit.image import layer, package
from patchkit.image.engine import Engine
from patchkit.imageref import Platform
from patchkit.manifest import Manifest
from patchkit.series.checkout import AppliedCheckout, Change

LAYER_FORMAT = "2"  # bump when the layer or config layout changes: it is part of the inputs key
PACKAGE = "vllm"
SERVE_SCRIPT = "build/serve.sh"
SERVE_PATH = "usr/local/bin/patchkit-serve"
GB10_ARCH = "12.1a"
SOURCE_TARGET = "vllm-openai"
DOCKERFILE = "docker/Dockerfile"
NATIVE_SUFFIXES = {".c", ".cc", ".cpp", ".cxx", ".cu", ".cuh", ".h", ".hh", ".hpp", ".inl",
                   ".pyx", ".pxd", ".so", ".cmake"}
# Top-level folders and files of a vLLM checkout that no image is built from.
NOT_SHIPPED_TOPS = {"tests", "docs", "examples", "benchmarks", ".github", ".buildkite"}
NOT_SHIPPED_SUFFIXES = {".md", ".rst"}
# Dockerfile syntax the classic builder does not know.
BUILDKIT_ONLY = re.compile(r"^\s*(?:#\s*syntax\s*=|(?:RUN|COPY|ADD)\b[^\n]*?(?:--mount|--link|"
                           r"--chmod|--parents|--exclude|--checksum|--security|--network)\b|"
                           r"(?:RUN|COPY)\b[^\n]*<<-?\s*['\"]?\w+)", re.I | re.M)

INPUTS_LABEL = "io.patchkit.inputs"
VARIANT_LABEL = "io.patchkit.variant"  # the variant built; empty for the default build
# The two build modes (not patch kinds: a series of any kinds builds either way).
OVERLAY_MODE = "overlay"
SOURCE_MODE = "source"
# What the image holds (see Holds): the installed version, the commit it names, the kind of
# source of the pristine tree, and the identity of the base it was laid on (an image cannot
# carry its own fingerprint, which its labels are part of).
INSTALLED_LABEL = "io.patchkit.vllm.installed"
INSTALLED_COMMIT_LABEL = "io.patchkit.vllm.installed.commit"
SOURCE_LABEL = "io.patchkit.vllm.source"
BASE_IDENTITY_LABEL = "io.patchkit.base.identity"


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


# ------------------------------------------------------------------------------ the mode

@dataclass(frozen=True)
class ModeChoice:
    mode: str                      # overlay | source
    reason: str
    shipped: tuple[Change, ...]    # the changes that go into the image (overlay)
    not_shipped: tuple[str, ...]   # changed paths no image is built from


def choose_mode(changes: Sequence[Change], forced: str = "auto") -> ModeChoice:
    shipped: list[Change] = []
    not_shipped: list[str] = []
    needs_source: str | None = None
    for c in changes:
        p = PurePosixPath(c.path)
        if p.parts[0] != PACKAGE:
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


# --------------------------------------------------------------------------------- labels

def patchset_digest(manifest: Manifest) -> str:
    """sha256 over patchset.yaml and every file it names, plus the serve script."""
    h = hashlib.sha256()
    files = [manifest.path]
    for patch in manifest.patches:
        target = manifest.root / patch.path
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


def base_labels(manifest: Manifest, tree: AppliedCheckout, *, mode: str, created: int,
                digest: str) -> dict[str, str]:
    vllm = tree.vllm
    repo = vllm.repo or (manifest.vllm.repos[0] if manifest.vllm.repos else "")
    kind = source.kind_of(repo) if repo else None
    if kind is not None:
        repo = kind.label(repo, str(vllm.version or vllm.ref))
    version = vllm.version or vllm.ref or "unknown"
    patches = [{"id": p.id, "status": p.status} for p in tree.report.patches]
    return {
        "org.opencontainers.image.title": manifest.name,
        "org.opencontainers.image.source": str(repo),
        "org.opencontainers.image.revision": str(vllm.commit or tree.base),
        "org.opencontainers.image.version": f"{version}+{manifest.name}",
        "org.opencontainers.image.created": layer.iso_time(created),
        "io.patchkit.mode": mode,
        "io.patchkit.patchset.name": manifest.name,
        "io.patchkit.patchset.digest": digest,
        "io.patchkit.vllm.ref": str(vllm.ref or ""),
        "io.patchkit.vllm.commit": str(vllm.commit or tree.base),
        "io.patchkit.vllm.version": str(vllm.version or ""),
        "io.patchkit.vllm.tree": tree.tree_id(),
        SOURCE_LABEL: kind.name if kind is not None else "",
        "io.patchkit.patches": json.dumps(patches, separators=(",", ":")),
        VARIANT_LABEL: tree.report.variant or "",
    }


# ------------------------------------------------------------------------------ overlay

@dataclass
class OverlayPlan:
    package: package.Package
    installed: str | None
    entries: list[layer.LayerEntry]


def _rel_in_image(path: str) -> str:
    return path.lstrip("/")


def plan_overlay(files: package.Files, base: layer.BaseImage, tree: AppliedCheckout,
                 shipped: Sequence[Change], serve: bytes | None, log: Callable[[str], None]
                 ) -> OverlayPlan:
    """Check that the base holds the pristine release, and list the layer's entries."""
    env = {}
    for item in base.config.get("Env") or ():
        k, _, v = item.partition("=")
        env[k] = v
    pkg = package.find_package(files, env)
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
    if named and not (vllm.repo and source.kind_of(vllm.repo).reads_base):
        log(f"base {base.name} was built from commit {named}, the pinned one")
    pristine = tree.pristine([c.path for c in shipped if c.status != "A"])
    where = f"vLLM {ref} (commit {tree.base[:12]})"
    for c in shipped:
        target = pkg.path_of(c.path)
        if c.status == "A":
            if files.exists(target):
                raise ImageError(f"base {base.name} already has {c.path}, which {where} does not; "
                                 "refusing to overwrite it")
            continue
        have = files.read(target)
        if have is None:
            raise ImageError(f"base {base.name} has no {c.path}, which {where} has")
        if have != pristine[c.path]:
            raise ImageError(f"base {base.name}: {c.path} is not the pristine file of {where}; "
                             "refusing to overwrite it")
    log(f"base holds vLLM {installed or '(version unknown)'}; "
        f"{sum(c.status != 'A' for c in shipped)} file(s) to replace are pristine")

    contents = tree.blobs([c.blob for c in shipped if c.status != "D"])
    entries: list[layer.LayerEntry] = []
    made_dirs: set[str] = set()
    stale: list[str] = []
    for c in shipped:
        target = pkg.path_of(c.path)
        if c.path.endswith(".py"):
            for cache in package.stale_caches(files, pkg, target):
                stale.append(cache)
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
    if serve is not None:
        entries.append(layer.LayerEntry(SERVE_PATH, "file", serve, 0o755))
    if stale:
        log(f"{len(stale)} byte-code cache(s) of patched modules removed in the layer")
    return OverlayPlan(pkg, installed, entries)


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
    if vllm.repo and source.kind_of(vllm.repo).reads_base:
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
               mtime: int) -> str:
    """What the overlay image is a function of.  An image carrying the same key was made from
    the same base (by what the image takes from it, the same on every store) and the same
    files, so it is the same image."""
    doc = {"format": LAYER_FORMAT, "base": base.identity, "platform": str(base.platform),
           "labels": labels, "mtime": mtime,
           "changes": [[c.status, c.path, c.mode, c.blob] for c in shipped],
           "serve": hashlib.sha256(serve).hexdigest() if serve is not None else None}
    return "sha256:" + hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class OverlayInputs:
    """What an overlay image is made of besides the base's files: the same on every path."""

    serve: bytes | None
    created: int
    labels: dict[str, str]
    key: str


def overlay_inputs(manifest: Manifest, tree: AppliedCheckout, choice: ModeChoice,
                   base: layer.BaseImage) -> OverlayInputs:
    serve_file = manifest.root / SERVE_SCRIPT
    serve = serve_file.read_bytes() if serve_file.is_file() else None
    created = source_date(tree)
    labels = base_labels(manifest, tree, mode=OVERLAY_MODE, created=created,
                         digest=patchset_digest(manifest))
    labels["org.opencontainers.image.base.name"] = base.name
    labels["org.opencontainers.image.base.digest"] = base.digest or base.image_id
    # store-independent, as the whole config must be: a base's fingerprint needs its config
    # digest, which a containerd store tells only through an export
    labels[BASE_IDENTITY_LABEL] = base.identity
    return OverlayInputs(serve, created, labels,
                         inputs_key(base, labels, choice.shipped, serve, created))


def overlay_image(base: layer.BaseImage, plan: OverlayPlan, inputs: OverlayInputs
                  ) -> tuple[layer.Layer, bytes]:
    """The overlay layer and the new image's config, byte for byte, from the plan."""
    made = layer.layer_tar(plan.entries, inputs.created)
    labels = dict(inputs.labels)
    labels.update({
        INPUTS_LABEL: inputs.key,
        "io.patchkit.vllm.dir": plan.package.dir,
        INSTALLED_LABEL: plan.installed or "",
        INSTALLED_COMMIT_LABEL: versions.named_commit(plan.installed) or "",
        "io.patchkit.layer.files": str(made.files),
        "io.patchkit.layer.bytes": str(made.bytes),
        "io.patchkit.layer.whiteouts": str(made.whiteouts),
    })
    config = layer.image_config(
        base, made, labels=labels, created=inputs.created,
        created_by=f"patchkit build-image: {made.files} file(s) into {plan.package.dir}",
        cmd=["/" + SERVE_PATH] if inputs.serve is not None else None,
        reset_entrypoint=inputs.serve is not None)
    return made, config


def _find_by_key(engine: Engine, key: str) -> str | None:
    found = engine.images_with_label(INPUTS_LABEL, key)
    return found[0] if found else None


def build_overlay(manifest: Manifest, tree: AppliedCheckout, choice: ModeChoice, engine: Engine, *,
                  base_ref: str, platform: Platform, log) -> Built:
    store = engine.store()
    log(f"resolving the base {base_ref} for {platform}")
    base = engine.resolve_base(base_ref, platform, log)
    log(f"base pinned by {base.pinned_by}: {base.pinned}")
    inputs = overlay_inputs(manifest, tree, choice, base)
    known = _find_by_key(engine, inputs.key)
    if known:
        attrs = engine.inspect(known) or {}
        got = (attrs.get("Config") or {}).get("Labels") or {}
        log(f"nothing changed since image {known[:19]}: reusing it")
        return Built(known, base, True,
                     LayerInfo(int(got.get("io.patchkit.layer.files", 0)),
                               int(got.get("io.patchkit.layer.bytes", 0)),
                               int(got.get("io.patchkit.layer.whiteouts", 0))),
                     got.get("io.patchkit.vllm.dir"), got.get(INSTALLED_LABEL) or None)
    with engine.files(base.image_id, base.name) as files:
        plan = plan_overlay(files, base, tree, choice.shipped, inputs.serve, log)
    made, config = overlay_image(base, plan, inputs)
    image_id = layer.image_id_of(config)
    reused = engine.has_image(image_id)
    held = image_id
    if reused:
        log(f"image {image_id[:19]} is already in the engine")
    elif store.partial_load:
        log(f"loading the layer alone ({made.files} files, {made.bytes} bytes) onto {base.pinned}: "
            f"the engine at {engine.host} keeps images in {store}, which holds the base's layers")
        engine.load(layer.load_archive(config, made, len(base.diff_ids)), image_id)
    else:
        log(f"loading a complete archive: the engine at {engine.host} keeps images in {store}, "
            "which cannot take a partial load")
        held = engine.load_complete(base, config, made, image_id, log)
    return Built(held, base, reused,
                 LayerInfo(made.files, made.bytes, made.whiteouts, made.diff_id),
                 plan.package.dir, plan.installed, config_digest=image_id,
                 load=None if reused else ("partial" if store.partial_load else "complete"))


# ------------------------------------------------------------------------------- source

def buildkit_need(dockerfile_text: str) -> str | None:
    """The first line that needs BuildKit, or None when the classic builder can run it."""
    m = BUILDKIT_ONLY.search(dockerfile_text)
    if not m:
        return None
    line_no = dockerfile_text.count("\n", 0, m.start()) + 1
    line = dockerfile_text.splitlines()[line_no - 1].strip()
    return f"line {line_no}: {line[:80]}"


def build_source(manifest: Manifest, tree: AppliedCheckout, engine: Engine, *,
                 platform: Platform, tag: str, push: bool, max_jobs: int | None,
                 nvcc_threads: int | None, log) -> Built:
    dockerfile = tree.root / DOCKERFILE
    if not dockerfile.is_file():
        raise ImageError(f"source mode needs {DOCKERFILE} in the checkout, and {tree.root} has none")
    text = dockerfile.read_text(errors="replace")
    buildargs = {"torch_cuda_arch_list": GB10_ARCH}
    if max_jobs is not None:
        buildargs["max_jobs"] = str(max_jobs)
    if nvcc_threads is not None:
        buildargs["nvcc_threads"] = str(nvcc_threads)
    created = source_date(tree)
    labels = base_labels(manifest, tree, mode=SOURCE_MODE, created=created,
                         digest=patchset_digest(manifest))
    need = buildkit_need(text)
    pushed_by_build = False
    if need:
        if not engine.buildx_available():
            raise ImageError(f"{DOCKERFILE} needs BuildKit ({need}) and 'docker buildx' is not "
                             "installed here: install the buildx plugin, or run build-image on "
                             "the DGX Spark")
        log(f"{DOCKERFILE} needs BuildKit ({need}): building with docker buildx")
        engine.buildx_build(tree.root, dockerfile=DOCKERFILE, target=SOURCE_TARGET,
                            buildargs=buildargs, labels=labels, tag=tag, platform=platform,
                            push=push, log=log)
        pushed_by_build = push
    else:
        log(f"building {DOCKERFILE} (target {SOURCE_TARGET}) with the engine's builder")
        engine.build(tree.root, dockerfile=DOCKERFILE, target=SOURCE_TARGET, buildargs=buildargs,
                     labels=labels, tag=tag, platform=platform, log=log)
    attrs = engine.inspect(tag) if not pushed_by_build else None
    if attrs is not None:
        got = Platform(attrs.get("Os") or "linux", attrs.get("Architecture") or "?",
                          attrs.get("Variant"))
        if not got.matches(platform):
            raise ImageError(f"the build gave a {got} image, not {platform}")
    return Built(attrs["Id"] if attrs else None, buildargs=buildargs,
                 pushed_by_build=pushed_by_build)


# ------------------------------------------------------------------------------ reading back

@dataclass(frozen=True)
class ImageFacts:
    """What an image's labels say about how patchkit made it (nothing when it did not)."""

    statuses: dict[str, str]       # patch id -> status
    vllm_dir: str | None
    installed: str | None
    variant: str | None = None     # the variant built (None: the default build)
    variant_known: bool = False    # the labels say which variant (images patchkit made)
    source: str | None = None      # git | pypi | image
    base_identity: str | None = None

    @classmethod
    def from_labels(cls, labels: dict[str, str]) -> ImageFacts:
        try:
            statuses = {str(p["id"]): str(p["status"])
                        for p in json.loads(labels.get("io.patchkit.patches") or "[]")}
        except (ValueError, TypeError, KeyError):
            statuses = {}
        return cls(statuses, labels.get("io.patchkit.vllm.dir") or None,
                   labels.get(INSTALLED_LABEL) or None,
                   labels.get(VARIANT_LABEL) or None, VARIANT_LABEL in labels,
                   labels.get(SOURCE_LABEL) or None, labels.get(BASE_IDENTITY_LABEL) or None)

    def skipped(self) -> set[str]:
        return {pid for pid, status in self.statuses.items() if status == "skipped"}


@dataclass(frozen=True)
class Holds:
    """What an image really holds, as build-image's summary and ``verify --image`` tell it."""

    installed: str | None     # the vLLM version installed in it
    commit: str | None        # the commit that version names (a dev build), else None
    source: str | None        # where the pristine tree came from: git, pypi, image (None: unknown)
    fingerprint: str | None   # its content: config digest + layer diff_ids (layer.fingerprint)

    @classmethod
    def of(cls, installed: str | None, source_kind: str | None, fingerprint: str | None) -> Holds:
        return cls(installed, versions.named_commit(installed), source_kind, fingerprint)

    def to_dict(self) -> dict:
        return asdict(self)
