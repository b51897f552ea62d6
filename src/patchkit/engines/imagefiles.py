"""An image's files, read through a stopped container, without running the image.

The engine has no listing of a folder but an archive of it; :meth:`ImageFiles.walk` streams
that archive once, never a request per file, never the whole archive in memory.
"""

from __future__ import annotations

import base64
import io
import json
import tarfile
from pathlib import PurePosixPath
from typing import Iterator

from patchkit.errors import ImageError
from patchkit.formats.archive import ChunkReader
from patchkit.engines.sdk import border, sdk


class ImageFiles:
    """Reads an image's files through a stopped container."""

    def __init__(self, api, container_id: str, image: str) -> None:
        self.api = api
        self.cid = container_id
        self.image = image
        self._kept: dict[str, bytes] = {}   # small files read on the way by names()

    def stat(self, path: str) -> dict | None:
        """``{"name", "size", "mode", "mtime", "linkTarget"}`` of ``path``, or None if absent."""
        with border(f"looking for {path} in {self.image}"):
            res = self.api.head(self.api._url("/containers/{0}/archive", self.cid),
                                params={"path": path})
            if res.status_code == 404:
                return None
            self.api._raise_for_status(res)
            header = res.headers.get("X-Docker-Container-Path-Stat")
        if not header:
            return None
        return json.loads(base64.b64decode(header))

    def exists(self, path: str) -> bool:
        return self.stat(path) is not None

    def walk(self, folder: str, _depth: int = 0) -> Iterator[tuple[tarfile.TarInfo, bytes | None]]:
        """Every entry under ``folder`` with a regular file's bytes, from one archive the
        engine streams: never one request per file, never the whole archive in memory.

        Names start with the folder's own name (``vllm/...``; when ``folder`` is a symlink,
        which is followed, its target's name); a hard link comes with no bytes and
        ``linkname`` naming the earlier entry."""
        st = self.stat(folder)
        if st is None:
            raise ImageError(f"{self.image} has no {folder}")
        target = st.get("linkTarget")
        if target and _depth < 8:
            if not target.startswith("/"):
                target = str(PurePosixPath(folder).parent / target)
            yield from self.walk(target, _depth + 1)
            return
        with border(f"reading {folder} from {self.image}"):
            stream, _ = self.api.get_archive(self.cid, folder, chunk_size=1 << 20)
            try:
                with tarfile.open(fileobj=io.BufferedReader(ChunkReader(stream), 1 << 20),
                                  mode="r|") as tar:
                    for member in tar:
                        data = None
                        if member.isreg():
                            fh = tar.extractfile(member)
                            data = fh.read() if fh else b""
                        yield member, data
            except tarfile.TarError as exc:
                raise ImageError(f"reading {folder} from {self.image}: the engine's archive is "
                                 f"not a tar stream ({exc})") from exc

    def names(self, folder: str) -> list[str] | None:
        """The names of ``folder``'s entries, or None when it is no folder.  The engine has
        no listing but an archive of the folder, so that archive is streamed once; the
        dist-info files met on the way (METADATA, RECORD, entry_points.txt) are kept for
        :meth:`read`, which saves one request each."""
        st = self.stat(folder)
        if st is None or not st.get("mode", 0) & (1 << 31) and not st.get("linkTarget"):
            return None
        names: set[str] = set()
        for info, data in self.walk(folder):
            parts = info.name.rstrip("/").split("/")
            if len(parts) < 2:
                continue  # the folder itself
            names.add(parts[1])
            if (data is not None and len(parts) == 3 and parts[1].endswith(".dist-info")
                    and parts[2] in ("METADATA", "RECORD", "entry_points.txt")):
                self._kept[f"{folder.rstrip('/')}/{parts[1]}/{parts[2]}"] = data
        return sorted(names)

    def read(self, path: str, _depth: int = 0) -> bytes | None:
        """The bytes of the regular file at ``path`` (symlinks followed), or None if absent."""
        if path in self._kept:
            return self._kept[path]
        docker = sdk()
        try:
            with border(f"reading {path} from {self.image}"):
                stream, st = self.api.get_archive(self.cid, path)
                data = b"".join(stream)
        except ImageError as exc:
            if isinstance(exc.__cause__, docker.errors.NotFound):
                return None
            raise
        if st.get("mode", 0) & (1 << 31):
            return None  # a directory
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            for member in tar:
                if member.issym() and _depth < 8:
                    target = st.get("linkTarget") or member.linkname
                    if not target.startswith("/"):
                        target = str(PurePosixPath(path).parent / target)
                    return self.read(target, _depth + 1)
                if member.isfile():
                    fh = tar.extractfile(member)
                    return fh.read() if fh else None
        return None
