"""How a build served, kept with the build: the evidence records of ``smoke`` and ``verify``.

A record says what one run found about one build: the image id and immutable tag, the node it
ran on, when, the model, the figures (decode speed, time to the first token, acceptance), each
check's verdict, the settings of the measurement, and patchkit's version.  It is the one
reader and writer of that JSON (:meth:`Record.from_json`).

Where records live:

* in the cache beside the node histories (``evidence/<sha256 of the image id>/<record
  id>.json``); the image id is the config's digest, the same on every node the build is on;
* beside the image in each registry it came from (its ``RepoDigests``), as an OCI artifact of
  type :data:`ARTIFACT_TYPE` whose ``subject`` is the image's manifest (the registry border
  pushes it, with the tag fallback where the registry has no referrers API).  Another machine
  reads them there and keeps them in its own cache.

A record's id is the digest of its canonical JSON, so a record read back from a registry is
the same file as the one written, and never kept twice.  A record that cannot be read (in the
cache or the registry) is named and skipped.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from patchkit import __version__
from patchkit import cache as cache_
from patchkit.errors import ImageError, UsageError
from patchkit.files import write_if_changed
from patchkit.nodes import ledger
from patchkit.image import labels
from patchkit.engines import registry
from patchkit.engines.docker import Engine
from patchkit.serving import speed as speed_

ARTIFACT_TYPE = "application/vnd.patchkit.evidence.v1+json"
PASSED, FAILED = "passed", "failed"


@dataclass(frozen=True)
class Build:
    """The build a server runs, as an engine told it."""

    image_id: str
    tag: str | None               # its immutable tag (None: it carries none)
    node: str                     # the engine's address
    patchset: str | None
    repo_digests: tuple[str, ...] = ()
    moving: str | None = None     # the moving tag its immutable tag was made beside

    @property
    def name(self) -> str:
        return self.tag or self.image_id[:19]


@dataclass(frozen=True)
class Verdict:
    name: str
    status: str
    message: str

    def to_dict(self) -> dict:
        return {"name": self.name, "status": self.status, "message": self.message}


@dataclass(frozen=True)
class Record:
    """One run's evidence about one build."""

    kind: str                     # "smoke" or "verify"
    image_id: str
    tag: str | None
    node: str
    at: float                     # when (Unix time)
    ok: bool
    verdicts: tuple[Verdict, ...]
    patchset: str | None = None
    model: str | None = None
    figures: speed_.Figures | None = None
    settings: speed_.Settings | None = None
    server_version: str | None = None
    spec_decode: bool | None = None
    acceptance: float | None = None   # smoke's acceptance check, when it ran
    url: str | None = None
    patchkit: str = __version__

    @property
    def verdict(self) -> str:
        return PASSED if self.ok else FAILED

    @property
    def when(self) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.at))

    @property
    def accepted(self) -> float | None:
        if self.acceptance is not None:
            return self.acceptance
        return self.figures.acceptance if self.figures else None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "image_id": self.image_id, "immutable_tag": self.tag,
                "patchset": self.patchset, "node": self.node, "time": self.when,
                "unix_time": self.at, "verdict": self.verdict, "ok": self.ok,
                "verdicts": [v.to_dict() for v in self.verdicts], "model": self.model,
                "url": self.url, "figures": self.figures.to_dict() if self.figures else None,
                "settings": self.settings.to_dict() if self.settings else None,
                "server_version": self.server_version, "spec_decode": self.spec_decode,
                "acceptance": self.acceptance, "patchkit": self.patchkit}

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":")).encode()

    @property
    def id(self) -> str:
        return hashlib.sha256(self.to_json()).hexdigest()

    @classmethod
    def from_json(cls, raw: bytes) -> "Record":
        """The record ``raw`` holds; ValueError (saying what) when it is not one."""
        try:
            d = json.loads(raw)
            if not isinstance(d, dict):
                raise ValueError("not a JSON object")
            if d.get("kind") not in ("smoke", "verify"):
                raise ValueError(f"kind {d.get('kind')!r} is not smoke or verify")
            for key in ("image_id", "node"):
                if not isinstance(d.get(key), str) or not d[key]:
                    raise ValueError(f"no {key}")
            if not isinstance(d.get("ok"), bool):
                raise ValueError("no verdict")
            at = d.get("unix_time")
            if isinstance(at, bool) or not isinstance(at, (int, float)):
                raise ValueError("no time")
            verdicts = tuple(Verdict(str(v["name"]), str(v["status"]), str(v["message"]))
                             for v in d.get("verdicts") or ())
            return cls(d["kind"], d["image_id"], d.get("immutable_tag"), d["node"], float(at),
                       d["ok"], verdicts, d.get("patchset"), d.get("model"),
                       speed_.Figures.from_dict(d["figures"]) if d.get("figures") else None,
                       speed_.Settings.from_dict(d["settings"]) if d.get("settings") else None,
                       d.get("server_version"), d.get("spec_decode"), d.get("acceptance"),
                       d.get("url"), str(d.get("patchkit") or "?"))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(str(exc) or type(exc).__name__) from None

    def describe(self) -> str:
        """One line: the verdict, the figures, when and where."""
        parts = [f"{self.kind} {self.verdict}"]
        f = self.figures
        if f is not None and f.decode_tok_s is not None:
            parts.append(f"{f.decode_tok_s:.1f} tok/s")
        if self.accepted is not None:
            parts.append(f"acceptance {self.accepted:.2f}")
        return ", ".join(parts) + f" at {self.when} on {self.node}"


# ------------------------------------------------------------------------ which build

def of_container(engine: Engine, name: str) -> Build:
    """The build the running container ``name`` runs on ``engine``; a container that is not
    there or not running is a usage error (exit 2)."""
    found = engine.container_image(name)
    if found is None:
        raise UsageError(f"--container {name}: no such container on the engine at "
                         f"{engine.host}")
    image_id, state = found
    if state != "running":
        raise UsageError(f"--container {name}: not running on the engine at {engine.host} "
                         f"(it is {state or 'in no state'})")
    return _build_of(engine, image_id, f"--container {name}")


def of_tag(engine: Engine, tag: str) -> Build:
    """The build ``tag`` names on ``engine``; none is a usage error (exit 2)."""
    return _build_of(engine, tag, f"--build {tag}")


def _build_of(engine: Engine, ref: str, what: str) -> Build:
    image = engine.inspect(ref)
    if image is None:
        raise UsageError(f"{what}: no such image on the engine at {engine.host}")
    one = ledger.make(image)
    tag = one.fixed
    return Build(image.id, tag, engine.host, one.facts.patchset, image.repo_digests,
                 labels.moving_of(tag) if tag else None)


# ------------------------------------------------------------------------ where they are kept

@dataclass
class Gathered:
    """A build's records, oldest first, and what could not be read."""

    records: list[Record] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def last(self) -> Record | None:
        return self.records[-1] if self.records else None


@dataclass(frozen=True)
class Kept:
    """Where one record went."""

    record: Record
    path: str                        # in the cache
    pushed: tuple[str, ...] = ()     # beside the image in its registries
    refused: tuple[str, ...] = ()    # registries that refused it (kept in the cache alone)

    def lines(self, build: Build) -> list[str]:
        """What a command says of it, a line each."""
        out = [f"evidence: {self.record.describe()} for {build.name}; kept in {self.path}"]
        out += [f"evidence: pushed beside the image: {p}" for p in self.pushed]
        out += [f"evidence: registry refused the record, kept in the cache only: {r}"
                for r in self.refused]
        return out

    def to_dict(self) -> dict:
        return {"record": self.record.to_dict(), "path": self.path,
                "pushed": list(self.pushed), "refused": list(self.refused)}


UNKNOWN = "evidence: the build is unknown (no --container or --build): nothing recorded"


def which(engine_address: str | None, container: str | None, build: str | None,
          connect: Callable[[str | None], Engine]) -> tuple[Build | None, Engine | None]:
    """(the build a container runs or a tag names, the engine it was read on, to close), or
    (None, None) when neither is given.  ``connect`` is the verb's: it connects the engine at
    an address (None: DOCKER_HOST's)."""
    from patchkit.engines.docker import engine_url

    if container and build:
        raise UsageError("give --container or --build, not both")
    if not (container or build):
        if engine_address:
            raise UsageError("--node goes with --container or --build: the engine that runs "
                             "the server")
        return None, None
    engine = connect(engine_url(engine_address, "--node") if engine_address else None)
    try:
        return (of_container(engine, container) if container else of_tag(engine, build)), engine
    except BaseException:
        engine.close()
        raise


class Store:
    """The records in the cache (``evidence/``), and beside images in their registries."""

    def __init__(self, cache: Path | None = None, timeout: float = 60.0) -> None:
        self.cache = cache
        self.timeout = timeout

    def _root(self) -> Path:
        return cache_.cache_subdir(self.cache or cache_.cache_dir(), "evidence")

    def _folder(self, image_id: str) -> Path:
        return self._root() / hashlib.sha256(image_id.encode()).hexdigest()[:32]

    def keep(self, record: Record) -> Path:
        """``record`` in the cache (written once: a record is named by its content)."""
        folder = self._folder(record.image_id)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{record.id}.json"
        write_if_changed(path, record.to_json() + b"\n")
        return path

    def local(self, image_id: str | None = None) -> Gathered:
        """The cache's records (of ``image_id``, else all), oldest first; a file that is not
        a record is named and skipped."""
        got = Gathered()
        folders = [self._folder(image_id)] if image_id else sorted(self._root().iterdir())
        for folder in folders:
            for path in sorted(folder.glob("*.json")) if folder.is_dir() else ():
                try:
                    record = Record.from_json(path.read_bytes())
                except (OSError, ValueError) as exc:
                    got.problems.append(f"{path}: not an evidence record ({exc}); skipped")
                    continue
                if image_id is None or record.image_id == image_id:
                    got.records.append(record)
        got.records.sort(key=lambda r: r.at)
        return got

    def record(self, record: Record, build: Build) -> Kept:
        """``record`` kept in the cache, then pushed beside the image in its registries."""
        path = self.keep(record)
        pushed, refused = self.push(record, build.repo_digests)
        return Kept(record, str(path), tuple(pushed), tuple(refused))

    def push(self, record: Record, repo_digests: tuple[str, ...]) -> tuple[list[str], list[str]]:
        """``record`` beside the image in each registry it came from: where it went (one line
        each) and what refused it."""
        pushed, refused = [], []
        for ref in dict.fromkeys(repo_digests):
            try:
                digest, fallback = registry.push_referrer(
                    ref, ARTIFACT_TYPE, record.to_json(),
                    {"org.opencontainers.image.created": record.when,
                     labels.EVIDENCE_KIND: record.kind,
                     labels.EVIDENCE_VERDICT: record.verdict}, timeout=self.timeout)
            except ImageError as exc:
                refused.append(f"{ref}: {exc}")
                continue
            how = (f"tag {registry.fallback_tag(ref.split('@', 1)[1])}" if fallback
                   else "the referrers API")
            pushed.append(f"{ref.split('@', 1)[0]}@{digest} (listed by {how})")
        return pushed, refused

    def remote(self, repo_digests: tuple[str, ...], image_id: str) -> Gathered:
        """The records beside the image in its registries, each kept in the cache too."""
        got = Gathered()
        for ref in dict.fromkeys(repo_digests):
            try:
                found = registry.referrers(ref, ARTIFACT_TYPE, timeout=self.timeout)
            except ImageError as exc:
                got.problems.append(f"{ref}: evidence not read: {exc}")
                continue
            for digest, payload in found:
                if isinstance(payload, str):
                    got.problems.append(f"{ref.split('@', 1)[0]}: {payload}; skipped")
                    continue
                try:
                    record = Record.from_json(payload)
                except ValueError as exc:
                    got.problems.append(f"{ref.split('@', 1)[0]}@{digest}: not an evidence "
                                        f"record ({exc}); skipped")
                    continue
                if record.image_id != image_id:
                    got.problems.append(f"{ref.split('@', 1)[0]}@{digest}: a record of "
                                        f"{record.image_id[:19]}, not of this image; skipped")
                    continue
                self.keep(record)
                got.records.append(record)
        return got

    def of(self, image_id: str, repo_digests: tuple[str, ...] = (), *,
           remote: bool = True) -> Gathered:
        """A build's records from the cache and (``remote``) its registries, oldest first,
        each once."""
        got = self.local(image_id)
        if remote and repo_digests:
            far = self.remote(repo_digests, image_id)
            got.problems += far.problems
            seen = {r.id for r in got.records}
            got.records += [r for r in far.records if r.id not in seen]
            got.records.sort(key=lambda r: r.at)
        return got

    def by_tag(self, tag: str) -> Gathered:
        """The cache's records of the build whose immutable tag (or image id) is ``tag``."""
        every = self.local()
        every.records = [r for r in every.records
                         if tag in (r.tag, r.image_id) or (len(tag) >= 12 and
                                                           r.image_id.startswith(tag))]
        return every


def current_line(moving: str, connect: Callable[[], Engine], timeout: float = 30.0,
                 cache: Path | None = None) -> str:
    """One line: the build the moving tag names on the engine ``connect`` (the verb's) reaches,
    and its last evidence (for a reviewer to compare with after a change); what stood in the
    way, else."""
    from patchkit.errors import PatchkitError

    try:
        engine = connect()
    except PatchkitError as exc:
        return f"not known: no engine to say which build {moving} names ({exc})"
    try:
        image = engine.inspect(moving)
        if image is None:
            return f"not known: {moving} names no build on {engine.host}"
        build = _build_of(engine, moving, moving)
        last = Store(cache, timeout).of(image.id, image.repo_digests).last
    except PatchkitError as exc:
        return f"not known: {exc}"
    finally:
        engine.close()
    return f"{build.name}: " + (last.describe() if last else "never served (no evidence)")
