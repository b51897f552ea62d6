"""Runtime markers judged against a server's logs: did the launch take the paths the patches open?

AST assertions prove that a patch is in the files; a marker proves the server ran it, from the
lines it logs at startup.  Only the markers of patches that are in (``applied`` or ``upstream``
in that checkout or image) count, with the manifest's top-level markers, which always do.

Several logs (rank 0 and rank 1 of one deployment) are judged together: a required line may be
in any of them, a forbidden one in none, and counts are summed over them.  A marker's ``unless``
leaves out each log that has a line matching it (rank 1 runs headless and never logs the API's
startup; a DeepSeek-V4.1 launch never takes a V4-only path).

An ``acceptance:`` marker is judged on the values of vLLM's periodic spec-decode metrics lines
(:mod:`patchkit.serving.acceptance` reads them) rather than on their number: the lines of the judged
logs together must reach its floor.

A log that holds several server starts (a restart appended to the same file) is judged on its
last start only: the tallies begin anew at each start, and an earlier start's matching lines
are kept only to say that a marker failing now held only before.  A start is judged up to its
stop: from the line where the server says it was asked to stop (SIGINT, SIGTERM), what it logs
while it tears itself down (an ``EngineDeadError`` from the output handler among it) is not
judged; a death logged before that line still is.

An acceptance marker over a start that logged no spec-decode metrics line at all is not yet
judged (``pending``): the server served no drafts, which is a normal moment at startup, not a
failure; the caller decides whether that may pass.

Pure: the caller reads the logs (files, stdin, a container's log through the image border) and
hands them over as chunks of bytes, which :class:`LogLines` cuts into bounded lines; nothing here
reads, prints or raises for a marker that does not hold.
"""

from __future__ import annotations

import dataclasses

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from patchkit.errors import LogError
from patchkit.manifest import VLLM, Manifest, Marker
from patchkit.manifest.model import quoted
from patchkit.serving import acceptance
from patchkit.report import Status

IN_STATUSES = (Status.APPLIED, Status.UPSTREAM)
SAMPLES = 3         # matching lines kept for a required or counted marker
FORBIDDEN_LINES = 20  # matching lines kept for a forbidden one (found says how many in all)

MAX_LINE = 64 * 1024     # bytes of a line judged; a longer one is judged on its first part
MAX_RUN = 1024 * MAX_LINE  # a line with no end past this is not a log (/dev/zero, a core dump)
CUT_SHOWN = 3            # numbers of cut lines a note names
HIT_SHOWN = 400          # characters of a matching line a report shows

# Colour and cursor sequences a server writes when its log is a terminal.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@dataclass(frozen=True)
class Log:
    """One log: ``name`` is how failures call it (a path, ``<stdin>``, ``container:NAME``);
    ``lines`` is read once, each line with or without its line ending."""

    name: str
    lines: Iterable[str]


class LogLines:
    """The lines of a log, from its bytes as they come (a file's reads, an engine's stream):
    each decoded as UTF-8 with bad bytes replaced, without its line end, and at most
    ``MAX_LINE`` bytes long; a longer line is judged on its first ``MAX_LINE`` bytes and
    counted in ``cut``.  Memory stays within a line and a chunk whatever the input; a line that
    runs past ``MAX_RUN`` with no end is a LogError naming ``what`` (the flag that gave it).
    Iterable once."""

    def __init__(self, chunks: Iterable[bytes], what: str) -> None:
        self._chunks = chunks
        self.what = what
        self.cut: list[int] = []   # the numbers of the first CUT_SHOWN lines cut
        self.cut_count = 0

    def __iter__(self) -> Iterator[str]:
        number = 0
        pending = bytearray()   # the line so far; only new chunks are searched for its end
        passed = 0   # bytes of a cut line's rest passed over while looking for its end
        for chunk in self._chunks:
            if passed:
                end = chunk.find(b"\n")
                if end < 0:
                    passed += len(chunk)
                    self._check_run(number, passed)
                    continue
                chunk, passed = chunk[end + 1:], 0
            if b"\n" in chunk:
                head, *whole, tail = chunk.split(b"\n")
                pending += head
                for line in (pending, *whole):
                    number += 1
                    yield self._text(number, line)
                pending = bytearray(tail)
            else:
                pending += chunk
            if len(pending) > MAX_LINE:
                number += 1
                yield self._text(number, pending)
                passed, pending = len(pending) - MAX_LINE, bytearray()
                self._check_run(number, passed)
        if pending:
            yield self._text(number + 1, pending)

    def _text(self, number: int, line: bytes | bytearray) -> str:
        if len(line) > MAX_LINE:
            self.cut_count += 1
            if len(self.cut) < CUT_SHOWN:
                self.cut.append(number)
            line = line[:MAX_LINE]
        return line.decode("utf-8", errors="replace")

    def _check_run(self, number: int, passed: int) -> None:
        if MAX_LINE + passed > MAX_RUN:
            raise LogError(f"{self.what}: line {number} runs on past {_size(MAX_RUN)} with no "
                           "line end: not a text log")

    def note(self, name: str) -> str | None:
        """One line saying which lines of the log ``name`` were cut, or None."""
        if not self.cut_count:
            return None
        if self.cut_count == 1:
            return (f"{name}: line {self.cut[0]} is longer than {_size(MAX_LINE)}; judged on its "
                    f"first {_size(MAX_LINE)}")
        shown = ", ".join(map(str, self.cut)) + (", ..." if self.cut_count > len(self.cut)
                                                 else "")
        return (f"{name}: {self.cut_count} lines are longer than {_size(MAX_LINE)} (lines "
                f"{shown}); each judged on its first {_size(MAX_LINE)}")


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


@dataclass(frozen=True)
class ScopedMarker:
    """A marker with the patch it belongs to (``None`` for the manifest's top level)."""

    patch: str | None
    marker: Marker


@dataclass(frozen=True)
class Hit:
    """A matching line: the log's name, the line's number (from 1) and its text."""

    log: str
    number: int
    text: str

    def __str__(self) -> str:
        return f"{self.log}:{self.number}: {self.text}"


@dataclass
class MarkerResult:
    patch: str | None    # None for a top-level marker
    log: str             # the marker's regular expression
    ok: bool
    found: int           # matching lines over the judged logs
    hits: list[Hit] = field(default_factory=list)  # the first few (forbidden: up to 20)
    message: str = ""
    judged: bool = True  # False when `unless` left every log out
    absent: bool = False
    earlier: list[str] = field(default_factory=list)  # LOG:A-B of earlier starts that matched
    pending: bool = False  # an acceptance floor before any traffic: not yet judged (ok False)
    acceptance: acceptance.Acceptance | None = None  # an acceptance marker's figures
    metrics: list[Hit] = field(default_factory=list)  # ... and the metrics lines they came from

    @property
    def label(self) -> str:
        return self.patch or "series"

    @property
    def lines(self) -> list[str]:
        """``FILE:LINE: text`` of the matching lines kept."""
        return [str(h) for h in self.hits]

    def failure_lines(self) -> list[str]:
        """One line per forbidden line found, ``FILE:LINE: [patch] forbidden 'RE': text``;
        ``[patch] message`` for any other marker that does not hold."""
        if self.ok:
            return []
        if self.absent and self.hits:
            more = self.found - len(self.hits)
            return ([f"{h.log}:{h.number}: [{self.label}] forbidden {quoted(self.log)}: {h.text}"
                     for h in self.hits]
                    + ([f"[{self.label}] ... and {more} more lines matching {quoted(self.log)}"]
                       if more > 0 else []))
        return [f"[{self.label}] {self.message}"]

    def to_dict(self) -> dict:
        out = {"patch": self.patch, "log": self.log, "ok": self.ok, "found": self.found,
               "lines": self.lines, "message": self.message, "judged": self.judged,
               "earlier": self.earlier, "pending": self.pending}
        if self.acceptance is not None:
            out["acceptance"] = {**self.acceptance.to_dict(),
                                 "lines": [str(h) for h in self.metrics]}
        return out


def patches_in(manifest: Manifest, statuses: Mapping[str, Status] | None,
               version: str | None) -> set[str]:
    """The ids of the patches that are in.  With the statuses of an apply report or an image's
    labels: those ``applied`` or ``upstream`` there.  Without (a tree or image patchkit did not
    make): those whose range holds the release found, or all when none was found, as the AST
    assertions judge it."""
    if statuses:
        return {p.id for p in manifest.patches if statuses.get(p.id) in IN_STATUSES}
    return {p.id for p in manifest.patches
            if not version or p.takes_effect({VLLM.name: version})[0]}


def markers_of(manifest: Manifest, patch_ids: set[str]) -> list[ScopedMarker]:
    """The markers that count: those of the patches in ``patch_ids`` in series order, then the
    top-level ones."""
    out = [ScopedMarker(p.id, m) for p in manifest.patches if p.id in patch_ids
           for m in p.runtime]
    return out + [ScopedMarker(None, m) for m in manifest.runtime]


# Where a server start begins, in the words of the releases patchkit supports (0.27.1 to
# 0.33.0).  Rank 0's API server logs its version before anything else of its own
# (log_version_and_model): "vLLM server version X, serving model M", or, with vLLM's own log
# formatter, a logo record (its header alone on the first line, the top row of the logo on the
# next); older releases said "vLLM API server version X".  A headless rank logs nothing of its
# own before its engine config, and only then "Launching vLLM (vX) headless multiproc executor"
# (or "Launching N data parallel engine(s) in headless mode"): so after such a line, the next
# "Resolved architecture" (the first line of the next config) begins the next start, or, in a
# log without config lines, the next launch line.
_VERSION = re.compile(r"\bvLLM (?:API )?server version \S+|(?P<logo>█ +█ +█▄ +▄█)")
_HEADLESS = re.compile(r"Launching vLLM \(v\S+\) headless multiproc executor|"
                       r"Launching \d+ data parallel engine\(s\) in headless mode")
_CONFIG = re.compile(r"\bResolved architecture: ")
# Lines each process logs once per start: an engine core's config, an API server's listen line
# ("Starting vLLM server on ADDRESS"; later vLLM: "Starting vLLM API server N on ADDRESS").  The
# same process logging one again in a start with no version line since began a new start there:
# a log or excerpt without the version lines is still cut, if later than it began.
_ONCE = re.compile(r"Initializing a V1 LLM engine \(v\S+\) with config|"
                   r"Starting vLLM (?:API )?server (?:\d+ )?on ")
# Where a start's stop begins, in the words of every supported release (0.27.1 to 0.34.0): the
# API server's signal handler (vllm/entrypoints/launcher.py, later launchers/launcher.py) logs
# "[shutdown] API server: shutdown triggered" on SIGINT or SIGTERM; an engine core's
# (vllm/v1/engine/core.py) "[shutdown] EngineCore: trigger received signal=SIGINT"; a headless
# rank's (vllm/entrypoints/cli/serve.py) "Received 2 signal." at DEBUG only.  The "[shutdown]"
# steps and the EngineDeadError of the output handler follow.  Not every "[shutdown]" line is a
# stop: "[shutdown] MPClient: engine core exited unexpectedly" is a death.
_STOP = re.compile(r"\[shutdown\] API server: shutdown triggered|"
                   r"\[shutdown\] EngineCore: trigger received signal=\w+|"
                   r"\bReceived \d+ signal\.")
_PROCESS = re.compile(r"\(([\w-]+) pid=\d+\)")   # vLLM's prefix of a child process's lines
_BARE_HEADER = re.compile(r"\[[\w.-]+:\d+\]\s*$")   # a log record's header with no text after


@dataclass
class _StartCut:
    """Where the starts of one log begin, found line by line: the first start begins at line 1
    (what a process logs before its own first line belongs to it), each later one at its
    version line (a logo's header), or at its config line after a headless launch (at the next
    launch line when no config line came between), or where a process logs again a line it logs
    once per start."""

    begun: bool = False      # the current start has logged its version or headless line
    headless: bool = False   # ... its headless launch line
    line: int = 1            # where the current start begins
    count: int = 1
    bare: bool = False       # the line before was a record's bare header
    once: set[tuple[str, str]] = field(default_factory=set)   # _ONCE lines of this start

    def begins(self, number: int, text: str) -> int | None:
        """The line where a new start begins, when line ``number`` shows one (the first
        start's own line does not), else None."""
        # plain substring tests first: most lines are none of these, and this runs on each
        bare, self.bare = self.bare, text.rstrip().endswith("]") and bool(
            _BARE_HEADER.search(text))
        if ("version" in text or "█" in text) and (found := _VERSION.search(text)):
            cut, self.begun, self.headless, self.once = self.begun, True, False, set()
            number -= bool(found["logo"] and bare)
        elif self.headless and "Resolved" in text and _CONFIG.search(text):
            cut, self.headless, self.once = True, False, set()
        elif "Launching" in text and _HEADLESS.search(text):
            # a second launch with no config line since (an excerpt without them) begins there
            cut, self.begun, self.headless = self.headless, True, True
            self.once = set() if cut else self.once
        elif ("Initializing" in text or "Starting" in text) and (once := _ONCE.search(text)):
            process = _PROCESS.search(text)
            key = (once[0].split(" on ")[0], process[1] if process else "")
            cut, self.begun = key in self.once, True
            self.once = {key} if cut else self.once | {key}
        else:
            return None
        if not cut:
            return None
        self.line, self.count = number, self.count + 1
        return number


@dataclass(frozen=True)
class Start:
    """The start of one log that was judged: its ``line`` (from 1) and how many starts the log
    holds (``count``; the earlier ones are not judged); ``stop``, the line where its stop
    began (None: not stopped), and that line's text."""

    log: str
    line: int
    count: int
    stop: int | None = None
    stop_text: str = ""

    def to_dict(self) -> dict:
        return {"log": self.log, "starts": self.count, "line": self.line, "stop": self.stop}

    def note(self) -> str | None:
        """One line for a log with several starts, or stopped, or None."""
        said = []
        if self.count > 1:
            said.append(f"{self.count} server starts; judged on the last, from line {self.line}")
        if self.stop is not None:
            said.append(f"the server was stopped at line {self.stop} ({self.stop_text}); what "
                        "it logged from there on is not judged")
        return f"{self.log}: {'; '.join(said)}" if said else None


@dataclass
class Judgment:
    """The markers' results, and which start of each log they were judged on."""

    results: list[MarkerResult]
    starts: list[Start]


@dataclass
class _Tally:
    """One marker in one start of one log."""

    found: int = 0
    hits: list[Hit] = field(default_factory=list)
    left_out: bool = False   # a line matched the marker's `unless`
    metrics: list[acceptance.LineMetrics] = field(default_factory=list)  # acceptance markers
    metric_lines: list[Hit] = field(default_factory=list)   # ... the lines they were read from
    lines: tuple[int, int] = (1, 1)   # the lines of an earlier start


@dataclass
class _LogTally:
    """What one log says of each marker: its last start's tallies, and for each marker the
    latest earlier start that had matching lines (or None), kept only to say so."""

    name: str
    start: _StartCut
    last: list[_Tally]
    earlier: list[_Tally | None]
    stop: int | None = None   # where the last start's stop began
    stop_text: str = ""

    @property
    def shown(self) -> str:
        return self.name if self.start.count == 1 else f"{self.name} from line {self.start.line}"


def judge(markers: Sequence[ScopedMarker], logs: Iterable[Log]) -> list[MarkerResult]:
    """Every marker against all ``logs`` together, in the order of ``markers``: each log on
    its last server start."""
    return assess(markers, logs).results


def assess(markers: Sequence[ScopedMarker], logs: Iterable[Log]) -> Judgment:
    """As :func:`judge`, with where each log's judged start begins."""
    compiled = [(re.compile(s.marker.log), re.compile(s.marker.unless) if s.marker.unless
                 else None) for s in markers]
    keep = [FORBIDDEN_LINES if s.marker.absent else SAMPLES for s in markers]
    metrics = [s.marker.acceptance is not None for s in markers]
    tallies = [_read(log, compiled, keep, metrics) for log in logs]
    results = [_verdict(s, [(t, t.last[i], t.earlier[i]) for t in tallies], keep[i])
               for i, s in enumerate(markers)]
    return Judgment(results, [Start(t.name, t.start.line, t.start.count, t.stop, t.stop_text)
                              for t in tallies])


def _read(log: Log, compiled, keep: list[int], metrics: list[bool]) -> _LogTally:
    """One pass over ``log``: the tallies are set anew at each start; for an acceptance
    marker (``metrics[i]``) its matching lines' spec-decode values are kept too."""
    start = _StartCut()
    here = [_Tally() for _ in compiled]
    earlier: list[_Tally | None] = [None] * len(compiled)
    stop: int | None = None
    stop_text = ""
    for number, raw in enumerate(log.lines, 1):
        text = _ANSI.sub("", raw.rstrip("\r\n"))
        first = start.line
        if begins := start.begins(number, text):
            # a logo's bare header, the line before, stays with the earlier start's tallies
            earlier = [_ended(t, first, begins - 1) if t.found else e
                       for t, e in zip(here, earlier)]
            here = [_Tally() for _ in compiled]
            stop, stop_text = None, ""
        if stop is not None:
            continue    # the start is stopping: its teardown is no launch to judge
        if "shutdown" in text or "signal" in text:
            if found := _STOP.search(text):
                stop, stop_text = number, found[0]
                continue
        for i, (pattern, unless) in enumerate(compiled):
            if pattern.search(text):
                tally = here[i]
                tally.found += 1
                if len(tally.hits) < keep[i]:
                    tally.hits.append(Hit(log.name, number, _shown(text)))
                if metrics[i] and (values := acceptance.parse_line(text)) is not None:
                    tally.metrics.append(values)
                    tally.metric_lines.append(Hit(log.name, number, _shown(text)))
            if unless is not None and not here[i].left_out and unless.search(text):
                here[i].left_out = True
    return _LogTally(log.name, start, here, earlier, stop, stop_text)


def _ended(tally: _Tally, first: int, last: int) -> _Tally:
    tally.lines = (first, last)
    return tally


def _shown(text: str) -> str:
    return text if len(text) <= HIT_SHOWN else text[:HIT_SHOWN] + "..."


def _verdict(scoped: ScopedMarker, per_log: list[tuple[_LogTally, _Tally, _Tally | None]],
             keep: int) -> MarkerResult:
    marker = scoped.marker
    judged = [(log, t, e) for log, t, e in per_log if not t.left_out]
    if per_log and not judged:
        return MarkerResult(scoped.patch, marker.log, True, 0, [],
                            f"not judged: every log has a line matching {quoted(marker.unless)}",
                            judged=False, absent=marker.absent)
    found = sum(t.found for _, t, _ in judged)
    hits = [hit for _, t, _ in judged for hit in t.hits][:keep]
    where = _names([log.shown for log, _, _ in judged]) or "no log"
    left = [log.shown for log, t, _ in per_log if t.left_out]
    aside = f" ({_names(left)} left out: {quoted(marker.unless)})" if left else ""
    times = f"{found} time{'s' if found != 1 else ''}"
    earlier = [(log, e) for log, _, e in judged if e is not None]
    measured = pending = None
    metric_lines: list[Hit] = []
    if marker.acceptance is not None:
        metric_lines = [h for _, t, _ in judged for h in t.metric_lines]
        ok, message, measured = _acceptance_verdict(
            marker.acceptance, [m for _, t, _ in judged for m in t.metrics], where, aside)
        pending = measured is None
        message += _before(earlier, "not counted")
    elif marker.absent:
        ok = found == 0
        if ok:
            message = (f"no line matches forbidden {quoted(marker.log)} in {where}{aside}"
                       + _before(earlier, "not counted"))
        else:
            message = (f"forbidden line {quoted(marker.log)} appears {times} in {where}: "
                       f"{hits[0]}" + (f" (and {found - 1} more)" if found > 1 else ""))
    else:
        ok = found == marker.count if marker.count is not None else found >= (marker.minimum
                                                                              or 1)
        if ok:
            message = f"{marker.describe()}: found {found} in {where}{aside}"
        elif found == 0 and marker.count is None:
            message = (f"required line {quoted(marker.log)} appears in none of {where}{aside}"
                       + (f": only in an earlier start{_before(earlier)}" if earlier else ""))
        else:
            message = (f"expected {marker.describe()}, found {found} in {where}{aside}"
                       + _before(earlier, "not counted"))
    earlier_lines = [f"{log.name}:{e.lines[0]}-{e.lines[1]}" for log, e in earlier]
    return MarkerResult(scoped.patch, marker.log, ok, found, hits, message,
                        absent=marker.absent, earlier=earlier_lines, pending=bool(pending),
                        acceptance=measured, metrics=metric_lines)


def _before(earlier: list[tuple[_LogTally, _Tally]], aside: str = "") -> str:
    """`` (lines A-B of LOG, ...)``: the earlier starts that had matching lines; with
    ``aside``, how many lines they had and the aside."""
    if not earlier:
        return ""
    spans = ", ".join(f"lines {e.lines[0]}-{e.lines[1]} of {log.name}" for log, e in earlier)
    if not aside:
        return f" ({spans})"
    found = sum(e.found for _, e in earlier)
    return f" ({found} in an earlier start, {spans}, {aside})"


NOT_YET_JUDGED = "not yet judged (no spec-decode metrics lines: the server has served no drafts)"
# the same floor when traffic is required (a check after smoke): judged, and failed
NO_TRAFFIC = ("failed: no spec-decode metrics lines, and traffic was required (the server has "
              "served no drafts)")


def traffic_required(result: MarkerResult) -> MarkerResult:
    """``result`` when the logs must show traffic: a floor not yet judged is a failure, said
    as one, never as "not yet judged"."""
    if not result.pending:
        return result
    return dataclasses.replace(result, pending=False,
                               message=result.message.replace(NOT_YET_JUDGED, NO_TRAFFIC))


def _acceptance_verdict(floor: acceptance.Floor, lines: list[acceptance.LineMetrics],
                        where: str, aside: str
                        ) -> tuple[bool, str, acceptance.Acceptance | None]:
    """An acceptance marker: the metrics lines of the judged logs together, held to the
    floor, and the figures they give.  No line at all is not yet judged (figures None: vLLM
    logs one every 10 s while it serves drafts, with log stats on); zero drafts fail as
    inconclusive."""
    if not lines:
        return False, f"{floor.describe()} in {where}{aside}: {NOT_YET_JUDGED}", None
    count = f"{len(lines)} metrics line{'s' if len(lines) != 1 else ''} of {where}{aside}"
    measured = acceptance.from_lines(lines)
    verdict = acceptance.judge(measured, floor, count)
    return verdict.ok, verdict.message, measured


def _names(names: list[str]) -> str:
    return ", ".join(names)
