"""``patchkit smoke URL``: is a running vLLM OpenAI-compatible server really serving?

Checks, in order, each giving one line:

* ``health``: ``GET /health`` answers 200 (vLLM answers 503 once its engine is dead);
* ``models``: ``GET /v1/models`` lists the model asked for, or exactly one model when none is;
* ``chat``: one ``POST /v1/chat/completions`` at temperature 0 with a small ``max_tokens`` gives
  an answer with content that is neither empty nor degenerate;
* ``acceptance`` (with ``min_acceptance``): the speculative-decoding acceptance over that one
  request, ``Δ vllm:spec_decode_num_accepted_tokens_total / Δ vllm:spec_decode_num_draft_tokens_total``
  read from ``/metrics`` just before and just after it, reaches the rate.  vLLM counts one series
  per engine (labels ``model_name`` and ``engine``); the series are summed.  Other traffic on the
  server during the request counts too: smoke an idle server.

A check that needs an earlier one which failed is reported as not run.  Nothing here prints;
the result is a :class:`SmokeReport`.
"""

from __future__ import annotations

import math
import re
import time
import unicodedata
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from patchkit import http, interrupt
from patchkit.errors import UsageError
from patchkit.timeouts import DEFAULT_TIMEOUT

HEALTH, MODELS, CHAT, ACCEPTANCE = "health", "models", "chat", "acceptance"
MAX_TOKENS = 32
PROMPT = "What is the capital of France? Answer in one short sentence."
# The counters vLLM's SpecDecodingProm registers (vllm/v1/spec_decode/metrics.py), as the
# Prometheus client exposes them: counter names get the ``_total`` suffix.
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens_total"
# vLLM records a step's counters just after it hands the outputs on, so the last step of the
# request may land a moment after the answer: /metrics is read again until it holds still.
SETTLE_SECONDS = 0.2
SETTLE_READS = 5
# /metrics of a server with many engines and histograms is large, but not this large.
METRICS_MAX_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    message: str
    ran: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "message": self.message}


@dataclass(frozen=True)
class SmokeReport:
    url: str
    model: str | None
    checks: tuple[Check, ...]
    acceptance: float | None = None
    answer: str | None = None
    unreachable: str | None = None   # set when nothing answered at all: the one line to show

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "url": self.url, "model": self.model,
                "checks": [c.to_dict() for c in self.checks], "acceptance": self.acceptance}


# ------------------------------------------------------------------------ Prometheus text

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


# ------------------------------------------------------------------------ the checks

def run(url: str, model: str | None = None, min_acceptance: float | None = None, *,
        timeout: float = DEFAULT_TIMEOUT, api_key: str | None = None,
        max_tokens: int = MAX_TOKENS, settle: float = SETTLE_SECONDS) -> SmokeReport:
    """Smoke the server at ``url`` (its root; a trailing ``/v1`` is allowed).  A bad URL, rate or
    timeout is an error (exit 2); everything the server does is in the report."""
    base = base_url(url)
    if min_acceptance is not None and not (isinstance(min_acceptance, (int, float))
                                           and 0 <= min_acceptance <= 1):
        raise UsageError(f"--min-acceptance {min_acceptance}: a rate from 0 to 1")
    if model is not None and not model.strip():
        raise UsageError("--model: empty name")
    if not timeout > 0 or math.isinf(timeout):
        raise UsageError(f"--timeout {timeout}: a positive number of seconds")
    check_api_key(api_key)
    client = _Client(base, timeout, api_key)
    checks: list[Check] = []

    def rest_not_run(after: str, because: str) -> None:
        names = [MODELS, CHAT] + ([ACCEPTANCE] if min_acceptance is not None else [])
        for name in names[names.index(after) + 1:] if after in names else names:
            checks.append(Check(name, False, f"not run: {because}", ran=False))

    health = _check_health(client)
    checks.append(health.check)
    if not health.check.ok:
        rest_not_run(HEALTH, "/health did not answer 200")
        return SmokeReport(base, model, tuple(checks),
                           unreachable=health.check.message if health.unreachable else None)
    interrupt.check()

    chosen, models_check = _check_models(client, model)
    checks.append(models_check)
    if chosen is None:
        rest_not_run(MODELS, "no model to ask")
        return SmokeReport(base, model, tuple(checks))
    interrupt.check()

    before = _read_counters(client) if min_acceptance is not None else None
    chat = _check_chat(client, chosen, max_tokens)
    checks.append(chat.check)
    acceptance = None
    if min_acceptance is not None:
        if not chat.answered:
            rest_not_run(CHAT, "the chat request got no answer")
        else:
            interrupt.check()
            after = _settled_counters(client, settle)
            acceptance, check = _check_acceptance(before, after, min_acceptance)
            checks.append(check)
    return SmokeReport(base, chosen, tuple(checks), acceptance=acceptance, answer=chat.answer)


def check_api_key(key: str | None) -> None:
    """A key that cannot travel in an ``Authorization`` header is an --api-key error (exit 2),
    said without the key itself, which is a secret."""
    if key is None:
        return
    if not key.strip():
        raise UsageError("--api-key (or VLLM_API_KEY): empty key")
    bad = next((c for c in key if c.isspace() or not c.isprintable()), None)
    if bad is not None:
        what = "white space" if bad.isspace() else "a control character"
        raise UsageError(f"--api-key (or VLLM_API_KEY): the key holds {what} "
                         f"(at character {key.index(bad) + 1})")
    if not key.isascii():
        at = next(n for n, c in enumerate(key) if not c.isascii())
        raise UsageError(f"--api-key (or VLLM_API_KEY): character {at + 1} is not ASCII; an "
                         "HTTP header cannot carry it")


def base_url(url: str) -> str:
    """The server's root: ``url`` checked, without a trailing ``/`` or ``/v1`` (the OpenAI
    base URL people copy from their client's settings)."""
    text = http.check_url(url).rstrip("/")
    if text.endswith("/v1"):
        text = text[:-3]
    return text


class _Client:
    def __init__(self, base: str, timeout: float, api_key: str | None) -> None:
        self.base = base
        self.timeout = timeout
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def url(self, path: str) -> str:
        return http.join(self.base, path)

    def get(self, path: str, **kw) -> http.Response:
        return http.get(self.url(path), headers=self.headers, timeout=self.timeout, **kw)

    def get_json(self, path: str) -> Any:
        return http.get_json(self.url(path), headers=self.headers, timeout=self.timeout)

    def get_text(self, path: str, **kw) -> str:
        return http.get_text(self.url(path), headers={**self.headers, "Accept": "text/plain"},
                             timeout=self.timeout, **kw)

    def post_json(self, path: str, payload: Any) -> Any:
        return http.post_json(self.url(path), payload, headers=self.headers,
                              timeout=self.timeout)


@dataclass(frozen=True)
class _Health:
    check: Check
    unreachable: bool = False


def _check_health(client: _Client) -> _Health:
    try:
        resp = client.get("/health", max_bytes=1024 * 1024)
    except http.HttpError as exc:
        if exc.kind == http.STATUS:
            return _Health(Check(HEALTH, False, f"/health answered {exc.detail}"))
        return _Health(Check(HEALTH, False, str(exc)), unreachable=exc.kind == http.UNREACHABLE)
    if resp.status != 200:
        return _Health(Check(HEALTH, False, f"/health answered HTTP {resp.status}, not 200"))
    return _Health(Check(HEALTH, True, "/health answered 200"))


def _quoted(names: Iterable[str]) -> str:
    return ", ".join(repr(n) for n in names)


def _check_models(client: _Client, model: str | None) -> tuple[str | None, Check]:
    try:
        doc = client.get_json("/v1/models")
    except http.HttpError as exc:
        return None, Check(MODELS, False, str(exc))
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list) or not all(isinstance(d, dict) and isinstance(d.get("id"), str)
                                             for d in data):
        return None, Check(MODELS, False, "/v1/models is not a model list "
                                          "({\"data\": [{\"id\": ...}]}): "
                                          f"{http.snippet(repr(doc))}")
    ids = [d["id"] for d in data]
    if not ids:
        return None, Check(MODELS, False, "/v1/models lists no model")
    if model is not None:
        if model in ids:
            return model, Check(MODELS, True, f"/v1/models lists {model!r}")
        return None, Check(MODELS, False,
                           f"/v1/models does not list {model!r}; it lists {_quoted(ids)}")
    if len(ids) > 1:
        return None, Check(MODELS, False,
                           f"/v1/models lists {len(ids)} models ({_quoted(ids)}); "
                           "say which with --model")
    return ids[0], Check(MODELS, True, f"/v1/models lists {ids[0]!r}, the only model")


@dataclass(frozen=True)
class _Chat:
    check: Check
    answered: bool       # the request came back with a JSON answer (right or wrong)
    answer: str | None = None


def _check_chat(client: _Client, model: str, max_tokens: int) -> _Chat:
    payload = {"model": model, "messages": [{"role": "user", "content": PROMPT}],
               "temperature": 0, "max_tokens": max_tokens, "stream": False}
    try:
        doc = client.post_json("/v1/chat/completions", payload)
    except http.HttpError as exc:
        return _Chat(Check(CHAT, False, str(exc)), answered=False)

    def fail(message: str) -> _Chat:
        return _Chat(Check(CHAT, False, message), answered=True)

    choices = doc.get("choices") if isinstance(doc, dict) else None
    if not isinstance(choices, list) or not choices:
        what = "an empty choices list" if isinstance(choices, list) else "no choices"
        return fail(f"the answer has {what}: {http.snippet(repr(doc))}")
    choice = choices[0]
    message = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(message, dict):
        return fail(f"the first choice has no message: {http.snippet(repr(choice))}")
    finish = choice.get("finish_reason")
    usage = doc.get("usage") if isinstance(doc.get("usage"), dict) else {}
    tokens = usage.get("completion_tokens")
    facts = ", ".join(x for x in (f"{tokens} tokens" if isinstance(tokens, int) else "",
                                  f"finish_reason {finish}" if finish else "") if x)
    facts = f" ({facts})" if facts else ""
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        return fail(f"content is a {type(content).__name__}, not text{facts}")
    text = (content or "").strip()
    if not text:
        # A reasoning model may spend a short answer on its reasoning; vLLM returns that as
        # ``reasoning`` (``reasoning_content`` before 0.11).
        reasoning = message.get("reasoning") or message.get("reasoning_content")
        if isinstance(reasoning, str) and reasoning.strip():
            bad = degenerate(reasoning.strip())
            if bad:
                return fail(f"garbled reasoning, no content: {bad}{facts}")
            return _Chat(Check(CHAT, True, f"no content, but the reasoning answered "
                                           f"{http.snippet(reasoning.strip(), 60)!r}{facts}"),
                         answered=True, answer=reasoning)
        if content is None:
            return fail(f"the answer has no content{facts}")
        what = "whitespace-only" if content else "empty"
        return fail(f"{what} content{facts}")
    bad = degenerate(text)
    if bad:
        return fail(f"garbled content: {bad}{facts}")
    return _Chat(Check(CHAT, True, f"answered {http.snippet(text, 60)!r}{facts}"),
                 answered=True, answer=content)


_REPEAT = re.compile(r"(.{1,8}?)\1{3,}", re.S)


def degenerate(text: str) -> str | None:
    """Why ``text`` is not a real answer, or None: what a model on a broken kernel or cache
    path says (one token over and over, bytes that are not text)."""
    if "\ufffd" in text:
        return f"undecodable bytes (U+FFFD) in {http.snippet(text, 40)!r}"
    if any(unicodedata.category(c) == "Cc" and c not in "\n\r\t" for c in text):
        return f"control characters in {http.snippet(text, 40)!r}"
    flat = " ".join(text.split())
    m = _REPEAT.fullmatch(flat) or _REPEAT.fullmatch(flat + " ")
    if len(flat) >= 8 and m:
        return f"{m.group(1).strip() or m.group(1)!r} over and over"
    return None


# ------------------------------------------------------------------------ acceptance

@dataclass(frozen=True)
class _Counters:
    draft: float | None = None
    accepted: float | None = None
    error: str | None = None


def _read_counters(client: _Client) -> _Counters:
    try:
        text = client.get_text("/metrics", max_bytes=METRICS_MAX_BYTES)
    except http.HttpError as exc:
        return _Counters(error=str(exc))
    try:
        samples = parse_metrics(text)
    except MetricsFormatError as exc:
        return _Counters(error=f"{client.url('/metrics')} is not Prometheus text: {exc}")
    return _Counters(counter_total(samples, DRAFT_TOKENS), counter_total(samples, ACCEPTED_TOKENS))


def _settled_counters(client: _Client, settle: float,
                      sleep: Callable[[float], None] = time.sleep) -> _Counters:
    current = _read_counters(client)
    for _ in range(SETTLE_READS - 1):
        if current.error or settle <= 0:
            break
        sleep(settle)
        again = _read_counters(client)
        if again == current:
            break
        current = again
    return current


def _check_acceptance(before: _Counters | None, after: _Counters,
                      rate: float) -> tuple[float | None, Check]:
    def fail(message: str) -> tuple[None, Check]:
        return None, Check(ACCEPTANCE, False, message)

    assert before is not None
    for reading, when in ((before, "before"), (after, "after")):
        if reading.error:
            return fail(f"/metrics {when} the request: {reading.error}")
    if before.draft is None or after.draft is None:
        return fail(f"spec decode did not run: /metrics has no {DRAFT_TOKENS} "
                    "(is speculative decoding configured?)")
    if before.accepted is None or after.accepted is None:
        return fail(f"/metrics has {DRAFT_TOKENS} but no {ACCEPTED_TOKENS}")
    drafted = after.draft - before.draft
    accepted = after.accepted - before.accepted
    if drafted < 0 or accepted < 0:
        return fail("the spec-decode counters went down over the request (did the server "
                    "restart?)")
    if drafted == 0:
        return fail(f"spec decode did not run: no draft tokens over the request "
                    f"({DRAFT_TOKENS} stayed at {before.draft:g})")
    if accepted > drafted:
        return fail(f"more tokens accepted ({accepted:g}) than drafted ({drafted:g}): "
                    "the counters do not add up")
    value = accepted / drafted
    said = f"{accepted:g} of {drafted:g} draft tokens accepted over the request: {value:.3f}"
    if value >= rate:
        return value, Check(ACCEPTANCE, True, f"{said}, at least {rate:g}")
    return value, Check(ACCEPTANCE, False, f"{said}, below {rate:g}")
