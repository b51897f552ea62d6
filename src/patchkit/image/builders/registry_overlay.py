"""The overlay image made straight in a registry, pushed there (``build-image`` with no
engine).

No engine takes part.  The base is resolved in its registry (an index is followed to the
platform's manifest); its layer blobs are read once into the cache and indexed; the proofs of
the engine path (the installed version, the pristine files, the stale byte-code caches) are
made by :func:`~patchkit.image.build.plan_overlay` on those layers through
:class:`~patchkit.image.layerfs.LayerFiles`.  The new layer and config are the engine path's,
byte for byte (:func:`~patchkit.image.build.overlay_image`), so the same inputs give the same
diff_id and the same config digest (the image id) on both paths.

What is pushed under the tag: one image manifest for the platform, in the base manifest's own
format, listing the base's layer descriptors unchanged followed by exactly one new layer.  The
new layer is the uncompressed tar (media type ``...rootfs.diff.tar`` or
``...layer.v1.tar``): its digest is its diff_id, the same on every machine, where a gzip stream
would depend on the compressor.  A base that is a multi-platform index gives a single-platform
image: the other platforms' files were never proven, so they are not carried over.

The base's blobs stay where they are (mounted from the base's repository when the tag is in the
same registry, else copied blob by blob); the manifest goes last, so a registry that refuses
a blob leaves the tag as it was.  A tag that already names the very manifest is left alone:
nothing is uploaded.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from patchkit.errors import ImageError, Origin, SettingError, literal
from patchkit.image import build, distinfo, labels, layerfs, lockfile
from patchkit.formats import layer
from patchkit.formats import manifests
from patchkit.image.builders.protocol import Asked, Job
from patchkit.formats.manifests import RemoteImage
from patchkit.engines.registry import Registry, blob_path
from patchkit.imageref import host_of
from patchkit.cache import cache_subdir

NO_DAEMON = Origin("no_daemon")

class RegistryOverlay:
    name = "registry-overlay"
    mode = build.OVERLAY_MODE
    needs_engine = False

    def refuse(self, asked: Asked) -> None:
        if not asked.push:
            raise SettingError("{no_daemon} builds the image in the registry, so it needs {push}",
                               NO_DAEMON, Origin("push"))
        if asked.save is not None:
            raise SettingError("{save} writes an engine's 'docker load' archive; {no_daemon} has "
                               "no engine", Origin("save"), NO_DAEMON)
        if asked.mode == build.SOURCE_MODE:
            raise SettingError("{mode} source builds vLLM through an engine; {no_daemon} makes "
                               "overlay images only", Origin("mode"), NO_DAEMON)
        if asked.copy_to:
            raise SettingError("{copy_to} copies from an engine, and {no_daemon} has none: pull "
                               "the pushed digest on the other node", Origin("copy_to"),
                               NO_DAEMON)
        if asked.base and asked.base.startswith("sha256:"):
            raise SettingError(f"{{base}} {literal(asked.base)} is an engine's image id; "
                               "{no_daemon} reads the base from a registry: name it as "
                               "host/repository:tag", asked.base_from, NO_DAEMON)

    def unfit(self, choice: build.ModeChoice) -> str | None:
        if choice.mode == build.OVERLAY_MODE:
            return None
        return (f"a build with no engine makes overlay images only, and this series needs "
                f"source mode ({choice.reason}): build it through an engine")

    def build(self, job: Job) -> build.Built:
        base_ref = job.base_ref()
        assert job.registry is not None, "the path straight in a registry is given one"
        built = build_overlay(job, base_ref, job.registry)
        job.log(f"{job.tag} is {built.digest}" + (" (already there)" if built.reused else ""))
        return built


def build_overlay(job: Job, base_ref: str, reg: Registry) -> build.Built:
    """Builds the overlay image in the registry under ``job.tag``, the base's blobs kept in
    the run's cache; what was built carries the manifest digest the tag names."""
    tag, platform, log = job.tag, job.platform, job.log
    log(f"path: straight in the registry at {host_of(tag)}, no engine")
    log(f"resolving the base {base_ref} in its registry for {platform}")
    remote = reg.resolve(base_ref, platform)
    current = reg.digest_of(tag)  # an unreachable target is known before the base is read
    store = cache_subdir(job.cache, "registry")
    blobs = store / "blobs"
    if not reg.fetch(remote, blobs, log):
        log(f"the base's {len(remote.layers)} layer(s) are in the cache")
    layers = _indexed(remote, base_ref, blobs, store / "index")
    base = manifests.base_image(remote, [sum(m.size for m in one.members if m.kind == "f")
                                     for one in layers], platform)
    log(f"base pinned by digest: {base.pinned}")
    inputs = build.overlay_inputs(job.manifest, job.tree, job.choice, base, job.packages,
                                  job.project)
    with layerfs.LayerFiles(base_ref, layers, store / "files") as files:
        if job.manifest.others or job.manifest.image.requires or job.lock is not None:
            # no engine read the base before the apply: its pins, requires and the lock are
            # judged here, on its layers, before anything is uploaded
            installed = distinfo.installed(files, base.env)
            lockfile.check_base(job.manifest, installed, base.name)
            if job.lock is not None:
                lockfile.check_locked(job.manifest, job.lock,  # type: ignore[arg-type]
                                   base.digest or base.image_id, installed, base.name)
                log(f"the base is the one {lockfile.LOCK_FILE} names")
        plan = build.plan_overlay(files, base, job.tree, job.choice.shipped, inputs.serve, log,
                                  job.packages, job.artifacts)
    made, config = build.overlay_image(base, plan, inputs)
    man = manifests.image_manifest(remote, config, made, labels.annotations(inputs.labels))
    digest = "sha256:" + hashlib.sha256(man).hexdigest()
    reused = current == digest
    if reused:
        log(f"{tag} already names this image ({digest[:19]}): nothing to upload")
    else:
        log(f"pushing one layer ({made.files} files, {made.bytes} bytes), its config and the "
            f"manifest onto {len(remote.layers)} base layer(s) of {remote.pinned}")
        reg.push_image(tag, man, config, made, remote, blobs, store)
    return build.Built(layer.image_id_of(config), base, reused,
                       build.LayerInfo(made.files, made.bytes, made.whiteouts, made.diff_id),
                       plan.package.dir, plan.installed, pushed_by_build=True,
                       config_digest=layer.image_id_of(config), digest=digest)


def _indexed(remote: RemoteImage, base_ref: str, blobs: Path, indexes: Path
             ) -> list[layerfs.IndexedLayer]:
    """The base's layer blobs, each indexed (once) and checked against its diff_id."""
    try:
        config_doc = json.loads(remote.config)
        diff_ids = list((config_doc.get("rootfs") or {}).get("diff_ids") or ())
    except ValueError:
        raise ImageError(f"base image {remote.name}: its config is not JSON") from None
    layers = []
    for i, d in enumerate(remote.layers):
        what = f"layer {i + 1} of {base_ref} ({d['digest'][:19]})"
        path = blob_path(blobs, d["digest"])
        members = layerfs.index_layer(path, d["digest"], diff_ids[i] if i < len(diff_ids) else None,
                                      indexes, what)
        layers.append(layerfs.IndexedLayer(path, d["digest"], members))
    return layers


BUILDER = RegistryOverlay()
