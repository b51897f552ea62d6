"""A small stand-in for vLLM's OpenAI-compatible server, for the ``patchkit smoke`` tests.

vLLM itself cannot serve here (no GPU), so this answers the four endpoints smoke uses with the
shapes vLLM 0.33.0 gives them:

* ``GET /health``: 200 with an empty body, or the status set (vLLM answers 503 when its engine
  is dead);
* ``GET /v1/models``: ``ModelList`` / ``ModelCard`` / ``ModelPermission`` of
  ``vllm/entrypoints/serve/engine/protocol.py``;
* ``POST /v1/chat/completions``: ``ChatCompletionResponse`` of
  ``vllm/entrypoints/openai/chat_completion/protocol.py``; an unknown model is vLLM's 404
  ``ErrorResponse`` ("The model `x` does not exist.");
* ``GET /metrics``: rendered by ``prometheus_client``, the library vLLM uses, from counters
  declared as ``SpecDecodingProm`` declares them (``vllm/v1/spec_decode/metrics.py``): names
  ``vllm:spec_decode_num_drafts``, ``..._num_draft_tokens``, ``..._num_accepted_tokens`` and
  ``..._num_accepted_tokens_per_pos``, labels ``model_name`` and ``engine`` (one series per
  engine), ``position`` for the last; beside them a few of vLLM's other metrics and the Python
  process collectors, as on a real server.

``POST /v1/completions`` with ``stream: true`` streams server-sent events as vLLM does
(``CompletionStreamResponse`` chunks, one token of text each, then ``data: [DONE]``; a last
chunk with ``usage`` and no choices when ``stream_options.include_usage`` is asked), at
``token_rate`` tokens a second after ``ttft`` seconds: each token is sent at its own time
(``start + ttft + i / rate``), so the rate the client sees is the one set, whatever the
sleeps' jitter.  ``GET /version`` answers ``{"version": version}``.

Each chat request adds ``draft_tokens`` and ``accepted_tokens`` to the counters, spread over
``engines`` engines.  ``prometheus_client`` renders each counter with its ``_created`` twin (the
Unix time the series was made, about 1.7e9): a reader that took those for the counts would get
rates and lengths far off, so the tests catch it.

A long request (smoke's ``--long`` prompts: "Count from 1 ..." or "Repeat the following text
...") gets ``max_tokens`` tokens of the right answer, one number or word a token, with the
OpenAI ``logprobs`` tokens when asked; with ``long_garble_after`` set, the tokens from that
offset on are garbled the ``long_garble`` way.  The faults a test can set are the fields of
:class:`Behaviour`.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import prometheus_client as prom

MODEL = "deepseek-ai/DeepSeek-V4-Flash"
ANSWER = "The capital of France is Paris."
BROKEN_JSON = b'{"id": "chatcmpl-0", "object": "chat.completion", "choices": [{"index": 0, "mess'
NUM_SPEC_TOKENS = 3


@dataclass
class Behaviour:
    models: list[str] = field(default_factory=lambda: [MODEL])
    health_status: int = 200
    content: str | None = ANSWER
    reasoning: str | None = None
    choices: bool = True                      # False: "choices": []
    drop_choices: bool = False                # True: no "choices" key at all
    garbled: set[str] = field(default_factory=set)   # paths whose 200 body is broken
    statuses: dict[str, int] = field(default_factory=dict)  # path -> error status
    spec_decode: bool = True                  # False: no spec-decode counters at all
    draft_tokens: int = 24                    # added per chat request
    accepted_tokens: int = 18
    engines: int = 2
    late_metrics: bool = False                # a request's counts show one /metrics read late
    hang: set[str] = field(default_factory=set)      # paths that do not answer
    api_key: str | None = None                # /v1/* wants "Authorization: Bearer KEY"
    long_garble_after: int | None = None      # a long answer goes wrong from this token on
    long_garble: str = "fffd"                 # how: "fffd", "repeat" (one token again), "skip",
                                              # "bytes" (partial characters of a byte-level BPE)
    long_stop_after: int | None = None        # a long answer ends (finish_reason stop) here
    reasoning_long: bool = False              # a long answer comes as reasoning, no content
    token_rate: float = 200.0                 # streamed completions: tokens a second
    ttft: float = 0.02                        # seconds before the first streamed token
    tokens_per_event: int = 1                 # tokens each streamed event carries (a
                                              # speculative step sends several at once)
    send_usage: bool = True                   # honour stream_options.include_usage
    version: str | None = "0.33.0"            # GET /version (None: 404, as an old server)


class _Metrics:
    def __init__(self, b: Behaviour) -> None:
        self.registry = prom.CollectorRegistry()
        prom.GCCollector(registry=self.registry)
        prom.PlatformCollector(registry=self.registry)
        labels = ["model_name", "engine"]
        self.model = b.models[0] if b.models else "none"
        self.engines = [str(i) for i in range(b.engines)]
        r = self.registry
        self.running = prom.Gauge("vllm:num_requests_running", "Number of requests in model "
                                  "execution batches.", labelnames=labels, registry=r)
        self.prompt = prom.Counter("vllm:prompt_tokens", "Number of prefill tokens processed.",
                                   labelnames=labels, registry=r)
        self.latency = prom.Histogram("vllm:e2e_request_latency_seconds",
                                      "Histogram of e2e request latency in seconds.",
                                      labelnames=labels, registry=r,
                                      buckets=[0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 5.0, 10.0])
        self.spec = b.spec_decode
        if self.spec:
            self.drafts = prom.Counter("vllm:spec_decode_num_drafts",
                                       "Number of spec decoding drafts.", labelnames=labels,
                                       registry=r)
            self.draft_tokens = prom.Counter("vllm:spec_decode_num_draft_tokens",
                                             "Number of draft tokens.", labelnames=labels,
                                             registry=r)
            self.accepted = prom.Counter("vllm:spec_decode_num_accepted_tokens",
                                         "Number of accepted tokens.", labelnames=labels,
                                         registry=r)
            self.per_pos = prom.Counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                                        "Accepted tokens per draft position.",
                                        labelnames=labels + ["position"], registry=r)
        for e in self.engines:   # vLLM creates every engine's series up front, at zero
            self.running.labels(self.model, e)
            self.prompt.labels(self.model, e)
            if self.spec:
                for c in (self.drafts, self.draft_tokens, self.accepted):
                    c.labels(self.model, e)
                for pos in range(NUM_SPEC_TOKENS):
                    self.per_pos.labels(self.model, e, str(pos))

    def observe(self, draft_tokens: int, accepted_tokens: int) -> None:
        """One request's counts, spread over the engines as evenly as integers go."""
        n = len(self.engines)
        for i, e in enumerate(self.engines):
            d = draft_tokens // n + (i < draft_tokens % n)
            a = accepted_tokens // n + (i < accepted_tokens % n)
            self.prompt.labels(self.model, e).inc(17)
            self.latency.labels(self.model, e).observe(0.42)
            if self.spec:
                self.draft_tokens.labels(self.model, e).inc(d)
                self.accepted.labels(self.model, e).inc(a)
                self.drafts.labels(self.model, e).inc(-(-d // NUM_SPEC_TOKENS))
                for k in range(a):
                    self.per_pos.labels(self.model, e, str(k % NUM_SPEC_TOKENS)).inc()

    def render(self) -> bytes:
        return prom.generate_latest(self.registry)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, behaviour: Behaviour) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.behaviour = behaviour
        self.metrics = _Metrics(behaviour)
        self.pending: list[tuple[int, int]] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.requests: list[tuple[str, str, dict | None]] = []   # (method, path, JSON body)

    def handle_error(self, request, client_address) -> None:
        pass   # a client that gave up on a hung request: nothing to say


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format, *args) -> None:
        pass

    def _send(self, status: int, body: bytes = b"", ctype: str = "application/json") -> None:
        self.send_response(status)
        if body or ctype:
            self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, doc) -> None:
        self._send(status, json.dumps(doc).encode())

    def _error(self, status: int, message: str, kind: str, param: str | None = None) -> None:
        self._json(status, {"error": {"message": message, "type": kind, "param": param,
                                      "code": status}})

    def _route(self, method: str) -> None:
        b, srv = self.server.behaviour, self.server
        path = self.path.split("?")[0]
        body = None
        if method == "POST":
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                body = json.loads(raw)
            except ValueError:
                body = None
        with srv.lock:
            srv.requests.append((method, path, body))
        if path in b.hang:
            srv.stopping.wait(60)
            return
        if b.api_key and path.startswith("/v1/") and \
                self.headers.get("Authorization") != f"Bearer {b.api_key}":
            return self._json(401, {"error": "Unauthorized"})
        if path in b.statuses:
            return self._error(b.statuses[path], "Internal Server Error", "InternalServerError")
        if path in b.garbled:
            return self._send(200, BROKEN_JSON if path != "/metrics" else
                              b"vllm:spec_decode_num_draft_tokens_total{engine=\"0\" 1\n<html>",
                              "application/json" if path != "/metrics" else "text/plain")
        if method == "GET" and path == "/health":
            return self._send(b.health_status, b"", "")
        if method == "GET" and path == "/v1/models":
            return self._json(200, _model_list(b))
        if method == "POST" and path == "/v1/chat/completions":
            return self._chat(b, body)
        if method == "POST" and path == "/v1/completions":
            return self._completions(b, body)
        if method == "GET" and path == "/version" and b.version is not None:
            return self._json(200, {"version": b.version})
        if method == "GET" and path == "/metrics":
            with srv.lock:
                text = srv.metrics.render()
                for counts in srv.pending:   # late: shown from the next read on
                    srv.metrics.observe(*counts)
                srv.pending.clear()
            return self._send(200, text, prom.CONTENT_TYPE_LATEST)
        self._json(404, {"detail": "Not Found"})

    def _long_tokens(self, b: Behaviour, prompt: str, budget: int) -> list[bytes] | None:
        """The tokens of a long answer as bytes, or None when ``prompt`` asks for none."""
        if prompt.startswith("Count from 1"):
            right = (f"{'' if n == 1 else ' '}{n}" for n in range(1, budget + 1))
        elif prompt.startswith("Repeat the following text"):
            words = prompt.split(": ", 1)[1].split()
            right = (("" if i == 0 else " ") + words[i % len(words)] for i in range(budget))
        else:
            return None
        tokens = [t.encode() for t in list(right)[:b.long_stop_after or budget]]
        k = b.long_garble_after
        if k is not None and k < len(tokens):
            # "bytes": the first two bytes of "€" (E2 82 AC), then " 7", over and over
            bad = {"fffd": lambda i: " \ufffd\ufffd".encode(), "repeat": lambda i: tokens[k - 1],
                   "skip": lambda i: tokens[i] + b"7",
                   "bytes": lambda i: (b" \xe2", b"\x82", b" 7")[(i - k) % 3]}[b.long_garble]
            tokens[k:] = [bad(i) for i in range(k, len(tokens))]
        return tokens

    def _chat(self, b: Behaviour, body) -> None:
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return self._error(400, "messages: Field required", "BadRequestError")
        model = body.get("model")
        if model not in b.models:
            return self._error(404, f"The model `{model}` does not exist.", "NotFoundError",
                               "model")
        srv = self.server
        with srv.lock:
            if b.late_metrics:
                srv.pending.append((b.draft_tokens, b.accepted_tokens))
            else:
                srv.metrics.observe(b.draft_tokens, b.accepted_tokens)
        prompt = body["messages"][-1].get("content") or ""
        tokens = self._long_tokens(b, prompt, int(body.get("max_tokens") or 16))
        # the answer is the tokens' bytes decoded as one stream, as vLLM's detokenizer makes it
        content = b.content if tokens is None else b"".join(tokens).decode("utf-8", "replace")
        reasoning = b.reasoning
        if tokens is not None and b.reasoning_long:
            content, reasoning = None, content
        message = {"role": "assistant", "content": content, "refusal": None,
                   "annotations": None, "audio": None, "function_call": None,
                   "reasoning": reasoning}
        completion_tokens = len((b.content or "").split()) + 1 if tokens is None else len(tokens)
        logprobs = None
        if tokens is not None and body.get("logprobs"):
            # each token's text decoded alone, its bytes that text encoded again (vLLM's way)
            texts = [t.decode("utf-8", "replace") for t in tokens]
            logprobs = {"content": [{"token": t, "logprob": -0.01, "bytes": list(t.encode()),
                                     "top_logprobs": []} for t in texts]}
        finish = "length" if tokens is not None and b.long_stop_after is None else "stop"
        doc = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
               "created": int(time.time()), "model": model,
               "choices": [{"index": 0, "message": message, "logprobs": logprobs,
                            "finish_reason": finish, "stop_reason": None, "token_ids": None,
                            "routed_experts": None, "weight_versions": None}]
               if b.choices else [],
               "service_tier": None, "system_fingerprint": None,
               "usage": {"prompt_tokens": 17, "total_tokens": 17 + completion_tokens,
                         "completion_tokens": completion_tokens, "prompt_tokens_details": None},
               "prompt_logprobs": None, "prompt_token_ids": None, "kv_transfer_params": None}
        if b.drop_choices:
            del doc["choices"]
        self._json(200, doc)

    def _completions(self, b: Behaviour, body) -> None:
        if not isinstance(body, dict) or not isinstance(body.get("prompt"), str):
            return self._error(400, "prompt: Field required", "BadRequestError")
        model = body.get("model")
        if model not in b.models:
            return self._error(404, f"The model `{model}` does not exist.", "NotFoundError",
                               "model")
        if not body.get("stream"):
            return self._error(400, "the stand-in streams completions only", "BadRequestError")
        n = int(body.get("max_tokens") or 16)
        srv = self.server
        with srv.lock:
            srv.metrics.observe(b.draft_tokens, b.accepted_tokens)
        rid = f"cmpl-{uuid.uuid4().hex}"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

        def event(doc) -> None:
            self.wfile.write(b"data: " + json.dumps(doc).encode() + b"\n\n")
            self.wfile.flush()

        def chunk(text: str, finish: str | None) -> dict:
            return {"id": rid, "object": "text_completion", "created": int(time.time()),
                    "model": model, "choices": [{"index": 0, "text": text, "logprobs": None,
                                                 "finish_reason": finish,
                                                 "stop_reason": None}], "usage": None}

        start = time.monotonic() + b.ttft
        k = max(1, b.tokens_per_event)
        try:
            for i in range(0, n, k):
                # the event holding token i goes at token i's time, the first at ttft
                delay = start + i / b.token_rate - time.monotonic()
                if delay > 0 and srv.stopping.wait(delay):
                    return
                text = "".join(f" {j + 1}" for j in range(i, min(n, i + k)))
                event(chunk(text, "length" if i + k >= n else None))
            if b.send_usage and (body.get("stream_options") or {}).get("include_usage"):
                event({"id": rid, "object": "text_completion", "created": int(time.time()),
                       "model": model, "choices": [],
                       "usage": {"prompt_tokens": 23, "total_tokens": 23 + n,
                                 "completion_tokens": n}})
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")


def _model_list(b: Behaviour) -> dict:
    now = int(time.time())
    return {"object": "list", "data": [
        {"id": name, "object": "model", "created": now, "owned_by": "vllm",
         "root": f"/models/{name}", "parent": None, "max_model_len": 131072,
         "permission": [{"id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission",
                         "created": now, "allow_create_engine": False, "allow_sampling": True,
                         "allow_logprobs": True, "allow_search_indices": False,
                         "allow_view": True, "allow_fine_tuning": False, "organization": "*",
                         "group": None, "is_blocking": False}]}
        for name in b.models]}


@dataclass
class StandIn:
    server: _Server

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def behaviour(self) -> Behaviour:
        return self.server.behaviour

    def requests(self, path: str | None = None) -> list[tuple[str, str, dict | None]]:
        with self.server.lock:
            return [r for r in self.server.requests if path is None or r[1] == path]


@contextmanager
def serve(behaviour: Behaviour | None = None) -> Iterator[StandIn]:
    """A stand-in on 127.0.0.1 on a free port, stopped (hung requests released) on exit."""
    server = _Server(behaviour or Behaviour())
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    try:
        yield StandIn(server)
    finally:
        server.stopping.set()
        server.shutdown()
        server.server_close()
        thread.join(5)


@contextmanager
def refusing_port() -> Iterator[int]:
    """A port on 127.0.0.1 that is bound but not listening: a connection to it is refused, and
    nothing else can take it while the test runs."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]
    finally:
        sock.close()
