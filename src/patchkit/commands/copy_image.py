"""``patchkit copy-image IMAGE --to ENGINE...``: the same image content on other engines.

Content is judged by fingerprint (``layer.fingerprint``: the config digest and the layers'
diff_ids), never by image id, which differs between snapshotters.  For each target:

* the same content under the tag already: nothing is sent (``present``);
* else the image streams from the source engine (DOCKER_HOST) into the target's load, with no
  file in between (``copied``, or ``replaced`` when the tag named other content); a target
  that holds the content under another name only gets the tag;
* then the target is read again: unless it now holds the fingerprint under the tag, the copy
  fails and the target's tag is put back as it was.

A target that cannot be reached, or refuses the load, fails alone: the others are still tried.

With ``via`` (a registry, ``host[:port][/prefix]``) the image goes through the registry instead
of the link: the source engine pushes it there (the registry is asked for each layer, and
only the ones it lacks are sent; nothing is tagged there until every blob is in), then each
target that lacks the content pulls it by digest (fetching only the layers it lacks), and it
is tagged under the image's own name there and checked by fingerprint as above.  A refused
push fails every target that needed it, with nothing changed on any of them.
"""

from __future__ import annotations

import functools
import re
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from patchkit.errors import ImageError, PatchkitError, UsageError
from patchkit.image.docker import Engine, Transfer, engine_url
from patchkit.image.layer import ArchiveFacts, fingerprint, relayed_export
from patchkit.image.registry import host_of
from patchkit.imageref import check_reference, reference_problem, repository, split_tag
from patchkit.timeouts import DEFAULT_TIMEOUT

Log = Callable[[str], None]
STATUSES = ("copied", "present", "replaced", "failed")


@dataclass
class Sent:
    """What travelled to a target: the archive's bytes and, of those, the layers'."""

    bytes: int = 0
    layer_bytes: int = 0
    layers: int = 0

    def to_dict(self) -> dict:
        return {"bytes": self.bytes, "layer_bytes": self.layer_bytes, "layers": self.layers}


@dataclass
class TargetResult:
    engine: str
    status: str                         # one of STATUSES
    fingerprint: str | None = None      # what the target holds under the tag afterwards
    error: str | None = None
    sent: Sent = field(default_factory=Sent)
    seconds: float = 0.0
    pulled: Transfer | None = None      # with --via: what the target fetched from the registry

    @property
    def ok(self) -> bool:
        return self.status != "failed"

    def to_dict(self) -> dict:
        data = {"engine": self.engine, "status": self.status, "fingerprint": self.fingerprint}
        if self.error is not None:
            data["error"] = self.error
        data["sent"] = self.sent.to_dict()
        data["seconds"] = self.seconds
        if self.pulled is not None:
            data["pulled"] = self.pulled.to_dict()
        return data


@dataclass
class CopyReport:
    """What ``copy-image`` did; ``to_dict`` is the ``--format json`` shape."""

    image: str
    fingerprint: str
    targets: list[TargetResult]
    via: Pushed | None = None           # with --via, when a target needed the push

    @property
    def ok(self) -> bool:
        return all(t.ok for t in self.targets)

    def to_dict(self) -> dict:
        data = {"ok": self.ok, "image": self.image, "fingerprint": self.fingerprint,
                "targets": [t.to_dict() for t in self.targets]}
        if self.via is not None:
            data["via"] = self.via.to_dict()
        return data


def check_targets(targets: Sequence[str], flag: str = "--to") -> list[str]:
    """The engine addresses, checked (a usage error names the bad one), each once."""
    urls: list[str] = []
    for text in targets:
        url = engine_url(text, flag)
        if url not in urls:
            urls.append(url)
    return urls


def run(image: str, targets: Sequence[str], *, source: Engine | None = None,
        connect: Callable[[str], Engine] | None = None, log: Log = lambda m: None,
        timeout: float = DEFAULT_TIMEOUT, via: str | None = None) -> CopyReport:
    """Copy ``image`` from ``source`` (default: the engine DOCKER_HOST names) to each target,
    through the registry ``via`` when given; ``timeout`` bounds each silence of an engine."""
    via = check_via(via) if via is not None else None
    if re.fullmatch(r"(sha256:)?[0-9a-f]{12,64}", image):
        raise UsageError(f"IMAGE {image!r} is an image id; copy-image takes a tag, which the "
                         "targets then hold")
    check_reference("IMAGE", image, digest_ok=False)
    urls = check_targets(targets)
    if not urls:
        raise UsageError("give the engines to copy to with --to ENGINE")
    source = source or Engine.connect(timeout=timeout)
    return copy(source, image, urls, connect=connect, log=log, timeout=timeout, via=via)


def copy(source: Engine, image: str, urls: Sequence[str], *,
         connect: Callable[[str], Engine] | None = None, log: Log = lambda m: None,
         timeout: float = DEFAULT_TIMEOUT, via: str | None = None) -> CopyReport:
    """``run`` once the targets (and ``via``, see ``check_via``) are checked and the source is
    connected (build-image's ``--copy-to`` comes in here)."""
    connect = connect or functools.partial(Engine.connect, timeout=timeout)
    attrs = source.content(image)
    if attrs is None:
        raise ImageError(f"no image {image} on the engine at {source.host}")
    want = fingerprint(attrs)
    if via:
        return copy_via(source, image, attrs, urls, via, connect=connect, log=log)
    results = []
    for url in urls:
        started = time.monotonic()
        try:
            result = _copy_to(source, image, attrs, want, url, connect(url), log)
        except PatchkitError as exc:
            result = TargetResult(url, "failed", error=str(exc))
        result.seconds = round(time.monotonic() - started, 2)
        results.append(result)
    return CopyReport(image, want, results)


def _copy_to(source: Engine, image: str, attrs: dict, want: str, url: str, target: Engine,
             log: Log) -> TargetResult:
    held = target.content(image)
    if held is not None and fingerprint(held) == want:
        log(f"{url}: holds {image} with the same content already; nothing sent")
        return TargetResult(url, "present", want)
    previous = held["Id"] if held is not None else None
    status = "replaced" if held is not None else "copied"
    sent = [ArchiveFacts()]
    held_as = None
    try:
        same = (target.content(attrs["ConfigDigest"])
                if target.store().ids_are_config_digests else None)
        if same is not None and fingerprint(same) == want:
            log(f"{url}: holds this content under another name; tagging it {image}")
            target.tag(same["Id"], image)
        else:
            log(f"{url}: streaming {image} from the engine at {source.host}")

            def stream():
                sent.append(ArchiveFacts())
                return relayed_export(source.export(image), sent[-1])
            held_as = target.load(stream, attrs["ConfigDigest"],
                                  (attrs.get("RootFS") or {}).get("Layers") or (), log)
        after = target.content(image)
        if after is None and held_as:
            # The export named no tag (an image given by id), or the engine did not tag it.
            target.tag(held_as, image)
            after = target.content(image)
        got = fingerprint(after) if after is not None else None
        if got != want:
            raise ImageError(f"after the load the engine at {url} holds "
                             f"{got or 'nothing'} under {image}, not {want}; its tag is put "
                             "back as it was")
    except BaseException:
        _put_back(target, image, previous)
        raise
    facts = sent[-1]
    return TargetResult(url, status, got,
                        sent=Sent(facts.sent, facts.layer_bytes(), facts.layer_count()))


def _put_back(target: Engine, image: str, previous: str | None) -> None:
    """The target's tag as it was before the copy: on ``previous``, or nowhere."""
    try:
        if target.tagged(image) != previous:
            target.restore_tag(image, previous)
    except PatchkitError:
        pass  # the error being reported matters more than this cleanup


# ----------------------------------------------------------------- through a registry (--via)

VIA_FORMS = "host[:port][/prefix], e.g. 127.0.0.1:5000 or registry.lan:5000/cluster"


@dataclass
class Pushed:
    """What the push to the ``--via`` registry did: layers sent and layers it held already."""

    ref: str
    digest: str
    transfer: Transfer
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return {"ref": self.ref, "digest": self.digest, **self.transfer.to_dict(),
                "seconds": self.seconds}


def check_via(text: str, flag: str = "--via") -> str:
    """``text`` checked to be a registry to copy through (see VIA_FORMS): a host (with a ``.``
    or a port, or ``localhost``) and an optional repository prefix; a usage error otherwise."""
    value = text.strip().rstrip("/")
    host = value.split("/", 1)[0]
    if ("://" in value or not host or host_of(f"{value}/x") != host
            or reference_problem(f"{value}/x:1", digest_ok=False)):
        raise UsageError(f"{flag} {text!r} is not a registry: expected {VIA_FORMS}")
    return value


def via_ref(via: str, image: str) -> str:
    """Where ``image`` goes in the registry ``via``: its path (without its own registry host)
    and tag under ``via``'s host and prefix."""
    repo, tag = split_tag(image)
    first, sep, rest = repo.partition("/")
    path = rest if sep and host_of(repo) == first else repo
    return f"{via}/{path}:{tag}"


def copy_via(source: Engine, image: str, attrs: dict, urls: Sequence[str], via: str, *,
             connect: Callable[[str], Engine], log: Log) -> CopyReport:
    """``copy`` through the registry ``via``: one push, then a pull on each target lacking it."""
    want = fingerprint(attrs)
    ref = via_ref(via, image)
    results: list[TargetResult] = []
    todo: list[tuple[TargetResult, Engine, str | None]] = []
    for url in urls:
        try:
            target = connect(url)
            held = target.content(image)
        except PatchkitError as exc:
            results.append(TargetResult(url, "failed", error=str(exc)))
            continue
        if held is not None and fingerprint(held) == want:
            log(f"{url}: holds {image} with the same content already; nothing pulled")
            results.append(TargetResult(url, "present", want))
            continue
        result = TargetResult(url, "replaced" if held is not None else "copied")
        results.append(result)
        todo.append((result, target, held["Id"] if held is not None else None))
    pushed = None
    if todo:
        try:
            pushed = _push_via(source, image, attrs["Id"], ref, log)
        except PatchkitError as exc:
            for result, _, _ in todo:
                result.status, result.error = "failed", str(exc)
            todo = []
    for result, target, previous in todo:
        started = time.monotonic()
        try:
            assert pushed is not None
            _pull_to(target, image, f"{repository(ref)}@{pushed.digest}", want, previous,
                     result, log, len((attrs.get("RootFS") or {}).get("Layers") or ()))
        except PatchkitError as exc:
            result.status, result.error = "failed", str(exc)
        result.seconds = round(time.monotonic() - started, 2)
    return CopyReport(image, want, results, via=pushed)


def _push_via(source: Engine, image: str, image_id: str, ref: str, log: Log) -> Pushed:
    """Push ``image`` to ``ref`` from ``source``, under a tag of the registry's name that is
    put back as it was afterwards (the source keeps its names)."""
    started = time.monotonic()
    tally = Transfer()
    previous = source.tagged(ref) if ref != image else None
    try:
        if ref != image:
            source.tag(image_id, ref)
        log(f"pushing {image} to {ref} (only the layers the registry lacks)")
        digest = source.push(ref, log, tally=tally)
    except PatchkitError as exc:
        raise ImageError(f"{exc}; nothing was pulled by any target") from None
    finally:
        if ref != image:
            source.restore_tag(ref, previous)
    return Pushed(ref, digest, tally, round(time.monotonic() - started, 2))


def _pull_to(target: Engine, image: str, pinned: str, want: str, previous: str | None,
             result: TargetResult, log: Log, layers: int) -> None:
    """``target`` pulls ``pinned`` (repo@digest), then names it ``image``; unless the tag then
    holds ``want``, the tag is put back as it was."""
    log(f"{result.engine}: pulling {pinned} (only the layers it lacks)")
    try:
        result.pulled = pulled_ = target.pull(pinned, log)
        # an engine that holds every layer names none of them in its progress
        pulled_.present = max(pulled_.present, layers - pulled_.moved)
        pulled = target.inspect(pinned)
        if pulled is None:
            raise ImageError(f"the engine at {result.engine} pulled {pinned} but holds no "
                             "image by that name")
        target.tag(pulled["Id"], image)
        after = target.content(image)
        got = fingerprint(after) if after is not None else None
        if got != want:
            raise ImageError(f"after the pull the engine at {result.engine} holds "
                             f"{got or 'nothing'} under {image}, not {want}; its tag is put "
                             "back as it was")
    except BaseException:
        _put_back(target, image, previous)
        raise
    result.fingerprint = got
