"""``docker load`` archives, streamed: an engine's export relayed member by member into another
engine's load (or into a complete archive), the chunk reader over an export stream, and the
compressions a copy may use.  Pure: the engines' pipes are the callers'.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Iterable, Iterator, Sequence

from patchkit.errors import ImageError
from patchkit.formats.layer import Layer, image_id_of


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
