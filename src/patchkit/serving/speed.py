"""Decode speed as the client timed it: the pure half of ``smoke --requests N``.

Each request is one streamed ``POST /v1/completions`` (server-sent events, as vLLM serves
them) of a fixed prompt at temperature 0, ``max_tokens`` tokens with ``ignore_eos`` so that
every answer has the same length.  For each, the client notes when each event carrying text
arrived; from that:

* the time to the first token (``ttft``): from sending the request to the first text;
* the decode rate: the tokens after the first over the time from the first text to the last
  (so the prefill is not in it).  The tokens are the server's own count where it gives one
  (``usage.completion_tokens``, asked with ``stream_options.include_usage``), else one a text
  event (vLLM sends several tokens in one event when a speculative step accepts drafts, so
  the count from the stream alone is a floor).

Over N requests one after another, the single-stream figure is the median decode rate, with
the lowest and highest as its spread.  With a concurrency C, C more requests are sent at once,
and the aggregate is all their tokens over the time from the first sent to the last done.
Nothing here talks to a server: :mod:`patchkit.commands.smoke` makes the requests and hands
each event here.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from typing import Any

# the fixed request: a long, deterministic answer that never runs out of things to say
PROMPT = ("Count from 1 to 100000, one number after another, separated by single spaces, "
          "and write nothing else.")
OUTPUT_TOKENS = 256
REQUESTS_MAX = 1000
CONCURRENCY_MAX = 256
OUTPUT_MAX = 1 << 16


@dataclass(frozen=True)
class Settings:
    """How a speed measurement was made: two are comparable when these agree (the server's
    version and whether it drafted are said, not compared: they are what a gate looks at)."""

    model: str
    output_tokens: int
    requests: int
    concurrency: int | None = None
    prompt: str = PROMPT
    endpoint: str = "/v1/completions"

    def comparable(self, other: "Settings") -> bool:
        return (self.model, self.output_tokens, self.prompt, self.endpoint) == \
            (other.model, other.output_tokens, other.prompt, other.endpoint)

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "output_tokens": self.output_tokens,
                "requests": self.requests, "concurrency": self.concurrency,
                "prompt": self.prompt, "endpoint": self.endpoint}

    @classmethod
    def from_dict(cls, data: dict) -> "Settings":
        conc = data.get("concurrency")
        return cls(str(data["model"]), int(data["output_tokens"]), int(data["requests"]),
                   int(conc) if conc is not None else None, str(data.get("prompt", PROMPT)),
                   str(data.get("endpoint", "/v1/completions")))


class Timing:
    """One streamed request as it comes in: feed it each line of the answer with the time it
    arrived (``time.monotonic()``)."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.first: float | None = None
        self.last: float | None = None
        self.events = 0          # events that carried text
        self.usage: int | None = None
        self.done = False
        self.finish: str | None = None
        self.error: str | None = None

    def line(self, raw: bytes, at: float) -> None:
        text = raw.decode("utf-8", "replace").strip()
        if not text.startswith("data:"):
            return   # comments, blank separators, event names
        data = text[5:].strip()
        if data == "[DONE]":
            self.done = True
            return
        try:
            doc = json.loads(data)
        except ValueError:
            self.error = self.error or f"an event is not JSON: {data[:80]!r}"
            return
        if not isinstance(doc, dict):
            return
        if isinstance(doc.get("error"), dict):
            self.error = str(doc["error"].get("message") or doc["error"])[:200]
            return
        usage = doc.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            self.usage = usage["completion_tokens"]
        for choice in doc.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            if choice.get("text"):
                self.events += 1
                self.first = at if self.first is None else self.first
                self.last = at
            if choice.get("finish_reason"):
                self.finish = str(choice["finish_reason"])

    def sample(self) -> "Sample | str":
        """The request's figures, or why there are none."""
        if self.error:
            return self.error
        if self.first is None or self.last is None:
            return "the stream carried no text"
        tokens = self.usage if self.usage is not None else self.events
        return Sample(tokens, self.first - self.started, self.last - self.first,
                      self.usage is not None)


@dataclass(frozen=True)
class Sample:
    tokens: int            # the answer's tokens
    ttft: float            # seconds to the first text
    decode: float          # seconds from the first text to the last
    counted: bool = True   # tokens from the server's usage (else one a text event)

    @property
    def rate(self) -> float | None:
        """Decode tokens a second (the tokens after the first); None for a one-token answer."""
        if self.tokens < 2 or self.decode <= 0:
            return None
        return (self.tokens - 1) / self.decode

    def to_dict(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "ttft_s": round(self.ttft, 4),
                "decode_s": round(self.decode, 4),
                "tok_s": round(self.rate, 3) if self.rate is not None else None}


@dataclass(frozen=True)
class Figures:
    """What a speed measurement found; the keys a gate compares are :data:`GATED`."""

    decode_tok_s: float | None           # the median single-stream decode rate
    decode_min: float | None = None
    decode_max: float | None = None
    ttft_s: float | None = None          # the median time to the first token
    aggregate_tok_s: float | None = None
    acceptance: float | None = None      # spec-decode acceptance over the requests
    samples: tuple[Sample, ...] = field(default=(), compare=False)
    tokens_from: str = "usage"           # "usage" (the server's count) or "stream" (events)

    def to_dict(self) -> dict[str, Any]:
        return {"decode_tok_s": _r(self.decode_tok_s), "decode_min_tok_s": _r(self.decode_min),
                "decode_max_tok_s": _r(self.decode_max), "ttft_s": _r(self.ttft_s, 4),
                "aggregate_tok_s": _r(self.aggregate_tok_s), "acceptance": _r(self.acceptance, 4),
                "tokens_from": self.tokens_from,
                "samples": [s.to_dict() for s in self.samples]}

    @classmethod
    def from_dict(cls, data: dict) -> "Figures":
        def num(key: str) -> float | None:
            value = data.get(key)
            if value is None:
                return None
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{key} is not a number")
            return float(value)
        return cls(num("decode_tok_s"), num("decode_min_tok_s"), num("decode_max_tok_s"),
                   num("ttft_s"), num("aggregate_tok_s"), num("acceptance"),
                   tokens_from=str(data.get("tokens_from", "usage")))


# the figures a gate holds to a bound, with how each is named; higher is better for each
GATED = (("decode_tok_s", "decode tok/s"), ("aggregate_tok_s", "aggregate tok/s"),
         ("acceptance", "acceptance"))


def figures(samples: list[Sample], aggregate: float | None = None,
            acceptance: float | None = None) -> Figures:
    rates = [s.rate for s in samples if s.rate is not None]
    ttfts = [s.ttft for s in samples]
    return Figures(statistics.median(rates) if rates else None, min(rates, default=None),
                   max(rates, default=None), statistics.median(ttfts) if ttfts else None,
                   aggregate, acceptance, tuple(samples),
                   "usage" if samples and all(s.counted for s in samples) else "stream")


def aggregate(samples: list[Sample], started: float, ended: float) -> float | None:
    """All the tokens of requests sent at once over the time from the first sent to the
    last done."""
    if ended <= started or not samples:
        return None
    return sum(s.tokens for s in samples) / (ended - started)


@dataclass(frozen=True)
class Drop:
    figure: str        # as :data:`GATED` names it
    was: float
    now: float

    @property
    def percent(self) -> float:
        return (self.was - self.now) / self.was * 100 if self.was else 0.0


def drops(was: Figures, now: Figures) -> list[Drop]:
    """Each gated figure both measured, with how far ``now`` fell below ``was`` (negative: it
    rose)."""
    out = []
    for key, name in GATED:
        a, b = getattr(was, key), getattr(now, key)
        if a is not None and b is not None and a > 0:
            out.append(Drop(name, a, b))
    return out


def check_counts(requests: int | None, concurrency: int | None, output_tokens: int | None
                 ) -> str | None:
    """What is wrong with the measurement's settings (worded by setting), or None."""
    for value, name, low, high in ((requests, "requests", 1, REQUESTS_MAX),
                                   (concurrency, "concurrency", 1, CONCURRENCY_MAX),
                                   (output_tokens, "output tokens", 2, OUTPUT_MAX)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            return f"{name} {value}: a whole number from {low} to {high}"
    return None


def _r(value: float | None, digits: int = 3) -> float | None:
    return round(value, digits) if value is not None else None
