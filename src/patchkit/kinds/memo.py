"""What a transform made, kept by content: the key is the digest of everything its result can
depend on, so a hit is the same result, never a stale one (the way ccache and Bazel key their
caches, not by time).

The key covers the transform file and every other ``.py`` file in its folder (a transform may
load its siblings), the release version it is told, each file it reads (path and bytes, or its
absence), and the code that runs it: patchkit's version, the bytes of the authoring API and of
the runner, and libcst's version.  Entries live under ``<cache>/transforms/`` of the run's
cache (:func:`folder`; the caller names it), one JSON file each, written by rename; one that
cannot be read is a miss.  With no folder named nothing is kept.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import libcst

from patchkit import __version__
from patchkit.report import Outcome, Reason, Status

FORMAT = "patchkit-transform-memo/1"
LIMIT = 64 << 20   # an entry is a few release files; a larger one is not ours
_RUNNER = [Path(__file__).with_name("transform.py"),
           Path(__file__).resolve().parents[1] / "transform.py"]


def folder(cache: Path) -> Path:
    """Where the results are kept in the run's ``cache``."""
    return cache / "transforms"


def _made(where: Path | None) -> Path | None:
    if where is None:
        return None
    try:
        where.mkdir(parents=True, exist_ok=True)
        return where
    except OSError:
        return None   # no cache: every run computes


def key(py_file: Path, inputs: dict[str, str | None], version) -> str:
    h = hashlib.sha256()

    def add(label: str, data: bytes) -> None:
        h.update(f"{label}\0{len(data)}\0".encode())
        h.update(data)

    add("format", FORMAT.encode())
    add("patchkit", __version__.encode())
    add("libcst", getattr(libcst, "__version__", "?").encode())
    for runner in _RUNNER:
        add("runner", runner.read_bytes() if runner.is_file() else b"")
    add("transform", py_file.read_bytes())
    for sibling in sorted(py_file.parent.glob("*.py")):
        if sibling.name != py_file.name:
            add(f"sibling {sibling.name}", sibling.read_bytes())
    add("version", str(version).encode())
    for path, text in inputs.items():
        add(f"input {path}", b"\0missing" if text is None else text.encode("utf-8"))
    return h.hexdigest()


def get(where: Path | None, digest: str) -> tuple[Outcome, dict[str, str]] | None:
    """The result kept in ``where`` under ``digest``, or None."""
    if where is None:
        return None
    try:
        with open(where / f"{digest}.json", "rb") as fh:
            data = json.loads(fh.read(LIMIT))
        reason = data["reason"]
        outcome = Outcome(Status(data["status"]), None if reason is None else Reason(reason),
                          data["message"])
        return outcome, dict(data["texts"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def put(where: Path | None, digest: str, outcome: Outcome, texts: dict[str, str]) -> None:
    """Keep a result in ``where`` (None: nothing is kept)."""
    folder = _made(where)
    if folder is None:
        return
    data = json.dumps({"status": outcome.status, "reason": outcome.reason,
                       "message": outcome.message, "texts": texts}).encode()
    if len(data) > LIMIT:
        return
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=".memo-", dir=folder)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, folder / f"{digest}.json")
    except OSError:
        if tmp is not None:   # a full disk costs a recompute next time, nothing else
            Path(tmp).unlink(missing_ok=True)
