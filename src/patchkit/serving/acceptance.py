"""Speculative-decoding acceptance: what it is, how it is read from vLLM, and how it is judged.

One value, :class:`Acceptance`, whether it comes from ``/metrics`` counters over a request
(``patchkit smoke``) or from the periodic spec-decode metrics lines of a server's log (the
``acceptance:`` runtime marker):

* ``rate``: accepted draft tokens over drafted tokens;
* ``mean_length``: ``1 + accepted / drafts``, the tokens each verification step yields, the
  bonus token included (vLLM's own convention, ``SpecDecodingLogging.log``);
* ``per_position``: accepted tokens at each draft position over the drafts.

:func:`judge` holds it to a :class:`Floor`.  Zero drafts prove nothing either way: the verdict
is ``inconclusive``, which never passes.

The log wordings are those of vLLM's own sources:

* V0 (``vllm/engine/metrics.py``): ``Speculative metrics: Draft acceptance rate: 0.273, System
  efficiency: 0.412, Number of speculative tokens: 5, Number of accepted tokens: 410, Number of
  draft tokens: 1500, Number of emitted tokens: 1700.`` (the rate as a fraction);
* early V1 (``vllm/v1/spec_decode/metrics.py``): ``SpecDecoding metrics: Draft acceptance rate:
  27.3%, Mean acceptance length: 2.37, Accepted: 410 tokens, Drafted: 1500 tokens,
  Per-position acceptance rate: 0.600, 0.400, ...`` (some releases without the last two
  fields);
* V1 from 0.26.0 or earlier to 0.34.0 (``SpecDecodingLogging.log`` in
  ``vllm/v1/spec_decode/metrics.py`` has the same format string in every release read: 0.26.0
  and 0.34.0 from their PyPI wheels, 0.27.1 to 0.33.0 from their tagged sources):
  ``SpecDecoding metrics: Mean acceptance length: 2.37, Accepted throughput: 41.00 tokens/s,
  Drafted throughput: 150.00 tokens/s, Accepted: 410 tokens, Drafted: 1500 tokens,
  Per-position acceptance rate: 0.600, 0.400, ..., Avg Draft acceptance rate: 27.3%``.

vLLM prints ``nan`` for a rate over zero drafts.  Pure: no I/O, no printing; the floor is the
manifest model's (``manifest.model.Floor``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# The floor is a manifest value (an `acceptance:` marker's `min` and `min_length`), checked where
# the manifest is read; `smoke` holds a measure to it too.
from patchkit.manifest.model import ACCEPTANCE_LINE, Floor, length_problem, rate_problem
from patchkit.report import Word

__all__ = ["FAIL", "INCONCLUSIVE", "LINE", "PASS", "Acceptance", "Floor", "Judgement",
           "LineMetrics", "Verdict", "from_counts", "from_lines", "judge", "length_problem", "parse_line",
           "rate_problem"]



class Judgement(Word):
    """A verdict on acceptance: ``inconclusive`` (nothing drafted) never passes."""

    PASS = "ok"
    FAIL = "failed"
    INCONCLUSIVE = "inconclusive"


PASS, FAIL, INCONCLUSIVE = Judgement.PASS, Judgement.FAIL, Judgement.INCONCLUSIVE


# ------------------------------------------------------------------------ the value

@dataclass(frozen=True)
class Acceptance:
    """Acceptance over some stretch of decoding.  Counts are None where the source gave only
    rates (log lines without counts)."""

    rate: float | None
    mean_length: float | None = None
    per_position: tuple[float, ...] = ()
    drafts: float | None = None         # verification steps with a draft
    draft_tokens: float | None = None
    accepted: float | None = None
    zero: bool = False                  # nothing was drafted: the figures mean nothing

    def describe(self) -> str:
        parts = []
        if self.rate is not None:
            counts = (f" ({self.accepted:g} of {self.draft_tokens:g} draft tokens)"
                      if self.accepted is not None and self.draft_tokens is not None else "")
            parts.append(f"rate {self.rate:.3f}{counts}")
        if self.mean_length is not None:
            parts.append(f"mean length {self.mean_length:.2f}")
        if self.per_position:
            parts.append("per position " + ", ".join(f"{p:.3f}" for p in self.per_position))
        return "acceptance " + ("; ".join(parts) or "unknown")

    def to_dict(self) -> dict:
        """The figures as numbers; counts as integers (a Prometheus counter is a float).
        ``drafted`` is ``draft_tokens`` in vLLM's word (its log's ``Drafted: N tokens``)."""
        return {"rate": self.rate, "mean_length": self.mean_length,
                "per_position": list(self.per_position), "drafts": _count(self.drafts),
                "draft_tokens": _count(self.draft_tokens), "drafted": _count(self.draft_tokens),
                "accepted": _count(self.accepted)}


def _count(value: float | None) -> int | float | None:
    """A count as an integer; a value that is no whole number (a counter that is not one)
    stays as it is."""
    if value is None or isinstance(value, bool) or not float(value).is_integer():
        return value
    return int(value)


def from_counts(drafts: float | None, draft_tokens: float, accepted: float,
                per_position: Sequence[float] = ()) -> Acceptance:
    """Acceptance from counters (the change over a request): ``drafts`` the verification steps
    (``vllm:spec_decode_num_drafts``), ``per_position`` the accepted tokens at each position."""
    if not draft_tokens or (drafts is not None and not drafts):
        return Acceptance(None, drafts=drafts, draft_tokens=draft_tokens, accepted=accepted,
                          zero=True)
    length = 1 + accepted / drafts if drafts else None
    per = tuple(n / drafts for n in per_position) if drafts else ()
    return Acceptance(accepted / draft_tokens, length, per, drafts, draft_tokens, accepted)


@dataclass(frozen=True)
class Verdict:
    status: Judgement
    message: str

    @property
    def ok(self) -> bool:
        return self.status is Judgement.PASS


def judge(acceptance: Acceptance, floor: Floor, over: str = "") -> Verdict:
    """``acceptance`` held to ``floor``; ``over`` says what it was measured over."""
    where = f" over {over}" if over else ""
    if acceptance.zero:
        drafted = (f" ({acceptance.draft_tokens:g} draft tokens)"
                   if acceptance.draft_tokens is not None else "")
        return Verdict(INCONCLUSIVE, f"inconclusive: nothing was drafted{where}{drafted}; zero "
                                     "drafts prove no acceptance (is speculative decoding "
                                     "running?)")
    said = f"{acceptance.describe()}{where}"
    short = []
    if floor.min_rate is not None:
        if acceptance.rate is None:
            return Verdict(FAIL, f"{said}: no acceptance rate to hold to {floor.min_rate:g}")
        if acceptance.rate < floor.min_rate:
            short.append(f"rate below {floor.min_rate:g}")
    if floor.min_length is not None:
        if acceptance.mean_length is None:
            return Verdict(FAIL, f"{said}: no mean acceptance length to hold to "
                                 f"{floor.min_length:g}")
        if acceptance.mean_length < floor.min_length:
            short.append(f"mean length below {floor.min_length:g}")
    if short:
        return Verdict(FAIL, f"{said}: {', '.join(short)}")
    return Verdict(PASS, f"{said}: {floor.describe()}")


# ------------------------------------------------------------------------ vLLM's log lines

# A periodic spec-decode metrics line, in any wording vLLM has used (see the module's doc): the
# manifest's acceptance marker searches for it (``model.ACCEPTANCE_LINE``).
LINE = ACCEPTANCE_LINE
_LINE = re.compile(LINE)
_NUM = r"(nan|\d+(?:\.\d*)?)"
_ACCEPTED = re.compile(r"(?:\bAccepted: (\d+) tokens\b|Number of accepted tokens: (\d+))")
_DRAFTED = re.compile(r"(?:\bDrafted: (\d+) tokens\b|Number of draft tokens: (\d+))")
_RATE = re.compile(r"Draft acceptance rate: " + _NUM + r"(%?)")
_LENGTH = re.compile(r"Mean acceptance length: " + _NUM)
_PER_POSITION = re.compile(r"Per-position acceptance rate: (" + _NUM + r"(?:, " + _NUM + r")*)")
_K = re.compile(r"Number of speculative tokens: (\d+)")


@dataclass(frozen=True)
class LineMetrics:
    """What one metrics line says; None where it says nothing (or ``nan``)."""

    rate: float | None
    accepted: int | None = None
    drafted: int | None = None
    mean_length: float | None = None
    per_position: tuple[float, ...] = ()
    spec_tokens: int | None = None   # V0: the draft length, from which the length follows


def _number(text: str) -> float | None:
    value = float(text)
    return None if math.isnan(value) else value


def parse_line(text: str) -> LineMetrics | None:
    """The metrics of a spec-decode metrics log line, or None for any other line."""
    if not _LINE.search(text):
        return None

    def count(pattern: re.Pattern) -> int | None:
        m = pattern.search(text)
        return int(next(g for g in m.groups() if g is not None)) if m else None

    rate = None
    m = _RATE.search(text)
    if m and (value := _number(m.group(1))) is not None:
        rate = value / 100 if m.group(2) else value
    m = _LENGTH.search(text)
    length = _number(m.group(1)) if m else None
    m = _PER_POSITION.search(text)
    per = tuple(float(x) for x in m.group(1).split(", ")) if m else ()
    k = _K.search(text)
    return LineMetrics(rate, count(_ACCEPTED), count(_DRAFTED), length,
                       () if any(math.isnan(p) for p in per) else per,
                       int(k.group(1)) if k else None)


def from_lines(lines: Iterable[LineMetrics]) -> Acceptance:
    """Acceptance over several metrics lines: from their counts when every line gives them
    (the rate is the accepted tokens over the drafted, the length and per-position rates are
    weighted by the drafted tokens), else the mean of the lines' own rates and lengths."""
    lines = list(lines)
    if lines and all(x.accepted is not None and x.drafted is not None for x in lines):
        drafted = sum(x.drafted for x in lines)
        accepted = sum(x.accepted for x in lines)
        if not drafted:
            return Acceptance(None, draft_tokens=0, accepted=accepted, zero=True)
        weighed = [x for x in lines if x.drafted]
        return Acceptance(accepted / drafted, _weighed(weighed, [_length(x) for x in weighed]),
                          _per_position(weighed), draft_tokens=drafted, accepted=accepted)
    rates = [x.rate for x in lines if x.rate is not None]
    if not rates:
        return Acceptance(None, zero=True)
    lengths = [v for v in (_length(x) for x in lines) if v is not None]
    return Acceptance(math.fsum(rates) / len(rates),
                      math.fsum(lengths) / len(lengths) if lengths else None)


def _length(x: LineMetrics) -> float | None:
    if x.mean_length is not None:
        return x.mean_length
    if x.spec_tokens and x.accepted is not None and x.drafted:   # V0: drafts = drafted / k
        return 1 + x.accepted * x.spec_tokens / x.drafted
    return None


def _weighed(lines: list[LineMetrics], values: list[float | None]) -> float | None:
    pairs = [(v, x.drafted) for v, x in zip(values, lines) if v is not None]
    total = sum(w for _, w in pairs)
    return math.fsum(v * w for v, w in pairs) / total if total else None


def _per_position(lines: list[LineMetrics]) -> tuple[float, ...]:
    with_rates = [x for x in lines if x.per_position]
    if not with_rates or len({len(x.per_position) for x in with_rates}) != 1:
        return ()   # none, or the draft length changed between lines: no one vector
    return tuple(_weighed(with_rates, [x.per_position[i] for x in with_rates])
                 for i in range(len(with_rates[0].per_position)))
