"""The image pieces patchkit makes by hand: the overlay layer, the config, a load archive.

Pure functions of their inputs.  The layer is written byte for byte: sorted entries, owner
0:0, one fixed time, whiteouts for the byte-code caches it makes stale.  The config is the
base's config with the labels and command replaced and the layer appended, so the image id
(the sha256 of the config) is known before any engine sees it.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import re
import tarfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import PurePosixPath
from typing import Iterable, Mapping, Sequence

from patchkit.errors import ImageError
from patchkit.imageref import Platform, repository


def parse_env(config: Mapping) -> dict[str, str]:
    """An image config's ``Env`` (``["NAME=value", ...]``) as a dict; the one parse of it."""
    return dict(item.partition("=")[::2] for item in config.get("Env") or ())


# The image config fields kept from the base.  Inspect output differs between engine versions
# (Hostname, AttachStdin, Image ...); keeping only these makes the config, and so the image id,
# the same whichever engine builds it.
CONFIG_FIELDS = ("User", "ExposedPorts", "Env", "Entrypoint", "Cmd", "Volumes", "WorkingDir",
                 "Labels", "StopSignal", "Healthcheck", "OnBuild", "Shell", "ArgsEscaped")
# Caches a Python of each minor version may have written beside a module, in __pycache__.


@dataclass(frozen=True)
class BaseImage:
    """A base image as the engine holds it, resolved to what pins it."""

    name: str                      # as the user gave it
    image_id: str                  # sha256:... of its config
    digest: str | None             # sha256:... of its registry manifest, None when local-only
    platform: Platform
    config: dict                   # the container config (Env, Cmd, Labels ...)
    diff_ids: tuple[str, ...]
    history: tuple[dict, ...]      # oldest first, image-config form
    config_digest: str | None = None  # known where an image id is its config's digest

    @property
    def pinned(self) -> str:
        """How the base is referenced: by registry digest, else by image id."""
        if self.digest:
            repo = repository(self.name)
            return f"{repo}@{self.digest}"
        return self.image_id

    @functools.cached_property
    def env(self) -> dict[str, str]:
        return parse_env(self.config)

    @property
    def pinned_by(self) -> str:
        return "digest" if self.digest else "image-id"

    @property
    def identity(self) -> str:
        """A digest of what a new image takes from the base (layers, kept config, history,
        platform): the same on every store, where the image id is not (a containerd store's
        is the digest of a manifest of its own)."""
        kept = {k: self.config[k] for k in CONFIG_FIELDS
                if self.config.get(k) not in (None, "", [], {})}
        doc = {"diff_ids": list(self.diff_ids), "config": kept, "history": list(self.history),
               "platform": str(self.platform)}
        return "sha256:" + hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()

    @property
    def fingerprint(self) -> str | None:
        """The base's :func:`fingerprint`, when its config digest is known without an export."""
        return fingerprint_of(self.config_digest, self.diff_ids) if self.config_digest else None


@dataclass(frozen=True)
class LayerEntry:
    """One entry of a hand-made layer; ``path`` is relative to the image root."""

    path: str
    kind: str = "file"             # file | dir | whiteout
    data: bytes = b""
    mode: int = 0o644

    def __post_init__(self) -> None:
        assert self.kind in ("file", "dir", "whiteout"), self.kind
        assert self.path and not self.path.startswith("/") and ".." not in self.path.split("/")


@dataclass(frozen=True)
class Layer:
    data: bytes
    diff_id: str
    files: int                     # regular files
    whiteouts: int
    content_bytes: int             # the files' own bytes, before tar headers

    @property
    def bytes(self) -> int:
        return len(self.data)


def layer_tar(entries: Iterable[LayerEntry], mtime: int) -> Layer:
    """A layer tarball that depends on nothing but ``entries`` and ``mtime``.

    Entries are sorted by path; owners are 0:0 with no names; every time is ``mtime``.  A
    ``whiteout`` entry deletes ``path`` from the layers below (the OCI ``.wh.`` convention).
    """
    buf = io.BytesIO()
    files = whiteouts = content = 0
    named = []
    for e in entries:
        parent, _, name = e.path.rpartition("/")
        member = (parent + "/" if parent else "") + ".wh." + name if e.kind == "whiteout" else e.path
        named.append((PurePosixPath(member).parts, member, e))
    named.sort(key=lambda t: t[0])
    seen: set[str] = set()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for _, member, e in named:
            if e.path in seen:
                raise ImageError(f"the layer would hold {e.path} twice")
            seen.add(e.path)
            if e.kind == "whiteout":
                info = tarfile.TarInfo(member)
                info.mode = 0o644
                whiteouts += 1
            elif e.kind == "dir":
                info = tarfile.TarInfo(e.path)
                info.type = tarfile.DIRTYPE
                info.mode = e.mode
            else:
                info = tarfile.TarInfo(e.path)
                info.size = len(e.data)
                info.mode = e.mode
                files += 1
                content += len(e.data)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = mtime
            tar.addfile(info, io.BytesIO(e.data) if e.kind == "file" else None)
    data = buf.getvalue()
    return Layer(data, "sha256:" + hashlib.sha256(data).hexdigest(), files, whiteouts, content)


def iso_time(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def image_config(base: BaseImage, layer: Layer, *, labels: dict[str, str], created: int,
                 created_by: str, cmd: Sequence[str] | None = None,
                 entrypoint: Sequence[str] | None = None, reset_entrypoint: bool = False,
                 env: Mapping[str, str] | None = None) -> bytes:
    """The new image's config: the base's, plus ``labels``, ``env`` (replacing the base's
    values of those names), the command, and ``layer``.

    Serialised with sorted keys and no spaces: its sha256 is the image id.
    """
    config = {k: base.config[k] for k in CONFIG_FIELDS if base.config.get(k) not in (None, "", [], {})}
    merged = dict(config.get("Labels") or {})
    merged.update(labels)
    config["Labels"] = merged
    if env:
        kept = [item for item in config.get("Env") or [] if item.partition("=")[0] not in env]
        config["Env"] = kept + [f"{k}={v}" for k, v in sorted(env.items())]
    if reset_entrypoint:
        config.pop("Entrypoint", None)
    if entrypoint is not None:
        config["Entrypoint"] = list(entrypoint)
    if cmd is not None:
        config["Cmd"] = list(cmd)
    history = [dict(h) for h in base.history]
    history.append({"created": iso_time(created), "created_by": created_by})
    doc = {
        "architecture": base.platform.arch,
        "os": base.platform.os,
        "config": config,
        "created": iso_time(created),
        "history": history,
        "rootfs": {"type": "layers", "diff_ids": [*base.diff_ids, layer.diff_id]},
    }
    if base.platform.variant:
        doc["variant"] = base.platform.variant
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def image_id_of(config: bytes) -> str:
    return "sha256:" + hashlib.sha256(config).hexdigest()


def load_archive(config: bytes, layer: Layer, base_layers: int) -> bytes:
    """A ``docker load`` archive holding the config and the new layer only.

    The manifest still lists one path per layer; the paths of the base's layers are never
    opened, because the engine finds those layers in its store first.
    """
    cid = hashlib.sha256(config).hexdigest()
    manifest = [{"Config": f"{cid}.json", "RepoTags": None,
                 "Layers": [f"base-{i}/layer.tar" for i in range(base_layers)]
                 + [f"{layer.diff_id.split(':', 1)[1]}/layer.tar"]}]
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in ((f"{cid}.json", config),
                           (manifest[0]["Layers"][-1], layer.data),
                           ("manifest.json", json.dumps(manifest).encode())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def history_of(entries: Sequence[dict], layers: int, base_name: str) -> tuple[dict, ...]:
    """The base's history in image-config form, from the engine's history API (newest first).

    The API does not say which entries made a layer; an entry of size 0 usually did not.  When
    that guess does not add up to the base's layer count, the history is replaced by one plain
    entry per layer, which keeps ``docker history`` working on the new image.
    """
    oldest_first = list(reversed(entries))
    out = []
    for h in oldest_first:
        item = {"created": iso_time(int(h.get("Created") or 0)),
                "created_by": h.get("CreatedBy") or ""}
        if h.get("Comment"):
            item["comment"] = h["Comment"]
        if not h.get("Size"):
            item["empty_layer"] = True
        out.append(item)
    if sum(not h.get("empty_layer") for h in out) != layers:
        # Zero-size layers exist (a RUN that only made a folder): promote size-0 entries that
        # made a layer by their nature until the count is right.
        for item in out:
            if sum(not h.get("empty_layer") for h in out) >= layers:
                break
            if item.get("empty_layer") and _makes_layer(item["created_by"]):
                del item["empty_layer"]
    if sum(not h.get("empty_layer") for h in out) != layers:
        out = [{"created": iso_time(0), "created_by": f"layer {i + 1} of {base_name}"}
               for i in range(layers)]
    return tuple(out)


def _makes_layer(created_by: str) -> bool:
    text = created_by.strip()
    if "#(nop)" in text:
        return bool(re.search(r"#\(nop\)\s+(COPY|ADD)\b", text))
    return bool(re.match(r"(RUN|COPY|ADD)\b|/bin/sh -c |\|\d+ ", text))


# ------------------------------------------------------------------------------ fingerprints

def fingerprint_of(config_digest: str, diff_ids: Sequence[str]) -> str:
    """The content fingerprint of an image whose config digest and layers' diff_ids are known
    (see :func:`fingerprint`)."""
    doc = json.dumps({"config": config_digest, "layers": list(diff_ids)}, sort_keys=True,
                     separators=(",", ":"))
    return "sha256:" + hashlib.sha256(doc.encode()).hexdigest()
