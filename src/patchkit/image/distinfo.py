"""What an image has installed, read from pip's own records without running it.

A wheel install leaves ``<name>-<version>.dist-info/`` beside the files it laid out: ``METADATA``
(the distribution's name and version) and ``RECORD`` (one ``path,sha256=<urlsafe b64>,size`` row
per file, relative to the folder holding the dist-info).  :func:`installed` reads every
dist-info under the image's site-packages and dist-packages folders; :func:`prove_pristine`
proves a checkout's changed files byte-identical to the installed ones, by RECORD's hashes
where it has them and by reading the file where it has none.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from email.parser import BytesHeaderParser
from typing import Callable, Protocol

from packaging.utils import canonicalize_name

from patchkit.errors import ImageError
from patchkit.image import package
from patchkit.series.checkout import AppliedCheckout

INFO_SUFFIX = ".dist-info"
MAX_RECORD = 64 * 1024 * 1024   # a RECORD larger than this is no RECORD


class ListedFiles(package.Files, Protocol):
    """An image's files, with the names of a folder's entries (None: no such folder)."""

    def names(self, folder: str) -> list[str] | None: ...


@dataclass(frozen=True)
class RecordRow:
    path: str                 # relative to the folder holding the dist-info
    sha256: str | None        # urlsafe base64 without padding, as pip writes it
    size: int | None


@dataclass(frozen=True)
class Dist:
    """One installed distribution, as its dist-info tells it."""

    name: str                 # normalized (PEP 503): flashinfer-python
    version: str
    site: str                 # the folder holding the dist-info, where its files live
    info: str                 # the dist-info folder, absolute
    record: Mapping[str, RecordRow] | None = None   # None: no RECORD

    def path_of(self, rel: str) -> str:
        return self.site.rstrip("/") + "/" + rel


@dataclass(frozen=True)
class Installed:
    """Every distribution an image has installed, by normalized name (the first site that
    holds a name wins, as Python's import path would have it)."""

    dists: Mapping[str, Dist]
    sites: tuple[str, ...]                    # the folders looked in, that exist
    shadowed: tuple[Dist, ...] = field(default=())  # further installs of a name, not used

    def get(self, name: str) -> Dist | None:
        return self.dists.get(canonicalize_name(name))

    def versions(self) -> dict[str, str]:
        return {name: d.version for name, d in sorted(self.dists.items())}

    def missing(self, dist: str) -> str:
        """One line: why ``dist`` is not there, naming where it was looked for."""
        glob = f"{canonicalize_name(dist).replace('-', '_')}-*{INFO_SUFFIX}"
        return f"no {glob} in {', '.join(self.sites) or '(no site-packages found)'}"


def normalize(name: str) -> str:
    return canonicalize_name(name)


def parse_metadata(data: bytes, where: str) -> tuple[str, str]:
    """``(name, version)`` of a METADATA file (RFC 822 headers)."""
    headers = BytesHeaderParser().parsebytes(data)
    name, version = headers.get("Name"), headers.get("Version")
    if not name or not version:
        raise ImageError(f"{where}: no Name and Version headers; not a dist-info METADATA")
    return str(name).strip(), str(version).strip()


def parse_record(data: bytes, where: str) -> dict[str, RecordRow]:
    """RECORD's rows by path; rows without a hash (the RECORD itself, byte-code) keep None."""
    rows: dict[str, RecordRow] = {}
    try:
        for row in csv.reader(io.StringIO(data.decode("utf-8"))):
            if not row or not row[0]:
                continue
            path, digest = row[0], row[1] if len(row) > 1 else ""
            size = row[2] if len(row) > 2 else ""
            algo, _, value = digest.partition("=")
            rows[path] = RecordRow(path, value if algo == "sha256" and value else None,
                                   int(size) if size.isdigit() else None)
    except (UnicodeDecodeError, csv.Error) as exc:
        raise ImageError(f"{where}: not a RECORD ({exc})") from None
    return rows


def record_hash(data: bytes) -> str:
    """``data``'s sha256 as RECORD writes it."""
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def site_folders(files: package.Files, env: dict[str, str]) -> list[str]:
    """The site-packages and dist-packages folders of the image, most likely first."""
    sites, prefixes = package.candidate_sites(env)
    out = [s for s in sites if files.exists(s)]
    for prefix in prefixes:
        for minor in package.PYTHON_MINORS:
            lib = f"{prefix}/lib/python3.{minor}"
            if not files.exists(lib):
                continue
            out.extend(f"{lib}/{sub}" for sub in ("dist-packages", "site-packages")
                       if files.exists(f"{lib}/{sub}"))
        if files.exists(f"{prefix}/lib/python3/dist-packages"):
            out.append(f"{prefix}/lib/python3/dist-packages")
    unique: list[str] = []
    for s in out:
        if s not in unique:
            unique.append(s)
    return unique


def read_dist(files: package.Files, site: str, folder: str) -> Dist | None:
    """The dist-info ``folder`` of ``site``, or None when it has no METADATA."""
    info = f"{site}/{folder}"
    meta = files.read(f"{info}/METADATA")
    if meta is None:
        return None
    name, version = parse_metadata(meta, f"{files.image}: {info}/METADATA")
    data = files.read(f"{info}/RECORD")
    if data is not None and len(data) > MAX_RECORD:
        raise ImageError(f"{files.image}: {info}/RECORD is {len(data)} bytes; refusing to read it")
    record = parse_record(data, f"{files.image}: {info}/RECORD") if data is not None else None
    return Dist(normalize(name), version, site, info, record)


def installed(files: ListedFiles, env: dict[str, str]) -> Installed:
    """Every ``*.dist-info`` under the image's site folders, read from its files."""
    sites = site_folders(files, env)
    dists: dict[str, Dist] = {}
    shadowed: list[Dist] = []
    for site in sites:
        for folder in sorted(files.names(site) or ()):
            if not folder.endswith(INFO_SUFFIX):
                continue
            dist = read_dist(files, site, folder)
            if dist is None:
                continue
            if dist.name in dists:
                shadowed.append(dist)
            else:
                dists[dist.name] = dist
    return Installed(dists, tuple(sites), tuple(shadowed))


# ------------------------------------------------------------------------------ the proof

@dataclass(frozen=True)
class Proof:
    """How each changed file of a package was proven pristine in the image."""

    by_record: tuple[str, ...]    # RECORD's sha256 equals the pristine blob's: no read needed
    by_reading: tuple[str, ...]   # no hash in RECORD: the image's file was read and compared

    def describe(self) -> str:
        parts = []
        if self.by_record:
            parts.append(f"{len(self.by_record)} proved by RECORD")
        if self.by_reading:
            parts.append(f"{len(self.by_reading)} by reading the file")
        return ", ".join(parts) or "no file to replace"


def prove_pristine(files: package.Files, dist: Dist, changed: Iterable[str],
                   pristine: Mapping[str, bytes | None], *, image: str, what: str,
                   added: Iterable[str] = (), to_image: Callable[[str], str] | None = None
                   ) -> Proof:
    """Prove that every path of ``changed`` (checkout-relative, replaced or removed by the
    series) is, in the image, byte-identical to ``pristine[path]``, and that no path of
    ``added`` is there yet.  ``what`` names the pristine tree in messages (``FlashInfer
    v0.6.15 (commit abc)``); ``to_image`` maps a checkout path to the image (default: the
    dist's site).  Raises :class:`ImageError` naming the first file that is not pristine."""
    where = to_image or dist.path_of
    record = dist.record or {}
    by_record: list[str] = []
    by_reading: list[str] = []
    for rel in added:
        if files.exists(where(rel)):
            raise ImageError(f"base {image} already has {rel}, which {what} does not; "
                             "refusing to overwrite it")
    for rel in changed:
        want = pristine.get(rel)
        if want is None:
            raise ImageError(f"{rel}: the pristine file of {what} is missing from the checkout")
        row = record.get(_record_path(dist, where(rel)))
        if row is not None and row.sha256 is not None:
            if row.sha256 != record_hash(want):
                raise ImageError(f"base {image}: {rel} is not the pristine file of {what} "
                                 f"(its RECORD hash differs); refusing to overwrite it")
            by_record.append(rel)
            continue
        have = files.read(where(rel))
        if have is None:
            raise ImageError(f"base {image} has no {rel}, which {what} has")
        if have != want:
            raise ImageError(f"base {image}: {rel} is not the pristine file of {what}; "
                             "refusing to overwrite it")
        by_reading.append(rel)
    return Proof(tuple(by_record), tuple(by_reading))


def prove_checkout(files: package.Files, dist: Dist, tree: AppliedCheckout, *, package: str,
                   image: str, what: str | None = None) -> Proof:
    """Prove the files an applied checkout of ``dist``'s package (``package``, as the manifest
    names it) changes (paths from the package's source root, the folder holding its
    dist-info) pristine in the image."""
    changes = tree.changes()
    changed = [c.path for c in changes if c.status != "A"]
    ref = tree.pin(package).ref or tree.base[:12]
    what = what or f"{dist.name} {ref} (commit {tree.base[:12]})"
    return prove_pristine(files, dist, changed, tree.pristine(changed), image=image, what=what,
                          added=[c.path for c in changes if c.status == "A"])


def _record_path(dist: Dist, absolute: str) -> str:
    prefix = dist.site.rstrip("/") + "/"
    return absolute[len(prefix):] if absolute.startswith(prefix) else absolute
