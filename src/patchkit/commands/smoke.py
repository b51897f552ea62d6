"""``patchkit smoke URL``: is a running vLLM OpenAI-compatible server really serving?

Checks, in order, each giving one line:

* ``health``: ``GET /health`` answers 200 (vLLM answers 503 once its engine is dead);
* ``models``: ``GET /v1/models`` lists the model asked for, or exactly one model when none is;
* ``chat``: one ``POST /v1/chat/completions`` at temperature 0 with a small ``max_tokens`` gives
  an answer with content that is neither empty nor degenerate;
* ``long`` (with ``long``): one deterministic generation at temperature 0 of that many tokens,
  counting from 1 or repeating a given text, walked for garble (:mod:`patchkit.serving.garble`):
  the first bad token's offset and the text around it;
* ``acceptance`` (with ``min_acceptance`` or ``min_acceptance_length``): the speculative-decoding
  acceptance over smoke's requests (:mod:`patchkit.serving.acceptance`), from the change in
  ``vllm:spec_decode_num_accepted_tokens_total`` over that in
  ``vllm:spec_decode_num_draft_tokens_total`` (the rate), in ``vllm:spec_decode_num_drafts_total``
  (the mean acceptance length, ``1 + accepted / drafts``) and in
  ``vllm:spec_decode_num_accepted_tokens_per_pos_total{position=...}`` (the per-position rates),
  read from ``/metrics`` just before and just after them, reaches the floor.  Nothing drafted is
  ``inconclusive``, which fails.  vLLM counts one series per engine (labels ``model_name`` and
  ``engine``); the series are summed.  Other traffic on the server during the requests counts
  too: smoke an idle server.
* ``speed`` (with ``requests``): decode speed as the client timed it
  (:mod:`patchkit.serving.speed`): N streamed ``POST /v1/completions`` one after another, the
  median decode tok/s with its spread and the median time to the first token; with
  ``concurrency`` C, C more at once and their aggregate tok/s.  How it was measured is kept
  with the figures: the prompt and output length, N, the model, the server's version
  (``GET /version``) and whether speculative decoding ran (the spec-decode counters of
  ``/metrics`` before and after; their change gives the acceptance over these requests).

A check that needs an earlier one which failed is reported as not run.  Nothing here prints;
the result is a :class:`SmokeReport`.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from patchkit import http, interrupt
from patchkit.cache import cache_dir
from patchkit.errors import UsageError
from patchkit.report import Word
from patchkit.serving import acceptance as spec
from patchkit.serving import garble as long_answer
from patchkit.serving import speed as speed_
from patchkit.serving.garble import degenerate
from patchkit.serving.metrics import (ACCEPTED_TOKENS, DRAFT_TOKENS, DRAFTS, MetricsFormatError,
                                      counter_total, parse_metrics, per_position)
from patchkit.timeouts import DEFAULT_TIMEOUT

HEALTH, MODELS, CHAT, LONG, ACCEPTANCE, SPEED = ("health", "models", "chat", "long",
                                                 "acceptance", "speed")
MAX_TOKENS = 32
LONG_MAX = 1 << 20   # tokens of one --long answer; no served context is longer
PROMPT = "What is the capital of France? Answer in one short sentence."
# vLLM records a step's counters just after it hands the outputs on, so the last step of the
# request may land a moment after the answer: /metrics is read again until it holds still.
SETTLE_SECONDS = 0.2
SETTLE_READS = 5
# /metrics of a server with many engines and histograms is large, but not this large.
METRICS_MAX_BYTES = 64 * 1024 * 1024


class CheckStatus(Word):
    """How one check of smoke came out, as reports word it."""

    OK = "ok"
    FAILED = "failed"
    INCONCLUSIVE = "inconclusive"   # it ran but could not tell (zero drafts): a failure
    NOT_RUN = "not run"             # an earlier check failed first


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    message: str
    ran: bool = True
    inconclusive: bool = False   # it ran but could not tell (zero drafts): a failure

    @property
    def status(self) -> CheckStatus:
        if self.ok:
            return CheckStatus.OK
        if self.inconclusive:
            return CheckStatus.INCONCLUSIVE
        return CheckStatus.FAILED if self.ran else CheckStatus.NOT_RUN

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "status": self.status,
                "message": self.message}


@dataclass(frozen=True)
class SmokeReport:
    url: str
    model: str | None
    checks: tuple[Check, ...]
    acceptance: float | None = None
    answer: str | None = None
    unreachable: str | None = None   # set when nothing answered at all: the one line to show
    spec_decode: spec.Acceptance | None = None   # the acceptance measured, with its parts
    garble: long_answer.Garble | None = None          # the first bad token of the long answer
    speed: Measured | None = None                     # with requests: the speed measured

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "url": self.url, "model": self.model,
                "checks": [c.to_dict() for c in self.checks], "acceptance": self.acceptance,
                "spec_decode": self.spec_decode.to_dict() if self.spec_decode else None,
                "garble": self.garble.to_dict() if self.garble else None,
                "speed": self.speed.to_dict() if self.speed else None}


@dataclass(frozen=True)
class Measured:
    """A speed measurement: its figures and how it was made."""

    figures: speed_.Figures
    settings: speed_.Settings
    server_version: str | None      # what GET /version said (None: it did not answer)
    spec_decode: bool | None        # the server drafted over the requests (None: no /metrics)

    def to_dict(self) -> dict[str, Any]:
        return {"figures": self.figures.to_dict(), "settings": self.settings.to_dict(),
                "server_version": self.server_version, "spec_decode": self.spec_decode}


# ------------------------------------------------------------------------ the checks

@dataclass(frozen=True)
class Measure:
    """How ``smoke`` measures decode speed: over ``requests`` streamed requests of
    ``output_tokens`` each (None: speed's default), and with ``concurrency`` C the aggregate
    of C at once."""

    requests: int | None   # None: refused (the count is what the rest goes with)
    output_tokens: int | None = None
    concurrency: int | None = None


@dataclass(frozen=True)
class Long:
    """The long answer ``smoke`` walks for garble: ``tokens`` generated at temperature 0,
    counting from 1 or repeating ``text``."""

    tokens: int | None   # None: refused (the text goes with a count)
    text: str | None = None


@dataclass(frozen=True)
class _Plan:
    """What one smoke asks beyond /health, /v1/models and one answer."""

    floor: spec.Floor | None
    long: Long | None
    measure: Measure | None

    @property
    def names(self) -> list[str]:
        return [MODELS, CHAT] + ([LONG] if self.long is not None else []) + \
            ([ACCEPTANCE] if self.floor is not None else []) + \
            ([SPEED] if self.measure is not None else [])

    def not_run(self, checks: list[Check], after: str, because: str) -> None:
        """Every check after ``after``, said not run, and why."""
        names = self.names
        for name in names[names.index(after) + 1:] if after in names else names:
            checks.append(Check(name, False, f"not run: {because}", ran=False))


def run(url: str, model: str | None = None, min_acceptance: float | None = None, *,
        timeout: float = DEFAULT_TIMEOUT, api_key: str | None = None,
        min_acceptance_length: float | None = None, long: Long | None = None,
        measure: Measure | None = None) -> SmokeReport:
    """Smoke the server at ``url`` (its root; a trailing ``/v1`` is allowed).  A bad URL, floor,
    token count or timeout is an error (exit 2); everything the server does is in the report.
    With ``measure``, also the decode speed."""
    base = base_url(url)
    floor = _floor(min_acceptance, min_acceptance_length)
    _check_options(model, timeout, api_key, long.tokens if long else None,
                   long.text if long else None)
    if measure is not None:
        _check_speed_options(measure.requests, measure.concurrency, measure.output_tokens)
    client = _Client(base, timeout, api_key)
    plan = _Plan(floor, long, measure)
    checks: list[Check] = []
    health = _check_health(client)
    checks.append(health.check)
    if not health.check.ok:
        plan.not_run(checks, HEALTH, "/health did not answer 200")
        return SmokeReport(base, model, tuple(checks),
                           unreachable=health.check.message if health.unreachable else None)
    interrupt.check()

    chosen, models_check = _check_models(client, model)
    checks.append(models_check)
    if chosen is None:
        plan.not_run(checks, MODELS, "no model to ask")
        return SmokeReport(base, model, tuple(checks))
    interrupt.check()
    return _asked(client, base, chosen, plan, checks)


def _asked(client: "_Client", base: str, chosen: str, plan: _Plan,
           checks: list[Check]) -> SmokeReport:
    """The answers, the acceptance and the speed, once the server answers and has a model."""
    floor, long = plan.floor, plan.long
    before = _read_counters(client) if floor is not None else None
    chat = _check_chat(client, chosen, MAX_TOKENS)
    checks.append(chat.check)
    answered, bad = chat.answered, None
    if long is not None:
        interrupt.check()
        long_check, bad, long_answered = _check_long_answer(client, chosen, long.tokens,
                                                            long.text)
        checks.append(long_check)
        answered = answered or long_answered
    accepted = None
    if floor is not None and not answered:
        plan.not_run(checks, LONG if long is not None else CHAT, "no request got an answer")
        return SmokeReport(base, chosen, tuple(checks), answer=chat.answer, garble=bad)
    elif floor is not None:
        accepted = _acceptance(client, before, floor, long.tokens if long else None, checks)
    measured = None
    if plan.measure is not None:
        interrupt.check()
        m = plan.measure
        measured, speed_check = _check_speed(client, speed_.Settings(
            chosen, m.output_tokens or speed_.OUTPUT_TOKENS, m.requests, m.concurrency))
        checks.append(speed_check)
    return SmokeReport(base, chosen, tuple(checks),
                       acceptance=accepted.rate if accepted else None, answer=chat.answer,
                       spec_decode=accepted, garble=bad, speed=measured)


def _check_speed_options(requests: int | None, concurrency: int | None,
                         output_tokens: int | None) -> None:
    if requests is None and (concurrency is not None or output_tokens is not None):
        raise UsageError("--concurrency and --output-tokens go with --requests N (the speed "
                         "measurement)")
    said = speed_.check_counts(requests, concurrency, output_tokens)
    if said:
        raise UsageError(f"--{said.replace('output tokens', 'output-tokens')}")


# ------------------------------------------------------------------------ speed

def _server_version(client: _Client) -> str | None:
    try:
        doc = client.get_json("/version")
    except http.HttpError:
        return None
    version = doc.get("version") if isinstance(doc, dict) else None
    return str(version) if isinstance(version, str) and version.strip() else None


def _streamed(client: _Client, settings: speed_.Settings) -> speed_.Sample | str:
    """One streamed completion, timed as it arrives: its sample, or why there is none."""
    payload = {"model": settings.model, "prompt": settings.prompt, "temperature": 0,
               "max_tokens": settings.output_tokens, "ignore_eos": True, "stream": True,
               "stream_options": {"include_usage": True}}
    timing = speed_.Timing(time.monotonic())
    try:
        http.stream_lines(client.url(settings.endpoint), payload, headers=client.headers,
                          timeout=client.timeout,
                          on_line=lambda line: timing.line(line, time.monotonic()))
    except http.HttpError as exc:
        return str(exc)
    return timing.sample()


def _at_once(client: _Client, settings: speed_.Settings, n: int
             ) -> tuple[list[speed_.Sample | str], float, float]:
    """``n`` streamed completions sent together: each one's sample (or why none), when the
    first was sent and when the last was done.  Each has the client's deadline."""
    got: list[speed_.Sample | str] = ["not done"] * n

    def one(i: int) -> None:
        got[i] = _streamed(client, settings)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:   # every request ends by its own deadline; this one is a backstop
        t.join(client.timeout + 5)
    return got, started, time.monotonic()


def _check_speed(client: _Client, settings: speed_.Settings) -> tuple[Measured | None, Check]:
    version = _server_version(client)
    before = _read_counters(client)
    samples: list[speed_.Sample] = []
    for i in range(settings.requests):
        interrupt.check()
        got = _streamed(client, settings)
        if isinstance(got, str):
            return None, Check(SPEED, False, f"request {i + 1} of {settings.requests}: {got}")
        samples.append(got)
    total = None
    if settings.concurrency:
        interrupt.check()
        many, started, ended = _at_once(client, settings, settings.concurrency)
        bad = next((g for g in many if isinstance(g, str)), None)
        if bad is not None:
            return None, Check(SPEED, False, f"{settings.concurrency} requests at once: {bad}")
        total = speed_.aggregate([g for g in many if not isinstance(g, str)], started, ended)
    after = _settled_counters(client, SETTLE_SECONDS) if before.error is None else before
    drafted = None if before.error or after.error else (
        before.draft is not None and after.draft is not None and after.draft > before.draft)
    rate = None
    if drafted and before.accepted is not None and after.accepted is not None:
        rate = (after.accepted - before.accepted) / (after.draft - before.draft)
    figures = speed_.figures(samples, total, rate)
    measured = Measured(figures, settings, version, drafted)
    if figures.decode_tok_s is None:
        return measured, Check(SPEED, False, "no answer had two tokens or more: no decode rate")
    return measured, Check(SPEED, True, describe_speed(measured))


def describe_speed(m: Measured) -> str:
    f, s = m.figures, m.settings
    text = (f"decode {f.decode_tok_s:.1f} tok/s median ({f.decode_min:.1f} to "
            f"{f.decode_max:.1f}) over {s.requests} request(s) of {s.output_tokens} tokens; "
            f"first token in {f.ttft_s * 1000:.0f} ms")
    if f.aggregate_tok_s is not None:
        text += f"; {f.aggregate_tok_s:.1f} tok/s aggregate at {s.concurrency} at once"
    spec = {True: "spec decode on", False: "spec decode off", None: "spec decode unknown"}
    text += f" ({spec[m.spec_decode]}"
    if f.acceptance is not None:
        text += f", acceptance {f.acceptance:.2f}"
    text += f"; vLLM {m.server_version or '?'}"
    if f.tokens_from != "usage":
        text += "; tokens counted from the stream"
    return text + ")"


def _check_options(model: str | None, timeout: float, api_key: str | None, long: int | None,
                   text: str | None) -> None:
    _check_long(long, text)
    if model is not None and not model.strip():
        raise UsageError("--model: empty name")
    if not timeout > 0 or math.isinf(timeout):
        raise UsageError(f"--timeout {timeout}: a positive number of seconds")
    check_api_key(api_key)


def _acceptance(client: _Client, before, floor: spec.Floor, long: int | None,
                checks: list[Check]):
    """The acceptance over the requests made since ``before``, judged against ``floor`` (its
    check appended to ``checks``), once the server's counters have settled."""
    interrupt.check()
    after = _settled_counters(client, SETTLE_SECONDS)
    over = "the request" if long is None else "the two requests"
    accepted, check = _check_acceptance(before, after, floor, over)
    checks.append(check)
    return accepted


def _floor(rate: float | None, length: float | None) -> spec.Floor | None:
    for value, flag, problem in ((rate, "--min-acceptance", spec.rate_problem),
                                 (length, "--min-acceptance-length", spec.length_problem)):
        if value is not None and (said := problem(value)):
            raise UsageError(f"{flag} {value}: {said}")
    return spec.Floor(rate, length) if rate is not None or length is not None else None


def _check_long(long: int | None, text: str | None) -> None:
    if long is None:
        if text is not None:
            raise UsageError("--text: only with --long N (the text the long answer repeats)")
        return
    if isinstance(long, bool) or not isinstance(long, int) or long <= 0:
        raise UsageError(f"--long {long}: a number of tokens to generate, 1 or more")
    if long > LONG_MAX:
        raise UsageError(f"--long {long}: at most {LONG_MAX} tokens")
    if text is not None and not text.strip():
        raise UsageError("--text: empty text; give the text to repeat, or leave --text out to "
                         "count from 1")


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


def _check_long_answer(client: _Client, model: str, tokens: int,
                       text: str | None) -> tuple[Check, long_answer.Garble | None, bool]:
    """The ``long`` check, the garble found (or None) and whether the request got an answer."""
    prompt = long_answer.count_prompt(tokens) if text is None else long_answer.repeat_prompt(text)
    # logprobs: the answer's tokens, so that a garble is placed by token, not only by character
    payload = {"model": model, "messages": [{"role": "user", "content": prompt}],
               "temperature": 0, "max_tokens": tokens, "stream": False, "logprobs": True}
    try:
        doc = client.post_json("/v1/chat/completions", payload)
    except http.HttpError as exc:
        return Check(LONG, False, str(exc)), None, False
    choices = doc.get("choices") if isinstance(doc, dict) else None
    choice = choices[0] if isinstance(choices, list) and choices else None
    message = choice.get("message") if isinstance(choice, dict) else None
    content = message.get("content") if isinstance(message, dict) else None
    if not (isinstance(content, str) and content.strip()) and isinstance(message, dict):
        # a reasoning model may spend the whole budget reasoning: that text is walked instead
        content = message.get("reasoning") or message.get("reasoning_content")
    if not isinstance(content, str) or not content.strip():
        return Check(LONG, False, f"the long answer has no content: "
                                  f"{http.snippet(repr(doc))}"), None, True
    usage = doc.get("usage") if isinstance(doc.get("usage"), dict) else {}
    got = usage.get("completion_tokens")
    facts = f" ({got} of {tokens} tokens" if isinstance(got, int) else f" (of {tokens} tokens"
    facts += f", finish_reason {choice.get('finish_reason')})"
    if text is None:
        bad, last = long_answer.check_count(content)
        said = f"counted from 1 to {last}"
    else:
        bad = long_answer.check_repeat(content, text)
        said = f"repeated {text.strip()!r}"
    bad = long_answer.with_tokens(bad, content, _tokens_of(choice))
    if bad is not None:
        return Check(LONG, False, bad.describe() + facts), bad, True
    return Check(LONG, True, f"{said}, no garble{facts}"), None, True


def _tokens_of(choice: dict) -> list[long_answer.Token]:
    """The answer's tokens from the OpenAI ``logprobs`` of a choice (each with its bytes where
    the API gives them), or [] when not given."""
    logprobs = choice.get("logprobs")
    items = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(items, list) or not all(isinstance(i, dict) and
                                              isinstance(i.get("token"), str) for i in items):
        return []
    return [long_answer.Token(i["token"], _bytes(i.get("bytes"))) for i in items]


def _bytes(value: object) -> bytes | None:
    if isinstance(value, list) and all(isinstance(b, int) and not isinstance(b, bool)
                                       and 0 <= b < 256 for b in value):
        return bytes(value)
    return None


# ------------------------------------------------------------------------ acceptance

@dataclass(frozen=True)
class _Counters:
    draft: float | None = None
    accepted: float | None = None
    error: str | None = None
    drafts: float | None = None
    per_position: tuple[tuple[int, float], ...] = ()   # (position, accepted there)


def _read_counters(client: _Client) -> _Counters:
    try:
        text = client.get_text("/metrics", max_bytes=METRICS_MAX_BYTES)
    except http.HttpError as exc:
        return _Counters(error=str(exc))
    try:
        samples = parse_metrics(text)
    except MetricsFormatError as exc:
        return _Counters(error=f"{client.url('/metrics')} is not Prometheus text: {exc}")
    return _Counters(counter_total(samples, DRAFT_TOKENS), counter_total(samples, ACCEPTED_TOKENS),
                     drafts=counter_total(samples, DRAFTS),
                     per_position=per_position(samples))


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
                      floor: spec.Floor, over: str = "the request",
                      ) -> tuple[spec.Acceptance | None, Check]:
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
    drafts = (after.drafts - before.drafts
              if after.drafts is not None and before.drafts is not None else None)
    if drafted < 0 or accepted < 0 or (drafts is not None and drafts < 0):
        return fail(f"the spec-decode counters went down over {over} (did the server "
                    "restart?)")
    if accepted > drafted:
        return fail(f"more tokens accepted ({accepted:g}) than drafted ({drafted:g}): "
                    "the counters do not add up")
    if floor.min_length is not None and drafts is None and drafted:
        return fail(f"/metrics has no {DRAFTS}: no mean acceptance length to hold to "
                    f"{floor.min_length:g}")
    was = dict(before.per_position)
    per = [n - was.get(p, 0.0) for p, n in after.per_position]
    value = spec.from_counts(drafts, drafted, accepted, per)
    if value.zero:
        return None, Check(ACCEPTANCE, False, f"inconclusive: spec decode did not run: no draft "
                                              f"tokens over {over} ({DRAFT_TOKENS} stayed "
                                              f"at {before.draft:g}); zero drafts prove no "
                                              "acceptance", inconclusive=True)
    verdict = spec.judge(value, floor, over)
    return value, Check(ACCEPTANCE, verdict.ok, verdict.message)


# ------------------------------------------------------------------------ evidence and the gate

AGAINST_REQUESTS = 5   # --against without --requests: the speed is measured over this many


@dataclass(frozen=True)
class Gate:
    """This run's figures against another build's evidence on the same model and settings."""

    against: str                     # the other build's name
    current: str                     # this build's name ("the server" when unknown)
    max_drop: float
    drops: tuple[speed_.Drop, ...]
    when: str                        # when the other build's record was made, and where

    @property
    def failed(self) -> list[speed_.Drop]:
        return [d for d in self.drops if d.percent > self.max_drop]

    @property
    def ok(self) -> bool:
        return not self.failed

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "against": self.against, "build": self.current,
                "max_drop": self.max_drop, "against_record": self.when,
                "figures": [{"figure": d.figure, "against": round(d.was, 3),
                             "now": round(d.now, 3), "drop_percent": round(d.percent, 2),
                             "ok": d.percent <= self.max_drop} for d in self.drops]}


@dataclass(frozen=True)
class Outcome:
    """``smoke`` with what it did with its evidence: the report, the build it judged (None:
    unknown), where its record went, the gate, and notes (one line each)."""

    report: SmokeReport
    build: Any = None                # evidence.Build
    recorded: Any = None             # evidence.Kept
    gate: Gate | None = None
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.report.ok and (self.gate is None or self.gate.ok)

    def to_dict(self) -> dict[str, Any]:
        out = self.report.to_dict()
        out["ok"] = self.ok
        out["build"] = ({"image_id": self.build.image_id, "immutable_tag": self.build.tag,
                         "node": self.build.node} if self.build else None)
        out["evidence"] = self.recorded.to_dict() if self.recorded else None
        out["gate"] = self.gate.to_dict() if self.gate else None
        out["notes"] = list(self.notes)
        return out


@dataclass(frozen=True)
class Which:
    """The build a server runs, as smoke is told it: a container (on ``node``, else
    DOCKER_HOST's engine), or a build's tag."""

    container: str | None = None
    build: str | None = None
    node: str | None = None


def run_recorded(url: str, which: Which = Which(), *, against: str | None = None,
                 max_drop: float | None = None, cache=None, **kw) -> Outcome:
    """``run`` with the evidence: the build (``which``) read before any request, the record
    kept in the cache and beside the image, and with ``against`` (a build's immutable tag, or
    ``previous``: the build before this one on its node) the gate, ``max_drop`` percent."""
    from patchkit.engines.docker import Engine
    from patchkit.nodes import evidence

    if (against is None) != (max_drop is None):
        raise UsageError("--against and --max-drop go together: the build to compare with "
                         "and the drop allowed (percent)")
    if max_drop is not None and (isinstance(max_drop, bool) or not 0 <= max_drop <= 100
                                 or math.isnan(max_drop)):
        raise UsageError(f"--max-drop {max_drop}: a percentage from 0 to 100")
    if against is not None and kw.get("measure") is None:
        kw["measure"] = Measure(AGAINST_REQUESTS)
    timeout = kw.get("timeout", DEFAULT_TIMEOUT)
    store = evidence.Store(cache or cache_dir(), timeout=timeout)   # the cache, decided once
    notes: list[str] = []
    build, engine = evidence.which(which.node, which.container, which.build,
                                   lambda url: Engine.connect(url, timeout=timeout))
    try:
        if against == "previous" and build is None:
            raise UsageError("--against previous needs the build this server runs "
                             "(--container or --build)")
        before = None
        if against is not None:
            before = _against(against, build, engine, store, notes)
        report = run(url, **kw)
    finally:
        if engine is not None:
            engine.close()
    recorded = None
    if build is None:
        notes.append(evidence.UNKNOWN)
    elif report.unreachable:
        notes.append("evidence: nothing recorded: the server did not answer")
    else:
        recorded = store.record(smoke_record(report, build), build)
    gate = None
    if before is not None:
        gate = _gate(report, before, build, max_drop, recorded)
    return Outcome(report, build, recorded, gate, tuple(notes))


def smoke_record(report: SmokeReport, build):
    from patchkit.nodes import evidence

    m = report.speed
    return evidence.Record(
        "smoke", build.image_id, build.tag, build.node, time.time(), report.ok,
        tuple(evidence.Verdict(c.name, str(c.status), c.message) for c in report.checks),
        build.patchset, report.model, m.figures if m else None, m.settings if m else None,
        m.server_version if m else None, m.spec_decode if m else None, report.acceptance,
        report.url)


@dataclass(frozen=True)
class _Before:
    name: str
    records: tuple[Any, ...]         # its records with figures, oldest first


def _against(against: str, build, engine, store, notes: list[str]) -> _Before:
    """The other build's records with speed figures; none is a usage error (exit 2)."""
    from patchkit.nodes import ledger

    if against == "previous":
        history = ledger.History(store.cache)
        listed = ledger.read(engine, build.patchset or "", history) if build.patchset else None
        lineage = listed.lineage(build.moving) if listed and build.moving else []
        ids = [b.id for b in lineage]
        older = lineage[ids.index(build.image_id) + 1:] if build.image_id in ids else []
        if not older:
            raise UsageError(f"--against previous: {engine.host} holds no build of "
                             f"{build.moving or build.name} older than {build.name}")
        other = older[0]
        name = other.fixed_for(build.moving) or other.id[:19]
        got = store.of(other.id, other.image.repo_digests)
    else:
        got = store.by_tag(against)
        name = against
        image = engine.inspect(against) if engine is not None else None
        if image is not None:
            got = store.of(image.id, image.repo_digests)
    notes += got.problems
    with_figures = tuple(r for r in got.records if r.figures is not None and
                         r.figures.decode_tok_s is not None and r.settings is not None)
    if not with_figures:
        raise UsageError(f"--against {against}: no speed evidence of {name} to compare with "
                         "(smoke --requests N, with --container or --build, records it)")
    return _Before(name, with_figures)


def _gate(report: SmokeReport, before: _Before, build, max_drop: float,
          recorded) -> Gate:
    m = report.speed
    kept = " (this run's record is kept)" if recorded else ""
    if m is None:
        raise UsageError(f"--against {before.name}: this run measured no speed "
                         f"({SPEED} check did not run){kept}")
    same = [r for r in before.records if r.settings.comparable(m.settings)]
    if not same:
        last = before.records[-1].settings
        raise UsageError(f"--against {before.name}: no evidence on the same model and "
                         f"settings ({m.settings.model}, {m.settings.output_tokens} tokens); "
                         f"its last is {last.model}, {last.output_tokens} tokens{kept}")
    other = same[-1]
    return Gate(before.name, build.name if build else "the server", max_drop,
                tuple(speed_.drops(other.figures, m.figures)),
                f"{other.when} on {other.node}")
