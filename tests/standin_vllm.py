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

Each chat request adds ``draft_tokens`` and ``accepted_tokens`` to the counters, spread over
``engines`` engines.  The faults a test can set are the fields of :class:`Behaviour`.
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
        if method == "GET" and path == "/metrics":
            with srv.lock:
                text = srv.metrics.render()
                for counts in srv.pending:   # late: shown from the next read on
                    srv.metrics.observe(*counts)
                srv.pending.clear()
            return self._send(200, text, prom.CONTENT_TYPE_LATEST)
        self._json(404, {"detail": "Not Found"})

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
        message = {"role": "assistant", "content": b.content, "refusal": None,
                   "annotations": None, "audio": None, "function_call": None,
                   "reasoning": b.reasoning}
        completion_tokens = len((b.content or "").split()) + 1
        doc = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
               "created": int(time.time()), "model": model,
               "choices": [{"index": 0, "message": message, "logprobs": None,
                            "finish_reason": "stop", "stop_reason": None, "token_ids": None,
                            "routed_experts": None, "weight_versions": None}]
               if b.choices else [],
               "service_tier": None, "system_fingerprint": None,
               "usage": {"prompt_tokens": 17, "total_tokens": 17 + completion_tokens,
                         "completion_tokens": completion_tokens, "prompt_tokens_details": None},
               "prompt_logprobs": None, "prompt_token_ids": None, "kv_transfer_params": None}
        if b.drop_choices:
            del doc["choices"]
        self._json(200, doc)

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
