"""vLLM's ``/metrics``: the Prometheus text read into samples, and the spec-decode counters
summed over a server's engines.

Pure: the caller fetches the text (``patchkit smoke``); :func:`parse_metrics` refuses what is
not Prometheus text with the line it stopped at.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from patchkit import http

# The counters vLLM's SpecDecodingProm registers (vllm/v1/spec_decode/metrics.py), as the
# Prometheus client exposes them: counter names get the ``_total`` suffix.
# Their ``_created`` twins (the time each series was made) have names of their own and are never
# read.
DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens_total"
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
POSITION = "position"     # its label: the draft position, from "0"


@dataclass(frozen=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float


class MetricsFormatError(ValueError):
    pass


# prometheus_client's parser is lax (it is documented to be): two things it lets through are
# refused here, so that a garbled /metrics is said to be garbled and not read half-way.
_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')
_ESCAPE = re.compile(r'\\[\\"n]')


def parse_metrics(text: str) -> list[Sample]:
    """The samples of a Prometheus text exposition (version 0.0.4, or OpenMetrics text), read
    by ``prometheus_client``'s parser, the library vLLM renders them with.

    Comments (``# HELP``, ``# TYPE``, ``# EOF`` and any other) and blank lines are skipped;
    label values may hold escaped quotes, backslashes and newlines; a sample may carry a
    timestamp, and under OpenMetrics an exemplar.  A line that is none of these raises
    :class:`MetricsFormatError` naming its number.
    """
    samples = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            samples += _parse_sample(line)
        except ValueError as exc:  # the library's, translated here with the line it refused
            said = " ".join(str(exc).split()) or "not a sample"
            raise MetricsFormatError(f"line {number}: {said}: {http.snippet(line, 80)!r}") from None
    return samples


def _parse_sample(line: str) -> list[Sample]:
    if "\\" in _ESCAPE.sub("", line):
        raise ValueError("bad escape in a label value")
    bare = _QUOTED.sub('""', line)  # no brace, space or '#' left inside a label value
    sample = bare.split(" # ", 1)[0]  # an OpenMetrics exemplar follows ' # '
    rest = sample.split("}", 1)[-1] if "{" in sample else sample.split(None, 1)[-1]
    if len(rest.split()) > 2:
        raise ValueError("expected a value and an optional timestamp")
    return [Sample(s.name, tuple(s.labels.items()), float(s.value))
            for family in text_string_to_metric_families(line) for s in family.samples]


def counter_total(samples: Iterable[Sample], name: str) -> float | None:
    """The sum of every series of ``name`` (all engines, all label sets); None when there is
    none.  A counter's ``_created`` samples have their own name: they never count."""
    values = [s.value for s in samples if s.name == name]
    return math.fsum(values) if values else None


def per_position(samples: Iterable[Sample]) -> tuple[tuple[int, float], ...]:
    """The accepted tokens at each draft position, every engine summed, by position."""
    by: dict[int, list[float]] = {}
    for s in samples:
        where = dict(s.labels).get(POSITION)
        if s.name == PER_POSITION and where is not None and where.isdigit():
            by.setdefault(int(where), []).append(s.value)
    return tuple((p, math.fsum(v)) for p, v in sorted(by.items()))
