"""Results kept by content: the key is the digest of everything a result can depend on, so a
hit is the same result, never a stale one (the way ccache and Bazel key their caches, not by
time).  Each kind of result has its space, a folder of the cache: ``transforms/`` for what a
transform made, ``transform-listings/`` for the classes a transform file defines and the paths
they edit (so a kept result needs no import of the file, nor of libcst), ``assertions/`` for
what the assertions on one file found (their key is ``series/assertions.py``'s to make).
Entries are one JSON file each, written by rename, sealed with the digest of their value: one
that does not read as expected (not JSON, changed since it was written, of another shape than
its reader takes) is dropped and made again (``cache.kept_json``), never a failure.  The
cache is the run's, named by the caller (``None``: nothing is kept, every run computes).

A transform's key covers the transform file and every other ``.py`` file in its folder (a
transform may load its siblings), the release version it is told, each file it reads (path and
bytes, or its absence), and the code that runs it: patchkit's version, the bytes of the
authoring API and of the runner, and libcst's version.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from patchkit import __version__
from patchkit.cache import kept_json
from patchkit.report import Outcome, Reason, Status

T = TypeVar("T")
FORMAT = "patchkit-transform-memo/1"
LISTING = "patchkit-transform-listing/1"
LIMIT = 64 << 20   # an entry is a few release files; a larger one is not ours
_RUNNER = [Path(__file__).with_name("transform.py"),
           Path(__file__).resolve().parents[1] / "transform.py"]
_LANGUAGES = Path(__file__).resolve().parents[1] / "syntax" / "__init__.py"


def _folder(cache: Path | None, space: str) -> Path | None:
    """``space``'s folder in the run's ``cache``, made once per process."""
    if cache is None:
        return None
    setting = (space, str(cache))
    if setting not in _made:
        try:
            folder = cache / space
            folder.mkdir(parents=True, exist_ok=True)
            _made[setting] = folder
        except OSError:
            return None   # no cache: every run computes
    return _made[setting]


_made: dict[tuple[str, str], Path] = {}


class Digest:
    """A key being made: each part labelled and length-prefixed, so no two lists of parts
    give the same key."""

    def __init__(self, form: str) -> None:
        self._h = hashlib.sha256()
        self.add("format", form.encode())
        self.add("patchkit", __version__.encode())

    def add(self, label: str, data: bytes) -> None:
        self._h.update(f"{label}\0{len(data)}\0".encode())
        self._h.update(data)

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def kept(cache: Path | None, space: str, digest: str,
         read: Callable[[Any], T] = lambda value: value) -> T | None:
    """The JSON value kept in ``space`` of ``cache`` under ``digest``, as ``read`` takes it
    (it raises KeyError, TypeError or ValueError for a value of another shape), or None; an
    entry that does not read so is dropped (``cache.kept_json``)."""
    folder = _folder(cache, space)
    if folder is None:
        return None
    return kept_json(folder / f"{digest}.json", lambda entry: read(_unsealed(entry)), LIMIT)


def _sealed(value: object) -> dict:
    data = json.dumps(value, sort_keys=True)
    return {"seal": hashlib.sha256(data.encode()).hexdigest(), "value": value}


def _unsealed(entry: dict) -> object:
    """The value of an entry whose seal holds; ValueError for one changed since it was kept."""
    value = entry["value"]
    if _sealed(value)["seal"] != entry["seal"]:
        raise ValueError("its content does not match its seal: changed since it was kept")
    return value


def drop(cache: Path | None, space: str, digest: str) -> None:
    """Forget what is kept in ``space`` under ``digest`` (found wrong by its reader)."""
    folder = _folder(cache, space)
    if folder is not None:
        (folder / f"{digest}.json").unlink(missing_ok=True)


def keep(cache: Path | None, space: str, digest: str, value: object) -> None:
    """Keep the JSON value ``value`` in ``space`` of ``cache`` under ``digest`` (a full disk,
    or a value too large, costs a recompute next time, nothing else)."""
    folder = _folder(cache, space)
    if folder is None:
        return
    data = json.dumps(_sealed(value)).encode()
    if len(data) > LIMIT:
        return
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=".memo-", dir=folder)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, folder / f"{digest}.json")
    except OSError:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def key(py_file: Path, inputs: dict[str, str | None], version) -> str:
    """The key of what the transform ``py_file`` makes of ``inputs`` at ``version``."""
    h = Digest(FORMAT)
    h.add("libcst", _libcst_version().encode())
    _code(h, py_file)
    h.add("version", str(version).encode())
    for path, text in inputs.items():
        h.add(f"input {path}", b"\0missing" if text is None else text.encode("utf-8"))
    return h.hexdigest()


def listing_key(py_file: Path) -> str:
    """The key of what the transform file ``py_file`` defines (its classes and their paths):
    its code, and the table of languages its classes are checked against."""
    h = Digest(LISTING)
    h.add("languages", _LANGUAGES.read_bytes() if _LANGUAGES.is_file() else b"")
    _code(h, py_file)
    return h.hexdigest()


def _code(h: Digest, py_file: Path) -> None:
    """The runner, the transform file and every other ``.py`` file beside it."""
    for runner in _RUNNER:
        h.add("runner", runner.read_bytes() if runner.is_file() else b"")
    h.add("transform", py_file.read_bytes())
    for sibling in sorted(py_file.parent.glob("*.py")):
        if sibling.name != py_file.name:
            h.add(f"sibling {sibling.name}", sibling.read_bytes())


_versions: dict[str, str] = {}


def _libcst_version() -> str:
    """libcst's version as installed, without importing it."""
    if "libcst" not in _versions:
        from importlib import metadata

        try:
            _versions["libcst"] = metadata.version("libcst")
        except metadata.PackageNotFoundError:
            _versions["libcst"] = "?"
    return _versions["libcst"]


def get(cache: Path | None, digest: str) -> tuple[Outcome, dict[str, str]] | None:
    """What a transform made, kept in the run's ``cache`` under ``digest``, or None."""
    return kept(cache, "transforms", digest, _outcome)


def _outcome(data: dict) -> tuple[Outcome, dict[str, str]]:
    reason = data["reason"]
    outcome = Outcome(Status(data["status"]), None if reason is None else Reason(reason),
                      str(data["message"]))
    texts = {str(path): text for path, text in data["texts"].items()}
    if not all(isinstance(text, str) for text in texts.values()):
        raise TypeError("a text that is not a string")
    return outcome, texts


def put(cache: Path | None, digest: str, outcome: Outcome, texts: dict[str, str]) -> None:
    keep(cache, "transforms", digest, {"status": outcome.status, "reason": outcome.reason,
                                "message": outcome.message, "texts": texts})
