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
"""

from __future__ import annotations

import functools
import re
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from patchkit.errors import ImageError, PatchkitError, UsageError
from patchkit.image.docker import Engine, engine_url
from patchkit.image.layer import ArchiveFacts, fingerprint, relayed_export
from patchkit.imageref import check_reference
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

    @property
    def ok(self) -> bool:
        return self.status != "failed"

    def to_dict(self) -> dict:
        data = {"engine": self.engine, "status": self.status, "fingerprint": self.fingerprint}
        if self.error is not None:
            data["error"] = self.error
        data["sent"] = self.sent.to_dict()
        data["seconds"] = self.seconds
        return data


@dataclass
class CopyReport:
    """What ``copy-image`` did; ``to_dict`` is the ``--format json`` shape."""

    image: str
    fingerprint: str
    targets: list[TargetResult]

    @property
    def ok(self) -> bool:
        return all(t.ok for t in self.targets)

    def to_dict(self) -> dict:
        return {"ok": self.ok, "image": self.image, "fingerprint": self.fingerprint,
                "targets": [t.to_dict() for t in self.targets]}


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
        timeout: float = DEFAULT_TIMEOUT) -> CopyReport:
    """Copy ``image`` from ``source`` (default: the engine DOCKER_HOST names) to each target;
    ``timeout`` bounds each silence of an engine."""
    if re.fullmatch(r"(sha256:)?[0-9a-f]{12,64}", image):
        raise UsageError(f"IMAGE {image!r} is an image id; copy-image takes a tag, which the "
                         "targets then hold")
    check_reference("IMAGE", image, digest_ok=False)
    urls = check_targets(targets)
    if not urls:
        raise UsageError("give the engines to copy to with --to ENGINE")
    source = source or Engine.connect(timeout=timeout)
    return copy(source, image, urls, connect=connect, log=log, timeout=timeout)


def copy(source: Engine, image: str, urls: Sequence[str], *,
         connect: Callable[[str], Engine] | None = None, log: Log = lambda m: None,
         timeout: float = DEFAULT_TIMEOUT) -> CopyReport:
    """``run`` once the targets are checked and the source is connected (build-image's
    ``--copy-to`` comes in here)."""
    connect = connect or functools.partial(Engine.connect, timeout=timeout)
    attrs = source.content(image)
    if attrs is None:
        raise ImageError(f"no image {image} on the engine at {source.host}")
    want = fingerprint(attrs)
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
