"""Registry manifests: their media types, one platform's image as a registry serves it, and the
base and the new image's manifest made from them (the registry build path's formats).
"""

from __future__ import annotations

import calendar
import json
import re
from dataclasses import dataclass

from patchkit.errors import ImageError
from patchkit.formats.layer import BaseImage, Layer, history_of, image_id_of
from patchkit.imageref import Platform


# --------------------------------------------------------------------- registry manifests

DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
INDEXES = (DOCKER_LIST, OCI_INDEX)
MANIFESTS = (DOCKER_MANIFEST, OCI_MANIFEST)
UNCOMPRESSED_LAYER = {DOCKER_MANIFEST: "application/vnd.docker.image.rootfs.diff.tar",
                      OCI_MANIFEST: "application/vnd.oci.image.layer.v1.tar"}
GO_ZERO_TIME = -62135596800  # what a history entry without "created" reads as in the engine


@dataclass(frozen=True)
class RemoteImage:
    """One platform's image in a registry, as the registry serves it."""

    name: str                      # as the user gave it
    repo: str                      # host/path, no tag
    digest: str                    # what ``name`` resolves to: an index, or the manifest itself
    manifest: dict                 # the platform's image manifest
    manifest_digest: str
    config: bytes                  # its config, byte for byte

    @property
    def media_type(self) -> str:
        return self.manifest.get("mediaType") or OCI_MANIFEST

    @property
    def layers(self) -> tuple[dict, ...]:
        return tuple(self.manifest.get("layers") or ())

    @property
    def pinned(self) -> str:
        return f"{self.repo}@{self.manifest_digest}"


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
    that :func:`history_of` gives what it gives on the engine path."""
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


def base_image(remote: RemoteImage, layer_sizes: list[int], platform: Platform) -> BaseImage:
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
    return BaseImage(
        name=remote.name, image_id=image_id_of(remote.config), digest=remote.digest,
        config_digest=image_id_of(remote.config),
        platform=got, config=doc.get("config") or {}, diff_ids=diff_ids,
        history=history_of(engine_history(doc, layer_sizes), len(diff_ids), remote.name))


def image_manifest(remote: RemoteImage, config: bytes, made: Layer,
                   annotations: dict[str, str] | None = None) -> bytes:
    """The new image's manifest: the base's layers as they are, then the new layer; with
    ``annotations`` (the OCI ones among the config's labels, for registries and scanners that
    read a manifest alone)."""
    kind = remote.media_type
    doc: dict = {"schemaVersion": 2}
    if remote.manifest.get("mediaType"):
        doc["mediaType"] = kind
    base_config = remote.manifest.get("config") or {}
    doc["config"] = {"mediaType": base_config.get("mediaType") or
                     "application/vnd.oci.image.config.v1+json",
                     "size": len(config), "digest": image_id_of(config)}
    doc["layers"] = [dict(d) for d in remote.layers] + [
        {"mediaType": UNCOMPRESSED_LAYER[kind], "size": made.bytes, "digest": made.diff_id}]
    if annotations:
        doc["annotations"] = dict(sorted(annotations.items()))
    return json.dumps(doc, indent=3).encode()
