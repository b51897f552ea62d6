"""The same image content on other engines (``copy-image``, ``build-image --copy-to``).

Content is judged by fingerprint (``facts.fingerprint``: the config digest and the layers'
diff_ids), never by image id, which differs between snapshotters.  For each target:

* the same content under the tag already: nothing is sent (``present``);
* else the target is asked which of the image's layers it holds (by diff_id, from the bottom:
  ``Engine.layers_held``), and the image streams from the source engine (DOCKER_HOST) into
  the target's load without those layers, with no file in between (``copied``, or
  ``replaced`` when the tag named other content).  A store that cannot take a partial load
  (containerd's, Podman's) gets the whole image, and the log says so; a target that holds the
  content under another name only gets the tag;
* then the target is read again: unless it now holds the fingerprint under the tag, the copy
  fails and the target's tag is put back as it was.

Where the docker CLI reaches both sides (``Engine.cli``), the export is a ``docker save``
child and each load a ``docker load`` child (over the target's ssh), and ``engines.pipes``
moves the bytes between their pipes in the kernel: spliced whole for a full copy, or with
only the tar headers and small JSON members read for a partial one.  Else the export and the
loads go through the Docker SDK, relayed by ``archive.relay``.  A failed target is one line that
ends by saying its tag is as it was.

A copy of a build's moving tag carries its immutable tag (``labels.immutable_tag``) along:
each target that holds the content afterwards gets that tag on it too.

Targets run in parallel, each in a thread of its own with its own deadline; targets that need
the same layers share one export of the source, teed to their loads.  A target that cannot be
reached, or refuses the load, or whose link drops, fails alone: the others go on.  A load that
did not complete tags nothing, so such a target keeps what it had under the tag.

With ``via`` (a registry, ``host[:port][/prefix]``) the image goes through the registry instead
of the link: the source engine pushes it there (the registry is asked for each layer, and
only the ones it lacks are sent; nothing is tagged there until every blob is in), then each
target that lacks the content pulls it by digest (fetching only the layers it lacks), and it
is tagged under the image's own name there and checked by fingerprint as above.  A refused
push fails every target that needed it, with nothing changed on any of them.
"""

from __future__ import annotations

import functools
import queue
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Sequence

from patchkit import progress
from patchkit.errors import ImageError, PatchkitError, UsageError
from patchkit.image import labels
from patchkit.engines import pipes
from patchkit.engines.docker import LOAD_PATIENCE, Engine, engine_url
from patchkit.engines.facts import Inspected, Prefix, Transfer
from patchkit.engines.facts import fingerprint
from patchkit.engines.sshlink import SshLink
from patchkit.formats.archive import (CHUNK, COMPRESSIONS, ArchiveFacts, compressed, relay,
                                      relayed_export, zstd_module)
from patchkit.imageref import host_of, reference_problem, repository, split_tag
from patchkit.process import Piped
from patchkit.report import Word
from patchkit.timeouts import DEFAULT_TIMEOUT

Log = Callable[[str], None]


class CopyStatus(Word):
    """What a copy did at one target."""

    COPIED = "copied"        # the target lacked the image; it holds it now
    PRESENT = "present"      # it held that content under the tag already; nothing sent
    REPLACED = "replaced"    # the tag named other content there, and now names this
    FAILED = "failed"        # unreachable, refused, or the link was lost; its tag as it was


STATUSES = tuple(s.value for s in CopyStatus)
DEFAULT_COMPRESS = "none"


@dataclass(frozen=True)
class How:
    """How a copy goes: through the registry ``via`` (None: over the link), only measured
    (``dry_run``), and with what compression on the link."""

    via: str | None = None
    dry_run: bool = False
    compress: str = DEFAULT_COMPRESS


@dataclass
class Sent:
    """What travelled to a target: the archive's bytes (as sent, after any compression) and,
    of the archive, the layers'; and the layers left out because the target holds them."""

    bytes: int = 0
    layer_bytes: int = 0
    layers: int = 0
    layers_skipped: int = 0
    skipped_bytes: int = 0
    compress: str = "none"

    def to_dict(self) -> dict:
        return {"bytes": self.bytes, "layer_bytes": self.layer_bytes, "layers": self.layers,
                "layers_skipped": self.layers_skipped, "skipped_bytes": self.skipped_bytes,
                "compress": self.compress}


@dataclass
class Plan:
    """What a target needs, found before anything is sent (``--dry-run`` prints it)."""

    action: str                 # present | tag | send
    layers: int = 0             # the image's layers
    held: int = 0               # of them, from the bottom, what the target's store holds
    partial: bool = True        # whether its store takes a load without the held layers
    why: str = ""
    missing_bytes: int | None = None   # the layer files to send, when measured

    @property
    def skipped(self) -> int:
        return self.held if self.partial and self.action == "send" else 0

    def to_dict(self) -> dict:
        return {"action": self.action, "layers": self.layers, "layers_present": self.held,
                "layers_missing": self.layers - self.held, "layers_to_send":
                self.layers - self.skipped if self.action == "send" else 0,
                "partial_load": self.partial, "missing_bytes": self.missing_bytes,
                "why": self.why}


@dataclass
class TargetResult:
    engine: str
    status: CopyStatus
    fingerprint: str | None = None      # what the target holds under the tag afterwards
    error: str | None = None
    sent: Sent = field(default_factory=Sent)
    seconds: float = 0.0
    plan: Plan | None = None
    pulled: Transfer | None = None      # with --via: what the target fetched from the registry

    @property
    def ok(self) -> bool:
        return self.status is not CopyStatus.FAILED

    def to_dict(self) -> dict:
        data = {"engine": self.engine, "status": self.status, "fingerprint": self.fingerprint}
        if self.error is not None:
            data["error"] = self.error
        data["sent"] = self.sent.to_dict()
        data["seconds"] = self.seconds
        if self.plan is not None:
            data["plan"] = self.plan.to_dict()
        if self.pulled is not None:
            data["pulled"] = self.pulled.to_dict()
        return data


@dataclass
class CopyReport:
    """What ``copy-image`` did; ``to_dict`` is the ``--format json`` shape."""

    image: str
    fingerprint: str
    targets: list[TargetResult]
    dry_run: bool = False
    via: Pushed | None = None           # with --via, when a target needed the push

    @property
    def ok(self) -> bool:
        return all(t.ok for t in self.targets)

    def to_dict(self) -> dict:
        data = {"ok": self.ok, "image": self.image, "fingerprint": self.fingerprint,
                "dry_run": self.dry_run, "targets": [t.to_dict() for t in self.targets]}
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


@contextmanager
def dialed(urls: Sequence[str], timeout: float,
           connect: Callable[[str], Engine] | None = None) -> Iterator[Callable[[str], Engine]]:
    """How ``copy`` reaches each of ``urls``: ``connect`` when given, else ``Engine.connect``
    over the ssh connections started here, at once, for the ssh:// ones, so that ssh connects
    while the source is asked (the SDK imported, the image read); those never taken end
    with the block.  A target that cannot be dialled is connected as before, and fails
    there."""
    if connect is not None:
        yield connect
        return
    links: dict[str, SshLink | None] = {}

    def reach(url: str) -> Engine:
        link = links.pop(url, None)
        try:
            return Engine.connect(url, timeout=timeout, link=link)
        except BaseException:
            if link is not None:
                link.close()
            raise

    try:
        for url in urls:
            try:
                links[url] = Engine.dial(url, timeout)
            except PatchkitError:
                pass   # connecting it says the same, as that target's failure
        yield reach
    finally:
        for link in list(links.values()):
            if link is not None:
                link.close()


def check_compress(how: str) -> str:
    if how not in COMPRESSIONS:
        raise UsageError(f"--compress {how!r}: expected one of {', '.join(COMPRESSIONS)}")
    if how == "zstd" and zstd_module() is None:
        raise UsageError("--compress zstd needs the zstandard package, which is not installed "
                         "(pip install zstandard); --compress gzip needs nothing")
    return how


def copy(source: Engine, image: str, urls: Sequence[str], *,
         connect: Callable[[str], Engine] | None = None, log: Log = lambda m: None,
         timeout: float = DEFAULT_TIMEOUT, via: str | None = None, dry_run: bool = False,
         compress: str = DEFAULT_COMPRESS) -> CopyReport:
    """Copy ``image`` from ``source`` to each engine of ``urls``, once the targets (and ``via``,
    see ``check_via``) are checked and the source is connected; through the registry ``via``
    when given.  ``connect`` reaches a target (default: ``Engine.connect``); ``timeout`` bounds
    each silence of an engine."""
    connect = connect or functools.partial(Engine.connect, timeout=timeout)
    content = source.content(image)
    if content is None:
        raise ImageError(f"no image {image} on the engine at {source.host}")
    if via:
        return copy_via(source, image, content, urls, via, connect=connect, log=log)
    job = _Job(source, image, content, fingerprint(content), log, timeout, compress)
    targets = [_Target(url) for url in urls]
    job.speculate = not dry_run
    try:
        _each([functools.partial(job.plan, t, connect) for t in targets], job.stop)
        if dry_run:
            job.measure([t for t in targets if t.result is None and t.plan.action == "send"])
        else:
            groups: dict[tuple[int, bool], list[_Target]] = {}
            for t in targets:
                if t.result is None and t.plan.action == "send":
                    groups.setdefault((t.plan.skipped, t.plan.partial), []).append(t)
            jobs = [functools.partial(job.finish, t, None, {}) for t in targets
                    if t.result is None and t.plan.action == "tag"]
            jobs += [functools.partial(job.send, g) for g in groups.values()]
            _each(jobs, job.stop)
    except BaseException:
        job.stop.set()   # a signal: every stream ends, every target's tag is put back
        job.end_children(close=False)   # a stuck stream's thread may still use its pipes
        _close(t.engine for t in targets)   # and their ssh sessions end with the run
        raise
    finally:
        job.end_children()
    if not dry_run:
        also = companions(image, content)
        for t in targets:
            if t.result is not None and t.result.ok and t.engine is not None:
                _carry(t.engine, t.result, image, also, log)
    _close(t.engine for t in targets)
    return CopyReport(image, job.want, [t.report(dry_run) for t in targets], dry_run)


def companions(image: str, content: Inspected) -> list[str]:
    """The tags a copy of ``image`` carries with it: a build's immutable tag, when ``image``
    is its moving tag and the source holds both (``labels.immutable_tag``)."""
    facts = labels.ImageFacts.from_labels(content.labels)
    if facts.patchset is None or labels.moving_of(image) is not None:
        return []
    fixed = labels.immutable_tag(image, content.labels, content.id)
    return [fixed] if fixed in content.repo_tags else []


def _carry(target: Engine, result: TargetResult, image: str, tags: Sequence[str], log: Log
           ) -> None:
    """``tags`` put on the image the target now holds under ``image`` (proven by fingerprint
    already); a target that would not take one fails, its copy of ``image`` kept."""
    if not tags:
        return
    try:
        held = target.tagged(image)
        for tag in tags:
            if held is not None and target.tagged(tag) != held:
                target.tag(held, tag)
                log(f"{result.engine}: tagged {tag}")
    except PatchkitError as exc:
        result.status = CopyStatus.FAILED
        result.error = f"{exc}; {image} is there, {tags[0]} is not"


def _each(calls: Sequence[Callable[[], None]], stop: threading.Event, grace: float = 1.0
          ) -> None:
    """Each call in a thread of its own, and the wait for them all; the first error of one is
    raised here.  A signal during the wait sets ``stop`` and leaves after at most ``grace``
    seconds more: the threads are daemons, so one stuck writing to a link that stalled does
    not hold the run (its load never completes, and so tags nothing)."""
    errors: list[BaseException] = []

    def call(f: Callable[[], None]) -> None:
        try:
            f()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=call, args=(f,), daemon=True) for f in calls]
    for th in threads:
        th.start()
    try:
        for th in threads:
            th.join()
    except BaseException:
        stop.set()
        until = time.monotonic() + grace
        for th in threads:
            th.join(max(0.0, until - time.monotonic()))
        raise
    if errors:
        raise errors[0]


@dataclass
class _Target:
    url: str
    engine: Engine | None = None
    plan: Plan | None = None
    held: Inspected | None = None       # what the tag named before (content), None: nothing
    same_id: str | None = None      # an image of the same content under another name
    result: TargetResult | None = None
    started: float = field(default_factory=time.monotonic)
    early_load: Piped | None = None   # its load, started while it was asked what it holds

    def fail(self, exc: BaseException) -> None:
        self.result = TargetResult(self.url, CopyStatus.FAILED, error=str(exc), plan=self.plan)

    def report(self, dry_run: bool) -> TargetResult:
        if self.result is None:   # a dry run: what would be
            p = self.plan
            status = (CopyStatus.PRESENT if p.action == "present" else
                      CopyStatus.REPLACED if self.held else CopyStatus.COPIED)
            self.result = TargetResult(self.url, status, plan=p)
        self.result.seconds = round(time.monotonic() - self.started, 2)
        return self.result


_PODMAN_REFUSAL = "Some layer tarfiles are missing in the tarball"


class _Job:
    """One copy of one image to many targets: the source, what it holds, and the deadline."""

    def __init__(self, source: Engine, image: str, content: Inspected, want: str, log: Log,
                 timeout: float, compress: str) -> None:
        self.source, self.image, self.content, self.want = source, image, content, want
        self.diff_ids = list(content.diff_ids)
        self.log, self.timeout, self.compress = log, timeout, compress
        self.stop = threading.Event()
        self._prefixes: list[Prefix] | None = None
        self._lock = threading.Lock()
        self._early: Piped | None = None
        self._children: list[Piped] = []
        self._started = False
        self.speculate = False   # start the export and the loads early (see start_early)

    # The export and the loads start while the targets are asked which layers they hold (a
    # second or so over ssh, and more on a busy store, against seconds of streaming): their
    # children start, ssh connects, the engine prepares its export (a classic store writes it
    # out before the first byte), and the first megabyte waits in the pipes.  Only once a
    # target is known to lack the content: a run that finds it present everywhere costs the
    # source nothing.  A target that then needs nothing has its load ended unfed (an empty
    # load loads nothing).

    def _child(self, start: Callable[[], Piped]) -> Piped:
        proc = start()
        with self._lock:
            self._children.append(proc)
        return proc

    def start_early(self, t: _Target) -> None:
        if not (self.speculate and self.source.cli and t.engine.cli):
            return
        with self._lock:
            first, self._started = not self._started, True
        try:
            if first:
                self._early = self._child(functools.partial(self.source.export_piped,
                                                            self.image))
            t.early_load = self._child(t.engine.load_piped)
        except PatchkitError:
            pass   # started again when needed, and then its error is told

    def take_export(self) -> Piped:
        with self._lock:
            early, self._early = self._early, None
        return early if early is not None else self._child(
            functools.partial(self.source.export_piped, self.image))

    def take_load(self, t: _Target) -> Piped:
        early, t.early_load = t.early_load, None
        return early if early is not None else self._child(t.engine.load_piped)

    def end_children(self, close: bool = True) -> None:
        """Every export and load child ended: those never used, and, after an interruption,
        those a stuck stream still holds (no child outlives the run)."""
        with self._lock:
            children, self._children, self._early = self._children, [], None
        for proc in children:
            proc.end(close)

    def prefixes(self) -> list[Prefix]:
        """The source's images that hold a prefix of the image's layers (its base), once:
        what each target is asked for by name before it is asked for all it holds."""
        with self._lock:
            if self._prefixes is None:
                self._prefixes = self.source.prefixes(self.diff_ids, self.content.size)
            return self._prefixes

    def plan(self, t: _Target, connect: Callable[[str], Engine]) -> None:
        try:
            t.engine = connect(t.url)
            t.held = t.engine.content(self.image)
            t.plan = self._plan_for(t)
            self.log(f"{t.url}: {t.plan.why}")
            if t.plan.action == "present":
                t.result = TargetResult(t.url, CopyStatus.PRESENT, self.want, plan=t.plan)
        except PatchkitError as exc:
            # a target asked and then lost has had nothing sent
            t.fail(exc if t.engine is None else ImageError(f"{exc}; its tag is as it was"))

    def _plan_for(self, t: _Target) -> Plan:
        n = len(self.diff_ids)
        if t.held is not None and fingerprint(t.held) == self.want:
            return Plan("present", n, n, why=f"holds {self.image} with the same content "
                        "already; nothing sent")
        store = t.engine.store()
        same = (t.engine.content(self.content.config_digest)
                if store.ids_are_config_digests else None)
        if same is not None and fingerprint(same) == self.want:
            t.same_id = same.id
            return Plan("tag", n, n, why=f"holds this content under another name; tagging it "
                        f"{self.image}, nothing sent")
        self.start_early(t)
        held = t.engine.layers_held(self.diff_ids, self.prefixes())
        if not held:
            why = f"holds none of the {n} layers: the whole image goes"
        elif not store.partial_load:
            refusal = f' ("{_PODMAN_REFUSAL}")' if store.kind == "containers-storage" else ""
            why = (f"{store} cannot take a partial load{refusal}: it holds {held} of the "
                   f"{n} layers, and the whole image goes instead")
        else:
            why = (f"holds {held} of the {n} layers: the other {n - held} go, with the config "
                   "and the manifest")
        return Plan("send", n, held, store.partial_load, why)

    def _stream(self, held: Sequence[str], lean: bool, box: dict,
                where: str) -> Iterator[bytes]:
        box["facts"], box["wire"] = ArchiveFacts(), [0]
        archive = relayed_export(self.source.export(self.image), box["facts"], held,
                                 self.diff_ids, lean)
        shown = progress.transfer(f"{self.image} to {where}", "sent")
        ok = False
        try:
            for chunk in compressed(_batched(archive), self.compress, box["wire"]):
                if self.stop.is_set():
                    raise ImageError("interrupted; the load is abandoned")
                yield chunk
                shown.update(box["wire"][0], None)
            ok = True
        finally:
            shown.close(ok)

    def send(self, group: list[_Target]) -> None:
        held = self.diff_ids[:group[0].plan.skipped]
        lean = group[0].plan.partial   # a classic store: its load reads no legacy files
        box: dict = {}
        for t in group:
            self.log(f"{t.url}: streaming {self.image} from the engine at {self.source.host}"
                     + (f" (one export for {len(group)} targets)" if len(group) > 1 else ""))
        if self.source.cli and all(t.engine.cli for t in group):
            self._send_piped(group, held, lean)
            return
        if len(group) == 1:
            t = group[0]
            self.finish(t, lambda: t.engine.load(lambda: self._stream(held, lean, box, t.url),
                                                 self.content.config_digest, self.diff_ids,
                                                 self.log), box)
            return
        streams = _tee(self._stream(held, lean, box, f"{len(group)} targets"), len(group),
                       self.timeout)
        threads = [threading.Thread(target=self.finish, daemon=True, args=(
            t, functools.partial(t.engine.load, s, self.content.config_digest, self.diff_ids,
                                 self.log), box)) for t, s in zip(group, streams)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()

    def _send_piped(self, group: list[_Target], held: Sequence[str], lean: bool) -> None:
        """``send`` through the docker CLI: ``docker save`` here, ``docker load`` on each
        target (over its ssh), the bytes between them moved by ``pipes.Pump``: spliced
        whole when the targets hold none of the layers (or cannot take fewer), else relayed
        without the layers they hold."""
        box: dict = {"facts": ArchiveFacts(), "wire": [0], "whole": not held}
        loads = {}
        for t in group:
            try:
                loads[t.url] = self.take_load(t)
            except PatchkitError as exc:
                self.finish(t, functools.partial(_raise, exc), box)
        live = [t for t in group if t.url in loads]
        if not live:
            return
        failure: PatchkitError | None = None
        pump = export = None
        where = live[0].url if len(live) == 1 else f"{len(live)} targets"
        shown = progress.transfer(f"{self.image} to {where}", "sent")
        try:
            export = self.take_export()
            pump = pipes.Pump(export.fd, [loads[t.url].fd for t in live], timeout=self.timeout,
                               first=self.timeout * LOAD_PATIENCE, stop=self.stop,
                               compress=self.compress,
                               what=f"the export from the engine at {self.source.host}",
                               names=[f"the load at {t.url}" for t in live],
                               on_wire=lambda n: shown.update(n, None))
            try:
                if held:
                    pipes.relay(pump, box["facts"], held, self.diff_ids, lean)
                else:
                    pipes.whole(pump)
            finally:
                pump.close()
                box["wire"][0] = pump.wire
            box["complete"] = True   # every byte of the archive went to the loads still live
            self.source.exported(export, self.timeout)
        except PatchkitError as exc:
            failure = exc
            if (export is not None and not self.stop.is_set() and (pump is None or pump.live())
                    and export.ended_badly(1.0)):
                try:   # the export's own words say more than a stream that ended early
                    self.source.exported(export, self.timeout)
                except PatchkitError as told:
                    failure = told
        finally:
            if export is not None and (failure is not None or export.proc.poll() is None):
                export.end()
        # the export failed, or was stopped: no load may complete; a load that broke says why
        abandon = failure is not None and (pump is None or bool(pump.live()))
        for t in live:
            proc = loads[t.url]
            fd = proc.fd
            stalled = pump is not None and fd in pump.broken and pump.broken[fd].stalled
            if abandon or stalled:
                proc.end()
                why = failure if abandon else ImageError(str(pump.broken[fd]))
                loads[t.url] = functools.partial(_raise, why)
            else:
                proc.close()
                loads[t.url] = functools.partial(self._loaded, t, proc, box["wire"][0])
        threads = [threading.Thread(target=self.finish, daemon=True, args=(t, loads[t.url], box))
                   for t in live]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        # "sent" once the loads took it: a load that failed after the last byte sent nothing
        shown.close(failure is None and all(t.result is not None and t.result.ok
                                            for t in live))

    def _loaded(self, t: _Target, proc, sent: int) -> str:
        try:
            return t.engine.loaded(proc, self.content.config_digest, self.diff_ids, self.timeout,
                                   sent)
        finally:
            for line in proc.err.decode(errors="replace").splitlines():
                if line.strip():
                    self.log(f"{t.url}: {line.strip()}")

    def finish(self, t: _Target, load: Callable[[], str] | None, box: dict) -> None:
        """The load (or the tag), then the check that the target holds the content."""
        previous = t.held.id if t.held is not None else None
        as_it_was = True
        try:
            try:
                held_as = None
                if t.plan.action == "tag":
                    t.engine.tag(t.same_id, self.image)
                elif load is not None:
                    held_as = load()
                after = t.engine.content(self.image)
                if after is None and held_as:
                    # The export named no tag (an image given by id), or the engine did not
                    # tag it.
                    t.engine.tag(held_as, self.image)
                    after = t.engine.content(self.image)
                got = fingerprint(after) if after is not None else None
                if got != self.want:
                    raise ImageError(f"after the load the engine at {t.url} holds "
                                     f"{got or 'nothing'} under {self.image}, not {self.want}")
            except BaseException:
                # a load whose archive never ended cannot have tagged anything
                as_it_was = (_put_back(t.engine, self.image, previous)
                             or not box.get("complete"))
                raise
        except PatchkitError as exc:
            self.log(f"{t.url}: {exc}")
            t.fail(ImageError(f"{exc}; " + ("its tag is as it was" if as_it_was else
                                            f"whether its tag is as it was could not be "
                                            f"checked: see 'docker image inspect {self.image}' "
                                            "there")))
            return
        facts, wire = box.get("facts") or ArchiveFacts(), box.get("wire") or [0]
        if box.get("whole"):   # spliced, never parsed: the layers as the source counts them
            sent = Sent(wire[0], self.content.size or 0, len(self.diff_ids), 0, 0,
                        self.compress)
        else:
            sent = Sent(wire[0], facts.layer_bytes(), facts.layer_count(), len(facts.left_out),
                        facts.left_out_bytes(), self.compress if load else "none")
        t.result = TargetResult(t.url, CopyStatus.REPLACED if t.held is not None
                                else CopyStatus.COPIED, got,
                                sent=sent, plan=t.plan)

    def measure(self, targets: list[_Target]) -> None:
        """For a dry run: the bytes of the layer files each target lacks, from one pass over
        the source's export on this side of the link."""
        if not targets:
            return
        facts = ArchiveFacts()
        for _ in relay(self.source.export(self.image), facts, layers=self.diff_ids):
            if self.stop.is_set():
                raise ImageError("interrupted")
        known = len(facts.positions) == len(self.diff_ids)
        for t in targets:
            t.plan.missing_bytes = (sum(v for k, v in facts.positions.items()
                                        if k >= t.plan.skipped) if known else None)


def _raise(exc: BaseException) -> str:
    raise exc


def _batched(chunks: Iterable[bytes], size: int = CHUNK) -> Iterator[bytes]:
    """``chunks`` in pieces of at least ``size`` bytes (but the last): the relay gives each
    tar header and small member on its own, and over ssh each write is a packet of its own,
    with its framing and a hand-over to ssh."""
    buf = bytearray()
    for chunk in chunks:
        if not buf and len(chunk) >= size:
            yield chunk
            continue
        buf += chunk
        if len(buf) >= size:
            yield bytes(buf)
            buf.clear()
    if buf:
        yield bytes(buf)


def _tee(chunks: Iterable[bytes], n: int, timeout: float) -> list[Iterator[bytes]]:
    """``n`` streams of the one stream ``chunks``, read once: a reader that stops, or lags by
    more than ``timeout``, is let go and the others go on."""
    queues = [queue.Queue(maxsize=16) for _ in range(n)]
    alive = [True] * n
    end = object()

    def produce() -> None:
        item: object = end
        try:
            for chunk in chunks:
                for i, q in enumerate(queues):
                    if alive[i]:
                        try:
                            q.put(chunk, timeout=timeout)
                        except queue.Full:
                            alive[i] = False
                if not any(alive):
                    return
        except BaseException as exc:  # handed to every reader, whose load then fails
            item = exc
        for i, q in enumerate(queues):
            if alive[i]:
                try:
                    q.put(item, timeout=timeout)
                except queue.Full:
                    pass

    def consume(i: int) -> Iterator[bytes]:
        try:
            while True:
                try:
                    item = queues[i].get(timeout=timeout)
                except queue.Empty:
                    raise ImageError(f"the source's export gave nothing for {timeout:g} s") from None
                if item is end:
                    return
                if isinstance(item, BaseException):
                    raise item if isinstance(item, ImageError) else ImageError(str(item))
                yield item
        finally:
            alive[i] = False

    threading.Thread(target=produce, daemon=True).start()
    return [consume(i) for i in range(n)]


def _close(engines: Iterable[Engine | None]) -> None:
    """The targets let go once every stream and put-back is done (their ssh sessions end)."""
    for engine in engines:
        if engine is not None:
            engine.close()


def _put_back(target: Engine, image: str, previous: str | None) -> bool:
    """The target's tag as it was before the copy: on ``previous``, or nowhere; whether it
    was seen to be so (a link that is gone cannot tell)."""
    try:
        if target.tagged(image) != previous:
            target.restore_tag(image, previous)
            return target.tagged(image) == previous
        return True
    except PatchkitError:
        return False  # the error being reported matters more than this cleanup


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


def copy_via(source: Engine, image: str, content: Inspected, urls: Sequence[str], via: str, *,
             connect: Callable[[str], Engine], log: Log) -> CopyReport:
    """``copy`` through the registry ``via``: one push, then a pull on each target lacking it."""
    want = fingerprint(content)
    ref = via_ref(via, image)
    results: list[TargetResult] = []
    todo: list[tuple[TargetResult, Engine, str | None]] = []
    engines: list[Engine] = []
    held_by: list[tuple[TargetResult, Engine]] = []
    for url in urls:
        try:
            target = connect(url)
            engines.append(target)
            held = target.content(image)
        except PatchkitError as exc:
            results.append(TargetResult(url, CopyStatus.FAILED, error=str(exc)))
            continue
        if held is not None and fingerprint(held) == want:
            log(f"{url}: holds {image} with the same content already; nothing pulled")
            results.append(TargetResult(url, CopyStatus.PRESENT, want))
            held_by.append((results[-1], target))
            continue
        result = TargetResult(url, CopyStatus.REPLACED if held is not None else CopyStatus.COPIED)
        results.append(result)
        held_by.append((result, target))
        todo.append((result, target, held.id if held is not None else None))
    pushed = None
    if todo:
        try:
            pushed = _push_via(source, image, content.id, ref, log)
        except PatchkitError as exc:
            for result, _, _ in todo:
                result.status, result.error = CopyStatus.FAILED, str(exc)
            todo = []
    for result, target, previous in todo:
        started = time.monotonic()
        try:
            assert pushed is not None
            _pull_to(target, image, f"{repository(ref)}@{pushed.digest}", want, previous,
                     result, log, len(content.diff_ids))
        except PatchkitError as exc:
            result.status, result.error = CopyStatus.FAILED, str(exc)
        result.seconds = round(time.monotonic() - started, 2)
    also = companions(image, content)
    for (result, target) in held_by:
        if result.ok:
            _carry(target, result, image, also, log)
    _close(engines)
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
        target.tag(pulled.id, image)
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
