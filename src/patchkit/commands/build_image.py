"""``patchkit build-image`` and ``patchkit verify --image``.

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
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Callable, Sequence

from packaging.version import InvalidVersion, Version

from patchkit import engine as apply_engine
from patchkit import git as g
from patchkit import image as im
from patchkit import paths
from patchkit.errors import ImageError, UsageError
from patchkit.manifest import Manifest
from patchkit.report import AssertionResult

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


# ------------------------------------------------------------------------ the applied tree

@dataclass(frozen=True)
class Change:
    status: str          # A, M, D (T, a type change, is refused)
    path: str            # checkout-relative, e.g. vllm/config/speculative.py
    mode: int            # the new file mode (0 for a deletion)
    blob: str            # the new blob id ("0"*40 for a deletion)


@dataclass(frozen=True)
class AppliedTree:
    """An applied workdir: tag ``patchkit/base`` = pristine upstream, HEAD = patched."""

    root: Path
    report: dict
    base: str            # the pristine commit
    head: str

    @classmethod
    def open(cls, workdir: Path) -> "AppliedTree":
        workdir = Path(workdir)
        report = apply_engine.read_report(workdir)
        if report is None:
            raise UsageError(f"{workdir} is not an applied checkout (no .git/"
                             f"{apply_engine.REPORT_FILE}); run 'patchkit apply' first")
        gone = g.missing_alternates(workdir)
        if gone:
            raise UsageError(f"{workdir} borrows its git objects from {gone[0]}, which is gone "
                             "(was the cache deleted?); run 'patchkit apply' again")
        base = g.resolve_commit(workdir, apply_engine.BASE_TAG) or (report.get("vllm") or {}).get("commit")
        if not base:
            raise UsageError(f"{workdir} has no {apply_engine.BASE_TAG} tag")
        head = g.out("rev-parse", "HEAD", cwd=workdir)
        return cls(workdir, report, base, head)

    @property
    def vllm(self) -> dict:
        return dict(self.report.get("vllm") or {})

    def changes(self) -> list[Change]:
        out = []
        for status, path, _old, new_mode, blob in g.changed_files(self.root, self.base, self.head):
            out.append(Change(status, path, int(new_mode, 8), blob))
        return sorted(out, key=lambda c: c.path)

    def pristine(self, rel_paths: Sequence[str]) -> dict[str, bytes | None]:
        blobs = g.read_blobs(self.root, [f"{self.base}:{p}" for p in rel_paths])
        return {p: blobs[f"{self.base}:{p}"] for p in rel_paths}

    def blobs(self, ids: Sequence[str]) -> dict[str, bytes | None]:
        return g.read_blobs(self.root, ids)

    def tree_id(self) -> str:
        return g.out("rev-parse", f"{self.head}^{{tree}}", cwd=self.root)

    def commit_time(self, commit: str) -> int:
        return int(g.out("show", "-s", "--format=%ct", commit, cwd=self.root))

    def has(self, rel: str) -> bool:
        return g.git("cat-file", "-e", f"{self.head}:{rel}", cwd=self.root, check=False).returncode == 0


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
    if forced == "source":
        return ModeChoice("source", "--mode source was asked for", tuple(shipped), tuple(not_shipped))
    if needs_source:
        if forced == "overlay":
            raise ImageError(f"--mode overlay cannot ship this series: {needs_source}")
        return ModeChoice("source", needs_source, tuple(shipped), tuple(not_shipped))
    n = len(shipped)
    reason = (f"all {n} patched file{'s' if n != 1 else ''} of the image are Python files of the "
              f"vllm package" if n else "the series changes no file of the vllm package")
    if forced == "overlay":
        reason = "--mode overlay was asked for; " + reason
    return ModeChoice("overlay", reason, tuple(shipped), tuple(not_shipped))


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


def expected_version(vllm: dict) -> str | None:
    if vllm.get("version"):
        return str(vllm["version"])
    ref = str(vllm.get("ref") or "")
    m = re.fullmatch(r"v?(\d+\.\d+(?:\.\d+)?(?:[.\-]?(?:rc|post|dev)\d+)?)", ref)
    return m.group(1) if m else None


def same_release(installed: str, expected: str) -> bool:
    try:
        # A local label (+cu130) names a build of the same release.
        return Version(installed).public == Version(expected).public
    except InvalidVersion:
        return installed == expected


def source_date(tree: AppliedTree) -> int:
    env = os.environ.get("SOURCE_DATE_EPOCH")
    if env:
        try:
            return int(env)
        except ValueError:
            raise UsageError(f"SOURCE_DATE_EPOCH={env!r} is not a number of seconds") from None
    return tree.commit_time(tree.base)


def base_labels(manifest: Manifest, tree: AppliedTree, *, mode: str, created: int,
                digest: str) -> dict[str, str]:
    vllm = tree.vllm
    repo = vllm.get("repo") or (manifest.vllm.repos[0] if manifest.vllm.repos else "")
    if repo == "pypi":
        repo = f"pypi:vllm=={vllm.get('version') or vllm.get('ref')}"
    version = vllm.get("version") or vllm.get("ref") or "unknown"
    patches = [{"id": p.get("id"), "status": p.get("status")} for p in tree.report.get("patches", [])]
    return {
        "org.opencontainers.image.title": manifest.name,
        "org.opencontainers.image.source": str(repo),
        "org.opencontainers.image.revision": str(vllm.get("commit") or tree.base),
        "org.opencontainers.image.version": f"{version}+{manifest.name}",
        "org.opencontainers.image.created": im.iso_time(created),
        "io.patchkit.mode": mode,
        "io.patchkit.patchset.name": manifest.name,
        "io.patchkit.patchset.digest": digest,
        "io.patchkit.vllm.ref": str(vllm.get("ref") or ""),
        "io.patchkit.vllm.commit": str(vllm.get("commit") or tree.base),
        "io.patchkit.vllm.version": str(vllm.get("version") or ""),
        "io.patchkit.vllm.tree": tree.tree_id(),
        "io.patchkit.patches": json.dumps(patches, separators=(",", ":")),
    }


# ------------------------------------------------------------------------------ overlay

@dataclass
class OverlayPlan:
    package: im.Package
    installed: str | None
    entries: list[im.LayerEntry]
    stale: list[str]


def _rel_in_image(path: str) -> str:
    return path.lstrip("/")


def plan_overlay(files: im.ImageFiles, base: im.BaseImage, tree: AppliedTree,
                 shipped: Sequence[Change], serve: bytes | None, log: Callable[[str], None]
                 ) -> OverlayPlan:
    """Check that the base holds the pristine release, and list the layer's entries."""
    env = {}
    for item in base.config.get("Env") or ():
        k, _, v = item.partition("=")
        env[k] = v
    pkg = im.find_package(files, env)
    log(f"vllm package in the base: {pkg.dir}"
        + (f" (also found, not used: {', '.join(pkg.others)})" if pkg.others else ""))
    vllm = tree.vllm
    expected = expected_version(vllm)
    installed = im.installed_version(files, pkg, expected)
    ref = vllm.get("ref") or tree.base[:12]
    if expected and installed and not same_release(installed, expected):
        raise ImageError(f"base {base.name} holds vLLM {installed}, not {expected}: the patches "
                         f"were applied to vLLM {ref}; use a base of that release")
    if expected and installed is None:
        raise ImageError(f"base {base.name}: cannot tell its vLLM version (no {pkg.dir}/_version.py"
                         f" nor vllm-{expected}.dist-info); refusing to lay vLLM {ref} files on it")
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
    entries: list[im.LayerEntry] = []
    made_dirs: set[str] = set()
    stale: list[str] = []
    for c in shipped:
        target = pkg.path_of(c.path)
        if c.path.endswith(".py"):
            for cache in im.stale_caches(files, pkg, target):
                stale.append(cache)
                entries.append(im.LayerEntry(_rel_in_image(cache), "whiteout"))
        if c.status == "D":
            entries.append(im.LayerEntry(_rel_in_image(target), "whiteout"))
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
            entries.append(im.LayerEntry(_rel_in_image(d), "dir", mode=0o755))
        entries.append(im.LayerEntry(_rel_in_image(target), "file", data,
                                     0o755 if c.mode & 0o111 else 0o644))
    if serve is not None:
        entries.append(im.LayerEntry(SERVE_PATH, "file", serve, 0o755))
    if stale:
        log(f"{len(stale)} byte-code cache(s) of patched modules removed in the layer")
    return OverlayPlan(pkg, installed, entries, stale)


def inputs_key(base: im.BaseImage, labels: dict, shipped: Sequence[Change], serve: bytes | None,
               mtime: int) -> str:
    """What the overlay image is a function of.  An image carrying the same key was made from
    the same base (by image id) and the same files, so it is the same image."""
    doc = {"format": LAYER_FORMAT, "base": base.image_id, "platform": str(base.platform),
           "labels": labels, "mtime": mtime,
           "changes": [[c.status, c.path, c.mode, c.blob] for c in shipped],
           "serve": hashlib.sha256(serve).hexdigest() if serve is not None else None}
    return "sha256:" + hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def _find_by_key(engine: im.Engine, key: str) -> str | None:
    found = engine.images_with_label(INPUTS_LABEL, key)
    return found[0] if found else None


def build_overlay(manifest: Manifest, tree: AppliedTree, choice: ModeChoice, engine: im.Engine, *,
                  base_ref: str, platform: im.Platform, log) -> dict:
    if engine.uses_containerd_store():
        raise ImageError(f"the engine at {engine.host} keeps images in containerd's store; overlay "
                         "mode needs the classic store (set \"features\": {\"containerd-snapshotter\""
                         ": false} in daemon.json) or use --mode source")
    log(f"resolving the base {base_ref} for {platform}")
    base = engine.resolve_base(base_ref, platform, log)
    log(f"base pinned by {base.pinned_by}: {base.pinned}")
    serve_file = manifest.root / SERVE_SCRIPT
    serve = serve_file.read_bytes() if serve_file.is_file() else None
    created = source_date(tree)
    labels = base_labels(manifest, tree, mode="overlay", created=created,
                         digest=patchset_digest(manifest))
    labels["org.opencontainers.image.base.name"] = base.name
    labels["org.opencontainers.image.base.digest"] = base.digest or base.image_id
    key = inputs_key(base, labels, choice.shipped, serve, created)
    known = _find_by_key(engine, key)
    if known:
        attrs = engine.inspect(known) or {}
        got = (attrs.get("Config") or {}).get("Labels") or {}
        log(f"nothing changed since image {known[:19]}: reusing it")
        return {"base": base, "image_id": known, "reused": True,
                "layer": {"files": int(got.get("io.patchkit.layer.files", 0)),
                          "bytes": int(got.get("io.patchkit.layer.bytes", 0)),
                          "whiteouts": int(got.get("io.patchkit.layer.whiteouts", 0))},
                "vllm_dir": got.get("io.patchkit.vllm.dir"),
                "installed": got.get("io.patchkit.vllm.installed") or None}
    with engine.files(base.image_id, base.name) as files:
        plan = plan_overlay(files, base, tree, choice.shipped, serve, log)
    layer = im.layer_tar(plan.entries, created)
    labels.update({
        INPUTS_LABEL: key,
        "io.patchkit.vllm.dir": plan.package.dir,
        "io.patchkit.vllm.installed": plan.installed or "",
        "io.patchkit.layer.files": str(layer.files),
        "io.patchkit.layer.bytes": str(layer.bytes),
        "io.patchkit.layer.whiteouts": str(layer.whiteouts),
    })
    config = im.image_config(
        base, layer, labels=labels, created=created,
        created_by=f"patchkit build-image: {layer.files} file(s) into {plan.package.dir}",
        cmd=["/" + SERVE_PATH] if serve is not None else None,
        reset_entrypoint=serve is not None)
    image_id = im.image_id_of(config)
    reused = engine.has_image(image_id)
    if reused:
        log(f"image {image_id[:19]} is already in the engine")
    else:
        log(f"loading the layer ({layer.files} files, {layer.bytes} bytes) onto {base.pinned}")
        engine.load(im.load_archive(config, layer, len(base.diff_ids)), image_id)
    return {"base": base, "image_id": image_id, "reused": reused,
            "layer": {"files": layer.files, "bytes": layer.bytes, "whiteouts": layer.whiteouts,
                      "diff_id": layer.diff_id},
            "vllm_dir": plan.package.dir, "installed": plan.installed}


# ------------------------------------------------------------------------------- source

def buildkit_need(dockerfile_text: str) -> str | None:
    """The first line that needs BuildKit, or None when the classic builder can run it."""
    m = BUILDKIT_ONLY.search(dockerfile_text)
    if not m:
        return None
    line_no = dockerfile_text.count("\n", 0, m.start()) + 1
    line = dockerfile_text.splitlines()[line_no - 1].strip()
    return f"line {line_no}: {line[:80]}"


def build_source(manifest: Manifest, tree: AppliedTree, engine: im.Engine, *,
                 platform: im.Platform, tag: str, push: bool, max_jobs: int | None,
                 nvcc_threads: int | None, log) -> dict:
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
    labels = base_labels(manifest, tree, mode="source", created=created,
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
        got = im.Platform(attrs.get("Os") or "linux", attrs.get("Architecture") or "?",
                          attrs.get("Variant"))
        if not got.matches(platform):
            raise ImageError(f"the build gave a {got} image, not {platform}")
    return {"base": None, "image_id": attrs["Id"] if attrs else None, "reused": False,
            "layer": None, "vllm_dir": None, "installed": None, "buildargs": buildargs,
            "pushed_by_build": pushed_by_build}


# ------------------------------------------------------------------------------ command

def default_tag(manifest: Manifest, tree_vllm: dict, tag: str | None) -> str:
    template = tag if tag is not None else manifest.image.tag or f"{manifest.name}:{{ref}}"
    # a branch ref such as release/0.27 holds characters no image tag may
    ref = re.sub(r"[^\w.-]", "-", str(tree_vllm.get("ref") or "latest"))
    version = re.sub(r"[^\w.-]", "-", str(tree_vllm.get("version") or ref))
    text = template.replace("{ref}", ref).replace("{version}", version)
    return text.replace("{name}", manifest.name)


def check_reference(flag: str, ref: str, *, digest_ok: bool = True) -> None:
    problem = im.reference_problem(ref, digest_ok=digest_ok)
    if problem:
        raise UsageError(f"{flag} {ref!r} is not an image reference: {problem}")


def build_image(manifest: Manifest, *, workdir: Path, ref: str | None = None,
                repos: Sequence[str] | None = None, base: str | None = None,
                tag: str | None = None, platform: str | None = None, push: bool = False,
                save: Path | None = None, mode: str = "auto", apply: bool = True,
                max_jobs: int | None = None, nvcc_threads: int | None = None,
                progress: apply_engine.Progress | None = None,
                engine: im.Engine | None = None) -> tuple[int, dict]:
    """Build (and optionally push and save) the image; returns ``(exit code, summary)``.

    Expected failures raise :class:`~patchkit.errors.PatchkitError` before anything is tagged.
    """
    progress = progress or apply_engine.Progress()
    log = progress.info
    started = time.monotonic()
    workdir = Path(workdir)
    if mode not in ("auto", "overlay", "source"):
        raise UsageError(f"--mode {mode!r}: expected auto, overlay or source")
    # What can be refused is refused before the apply, which takes a while.
    if not apply and (ref is not None or repos):
        raise UsageError("--vllm-ref and --vllm-repo choose what to apply; with --no-apply the "
                         "workdir is used as it is")
    if base is not None:
        check_reference("--base", base)
    if tag is not None:
        check_reference("--tag", default_tag(manifest, {"ref": "x", "version": "x"}, tag),
                        digest_ok=False)
    plat = im.Platform.parse(platform or manifest.image.platform or "linux/arm64")
    if apply:
        report = apply_engine.apply_series(manifest, ref=ref, repos=repos, workdir=workdir,
                                           progress=progress)
        if not report.ok:
            failed = [p.id for p in report.patches if p.status == "failed"]
            data = report.to_dict()
            return 1, {"ok": False, "error": "the series did not apply"
                       + (f" ({', '.join(failed)} failed)" if failed else " (assertions failed)"),
                       "vllm": data["vllm"], "patches": data["patches"]}
    tree = AppliedTree.open(workdir)
    choice = choose_mode(tree.changes(), mode)
    log(f"mode: {choice.mode} ({choice.reason})")
    if choice.not_shipped:
        log(f"not in the image (no build reads them): {', '.join(choice.not_shipped)}")
    final_tag = default_tag(manifest, tree.vllm, tag)
    check_reference("--tag" if tag is not None else "image.tag", final_tag, digest_ok=False)
    engine = engine or im.Engine.connect()
    previous = (engine.inspect(final_tag) or {}).get("Id")
    if choice.mode == "overlay":
        base_ref = base or manifest.image.base
        if not base_ref:
            raise UsageError("no base image: give --base or set image.base in patchset.yaml")
        built = build_overlay(manifest, tree, choice, engine, base_ref=base_ref, platform=plat,
                              log=log)
        engine.tag(built["image_id"], final_tag)
    else:
        built = build_source(manifest, tree, engine, platform=plat, tag=final_tag,
                             push=push, max_jobs=max_jobs, nvcc_threads=nvcc_threads, log=log)
    log(f"tagged {final_tag}")
    digest = None
    saved = None
    try:
        if push and not built.get("pushed_by_build"):
            log(f"pushing {final_tag}")
            digest = engine.push(final_tag, log)
        if save is not None:
            size = engine.save(final_tag, Path(save))
            saved = {"path": str(save), "bytes": size}
            log(f"saved {final_tag} to {save} ({size} bytes)")
    except Exception:
        # A refused push leaves no tag behind: the tag names what was delivered.
        if not built.get("pushed_by_build"):
            engine.restore_tag(final_tag, previous)
        raise
    b: im.BaseImage | None = built["base"]
    vllm = tree.vllm
    if built.get("vllm_dir"):
        vllm["dir"] = built["vllm_dir"]
    if built.get("installed"):
        vllm["installed"] = built["installed"]
    summary = {
        "ok": True,
        "mode": choice.mode,
        "mode_reason": choice.reason,
        "tag": final_tag,
        "image_id": built["image_id"],
        "digest": digest,
        "platform": str(plat),
        "base": ({"name": b.name, "digest": b.digest or b.image_id, "pinned_by": b.pinned_by,
                  "image_id": b.image_id} if b else None),
        "vllm": vllm,
        "patches": [{"id": p.get("id"), "status": p.get("status")}
                    for p in tree.report.get("patches", [])],
        "layer": built["layer"],
        "reused": built["reused"],
        "pushed": bool(push),
        "saved": saved,
        "not_shipped": list(choice.not_shipped),
        "seconds": round(time.monotonic() - started, 2),
    }
    if built.get("buildargs"):
        summary["buildargs"] = built["buildargs"]
    return 0, summary


def render_summary(summary: dict) -> str:
    """The closing lines of a text run."""
    if not summary.get("ok"):
        return f"FAILED: {summary.get('error', 'build-image failed')}"
    lines = []
    image_id = summary.get("image_id") or "(pushed by the build)"
    what = f"{summary['tag']} {image_id[:19]} ({summary['platform']}, {summary['mode']} mode"
    what += ", reused)" if summary.get("reused") else ")"
    lines.append(f"ok: {what}")
    layer = summary.get("layer")
    if layer:
        lines.append(f"  layer: {layer['files']} file(s), {layer['bytes']} bytes"
                     + (f", {layer.get('whiteouts')} whiteout(s)" if layer.get("whiteouts") else ""))
    if summary.get("base"):
        lines.append(f"  base: {summary['base']['name']} @ {summary['base']['digest']}")
    if summary.get("digest"):
        lines.append(f"  digest: {summary['digest']}")
        repo = im.split_tag(summary["tag"])[0]
        lines.append(f"  other node: docker pull {repo}@{summary['digest']}")
    if summary.get("saved"):
        lines.append(f"  other node: docker load -i {summary['saved']['path']}")
    if summary["mode"] == "overlay" and not summary.get("digest") and not summary.get("saved"):
        lines.append(f"  other node: the same command against the same base gives image "
                     f"{image_id[:19]}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- verify --image

def verify_image(manifest: Manifest, image: str, *, engine: im.Engine | None = None
                 ) -> list[AssertionResult]:
    """The manifest's assertions on the files inside ``image``, read without running it."""
    from patchkit import verify
    from patchkit.commands import active_patches

    check_reference("--image", image)
    engine = engine or im.Engine.connect()
    attrs = engine.inspect(image)
    if attrs is None:
        plat = im.Platform.parse(manifest.image.platform or "linux/arm64")
        try:
            engine.resolve_base(image, plat)
        except ImageError as exc:
            raise ImageError(str(exc).replace("base image ", "image ", 1)) from exc
        attrs = engine.inspect(image)
    if attrs is None:
        raise ImageError(f"image {image} not found on the engine at {engine.host}")
    config = attrs.get("Config") or {}
    labels = config.get("Labels") or {}
    env = dict(item.partition("=")[::2] for item in config.get("Env") or ())
    with engine.files(attrs["Id"], image) as files:
        hinted = labels.get("io.patchkit.vllm.dir")
        if hinted and files.exists(hinted.rstrip("/") + "/__init__.py"):
            pkg = im.Package(str(PurePosixPath(hinted).parent), None)
        else:
            pkg = im.find_package(files, env)
        version = labels.get("io.patchkit.vllm.installed") or im.installed_version(files, pkg, None)
        try:
            statuses = {p["id"]: p["status"] for p in json.loads(labels.get("io.patchkit.patches") or "[]")}
        except (ValueError, TypeError, KeyError):
            statuses = {}
        skipped = {pid for pid, status in statuses.items() if status == "skipped"}
        active = active_patches(manifest, skipped, version)
        cache: dict[str, str | None] = {}

        def read(rel: str) -> str | None:
            paths.check_relative(rel)
            if rel not in cache:
                data = files.read(pkg.path_of(rel))
                cache[rel] = None if data is None else data.decode("utf-8")
            return cache[rel]

        return verify.run_assertions(active, read)
