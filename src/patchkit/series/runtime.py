"""Runtime markers judged against a server's logs: did the launch take the paths the patches open?

AST assertions prove that a patch is in the files; a marker proves the server ran it, from the
lines it logs at startup.  Only the markers of patches that are in (``applied`` or ``upstream``
in that checkout or image) count, with the manifest's top-level markers, which always do.

Several logs (rank 0 and rank 1 of one deployment) are judged together: a required line may be
in any of them, a forbidden one in none, and counts are summed over them.  A marker's ``unless``
leaves out each log that has a line matching it (rank 1 runs headless and never logs the API's
startup; a DeepSeek-V4.1 launch never takes a V4-only path).

An ``acceptance:`` marker is judged on the values of vLLM's periodic spec-decode metrics lines
(:mod:`patchkit.acceptance` reads them) rather than on their number: the lines of the judged
logs together must reach its floor.

Pure: the caller reads the logs (files, stdin, a container's log through the image border) and
hands them over as chunks of bytes, which :class:`LogLines` cuts into bounded lines; nothing here
reads, prints or raises for a marker that does not hold.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from patchkit import acceptance, versions
from patchkit.errors import LogError
from patchkit.manifest import Manifest, Marker
from patchkit.manifest.model import quoted

IN_STATUSES = ("applied", "upstream")
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
        return {"patch": self.patch, "log": self.log, "ok": self.ok, "found": self.found,
                "lines": self.lines, "message": self.message, "judged": self.judged}


def patches_in(manifest: Manifest, statuses: Mapping[str, str] | None,
               version: str | None) -> set[str]:
    """The ids of the patches that are in.  With the statuses of an apply report or an image's
    labels: those ``applied`` or ``upstream`` there.  Without (a tree or image patchkit did not
    make): those whose range holds the release found, or all when none was found, as the AST
    assertions judge it."""
    if statuses:
        return {p.id for p in manifest.patches if statuses.get(p.id) in IN_STATUSES}
    return {p.id for p in manifest.patches
            if not version or versions.in_ranges(p.ranges, {"vllm": version})[0]}


def markers_of(manifest: Manifest, patch_ids: set[str]) -> list[ScopedMarker]:
    """The markers that count: those of the patches in ``patch_ids`` in series order, then the
    top-level ones."""
    out = [ScopedMarker(p.id, m) for p in manifest.patches if p.id in patch_ids
           for m in p.runtime]
    return out + [ScopedMarker(None, m) for m in manifest.runtime]


@dataclass
class _Tally:
    """One marker in one log."""

    found: int = 0
    hits: list[Hit] = field(default_factory=list)
    left_out: bool = False   # a line matched the marker's `unless`
    metrics: list[acceptance.LineMetrics] = field(default_factory=list)  # acceptance markers


def judge(markers: Sequence[ScopedMarker], logs: Iterable[Log]) -> list[MarkerResult]:
    """Every marker against all ``logs`` together, in the order of ``markers``."""
    compiled = [(re.compile(s.marker.log), re.compile(s.marker.unless) if s.marker.unless
                 else None) for s in markers]
    keep = [FORBIDDEN_LINES if s.marker.absent else SAMPLES for s in markers]
    names: list[str] = []
    tallies: list[list[_Tally]] = [[] for _ in markers]
    for log in logs:
        names.append(log.name)
        here = [_Tally() for _ in markers]
        for number, raw in enumerate(log.lines, 1):
            text = _ANSI.sub("", raw.rstrip("\r\n"))
            for i, (pattern, unless) in enumerate(compiled):
                if pattern.search(text):
                    tally = here[i]
                    tally.found += 1
                    if len(tally.hits) < keep[i]:
                        tally.hits.append(Hit(log.name, number, _shown(text)))
                    if markers[i].marker.acceptance is not None and \
                            (metrics := acceptance.parse_line(text)) is not None:
                        tally.metrics.append(metrics)
                if unless is not None and not here[i].left_out and unless.search(text):
                    here[i].left_out = True
        for i, tally in enumerate(here):
            tallies[i].append(tally)
    return [_verdict(s, list(zip(names, t)), keep[i]) for i, (s, t)
            in enumerate(zip(markers, tallies))]


def _shown(text: str) -> str:
    return text if len(text) <= HIT_SHOWN else text[:HIT_SHOWN] + "..."


def _verdict(scoped: ScopedMarker, per_log: list[tuple[str, _Tally]], keep: int) -> MarkerResult:
    marker = scoped.marker
    judged = [(name, t) for name, t in per_log if not t.left_out]
    if per_log and not judged:
        return MarkerResult(scoped.patch, marker.log, True, 0, [],
                            f"not judged: every log has a line matching {quoted(marker.unless)}",
                            judged=False, absent=marker.absent)
    found = sum(t.found for _, t in judged)
    hits = [hit for _, t in judged for hit in t.hits][:keep]
    where = _names([name for name, _ in judged]) or "no log"
    left = [name for name, t in per_log if t.left_out]
    aside = f" ({_names(left)} left out: {quoted(marker.unless)})" if left else ""
    times = f"{found} time{'s' if found != 1 else ''}"
    if marker.acceptance is not None:
        ok, message = _acceptance_verdict(marker.acceptance, [m for _, t in judged
                                                              for m in t.metrics], where, aside)
    elif marker.absent:
        ok = found == 0
        if ok:
            message = f"no line matches forbidden {quoted(marker.log)} in {where}{aside}"
        else:
            message = (f"forbidden line {quoted(marker.log)} appears {times} in {where}: "
                       f"{hits[0]}" + (f" (and {found - 1} more)" if found > 1 else ""))
    elif marker.count is not None:
        ok = found == marker.count
        message = (f"{marker.describe()}: found {found} in {where}{aside}" if ok else
                   f"expected {marker.describe()}, found {found} in {where}{aside}")
    else:
        need = marker.minimum or 1
        ok = found >= need
        if ok:
            message = f"{marker.describe()}: found {found} in {where}{aside}"
        elif found == 0:
            message = f"required line {quoted(marker.log)} appears in none of {where}{aside}"
        else:
            message = f"expected {marker.describe()}, found {found} in {where}{aside}"
    return MarkerResult(scoped.patch, marker.log, ok, found, hits, message,
                        absent=marker.absent)


def _acceptance_verdict(floor: acceptance.Floor, lines: list[acceptance.LineMetrics],
                        where: str, aside: str) -> tuple[bool, str]:
    """An acceptance marker: the metrics lines of the judged logs together, held to the
    floor.  No line at all fails (the server logged no spec-decode metrics: stats off, or no
    request served yet); zero drafts fail as inconclusive."""
    if not lines:
        return False, (f"no spec-decode metrics lines in {where}{aside} (vLLM logs one every "
                       "10 s while it serves with speculative decoding and log stats on); "
                       f"{floor.describe()} not shown")
    count = f"{len(lines)} metrics line{'s' if len(lines) != 1 else ''} of {where}{aside}"
    verdict = acceptance.judge(acceptance.from_lines(lines), floor, count)
    return verdict.ok, verdict.message


def _names(names: list[str]) -> str:
    return ", ".join(names)
