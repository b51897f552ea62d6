"""An image made from an applied checkout: the packages proven on the base, the build path
chosen, the image built, tagged, pushed and saved, and the report of it.  ``build-image`` comes
here once its series is applied, and the series bisect, building an image, for each tree it
makes."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from patchkit import git
from patchkit import source
from patchkit.image import artifact
from patchkit.image import base as base_
from patchkit.image import build, builders, labels
from patchkit.engines import facts
from patchkit.formats import layer
from patchkit.image import lockfile
from patchkit.image.builders.protocol import Job
from patchkit.imageref import Platform
from patchkit.manifest import Manifest
from patchkit.run import RunSpec
from patchkit.report import ApplyReport, Status
from patchkit.series.checkout import AppliedCheckout, is_checkout


@dataclass(frozen=True)
class Choices:
    """How the image is made and delivered (the run value holds what is built)."""

    mode: str = "auto"
    push: bool = False
    save: Path | None = None
    no_daemon: bool = False
    max_jobs: int | None = None
    nvcc_threads: int | None = None
    immutable: bool = True   # also tag the build for good (bisect's scratch images are not)


@dataclass(frozen=True)
class BuildReport:
    """What ``build-image`` made; ``to_dict`` is its JSON shape.  One ``ok``: the image was
    made (no ``error``) and every copy to other engines landed."""

    error: str | None = None        # why no image was made (None: it was)
    mode: str | None = None
    mode_reason: str | None = None
    tag: str | None = None
    immutable_tag: str | None = None   # <tag>-<12 hex of the inputs key>: this build for good
    image_id: str | None = None
    digest: str | None = None
    platform: str | None = None
    base: dict | None = None
    vllm: dict = field(default_factory=dict)
    patches: list[dict] = field(default_factory=list)
    layer: build.LayerInfo | None = None
    reused: bool = False
    pushed: bool = False
    saved: dict | None = None
    not_shipped: list[str] = field(default_factory=list)
    seconds: float = 0.0
    buildargs: dict | None = None
    variant: str | None = None
    load: str | None = None         # overlay: "partial" or "complete" archive
    copy: object | None = None      # transfer.CopyReport of the copy to other engines
    holds: build.Holds | None = None
    # what the image runs: {"from": "image.serve" | "build/serve.sh" | "base" | "Dockerfile",
    # "command": [the words]}; "base": the base's command, unchanged (said in one line)
    serves: dict | None = None

    @property
    def built(self) -> bool:
        """The image was made (a copy to other engines may still have failed)."""
        return self.error is None

    @property
    def ok(self) -> bool:
        return self.built and (self.copy is None or self.copy.ok)

    @classmethod
    def failed_apply(cls, report: ApplyReport) -> BuildReport:
        failed = [p.id for p in report.patches if p.status is Status.FAILED]
        data = report.to_dict()
        return cls("the series did not apply"
                   + (f" ({', '.join(failed)} failed)" if failed else " (assertions failed)"),
                   vllm=data["vllm"], patches=data["patches"])

    def to_dict(self) -> dict:
        if not self.built:
            return {"ok": False, "error": self.error, "vllm": self.vllm, "patches": self.patches}
        data = {"ok": self.ok, "mode": self.mode, "mode_reason": self.mode_reason, "tag": self.tag,
                "immutable_tag": self.immutable_tag, "image_id": self.image_id,
                "digest": self.digest, "platform": self.platform,
                "base": self.base, "vllm": self.vllm, "patches": self.patches,
                "layer": self.layer.to_dict() if self.layer else None, "reused": self.reused,
                "pushed": self.pushed, "saved": self.saved, "not_shipped": self.not_shipped,
                "seconds": self.seconds, "variant": self.variant}
        if self.buildargs:
            data["buildargs"] = self.buildargs
        if self.load:
            data["load"] = self.load
        if self.holds is not None:
            data["holds"] = self.holds.to_dict()
        if self.serves is not None:
            data["serves"] = self.serves
        if self.copy is not None:
            data["copy"] = self.copy.to_dict()
        return data


def assemble(manifest: Manifest, run: RunSpec, choices: Choices, *, tree: AppliedCheckout,
             held: base_.BaseStack | None, lock: lockfile.Lock | None, registry=None,
             log=lambda m: None, started: float | None = None) -> BuildReport:
    """The image of the applied checkout ``tree`` (at the run's workdir, the other packages
    beside it), built on the engine the run connected, or with ``no_daemon`` straight in
    ``registry``; ``held`` is the base as read before the apply (None: not read), ``lock``
    the lock the stack must match."""
    started = time.monotonic() if started is None else started
    engine = run.engine   # the one the verb connected (None: built straight in the registry)
    workdir = tree.root
    base_.prove_packages(manifest, workdir, held, log)
    if lock is not None:
        lockfile.check_packages(manifest, lock, lockfile.patched_packages(
            manifest, workdir, held.installed if held else None))
        log(f"the base and the packages are the ones {lockfile.LOCK_FILE} names")
    packages = _shipped_packages(manifest, workdir, held)
    choice = replace(build.choose_mode(tree.changes(), choices.mode),
                     packages=tuple(p.name for p in packages))
    _log_choice(choice, log)
    final_tag = run.final_tag(manifest, tree.vllm.ref, tree.vllm.version, tree.report.variant)
    plat = run.platform
    project = git.provenance(manifest.root)
    job = Job(manifest, tree, choice, plat, final_tag, run.base, choices.push, log, run.cache,
                       engine=engine, registry=registry, max_jobs=choices.max_jobs,
                       nvcc_threads=choices.nvcc_threads, packages=packages, lock=lock,
                       artifacts=_artifacts(manifest, tree, plat, run, log),
                       base_from=run.base_from, held=held, project=project)
    previous = engine.tagged(final_tag) if engine is not None else None
    built = builders.choose(choices.no_daemon, choice).build(job)
    immutable = _immutable(engine, built, final_tag) if choices.immutable else None
    digest, saved = _deliver(engine, built, final_tag, immutable, push=choices.push,
                             save=choices.save, previous=previous, log=log)
    kind = source.kind_of(tree.vllm.source or run.sources[0]).name
    holds = build.Holds.of(built.installed, kind, _fingerprint(built, engine, final_tag),
                           project.revision,
                           labels.real_time(layer.iso_time(build.source_date(tree))))
    return _report(tree, choice, plat, final_tag, built, digest, push=choices.push,
                   saved=saved, started=started, holds=holds, immutable=immutable,
                   serves=_serves(manifest, choice.mode, built.base))


def _serves(manifest: Manifest, mode: str, base) -> dict:
    """What the image runs, and where that came from (see ``BuildReport.serves``)."""
    if mode == build.SOURCE_MODE:
        return {"from": "Dockerfile", "command": None}
    command = build.serve_command(manifest)
    if command is not None:
        asked = manifest.image.serve
        return {"from": "image.serve" if asked is not None and asked.command
                else build.SERVE_SCRIPT, "command": list(command)}
    config = (base.config if base is not None else None) or {}
    return {"from": "base", "command": [*(config.get("Entrypoint") or []),
                                        *(config.get("Cmd") or [])]}


def _shipped_packages(manifest: Manifest, workdir: Path, held: base_.BaseStack | None
                      ) -> tuple[build.PackageTree, ...]:
    """The other packages whose applied checkouts change files the image ships, each with
    the site the base installed it in when the base was read (and proven) here; the registry
    path finds the others' sites on the base's layers."""
    out = []
    for package in manifest.others:
        where = package.checkout(workdir)
        if not is_checkout(where):
            continue
        tree = AppliedCheckout.open(where)
        shipped = build.package_shipped(tree.changes())
        if not shipped:
            continue
        dist = held.installed.get(package.dist) if held is not None else None
        rebuild = {p.id for p in manifest.patches if p.rebuild == "jit"}
        rebuild_jit = tuple(f for r in tree.report.patches
                            if r.package == package.name and r.id in rebuild for f in r.files)
        out.append(build.PackageTree(package.name, package.dist, tree, shipped,
                                     dist.site if dist is not None else None, rebuild_jit,
                                     manifest.image.cuda_arch))
    return tuple(out)


def _artifacts(manifest: Manifest, tree: AppliedCheckout, plat: Platform, run: RunSpec, log
               ) -> tuple[build.PlacedArtifact, ...]:
    """The members of the run's applied artifacts, each checked against its pins and the
    image's platform (one line, exit 2, before anything is built); a wheel named by URL
    downloaded into the run's cache within its timeout."""
    applied = {p.id for p in tree.report.patches if p.status is Status.APPLIED}
    out = []
    for patch in manifest.patches:
        a = patch.artifact
        if a is None or patch.id not in applied:
            continue
        data = artifact.checked(a, manifest.root, plat.arch, str(plat), run.cache, run.timeout)
        log(f"{patch.id}: {a.member} from {a.wheel.rsplit('/', 1)[-1]}: pins and ELF header "
            f"({plat.arch}) checked")
        out.append(build.PlacedArtifact(patch.id, a.dist, a.member, data))
    return tuple(out)



def _log_choice(choice: build.ModeChoice, log) -> None:
    log(f"mode: {choice.mode} ({choice.reason})")
    if choice.not_shipped:
        log(f"not in the image (no build reads them): {', '.join(choice.not_shipped)}")


def _immutable(engine, built: build.Built, tag: str) -> str | None:
    """The build's immutable tag (``labels.immutable_tag``) beside the moving ``tag``, from
    the labels of the image the engine holds; None where the image is not in an engine (a
    build straight in the registry)."""
    if engine is None or built.pushed_by_build or not built.image_id:
        return None
    image = engine.inspect(built.image_id)
    return labels.immutable_tag(tag, image.labels, image.id) if image is not None else None


def _deliver(engine, built: build.Built, tag: str, immutable: str | None, *, push: bool,
             save: Path | None, previous: str | None, log) -> tuple[str | None, dict | None]:
    """Tag the build for good (``immutable``), push and save what the build left in the
    engine (what a build pushed itself is not pushed again): the manifest digest and the
    archive saved."""
    digest, saved = built.digest, None
    had = engine.tagged(immutable) if immutable else None
    try:
        if immutable:
            engine.tag(built.image_id, immutable)
            log(f"tagged {immutable}")
        if push and not built.pushed_by_build:
            log(f"pushing {tag}")
            digest = engine.push(tag, log)
            if immutable:
                log(f"pushing {immutable}")
                engine.push(immutable, log)
        if save is not None:
            size = engine.save(tag, Path(save))
            saved = {"path": str(save), "bytes": size}
            log(f"saved {tag} to {save} ({size} bytes)")
    except BaseException:
        # A refused or interrupted push leaves no tag behind: the tag names what was delivered.
        if not built.pushed_by_build:
            engine.restore_tag(tag, previous)
            if immutable:
                engine.restore_tag(immutable, had)
        raise
    return digest, saved



def _fingerprint(built: build.Built, engine, tag: str) -> str | None:
    """The built image's fingerprint: from the config patchkit made, when it made one; else
    from the engine where that needs no export (its ids are config digests); else unknown."""
    b, made = built.base, built.layer
    if built.config_digest and b is not None and made is not None and made.diff_id:
        return layer.fingerprint_of(built.config_digest, [*b.diff_ids, made.diff_id])
    if engine is None or built.pushed_by_build or not engine.store().ids_are_config_digests:
        return None
    content = engine.content(tag)
    return facts.fingerprint(content) if content else None



def reach_registry(manifest: Manifest, run: RunSpec):
    """The registry the tag goes to, asked once what it holds there: a registry that cannot be
    reached is an error before any work (the tag's {version} is not known yet; its host is)."""
    from patchkit.engines.registry import Registry

    registry = Registry(timeout=run.timeout)
    registry.digest_of(run.final_tag(manifest, run.ref, None, run.variant))
    return registry



def _report(tree: AppliedCheckout, choice, plat: Platform, final_tag: str, built, digest, *,
            push: bool, saved: dict | None, started: float, holds: build.Holds,
            immutable: str | None, serves: dict | None = None) -> BuildReport:
    b = built.base
    vllm = asdict(tree.vllm)
    if built.vllm_dir:
        vllm["dir"] = built.vllm_dir
    if built.installed:
        vllm["installed"] = built.installed
    return BuildReport(
        mode=choice.mode, mode_reason=choice.reason, tag=final_tag,
        image_id=built.image_id, digest=digest, platform=str(plat),
        base=({"name": b.name, "digest": b.digest or b.image_id, "pinned_by": b.pinned_by,
               "image_id": b.image_id, "fingerprint": b.fingerprint} if b else None),
        vllm=vllm, patches=[{"id": p.id, "status": p.status} for p in tree.report.patches],
        variant=tree.report.variant,
        layer=built.layer, reused=built.reused, pushed=bool(push), saved=saved,
        not_shipped=list(choice.not_shipped), seconds=round(time.monotonic() - started, 2),
        buildargs=built.buildargs, load=built.load, holds=holds, immutable_tag=immutable,
        serves=serves)
