"""``patchkit build-image``: apply, choose the build path, build, tag, push, save."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Sequence

from patchkit import source
from patchkit.commands import copy_image
from patchkit.commands import lock as lock_cmd
from patchkit.errors import UsageError
from patchkit.image import artifact
from patchkit.image import basevllm, build, builders, layer, lockfile
from patchkit.image.builders.protocol import Asked, Job
from patchkit.cache import cache_dir
from patchkit.imageref import Platform, check_reference
from patchkit.manifest import Manifest, variants
from patchkit.manifest.runspec import RunSpec, run_spec
from patchkit.report import ApplyReport
from patchkit.series.checkout import AppliedCheckout, is_checkout
from patchkit.series.applier import Progress, apply_series, check_workdir
from patchkit.timeouts import DEFAULT_TIMEOUT

MODES = ("auto", build.OVERLAY_MODE, build.SOURCE_MODE)


@dataclass
class BuildReport:
    """What ``build-image`` made; ``to_dict`` is the ``--format json`` shape."""

    ok: bool
    error: str | None = None
    mode: str | None = None
    mode_reason: str | None = None
    tag: str | None = None
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
    copy: object | None = None      # copy_image.CopyReport of --copy-to
    holds: build.Holds | None = None

    @classmethod
    def failed_apply(cls, report: ApplyReport) -> BuildReport:
        failed = [p.id for p in report.patches if p.status == "failed"]
        data = report.to_dict()
        return cls(False, "the series did not apply"
                   + (f" ({', '.join(failed)} failed)" if failed else " (assertions failed)"),
                   vllm=data["vllm"], patches=data["patches"])

    def to_dict(self) -> dict:
        if not self.ok:
            return {"ok": False, "error": self.error, "vllm": self.vllm, "patches": self.patches}
        data = {"ok": True, "mode": self.mode, "mode_reason": self.mode_reason, "tag": self.tag,
                "image_id": self.image_id, "digest": self.digest, "platform": self.platform,
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
        if self.copy is not None:
            data["copy"] = self.copy.to_dict()
            data["ok"] = self.copy.ok
        return data


def run(manifest: Manifest, *, workdir: Path, ref: str | None = None,
        repos: Sequence[str] | None = None, base: str | None = None,
        tag: str | None = None, platform: str | None = None, push: bool = False,
        save: Path | None = None, mode: str = "auto", apply: bool = True,
        max_jobs: int | None = None, nvcc_threads: int | None = None,
        progress: Progress | None = None, engine=None, variant: str | None = None,
        no_daemon: bool = False, registry=None, copy_to: Sequence[str] = (),
        timeout: float = DEFAULT_TIMEOUT, discard: bool = False,
        locked: bool = False, via: str | None = None) -> BuildReport:
    """Build (and optionally push and save) the image; with ``no_daemon``, straight in the
    registry (``push`` required, no engine).  The engine (or the registry) is reached before
    the series is applied; ``timeout`` bounds each of its silences.  The base's installed
    distributions are judged before the apply too (the packages' pins, ``image.requires``, and
    with ``locked`` the lock).

    Expected failures raise :class:`~patchkit.errors.PatchkitError` before anything is tagged;
    a series that does not apply is a report with ``ok`` false.
    """
    progress = progress or Progress()
    log = progress.info
    started = time.monotonic()
    spec = run_spec(manifest, ref=ref, repos=repos, base=base, platform=platform, variant=variant)
    workdir = Path(workdir)
    # What can be refused is refused before the apply, which takes a while.
    asked = Asked(push, save, mode, tuple(copy_to))
    _check_options(asked, no_daemon, apply=apply, ref=ref, repos=repos, discard=discard)
    if apply:
        check_workdir(workdir, discard)  # before any source or engine is asked
    plat, copy_urls = _check_inputs(manifest, spec, base=base, tag=tag, copy_to=copy_to)
    if via is not None:
        via = copy_image.check_via(via)
        if not copy_urls:
            raise UsageError("--via REGISTRY is the way --copy-to copies; give --copy-to ENGINE")
    lock = _lock_of(manifest, locked)
    # Reached before the apply too: an engine or registry that is not there is known at once.
    engine, registry = _reach(manifest, no_daemon, engine, registry, ref=spec.ref, tag=tag,
                              variant=variant, timeout=timeout)
    held = _check_stack(manifest, spec, plat, engine, lock, log)
    if apply:
        report = _apply(manifest, spec, workdir, engine, progress=progress, discard=discard)
        if not report.ok:
            return BuildReport.failed_apply(report)
    tree = _applied(workdir, apply, variant)
    lock_cmd.prove_packages(manifest, workdir, engine, held, log)
    if lock is not None:
        lock_cmd.check_packages(manifest, lock, lockfile.patched_packages(
            manifest, workdir, held.installed if held else None))
        log(f"the base and the packages are the ones {lockfile.LOCK_FILE} names")
    packages = _shipped_packages(manifest, workdir, held)
    choice = replace(build.choose_mode(tree.changes(), mode),
                     packages=tuple(p.name for p in packages))
    _log_choice(choice, log)
    final_tag = variants.default_tag(manifest, tree.vllm.ref, tree.vllm.version, tag, tree.report.variant)
    check_reference("--tag" if tag is not None else "image.tag", final_tag, digest_ok=False)
    builder = builders.choose(no_daemon, choice)
    job = Job(manifest, tree, choice, plat, final_tag, base, push, log, engine=engine,
                       registry=registry, max_jobs=max_jobs, nvcc_threads=nvcc_threads,
                       packages=packages, lock=lock,
                       artifacts=_artifacts(manifest, tree, plat, log))
    previous = engine.tagged(final_tag) if engine is not None else None
    built = builder.build(job)
    digest, saved = _deliver(engine, built, final_tag, push=push, save=save, previous=previous,
                             log=log)
    kind = source.kind_of(tree.vllm.source or spec.sources[0]).name
    holds = build.Holds.of(built.installed, kind, _fingerprint(built, engine, final_tag))
    report = _report(tree, choice, plat, final_tag, built, digest, push=push,
                     saved=saved, started=started, holds=holds)
    if copy_urls:
        log(f"copying {final_tag} to {', '.join(copy_urls)}")
        report.copy = copy_image.copy(engine, final_tag, copy_urls, log=log, timeout=timeout,
                                      via=via)
    return report


def _shipped_packages(manifest: Manifest, workdir: Path, held: lock_cmd.BaseStack | None
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
                                     dist.site if dist is not None else None, rebuild_jit))
    return tuple(out)


def _artifacts(manifest: Manifest, tree: AppliedCheckout, plat: Platform, log
               ) -> tuple[build.PlacedArtifact, ...]:
    """The members of the run's applied artifacts, each checked against its pins and the
    image's platform (one line, exit 2, before anything is built)."""
    applied = {p.id for p in tree.report.patches if p.status == "applied"}
    out = []
    for patch in manifest.patches:
        a = patch.artifact
        if a is None or patch.id not in applied:
            continue
        data = artifact.checked(a, manifest.root, plat.arch, str(plat), cache_dir())
        log(f"{patch.id}: {a.member} from {a.wheel.rsplit('/', 1)[-1]}: pins and ELF header "
            f"({plat.arch}) checked")
        out.append(build.PlacedArtifact(patch.id, a.dist, a.member, data))
    return tuple(out)


def _lock_of(manifest: Manifest, locked: bool) -> lockfile.Lock | None:
    if not locked:
        return None
    return lock_cmd.read_lock(manifest)


def _check_stack(manifest: Manifest, spec: RunSpec, plat: Platform, engine,
                 lock: lockfile.Lock | None, log) -> lock_cmd.BaseStack | None:
    """The base's installed distributions, judged before the apply: the packages' pins,
    ``image.requires`` and the lock.  None when nothing asks (or no engine reads it: the
    registry path judges them on the base's layers)."""
    if lock is not None and not spec.base:
        raise UsageError("--locked compares the base with the lock: give --base IMAGE or set "
                         "image.base in patchset.yaml")
    if engine is None or not spec.base:
        return None
    if lock is None and not manifest.others and not manifest.image.requires:
        return None
    check_reference("--base", spec.base)
    held = lock_cmd.read_base(engine, spec.base, plat, log)
    lock_cmd.check_base(manifest, held, lock)
    return held


def _check_options(asked: Asked, no_daemon: bool, *, apply: bool, ref: str | None,
                   repos: Sequence[str] | None, discard: bool) -> None:
    if asked.mode not in MODES:
        raise UsageError(f"--mode {asked.mode!r}: expected auto, overlay or source")
    builders.refuse(no_daemon, asked)
    if not apply and (ref is not None or repos):
        raise UsageError("--vllm-ref and --vllm-repo choose what to apply; with --no-apply the "
                         "workdir is used as it is")
    if not apply and discard:
        raise UsageError("--discard replaces the workdir by a new apply; with --no-apply the "
                         "workdir is used as it is")


def _check_inputs(manifest: Manifest, spec: RunSpec, *, base: str | None, tag: str | None,
                  copy_to: Sequence[str]) -> tuple[Platform, list[str]]:
    """The platform and the --copy-to engines, once every name given is known to be good."""
    variants.check(manifest, spec.variant)
    if base is not None:
        check_reference("--base", base)
    if tag is not None:
        check_reference("--tag", variants.default_tag(manifest, "x", "x", tag, spec.variant),
                        digest_ok=False)
    return Platform.parse(spec.platform), copy_image.check_targets(copy_to, "--copy-to")


def _reach(manifest: Manifest, no_daemon: bool, engine, registry, *, ref: str | None,
           tag: str | None, variant: str | None, timeout: float):
    """The engine, or with ``no_daemon`` the registry, once it has answered."""
    if no_daemon:
        return None, registry or _reach_registry(manifest, ref, tag, variant, timeout)
    if engine is None:
        from patchkit.image.docker import Engine

        engine = Engine.connect(timeout=timeout)
    return engine, None


def _apply(manifest: Manifest, spec: RunSpec, workdir: Path, engine, *, progress: Progress,
           discard: bool) -> ApplyReport:
    needs = basevllm.needed(spec)
    if needs and engine is None:
        raise UsageError(f"{needs}, read through an engine, and --no-daemon has none: apply "
                         "with an engine first, then build-image --no-daemon --no-apply")
    holder = basevllm.for_run(spec, engine=engine, log=progress.info)
    bases = basevllm.for_packages(spec, engine=engine, log=progress.info) if engine else {}
    return apply_series(manifest, run=spec, workdir=workdir, progress=progress, base=holder,
                        discard=discard, bases=bases)


def _applied(workdir: Path, apply: bool, variant: str | None) -> AppliedCheckout:
    tree = AppliedCheckout.open(workdir)
    if not apply and variant is not None and variant != tree.report.variant:
        raise UsageError(f"--variant {variant}: {workdir} was applied as "
                         f"{variants.describe(tree.report.variant)}; with --no-apply the "
                         "workdir is used as it is")
    return tree


def _log_choice(choice: build.ModeChoice, log) -> None:
    log(f"mode: {choice.mode} ({choice.reason})")
    if choice.not_shipped:
        log(f"not in the image (no build reads them): {', '.join(choice.not_shipped)}")


def _deliver(engine, built: build.Built, tag: str, *, push: bool, save: Path | None,
             previous: str | None, log) -> tuple[str | None, dict | None]:
    """Push and save what the build left in the engine (what a build pushed itself is
    not pushed again): the manifest digest and the archive saved."""
    digest, saved = built.digest, None
    try:
        if push and not built.pushed_by_build:
            log(f"pushing {tag}")
            digest = engine.push(tag, log)
        if save is not None:
            size = engine.save(tag, Path(save))
            saved = {"path": str(save), "bytes": size}
            log(f"saved {tag} to {save} ({size} bytes)")
    except BaseException:
        # A refused or interrupted push leaves no tag behind: the tag names what was delivered.
        if not built.pushed_by_build:
            engine.restore_tag(tag, previous)
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
    return layer.fingerprint(content) if content else None


def _reach_registry(manifest: Manifest, ref: str, tag: str | None,
                    variant: str | None, timeout: float):
    """The registry the tag goes to, asked once what it holds there: a registry that cannot be
    reached is an error before any work (the tag's {version} is not known yet; its host is)."""
    from patchkit.image.registry import Registry

    registry = Registry(timeout=timeout)
    registry.digest_of(variants.default_tag(manifest, ref, None, tag, variant))
    return registry


def _report(tree: AppliedCheckout, choice, plat: Platform, final_tag: str, built, digest, *,
            push: bool, saved: dict | None, started: float, holds: build.Holds) -> BuildReport:
    b = built.base
    vllm = asdict(tree.vllm)
    if built.vllm_dir:
        vllm["dir"] = built.vllm_dir
    if built.installed:
        vllm["installed"] = built.installed
    return BuildReport(
        ok=True, mode=choice.mode, mode_reason=choice.reason, tag=final_tag,
        image_id=built.image_id, digest=digest, platform=str(plat),
        base=({"name": b.name, "digest": b.digest or b.image_id, "pinned_by": b.pinned_by,
               "image_id": b.image_id, "fingerprint": b.fingerprint} if b else None),
        vllm=vllm, patches=[{"id": p.id, "status": p.status} for p in tree.report.patches],
        variant=tree.report.variant,
        layer=built.layer, reused=built.reused, pushed=bool(push), saved=saved,
        not_shipped=list(choice.not_shipped), seconds=round(time.monotonic() - started, 2),
        buildargs=built.buildargs, load=built.load, holds=holds)


__all__ = ["BuildReport", "check_reference", "run"]
