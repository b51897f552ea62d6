"""An image's files held in memory, for the unit tests of what reads a base: ``TreeFiles`` answers
as the engine's file reader does, and ``dist`` lays a distribution into it as pip installs one
(METADATA, and a RECORD with sha256 hashes)."""

from __future__ import annotations

import base64
import hashlib

SITE = "/usr/local/lib/python3.11/dist-packages"

# a small FlashInfer: two of its files
FI = {"flashinfer/__init__.py": b"x = 1\n", "flashinfer/fused_moe/core.py": b"def f():\n    pass\n"}


class TreeFiles:
    """An image's files as a dict of absolute path -> bytes (folders are implied)."""

    image = "base:test"

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files
        self.reads: list[str] = []

    def exists(self, path: str) -> bool:
        return path in self.files or any(p.startswith(path.rstrip("/") + "/") for p in self.files)

    def read(self, path: str) -> bytes | None:
        self.reads.append(path)
        return self.files.get(path)

    def names(self, folder: str) -> list[str] | None:
        prefix = folder.rstrip("/") + "/"
        found = {p[len(prefix):].split("/")[0] for p in self.files if p.startswith(prefix)}
        return sorted(found) if found else None


def record_sha256(data: bytes) -> str:
    """The sha256 of ``data`` as a RECORD row writes it (urlsafe base64, no padding)."""
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def dist(name: str, version: str, files: dict[str, bytes], *, record: bool = True,
         folder: str | None = None, site: str = SITE) -> dict[str, bytes]:
    """``files`` (site-relative) under ``site`` with ``name``'s dist-info: a METADATA, and
    unless ``record`` is false a RECORD of them."""
    folder = folder or f"{name.replace('-', '_')}-{version}.dist-info"
    out = {f"{site}/{rel}": data for rel, data in files.items()}
    out[f"{site}/{folder}/METADATA"] = (f"Metadata-Version: 2.1\nName: {name}\n"
                                        f"Version: {version}\n\nlong text\n").encode()
    if record:
        rows = [f"{rel},sha256={record_sha256(data)},{len(data)}" for rel, data in files.items()]
        rows.append(f"{folder}/RECORD,,")
        out[f"{site}/{folder}/RECORD"] = ("\n".join(rows) + "\n").encode()
    return out
