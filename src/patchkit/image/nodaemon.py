"""``build-image --no-daemon --push``: the overlay image made straight in a registry.

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

import calendar
import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from patchkit.errors import ImageError
from patchkit.image import build, layer, layerfs
from patchkit.image.registry import (DOCKER_MANIFEST, OCI_MANIFEST, Registry, RemoteImage,
                                     blob_path, host_of)
from patchkit.imageref import Platform
from patchkit.manifest import Manifest
from patchkit.series.checkout import AppliedCheckout
from patchkit.cache import cache_dir, cache_subdir

Log = Callable[[str], None]

UNCOMPRESSED_LAYER = {DOCKER_MANIFEST: "application/vnd.docker.image.rootfs.diff.tar",
                      OCI_MANIFEST: "application/vnd.oci.image.layer.v1.tar"}
DIR_VERSION = "Directory Transport Version: 1.1\n"  # skopeo's dir: layout
GO_ZERO_TIME = -62135596800  # what a history entry without "created" reads as in the engine


def unix_time(text: str | None) -> int:
    """An RFC 3339 time (the config's ``created``) in whole seconds, as the engine gives it."""
    if not text:
        return GO_ZERO_TIME
    m = re.fullmatch(r"(\d{4})-(\d\d)-(\d\d)[Tt ](\d\d):(\d\d):(\d\d)(?:\.\d+)?"
                     r"(?:([Zz])|([+-])(\d\d):(\d\d))", text.strip())
    if not m:
        return GO_ZERO_TIME
    y, mo, d, h, mi, s = (int(g) for g in m.groups()[:6])
    seconds = calendar.timegm((y, mo, d, h, mi, s, 0, 0, 0))
    if m.group(8):
        offset = int(m.group(9)) * 3600 + int(m.group(10)) * 60
        seconds -= offset if m.group(8) == "+" else -offset
    return seconds


def engine_history(config: dict, layer_sizes: list[int]) -> list[dict]:
    """The config's history as the engine's history API would list it (newest first), so
    that :func:`~patchkit.image.layer.history_of` gives what it gives on the engine path."""
    out = []
    i = 0
    for h in config.get("history") or ():
        size = 0
        if not h.get("empty_layer"):
            size = layer_sizes[i] if i < len(layer_sizes) else 0
            i += 1
        out.append({"Created": unix_time(h.get("created")), "CreatedBy": h.get("created_by") or "",
                    "Comment": h.get("comment") or "", "Size": size})
    return list(reversed(out))


def base_image(remote: RemoteImage, layer_sizes: list[int], platform: Platform) -> layer.BaseImage:
    """The base as the engine path sees it, from the registry's manifest and config."""
    try:
        doc = json.loads(remote.config)
    except ValueError:
        raise ImageError(f"base image {remote.name}: its config is not JSON") from None
    got = Platform(doc.get("os") or "linux", doc.get("architecture") or "unknown",
                   doc.get("variant") or None)
    if not got.matches(platform):
        raise ImageError(f"base image {remote.name} is {got}, not {platform}")
    diff_ids = tuple((doc.get("rootfs") or {}).get("diff_ids") or ())
    if len(diff_ids) != len(remote.layers):
        raise ImageError(f"base image {remote.name}: its manifest lists {len(remote.layers)} "
                         f"layer(s) and its config {len(diff_ids)}")
    return layer.BaseImage(
        name=remote.name, image_id=layer.image_id_of(remote.config), digest=remote.digest,
        config_digest=layer.image_id_of(remote.config),
        platform=got, config=doc.get("config") or {}, diff_ids=diff_ids,
        history=layer.history_of(engine_history(doc, layer_sizes), len(diff_ids), remote.name))


def image_manifest(remote: RemoteImage, config: bytes, made: layer.Layer) -> bytes:
    """The new image's manifest: the base's layers as they are, then the new layer."""
    kind = remote.media_type
    doc: dict = {"schemaVersion": 2}
    if remote.manifest.get("mediaType"):
        doc["mediaType"] = kind
    base_config = remote.manifest.get("config") or {}
    doc["config"] = {"mediaType": base_config.get("mediaType") or
                     "application/vnd.oci.image.config.v1+json",
                     "size": len(config), "digest": layer.image_id_of(config)}
    doc["layers"] = [dict(d) for d in remote.layers] + [
        {"mediaType": UNCOMPRESSED_LAYER[kind], "size": made.bytes, "digest": made.diff_id}]
    return json.dumps(doc, indent=3).encode()


def write_layout(dest: Path, manifest: bytes, config: bytes, made: layer.Layer,
                 remote: RemoteImage, blobs: Path) -> None:
    """skopeo's ``dir:`` layout of the new image; the base's blobs are links into the cache."""
    dest.mkdir()
    (dest / "version").write_text(DIR_VERSION)
    (dest / "manifest.json").write_bytes(manifest)
    (dest / layer.image_id_of(config).split(":", 1)[1]).write_bytes(config)
    (dest / made.diff_id.split(":", 1)[1]).write_bytes(made.data)
    for d in remote.layers:
        link = dest / d["digest"].split(":", 1)[1]
        if not link.exists():
            os.symlink(blob_path(blobs, d["digest"]), link)


def build_overlay(manifest: Manifest, tree: AppliedCheckout, choice: build.ModeChoice, *,
                  base_ref: str, platform: Platform, tag: str, log: Log,
                  registry: Registry | None = None, cache: Path | None = None
                  ) -> tuple[build.Built, str]:
    """Builds the overlay image in the registry under ``tag``; returns what was built and the
    manifest digest the tag names."""
    if base_ref.startswith("sha256:"):
        raise ImageError(f"--base {base_ref} is an engine's image id; --no-daemon reads the base "
                         "from a registry: name it as host/repository:tag")
    reg = registry or Registry()
    log(f"path: straight in the registry at {host_of(tag)}, no engine (--no-daemon)")
    log(f"resolving the base {base_ref} in its registry for {platform}")
    remote = reg.resolve(base_ref, platform)
    current = reg.digest_of(tag)  # an unreachable target is known before the base is read
    store = cache_subdir(cache or cache_dir(), "registry")
    blobs, indexes = store / "blobs", store / "index"
    fetched = reg.fetch(remote, blobs, log)
    if not fetched:
        log(f"the base's {len(remote.layers)} layer(s) are in the cache")
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
    sizes = [sum(m.size for m in one.members if m.kind == "f") for one in layers]
    base = base_image(remote, sizes, platform)
    log(f"base pinned by digest: {base.pinned}")
    inputs = build.overlay_inputs(manifest, tree, choice, base)
    with layerfs.LayerFiles(base_ref, layers, store / "files") as files:
        plan = build.plan_overlay(files, base, tree, choice.shipped, inputs.serve, log)
    made, config = build.overlay_image(base, plan, inputs)
    man = image_manifest(remote, config, made)
    digest = "sha256:" + hashlib.sha256(man).hexdigest()
    reused = current == digest
    if reused:
        log(f"{tag} already names this image ({digest[:19]}): nothing to upload")
    else:
        log(f"pushing one layer ({made.files} files, {made.bytes} bytes), its config and the "
            f"manifest onto {len(remote.layers)} base layer(s) of {remote.pinned}")
        tmp = Path(tempfile.mkdtemp(prefix="push-", dir=store))
        try:
            write_layout(tmp / "image", man, config, made, remote, blobs)
            pushed = reg.push(tmp / "image", tag)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        if pushed != digest:
            raise ImageError(f"the registry stored {tag} as {pushed}, not the manifest {digest} "
                             "patchkit made")
    built = build.Built(layer.image_id_of(config), base, reused,
                        build.LayerInfo(made.files, made.bytes, made.whiteouts, made.diff_id),
                        plan.package.dir, plan.installed, pushed_by_build=True,
                        config_digest=layer.image_id_of(config))
    return built, digest
