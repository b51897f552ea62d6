"""An image's file system read straight from its layer blobs, with no engine.

Each layer blob (a tar, plain or gzip) is indexed once: the name, kind, size and offset of every
member, written beside the blob cache as ``<hex>.json``.  Indexing reads the whole blob and
checks both its digest (the registry's name for it) and the digest of its tar (the config's
``diff_id``), so the proofs made on these files are made on what the registry serves.

:class:`LayerFiles` stacks the indexes in layer order the way an engine unpacks them: a
``.wh.NAME`` entry deletes NAME of the layers below, ``.wh..wh..opq`` empties its folder of
what the layers below put there, a non-folder replaces whatever was at its path.  Paths are
looked up through symlinks (absolute targets from the image root), as a process in the
container would see them; ``read`` opens the one member that holds the file.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
import zlib
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from patchkit.cache import kept_json
from patchkit.errors import ImageError
from patchkit.files import write_if_changed

INDEX_FORMAT = 1
GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
MAX_LINKS = 40  # symlinks followed in one lookup, as Linux allows


@dataclass(frozen=True)
class Member:
    """One entry of a layer tar; ``name`` is relative to the image root, without ``./``."""

    name: str
    kind: str          # f(ile) d(ir) l(symlink) h(ardlink) o(ther)
    size: int = 0
    offset: int = 0    # where the file's bytes start in the uncompressed tar
    link: str = ""

    def to_list(self) -> list:
        return [self.name, self.kind, self.size, self.offset, self.link]


class _Hashing(io.RawIOBase):
    """A reader that hashes what passes through it."""

    def __init__(self, inner, h) -> None:
        self.inner = inner
        self.h = h

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        data = self.inner.read(len(buf))
        self.h.update(data)
        buf[: len(data)] = data
        return len(data)


def _kind(info: tarfile.TarInfo) -> str:
    if info.isreg():
        return "f"
    if info.isdir():
        return "d"
    if info.issym():
        return "l"
    if info.islnk():
        return "h"
    return "o"


def _clean(name: str) -> str:
    parts = [p for p in name.split("/") if p not in ("", ".")]
    return "/".join(parts)


def compression(head: bytes) -> str:
    if head.startswith(GZIP_MAGIC):
        return "gzip"
    if head.startswith(ZSTD_MAGIC):
        return "zstd"
    return "none"


def _check_readable(kind: str, what: str) -> None:
    if kind == "zstd":
        raise ImageError(f"{what} is zstd-compressed, which patchkit cannot read yet; "
                         "use a base with gzip or plain layers")


def _decompressed(raw, kind: str, what: str):
    _check_readable(kind, what)
    return gzip.GzipFile(fileobj=raw, mode="rb") if kind == "gzip" else raw


class _Inflater:
    """Random reads from a gzip stream.  It inflates forward and keeps the inflater's state
    every STEP bytes of output, so that a read behind the current point starts from the nearest
    kept state instead of the start of the stream."""

    STEP = 32 << 20
    CHUNK = 1 << 16

    def __init__(self, raw) -> None:
        self.raw = raw
        self.points: list[tuple[int, int, object]] = [(0, 0, None)]  # (in, out, state or fresh)
        self.here: tuple[int, int, object] | None = None

    def _start(self, offset: int) -> tuple[int, int, object]:
        best = max((p for p in self.points if p[1] <= offset), key=lambda p: p[1])
        if self.here is not None and best[1] <= self.here[1] <= offset:
            return self.here  # on from where the last read stopped
        return best[0], best[1], (best[2].copy() if best[2] is not None else None)

    def read_at(self, offset: int, size: int) -> bytes:
        pos_in, pos_out, inflater = self._start(offset)
        if inflater is None:
            inflater = zlib.decompressobj(31)
        self.raw.seek(pos_in)
        out = bytearray()
        pending = b""
        while pos_out < offset + size:
            data = pending or self.raw.read(self.CHUNK)
            pending = b""
            if not data:
                break
            try:
                chunk = inflater.decompress(data)
            except zlib.error as exc:
                if pos_in and not any(data):
                    break  # zero padding after the last member
                raise OSError(f"bad gzip data: {exc}") from None
            if inflater.eof:
                rest = inflater.unused_data
                pos_in += len(data) - len(rest)
                inflater = zlib.decompressobj(31)  # the next member, if any
                pending = rest
            else:
                pos_in += len(data)
            lo, hi = max(offset - pos_out, 0), min(offset + size - pos_out, len(chunk))
            if lo < hi:
                out += chunk[lo:hi]
            before = pos_out
            pos_out += len(chunk)
            if not pending and pos_out // self.STEP > before // self.STEP:
                self.points.append((pos_in, pos_out, inflater.copy()))
        if not pending:
            self.here = (pos_in, pos_out, inflater)
        else:
            self.here = None
        return bytes(out)


def _index(doc: dict) -> tuple[tuple[object, object, object], list[Member]]:
    """A kept index: what it was made for, and its members (TypeError for another shape)."""
    members = [Member(str(n), str(k), int(s), int(o), str(link))
               for n, k, s, o, link in doc["members"]]
    return (doc.get("format"), doc.get("digest"), doc.get("diff_id")), members


def index_layer(blob: Path, digest: str, diff_id: str | None, index_dir: Path,
                what: str) -> list[Member]:
    """The members of the layer blob at ``blob``, from its index (made on first use)."""
    hexpart = digest.split(":", 1)[1]
    cached = index_dir / f"{hexpart}.json"
    kept = kept_json(cached, _index)
    if kept is not None and kept[0] == (INDEX_FORMAT, digest, diff_id):
        return kept[1]
    members: list[Member] = []
    try:
        with open(blob, "rb") as raw_file:
            kind = compression(raw_file.read(4))
            raw_file.seek(0)
            outer = _Hashing(raw_file, hashlib.sha256())
            inner = _Hashing(_decompressed(outer, kind, what), hashlib.sha256())
            try:
                with tarfile.open(fileobj=inner, mode="r|") as tar:
                    for info in tar:
                        name = _clean(info.name)
                        if not name:
                            continue
                        link = (info.linkname if info.issym() else
                                _clean(info.linkname) if info.islnk() else "")
                        members.append(Member(name, _kind(info), info.size if info.isreg() else 0,
                                              info.offset_data, link))
            except (tarfile.TarError, EOFError, OSError, gzip.BadGzipFile) as exc:
                raise ImageError(f"{what} is not a readable layer: {exc}") from None
            while inner.read(1 << 20):
                pass
            while outer.read(1 << 20):
                pass
    except OSError as exc:
        raise ImageError(f"{what}: cannot read {blob}: {exc.strerror}") from None
    got = "sha256:" + outer.h.hexdigest()
    if got != digest:
        blob.unlink(missing_ok=True)  # a damaged cache entry: fetched again next time
        raise ImageError(f"{what}: the blob in the cache is {got}, not {digest}; it was removed, "
                         "run again")
    content = "sha256:" + inner.h.hexdigest()
    if diff_id is not None and content != diff_id:
        raise ImageError(f"{what} holds the tar {content}, not {diff_id} as the image's config "
                         "says")
    index_dir.mkdir(parents=True, exist_ok=True)
    write_if_changed(cached, json.dumps({"format": INDEX_FORMAT, "digest": digest,
                                         "diff_id": diff_id,
                                         "members": [m.to_list() for m in members]},
                                        separators=(",", ":")).encode())
    return members


class _Node:
    __slots__ = ("kind", "layer", "offset", "size", "link", "children")

    def __init__(self, kind: str, layer: int = -1, offset: int = 0, size: int = 0,
                 link: str = "") -> None:
        self.kind = kind
        self.layer = layer
        self.offset = offset
        self.size = size
        self.link = link
        self.children: dict[str, _Node] | None = {} if kind == "d" else None


@dataclass(frozen=True)
class IndexedLayer:
    blob: Path
    digest: str
    members: Sequence[Member]


class LayerFiles:
    """The merged file system of layer blobs (oldest first), readable through the
    :class:`~patchkit.image.package.Files` protocol.  With ``memo`` (a folder), the files read
    are kept there by layer digest and offset, so that a later run reads none of them from the
    blobs again."""

    def __init__(self, image: str, layers: Sequence[IndexedLayer],
                 memo: Path | None = None) -> None:
        self.image = image
        self._layers = list(layers)
        self._memo = memo
        self._root = _Node("d")
        self._open: dict[int, tuple] = {}
        self._read: dict[tuple[int, int], bytes] = {}
        for i, one in enumerate(self._layers):
            self._apply(i, one.members)

    # -- building the view

    def _exact(self, path: str) -> _Node | None:
        node = self._root
        for comp in path.split("/") if path else ():
            if node.children is None:
                return None
            node = node.children.get(comp)
            if node is None:
                return None
        return node

    def _apply(self, layer: int, members: Sequence[Member]) -> None:
        # Whiteouts speak of the layers below, so they go first; then the layer's own entries.
        adds = []
        for m in members:
            parent, _, base = m.name.rpartition("/")
            if base.startswith(WHITEOUT):
                node = self._exact(parent)
                if node is None or node.children is None:
                    continue
                if base == OPAQUE:
                    node.children.clear()
                else:
                    node.children.pop(base[len(WHITEOUT):], None)
            else:
                adds.append(m)
        for m in adds:
            self._put(layer, m)

    def _put(self, layer: int, m: Member) -> None:
        parts = m.name.split("/")
        node = self._root
        for comp in parts[:-1]:
            assert node.children is not None
            child = node.children.get(comp)
            if child is None or child.kind != "d":
                child = _Node("d")  # a folder the tar implies; it hides a non-folder below
                node.children[comp] = child
            node = child
        assert node.children is not None
        name = parts[-1]
        old = node.children.get(name)
        if m.kind == "d":
            if old is None or old.kind != "d":
                node.children[name] = _Node("d")
            return
        if m.kind == "h":
            target = self._resolve(m.link, follow_last=False)
            if target is not None and target.kind == "f":
                node.children[name] = _Node("f", target.layer, target.offset, target.size)
            else:
                node.children[name] = _Node("o")
            return
        node.children[name] = _Node(m.kind, layer, m.offset, m.size, m.link)

    def _resolve(self, path: str, follow_last: bool = True) -> _Node | None:
        todo = deque(p for p in path.split("/") if p not in ("", "."))
        nodes = [self._root]
        hops = 0
        while todo:
            comp = todo.popleft()
            if comp == "..":
                if len(nodes) > 1:
                    nodes.pop()
                continue
            here = nodes[-1]
            if here.children is None:
                return None
            child = here.children.get(comp)
            if child is None:
                return None
            if child.kind == "l" and (todo or follow_last):
                hops += 1
                if hops > MAX_LINKS:
                    return None
                if child.link.startswith("/"):
                    nodes = [self._root]
                todo.extendleft(reversed([p for p in child.link.split("/") if p not in ("", ".")]))
                continue
            nodes.append(child)
        return nodes[-1]

    # -- the Files protocol

    def exists(self, path: str) -> bool:
        return self._resolve(path, follow_last=False) is not None

    def names(self, folder: str) -> list[str] | None:
        """The names of ``folder``'s entries (symlinks followed), or None when no folder."""
        node = self._resolve(folder)
        if node is None or node.children is None:
            return None
        return sorted(node.children)

    def read(self, path: str) -> bytes | None:
        """The bytes of the regular file at ``path`` (symlinks followed), or None."""
        node = self._resolve(path)
        if node is None or node.kind != "f":
            return None
        key = (node.layer, node.offset)
        if key not in self._read:
            self._read[key] = self._content(node)
        return self._read[key]

    def _content(self, node: _Node) -> bytes:
        if node.size == 0:
            return b""
        one = self._layers[node.layer]
        what = f"layer {node.layer + 1} of {self.image}"
        kept = None
        if self._memo is not None:
            kept = self._memo / f"{one.digest.split(':', 1)[1]}-{node.offset}-{node.size}"
            try:
                data = kept.read_bytes()
                if len(data) == node.size:
                    return data
            except OSError:
                pass
        try:
            opened = self._open.get(node.layer)
            if opened is None:
                raw = open(one.blob, "rb")
                kind = compression(raw.read(4))
                _check_readable(kind, what)
                opened = (raw, _Inflater(raw) if kind == "gzip" else None)
                self._open[node.layer] = opened
            raw, inflater = opened
            if inflater is not None:
                data = inflater.read_at(node.offset, node.size)
            else:
                raw.seek(node.offset)
                data = raw.read(node.size)
        except (OSError, EOFError) as exc:
            raise ImageError(f"{what}: cannot read {one.blob}: {exc}") from None
        if len(data) != node.size:
            raise ImageError(f"{what} ends inside a file")
        if kept is not None:
            try:
                write_if_changed(kept, data)
            except OSError:
                pass  # the memo only saves time
        return data

    def close(self) -> None:
        for raw, _ in self._open.values():
            try:
                raw.close()
            except OSError:
                pass
        self._open.clear()

    def __enter__(self) -> LayerFiles:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
