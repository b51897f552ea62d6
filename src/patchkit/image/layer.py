"""The image pieces patchkit makes by hand: the overlay layer, the config, a load archive.

Pure functions of their inputs.  The layer is written byte for byte: sorted entries, owner
0:0, one fixed time, whiteouts for the byte-code caches it makes stale.  The config is the
base's config with the labels and command replaced and the layer appended, so the image id
(the sha256 of the config) is known before any engine sees it.
"""

from __future__ import annotations

import calendar
import functools
import hashlib
import io
import json
import re
import tarfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import PurePosixPath
from typing import Iterable, Iterator, Mapping, Sequence

from patchkit.errors import ImageError
from patchkit.image.enginefacts import Inspected, parse_env
from patchkit.imageref import Platform, repository

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


def fingerprint(image: Inspected) -> str:
    """The content fingerprint of an image as an engine reports it: its config digest and its
    layers' diff_ids, never the engine's image id (a containerd store's id is the digest of a
    manifest it made, which differs between snapshotters and between loads).

    ``image`` comes from ``Engine.content``, which knows how its engine names the config.
    """
    if not image.config_digest:
        raise ImageError("no config digest is known for this image; cannot fingerprint it")
    return fingerprint_of(image.config_digest, image.diff_ids)


# ---------------------------------------------------------------------- archives, streamed
#
# A ``docker load`` archive is relayed member by member from one engine's export into another
# engine's load (or into a complete archive): nothing is written to disk and no member is
# held whole in memory, except the small JSON ones, which say what the archive holds.

CHUNK = 1 << 20
_BLOCK = 512
_SMALL = 4 << 20
# What an export says about itself; a complete archive gets its own manifest instead.
_EXPORT_METADATA = {"manifest.json", "repositories", "index.json", "oci-layout"}


class ChunkReader(io.RawIOBase):
    """A readable file over an iterator of byte chunks (an engine's export stream)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._it = iter(chunks)
        self._view = memoryview(b"")
        self.bytes = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        while not self._view:
            try:
                self._view = memoryview(next(self._it))
            except StopIteration:
                return 0
        n = min(len(buf), len(self._view))
        buf[:n] = self._view[:n]
        self._view = self._view[n:]
        self.bytes += n
        return n


@dataclass
class ArchiveFacts:
    """What a relayed archive held, learnt as it went by."""

    manifest: list = field(default_factory=list)    # its manifest.json
    sizes: dict = field(default_factory=dict)       # member -> size, regular files
    links: dict = field(default_factory=dict)       # member -> the member it points at
    small: dict = field(default_factory=dict)       # member -> bytes, small JSON members
    sent: int = 0                                   # bytes of the archive relayed
    left_out: dict = field(default_factory=dict)    # member -> size, layers the target holds
    positions: dict = field(default_factory=dict)   # layer position (0 = bottom) -> file size

    def resolve(self, name: str) -> str:
        for _ in range(8):
            if name not in self.links:
                break
            name = self.links[name]
        return name

    def layer_bytes(self) -> int:
        """Bytes of the layer files the manifest names (each counted once)."""
        return sum(self.sizes.get(p, 0) for p in self._layers())

    def layer_count(self) -> int:
        """How many of the manifest's layer files the archive carried."""
        return len([p for p in self._layers() if p in self.sizes])

    def left_out_bytes(self) -> int:
        return sum(self.left_out.values())

    def _layers(self) -> set[str]:
        return {self.resolve(_norm(p)) for entry in self.manifest
                for p in entry.get("Layers") or ()}

    def entry_for(self, diff_ids: Sequence[str]) -> dict:
        """The manifest entry whose config lists exactly ``diff_ids``."""
        for entry in self.manifest:
            raw = self.small.get(self.resolve(_norm(entry.get("Config") or "")))
            try:
                got = (json.loads(raw or b"{}").get("rootfs") or {}).get("diff_ids")
            except ValueError:
                got = None
            if got == list(diff_ids):
                return entry
        if len(self.manifest) == 1 and len(self.manifest[0].get("Layers") or ()) == len(diff_ids):
            return self.manifest[0]
        raise ImageError(f"the engine's export holds no image of these {len(diff_ids)} layer(s)")

    def config_digest(self, diff_ids: Sequence[str]) -> str:
        raw = self.small.get(self.resolve(_norm(self.entry_for(diff_ids).get("Config") or "")))
        if raw is None:
            raise ImageError("the engine's export holds no config for its image")
        return image_id_of(raw)


def _norm(name: str) -> str:
    while name.startswith("./"):
        name = name[2:]
    return name.rstrip("/")


def _header(info: tarfile.TarInfo) -> bytes:
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def _padding(size: int) -> bytes:
    return b"\0" * (-size % _BLOCK)


def _file_member(name: str, data: bytes) -> Iterator[bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    yield _header(info)
    yield data
    yield _padding(len(data))


def relay(chunks: Iterable[bytes], facts: ArchiveFacts,
          skip: frozenset | set = frozenset(), held: Sequence[str] = (),
          layers: Sequence[str] | None = None, lean: bool = False) -> Iterator[bytes]:
    """Re-emit the members of the archive in ``chunks`` (less those named in ``skip``, and the
    layer files of ``held``, the first diff_ids of the image, which the target's store holds)
    as tar bytes, filling ``facts``; the end-of-archive blocks are left to the caller.
    ``layers``, all the image's diff_ids, lets ``facts.positions`` say every layer's size.
    ``lean`` leaves out what only a legacy load (an archive without manifest.json) reads:
    the layer folders' entries, ``VERSION`` and ``json``, and ``repositories`` (see
    :func:`_legacy_only`); they are read all the same, for ``facts``."""
    reader = ChunkReader(chunks)
    try:
        tar = tarfile.open(fileobj=reader, mode="r|", bufsize=CHUNK)
    except tarfile.TarError as exc:
        raise ImageError(f"the engine's export is not a tar archive: {exc}") from None
    with tar:
        try:
            held_layers = _HeldLayers(held, layers)
            for info in tar:
                yield from _relay_member(tar, info, facts, skip, held_layers, lean)
        except tarfile.TarError as exc:
            raise ImageError(f"the engine's export ends early or is no tar archive: "
                             f"{exc}") from None
    if "manifest.json" not in facts.small:
        raise ImageError("the engine's export has no manifest.json")


def _legacy_only(name: str, info: tarfile.TarInfo) -> bool:
    """Whether a member of an engine's export is read by a legacy load alone: a classic
    store's load of an archive with a manifest.json reads the config and the layer files it
    names, and the tags it lists, and nothing else (moby's ``tarexport.Load``)."""
    parts = name.split("/")
    legacy_folder = len(parts[0]) == 64 and all(c in "0123456789abcdef" for c in parts[0])
    if len(parts) == 1:
        return name == "repositories" or (legacy_folder and info.isdir())
    return legacy_folder and len(parts) == 2 and parts[1] in ("VERSION", "json")


def _relay_member(tar: tarfile.TarFile, info: tarfile.TarInfo, facts: ArchiveFacts,
                  skip, held: "_HeldLayers", lean: bool = False) -> Iterator[bytes]:
    name = _norm(info.name)
    if info.issym():
        target = info.linkname
        if not target.startswith("/"):
            target = f"{PurePosixPath(name).parent}/{target}"
        facts.links[name] = _collapse(target.lstrip("/"))
    elif info.islnk():
        facts.links[name] = _norm(info.linkname)
    fh = tar.extractfile(info) if info.isreg() else None
    body = None
    if fh is not None and info.size <= _SMALL:
        body = fh.read()
        if len(body) != info.size:
            raise ImageError(f"the engine's export ends inside {name}")
        if body[:1] in (b"{", b"["):
            facts.small[name] = body
        if name == "manifest.json":
            try:
                facts.manifest = json.loads(body)
            except ValueError:
                raise ImageError("the engine's export has a manifest.json that is not "
                                 "JSON") from None
            facts.small[name] = body
    if name in skip or (lean and _legacy_only(name, info)):
        return
    position = held.position(name, facts) if info.isreg() else None
    if position is not None:
        facts.positions[position] = info.size
        if position < held.count:
            facts.left_out[name] = info.size
            return
    if info.isreg():
        facts.sizes[name] = info.size
    head = _header(info)
    facts.sent += len(head)
    yield head
    if body is not None:
        out = body + _padding(info.size)
        facts.sent += len(out)
        yield out
    elif fh is not None:
        left = info.size
        while left:
            data = fh.read(min(CHUNK, left))
            if not data:
                raise ImageError(f"the engine's export ends inside {name}")
            left -= len(data)
            facts.sent += len(data)
            yield data
        pad = _padding(info.size)
        facts.sent += len(pad)
        yield pad


def chain_ids(diff_ids: Sequence[str]) -> list[str]:
    """The chain id of each prefix of ``diff_ids``: how a classic store names its layers."""
    out: list[str] = []
    for d in diff_ids:
        out.append(d if not out else
                   "sha256:" + hashlib.sha256(f"{out[-1]} {d}".encode()).hexdigest())
    return out


class _HeldLayers:
    """Which members of an export are the layer files of layers the target holds.

    An OCI-layout export (Docker 25 and later) names an uncompressed layer by its digest,
    the diff_id.  The legacy layout names each layer's folder by a v1 id, the sha256 of the
    folder's ``json`` (which comes before its ``layer.tar``) less its id, plus the layer's
    chain id as ``layer_id`` and its parent as a digest, keys sorted; below the top layer the
    engine adds ``os`` after computing the id.  A member matching neither is sent: sending a
    held layer costs bytes, never correctness."""

    def __init__(self, held: Sequence[str], layers: Sequence[str] | None = None) -> None:
        self.count = len(held)
        self.layers = list(held if layers is None else layers)
        self.digests = {d.split(":", 1)[-1]: i for i, d in enumerate(self.layers)}
        self.chains = chain_ids(self.layers)

    def position(self, name: str, facts: ArchiveFacts) -> int | None:
        """Which of ``layers`` (0 = bottom) the member ``name`` is the file of, if known."""
        if not self.layers:
            return None
        parts = name.split("/")
        if len(parts) == 3 and parts[:2] == ["blobs", "sha256"]:
            return self.digests.get(parts[2])
        if len(parts) == 2 and parts[1] == "layer.tar":
            raw = facts.small.get(f"{parts[0]}/json")
            for i, chain in enumerate(self.chains if raw is not None else ()):
                if any(v1_id(raw, chain, drop) == parts[0] for drop in ((), ("os",))):
                    return i
        return None


def v1_id(raw: bytes, chain_id: str, drop: Sequence[str] = ()) -> str | None:
    """The legacy v1 id of a saved layer folder whose ``json`` is ``raw``, if its chain id
    is ``chain_id`` (see :class:`_HeldLayers`); None when ``raw`` is not such a json."""
    try:
        text = raw.decode()
        doc = _raw_members(text)
    except (UnicodeDecodeError, ValueError, IndexError):
        return None
    doc.pop("id", None)
    for key in drop:
        doc.pop(key, None)
    if "parent" in doc:
        doc["parent"] = json.dumps("sha256:" + json.loads(doc["parent"]))
    doc["layer_id"] = json.dumps(chain_id)
    canon = "{" + ",".join(f"{json.dumps(k)}:{doc[k]}" for k in sorted(doc)) + "}"
    return hashlib.sha256(canon.encode()).hexdigest()


def _raw_members(text: str) -> dict:
    """A JSON object's top-level members, each value as its own text (the engine hashes them
    byte for byte)."""
    dec = json.JSONDecoder()
    text = text.strip()
    if not text.startswith("{"):
        raise ValueError("not an object")
    out: dict = {}
    i = 1
    while text[i] != "}":
        key, i = dec.raw_decode(text, i)
        if text[i] != ":":
            raise ValueError("compact JSON expected")
        _, j = dec.raw_decode(text, i + 1)
        out[key] = text[i + 1:j]
        i = j + 1 if text[j] == "," else j
    return out


def _collapse(path: str) -> str:
    parts: list[str] = []
    for p in path.split("/"):
        if p in ("", "."):
            continue
        if p == "..":
            if parts:
                parts.pop()
            continue
        parts.append(p)
    return "/".join(parts)


END_OF_ARCHIVE = b"\0" * (2 * _BLOCK)


def relayed_export(chunks: Iterable[bytes], facts: ArchiveFacts,
                   held: Sequence[str] = (), layers: Sequence[str] | None = None,
                   lean: bool = False) -> Iterator[bytes]:
    """An engine's export, member for member, for another engine's load; without the layer
    files of ``held`` (the image's first diff_ids, which that engine's store holds), and with
    ``lean`` (for a classic store) without what only a legacy load reads."""
    yield from relay(chunks, facts, held=held, layers=layers, lean=lean)
    yield END_OF_ARCHIVE
    facts.sent += len(END_OF_ARCHIVE)


COMPRESSIONS = ("none", "gzip", "zstd")


def zstd_module():
    """A zstd compressor module, or None when no library for it is installed."""
    try:
        import zstandard
        return zstandard
    except ImportError:
        return None


def compressed(chunks: Iterable[bytes], how: str, counter: list[int]) -> Iterator[bytes]:
    """``chunks`` compressed as a whole (``gzip``, ``zstd``) or as they are (``none``): an
    engine's load takes a compressed archive and inflates it itself.  ``counter[0]`` adds up
    the bytes given out."""
    if how == "none":
        for chunk in chunks:
            counter[0] += len(chunk)
            yield chunk
        return
    if how == "gzip":
        import zlib
        comp = zlib.compressobj(1, zlib.DEFLATED, 31)   # level 1: a link, not an archive
        step, end = comp.compress, comp.flush
    else:
        mod = zstd_module()
        if mod is None:
            raise ImageError("--compress zstd needs the zstandard package, which is not installed")
        comp = mod.ZstdCompressor(level=3).compressobj()
        step, end = comp.compress, comp.flush
    for chunk in chunks:
        out = step(chunk)
        if out:
            counter[0] += len(out)
            yield out
    out = end()
    counter[0] += len(out)
    yield out


def complete_archive(base_export: Iterable[bytes], config: bytes, layer: Layer,
                     base_diff_ids: Sequence[str], facts: ArchiveFacts | None = None
                     ) -> Iterator[bytes]:
    """A ``docker load`` archive of the whole image, streamed: the base's layers as the engine
    exported them, then the new layer and ``config`` (unchanged, so the image is the same
    whichever way it was loaded), and a manifest naming them in order."""
    facts = facts if facts is not None else ArchiveFacts()
    yield from relay(base_export, facts, skip=_EXPORT_METADATA)
    entry = facts.entry_for(base_diff_ids)
    layers = [_norm(p) for p in entry.get("Layers") or ()]
    cid = hashlib.sha256(config).hexdigest()
    config_name = f"{cid}.json"
    layer_name = f"{layer.diff_id.split(':', 1)[1]}/layer.tar"
    tail = b""
    for name, data in ((config_name, config), (layer_name, layer.data)):
        if name not in facts.sizes:
            tail += b"".join(_file_member(name, data))
    manifest = [{"Config": config_name, "RepoTags": None, "Layers": layers + [layer_name]}]
    tail += b"".join(_file_member("manifest.json", json.dumps(manifest).encode()))
    tail += END_OF_ARCHIVE
    facts.sent += len(tail)
    yield tail


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
