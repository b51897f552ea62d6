"""An engine's export moved into other engines' loads through the kernel.

The export is a child's stdout (``docker save``) and each load a child's stdin (``ssh NODE
docker load``), both pipes (``process.Piped``).  :class:`Pump` moves bytes from the one to the
others:

* a full copy to one target is ``os.splice`` from pipe to pipe, a megabyte a call: the bytes
  never become Python objects, and the interpreter's share of the work is one system call per
  megabyte;
* to several targets (one export for all) or compressed, each megabyte is read once into one
  buffer, reused, and written to every load (``memoryview``: no object per chunk);
* :func:`relay` walks the archive's tar headers (a few blocks per member) and hands each
  member's body on with the same calls, or sends it to ``/dev/null`` by ``os.splice`` when it
  is a layer the target holds: only the headers and the small JSON members (the manifest and
  the configs, which say which member is which layer) are read by Python.

Every wait has a deadline: the export's silence and each load's refusal to take more are
bounded by ``timeout``; ``stop`` (an interruption) ends the pump between two calls.  A load
that breaks (its pipe closes) or stalls is let go alone; the others go on.
"""

from __future__ import annotations

import errno
import os
import select
import tarfile
import threading
from dataclasses import dataclass
from typing import Callable, Sequence

from patchkit.errors import ImageError
from patchkit.formats.archive import (_BLOCK, _SMALL, CHUNK, END_OF_ARCHIVE, ArchiveFacts,
                                      _collapse, _HeldLayers, _legacy_only, _norm, zstd_module)
from patchkit.timeouts import shown

_ZERO = bytes(_BLOCK)


@dataclass(frozen=True)
class Broken:
    """Why a sink was let go: ``stalled`` when it took nothing for the timeout (a load that
    stopped reading), else its pipe broke (the load ended)."""

    why: str
    stalled: bool = False

    def __str__(self) -> str:
        return self.why


class Pump:
    """Bytes from ``src`` (a readable pipe, non-blocking) to the writable pipes ``sinks``
    (non-blocking), compressed as ``compress`` says.  ``wire`` counts the bytes given to each
    load (after compression); ``broken`` says, per sink, why it was let go."""

    def __init__(self, src: int, sinks: Sequence[int], *, timeout: float,
                 first: float | None = None, stop: threading.Event | None = None,
                 compress: str = "none", what: str = "the source's export",
                 names: Sequence[str] | None = None,
                 on_wire: Callable[[int], None] | None = None) -> None:
        self.src, self.sinks = src, list(sinks)
        self.timeout, self.stop, self.what = timeout, stop or threading.Event(), what
        # the wait for the first byte: a classic store writes its whole export out first
        self.first = first if first is not None else timeout
        self._begun = False
        self.names = list(names) if names is not None else [f"load {i + 1}"
                                                           for i in range(len(self.sinks))]
        self.broken: dict[int, Broken] = {}
        self.wire = 0
        self._on_wire = on_wire or (lambda n: None)   # told ``wire`` as it grows (progress)
        self._buf = bytearray(CHUNK)
        self._view = memoryview(self._buf)
        self._null: int | None = None
        self._comp = _compressor(compress)

    # -- the sinks

    def live(self) -> list[int]:
        return [fd for fd in self.sinks if fd not in self.broken]

    def _check(self) -> None:
        if self.stop.is_set():
            raise ImageError("interrupted; the load is abandoned")
        if not self.live():
            raise ImageError(str(next(iter(self.broken.values()), "no load takes the stream")))

    def _wait(self, fd: int, writing: bool) -> bool:
        """Whether ``fd`` became ready within the timeout."""
        poll = select.poll()
        poll.register(fd, select.POLLOUT if writing else select.POLLIN)
        return bool(poll.poll(self.timeout * 1000))

    def _put(self, fd: int, view: memoryview) -> None:
        """All of ``view`` into ``fd``, or that sink let go."""
        while view:
            try:
                view = view[os.write(fd, view):]
            except BlockingIOError:
                if not self._wait(fd, True):
                    self._stalled(fd)
                    return
            except OSError as exc:
                self._let_go(fd, _broke(exc))
                return

    def _let_go(self, fd: int, why: str, stalled: bool = False) -> None:
        self.broken[fd] = Broken(f"{self.names[self.sinks.index(fd)]} {why}", stalled)

    def _stalled(self, fd: int) -> None:
        self._let_go(fd, f"took nothing for {shown(self.timeout)}", stalled=True)

    def _out(self, view: memoryview) -> None:
        live = self.live()
        if len(live) == 1:
            self._put(live[0], view)
        else:
            self._spread(live, view)
        self.wire += len(view)
        self._on_wire(self.wire)
        self._check()

    def _spread(self, fds: list[int], view: memoryview) -> None:
        """``view`` into every one of ``fds``, each taking what it can as it can (one that
        is slow does not leave the others idle); one that takes nothing for the timeout is
        let go."""
        import time

        left = {fd: view for fd in fds}
        since = {fd: time.monotonic() for fd in fds}
        poll = select.poll()
        for fd in fds:
            poll.register(fd, select.POLLOUT)
        while left:
            for fd, rest in list(left.items()):
                try:
                    n = os.write(fd, rest)
                except BlockingIOError:
                    if time.monotonic() - since[fd] > self.timeout:
                        self._stalled(fd)
                        del left[fd]
                        poll.unregister(fd)
                    continue
                except OSError as exc:
                    self._let_go(fd, _broke(exc))
                    del left[fd]
                    poll.unregister(fd)
                    continue
                since[fd] = time.monotonic()
                if n < len(rest):
                    left[fd] = rest[n:]
                else:
                    del left[fd]
                    poll.unregister(fd)
            if left:
                poll.poll(self.timeout * 1000)

    def write(self, data) -> None:
        """Bytes of the archive (headers, small members) to every load."""
        if self._comp is not None:
            data = self._comp.compress(data)
            if not data:
                return
        self._out(memoryview(data))

    def finish(self) -> None:
        """The end of a compressed stream (what the compressor still holds)."""
        if self._comp is not None:
            tail = self._comp.flush()
            self._comp = None
            if tail:
                self._out(memoryview(tail))

    # -- the source

    def _readable(self) -> None:
        limit = self.timeout if self._begun else self.first
        poll = select.poll()
        poll.register(self.src, select.POLLIN)
        if not poll.poll(limit * 1000):
            raise ImageError(f"{self.what} gave nothing for {shown(limit)}")
        self._begun = True

    def read(self, n: int) -> bytes:
        """Exactly ``n`` bytes of the source (a tar header); fewer only at its end."""
        got = bytearray()
        while len(got) < n:
            try:
                chunk = os.read(self.src, n - len(got))
            except BlockingIOError:
                self._check()
                self._readable()
                continue
            if not chunk:
                break
            got += chunk
        return bytes(got)

    def move(self, n: int | None = None) -> int:
        """``n`` bytes of the source (None: all it has left) to every load; the count moved.
        One load, uncompressed: spliced, pipe to pipe.  Else read once per megabyte into one
        buffer and written to each."""
        if self._comp is None and len(self.live()) == 1:
            return self._splice(self.live()[0], n)
        moved = 0
        while n is None or moved < n:
            want = CHUNK if n is None else min(CHUNK, n - moved)
            try:
                got = os.readv(self.src, [self._view[:want]])
            except BlockingIOError:
                self._check()
                self._readable()
                continue
            if not got:
                break
            self.write(self._view[:got])
            moved += got
        return self._short(moved, n)

    def _splice(self, dst: int, n: int | None, counted: bool = True) -> int:
        moved = 0
        while n is None or moved < n:
            want = CHUNK if n is None else min(CHUNK, n - moved)
            try:
                got = os.splice(self.src, dst, want)
            except BlockingIOError:   # the source is empty, or the load is full: wait for both
                self._check()
                self._readable()
                if not self._wait(dst, True):
                    if not counted:
                        raise ImageError(f"/dev/null took nothing for {shown(self.timeout)}")
                    self._stalled(dst)
                    self._check()
                continue
            except OSError as exc:
                if not counted:
                    raise
                self._let_go(dst, _broke(exc))
                self._check()
                continue
            if not got:
                break
            moved += got
            if counted:
                self.wire += got
                self._on_wire(self.wire)
        return self._short(moved, n)

    def _short(self, moved: int, n: int | None) -> int:
        if n is not None and moved < n:
            raise ImageError(f"{self.what} ends early: {moved:,} of {n:,} bytes of a member")
        return moved

    def skip(self, n: int) -> None:
        """``n`` bytes of the source to nowhere (a layer the targets hold): spliced into
        /dev/null, never read by Python."""
        if self._null is None:
            self._null = os.open(os.devnull, os.O_WRONLY)
        try:
            self._splice(self._null, n, counted=False)
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.ENOSYS):
                raise ImageError(f"{self.what}: {exc.strerror}") from None
            left = n   # a kernel that splices into no /dev/null: read into the one buffer
            while left:
                got = len(self.read(min(left, CHUNK)))
                if not got:
                    self._short(n - left, n)
                left -= got

    def drain(self) -> None:
        """What the source has after the archive's end (padding), to nowhere."""
        while True:
            try:
                if not os.readv(self.src, [self._view]):
                    return
            except BlockingIOError:
                self._readable()

    def close(self) -> None:
        if self._null is not None:
            os.close(self._null)
            self._null = None


def _broke(exc: OSError) -> str:
    if exc.errno == errno.EPIPE:
        return "closed its end of the stream"
    return f"refused the stream ({exc.strerror})"


def _compressor(how: str):
    if how == "none":
        return None
    if how == "gzip":
        import zlib
        return zlib.compressobj(1, zlib.DEFLATED, 31)   # level 1: a link, not an archive
    mod = zstd_module()
    if mod is None:
        raise ImageError("--compress zstd needs the zstandard package, which is not installed")
    return mod.ZstdCompressor(level=3).compressobj()


# --------------------------------------------------------------------------- the tar walk

_HEADER_KINDS = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.GNUTYPE_LONGNAME,
                 tarfile.GNUTYPE_LONGLINK)


def _member(pump: Pump) -> tuple[bytes, tarfile.TarInfo] | None:
    """The next member's header blocks (its pax or GNU extension headers included, as they
    came) and what they say; None at the end of the archive."""
    raw = bytearray()
    pax: dict[str, str] = {}
    while True:
        block = pump.read(_BLOCK)
        if len(block) < _BLOCK:
            raise ImageError("the engine's export ends early (no end-of-archive blocks)")
        if block == _ZERO:
            return None
        raw += block
        try:
            info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
        except tarfile.HeaderError as exc:
            raise ImageError(f"the engine's export is not a tar archive: {exc}") from None
        if info.type not in _HEADER_KINDS:
            break
        body = pump.read(info.size + -info.size % _BLOCK)
        raw += body
        data = body[:info.size]
        if info.type == tarfile.XHDTYPE:
            pax.update(_pax_records(data))
        elif info.type == tarfile.GNUTYPE_LONGNAME:
            pax["path"] = data.rstrip(b"\0").decode("utf-8", "surrogateescape")
        elif info.type == tarfile.GNUTYPE_LONGLINK:
            pax["linkpath"] = data.rstrip(b"\0").decode("utf-8", "surrogateescape")
    if "path" in pax:
        info.name = pax["path"]
    if "linkpath" in pax:
        info.linkname = pax["linkpath"]
    if "size" in pax:
        info.size = int(pax["size"])
    return bytes(raw), info


def _pax_records(data: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        space = data.find(b" ", pos)
        if space < 0:
            break
        length = int(data[pos:space])
        if length <= 0:
            break
        key, _, value = data[space + 1:pos + length - 1].partition(b"=")
        out[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return out


def relay(pump: Pump, facts: ArchiveFacts, held: Sequence[str] = (),
          layers: Sequence[str] | None = None, lean: bool = False,
          skip: frozenset | set = frozenset()) -> None:
    """The archive on ``pump``'s source, member by member, to its loads: without the layer
    files of ``held`` (the image's first diff_ids, which the targets hold), without ``skip``,
    and with ``lean`` without what only a legacy load reads; then the end-of-archive blocks.
    ``facts`` learns what it held, as ``archive.relay`` tells it."""
    held_layers = _HeldLayers(held, layers)
    while (member := _member(pump)) is not None:
        raw, info = member
        name = _norm(info.name)
        if info.issym():
            target = info.linkname
            if not target.startswith("/"):
                target = f"{os.path.dirname(name)}/{target}"
            facts.links[name] = _collapse(target.lstrip("/"))
        elif info.islnk():
            facts.links[name] = _norm(info.linkname)
        size = info.size if info.isreg() else 0
        span = size + -size % _BLOCK
        position = held_layers.position(name, facts) if info.isreg() else None
        body = None
        if info.isreg() and position is None and size <= _SMALL and not _a_layer(name):
            body = pump.read(span)
            if len(body) != span:
                raise ImageError(f"the engine's export ends inside {name}")
            if body[:1] in (b"{", b"["):
                facts.small[name] = body[:size]
            if name == "manifest.json":
                _manifest(facts, body[:size])
        if position is not None:
            facts.positions[position] = size
        left_out = position is not None and position < held_layers.count
        if left_out or name in skip or (lean and _legacy_only(name, info)):
            if left_out:
                facts.left_out[name] = size
            if body is None:
                pump.skip(span)
            continue
        if info.isreg():
            facts.sizes[name] = size
        pump.write(raw)
        if body is not None:
            pump.write(body)
        else:
            pump.move(span)
        facts.sent += len(raw) + span
    pump.write(END_OF_ARCHIVE)
    facts.sent += len(END_OF_ARCHIVE)
    pump.drain()
    pump.finish()
    if "manifest.json" not in facts.small:
        raise ImageError("the engine's export has no manifest.json")


def _a_layer(name: str) -> bool:
    """A member that is a layer file in a layout whose names say so (never read whole)."""
    return name.endswith("/layer.tar") or (name.endswith(".tar") and "/" not in name)


def _manifest(facts: ArchiveFacts, body: bytes) -> None:
    import json

    try:
        facts.manifest = json.loads(body)
    except ValueError:
        raise ImageError("the engine's export has a manifest.json that is not JSON") from None
    facts.small["manifest.json"] = body


def whole(pump: Pump) -> None:
    """The export as it is, to the loads (a full copy): nothing of it parsed."""
    pump.move(None)
    pump.finish()

