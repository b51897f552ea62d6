"""The one owner of HTTP: small typed calls with bounded waits, every failure one ``HttpError``.

Standard library only (``urllib``).  Each call takes a ``timeout`` in seconds that is a deadline
for the exchange as a whole (connect, headers and body): a watchdog shuts the connection's
socket when it passes, so a server that trickles its headers or its body a byte at a time
cannot hold a call longer than that.  Answers are read up to ``max_bytes``; a larger one is a
failure, not a truncation.

A failure of any kind (bad URL, nothing listening, unknown host, timeout, a status outside 2xx,
a body that is not what was asked for) is an :class:`HttpError` whose message is one line naming
the method and the URL.  Its ``kind`` says which, for callers that word things their own way.
"""

from __future__ import annotations

import errno
import http.client
import json
import socket
import ssl
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from patchkit.errors import PatchkitError

DEFAULT_MAX_BYTES = 32 * 1024 * 1024
SCHEMES = ("http", "https")
USER_AGENT = "patchkit"
_CHUNK = 64 * 1024
_SNIPPET = 120

# HttpError.kind
BAD_URL = "bad-url"            # not an http(s) URL: a usage error (exit 2)
UNREACHABLE = "unreachable"    # connection refused, reset before any answer, host unknown
TIMEOUT = "timeout"            # no connection or no data within the timeout
STATUS = "status"              # an answer outside 2xx
TOO_LARGE = "too-large"        # more than max_bytes
BAD_BODY = "bad-body"          # not JSON, not text, or a broken HTTP answer


class HttpError(PatchkitError):
    """An HTTP call that did not give what was asked; ``str()`` is one line naming the URL."""

    def __init__(self, kind: str, method: str, url: str, detail: str, *,
                 status: int | None = None, body: bytes = b"") -> None:
        self.kind = kind
        self.method = method
        self.url = url
        self.detail = detail
        self.status = status
        self.body = body
        self.exit_code = 2 if kind == BAD_URL else 1
        where = f"URL {url!r}" if kind == BAD_URL else f"{method} {url}"
        super().__init__(f"{where}: {detail}")


@dataclass(frozen=True)
class Response:
    url: str
    status: int
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "").split(";")[0].strip().lower()


def check_url(url: str) -> str:
    """``url`` if it is an absolute http:// or https:// URL with a host, else HttpError
    (kind ``bad-url``, exit 2)."""
    if not isinstance(url, str) or not url.strip():
        raise HttpError(BAD_URL, "GET", str(url), "empty URL")
    text = url.strip()
    if "://" not in text:
        raise HttpError(BAD_URL, "GET", text, f"no scheme; did you mean 'http://{text}'?")
    try:
        parts = urllib.parse.urlsplit(text)
        parts.port  # noqa: B018 -- raises ValueError on a bad port
    except ValueError as exc:
        raise HttpError(BAD_URL, "GET", text, f"not a valid URL ({exc})") from None
    if parts.scheme.lower() not in SCHEMES:
        raise HttpError(BAD_URL, "GET", text,
                        f"scheme {parts.scheme!r} is not http or https")
    if not parts.hostname:
        raise HttpError(BAD_URL, "GET", text, "no host")
    if any(c.isspace() for c in text):
        raise HttpError(BAD_URL, "GET", text, "white space in the URL")
    return text


def join(base: str, path: str) -> str:
    """``base`` (scheme, host and an optional path prefix) with ``path`` under it."""
    return base.rstrip("/") + "/" + path.lstrip("/")


def request(method: str, url: str, *, body: bytes | None = None,
            headers: Mapping[str, str] | None = None, timeout: float,
            max_bytes: int = DEFAULT_MAX_BYTES) -> Response:
    """One HTTP exchange; a 2xx answer read whole, or HttpError."""
    with _opened(method, url, body, headers or {}, timeout) as resp:
        data = _read(resp, method, url, max_bytes)
        return Response(url, resp.status, _lower(resp.headers), data)


@contextmanager
def _opened(method: str, url: str, body: bytes | None, headers: Mapping[str, str],
            timeout: float) -> Iterator:
    """The answer of one exchange, open for the caller to read within ``timeout`` (the
    deadline of the whole exchange); every failure, the caller's reading included, is one
    HttpError."""
    check_url(url)
    if timeout <= 0:
        raise ValueError(f"timeout must be positive, not {timeout}")
    all_headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity", **headers}
    req = urllib.request.Request(url, data=body, method=method, headers=all_headers)
    watch = _Watch(timeout)
    opener = urllib.request.build_opener(_Handler(watch), _TLSHandler(watch))
    try:
        with opener.open(req, timeout=timeout) as resp:
            yield resp
            if watch.fired:  # a close-delimited body cut short by the watchdog
                raise _late(method, url, timeout)
    except urllib.error.HTTPError as exc:
        raise _status_error(method, url, exc, timeout) from None
    except urllib.error.URLError as exc:
        raise _late(method, url, timeout) if watch.fired else \
            _transport_error(method, url, exc.reason, timeout) from None
    except HttpError as exc:
        raise _late(method, url, timeout) if watch.fired and exc.kind != TIMEOUT else exc
    except (http.client.HTTPException, OSError, ValueError) as exc:
        raise _late(method, url, timeout) if watch.fired else \
            _transport_error(method, url, exc, timeout) from None
    finally:
        watch.cancel()


def get(url: str, *, headers: Mapping[str, str] | None = None, timeout: float,
        max_bytes: int = DEFAULT_MAX_BYTES) -> Response:
    return request("GET", url, headers=headers, timeout=timeout, max_bytes=max_bytes)


def get_bytes(url: str, *, headers: Mapping[str, str] | None = None,
              timeout: float, max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
    return get(url, headers=headers, timeout=timeout, max_bytes=max_bytes).body


def get_text(url: str, *, headers: Mapping[str, str] | None = None,
             timeout: float, max_bytes: int = DEFAULT_MAX_BYTES) -> str:
    resp = get(url, headers=headers, timeout=timeout, max_bytes=max_bytes)
    return _text(resp, "GET")


def get_json(url: str, *, headers: Mapping[str, str] | None = None,
             timeout: float, max_bytes: int = DEFAULT_MAX_BYTES) -> Any:
    resp = get(url, headers={"Accept": "application/json", **(headers or {})}, timeout=timeout,
               max_bytes=max_bytes)
    return _json(resp, "GET")


def post_json(url: str, payload: Any, *, headers: Mapping[str, str] | None = None,
              timeout: float, max_bytes: int = DEFAULT_MAX_BYTES) -> Any:
    """POST ``payload`` as JSON; the answer's JSON."""
    data = json.dumps(payload).encode()
    resp = request("POST", url, body=data, timeout=timeout, max_bytes=max_bytes,
                   headers={"Content-Type": "application/json", "Accept": "application/json",
                            **(headers or {})})
    return _json(resp, "POST")


# ------------------------------------------------------------------------ inside

def _lower(headers) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


class _Watch:
    """The deadline of one exchange: when it passes, the connection's socket is shut, which
    ends any read or write blocked on it (urllib's own timeout bounds each wait alone)."""

    def __init__(self, seconds: float) -> None:
        self.fired = False
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def attach(self, sock: socket.socket) -> None:
        with self._lock:
            self._sock = sock
            if self.fired:
                self._shut()

    def cancel(self) -> None:
        self._timer.cancel()

    def _fire(self) -> None:
        with self._lock:
            self.fired = True
            self._shut()

    def _shut(self) -> None:
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # closed already


def _watched(conn_class, watch: _Watch):
    class Watched(conn_class):
        def connect(self) -> None:
            super().connect()
            watch.attach(self.sock)
    return Watched


class _Handler(urllib.request.HTTPHandler):
    def __init__(self, watch: _Watch) -> None:
        super().__init__()
        self.watch = watch

    def do_open(self, http_class, req, **kw):
        return super().do_open(_watched(http_class, self.watch), req, **kw)


class _TLSHandler(urllib.request.HTTPSHandler):
    def __init__(self, watch: _Watch) -> None:
        super().__init__()
        self.watch = watch

    def do_open(self, http_class, req, **kw):
        return super().do_open(_watched(http_class, self.watch), req, **kw)


def _late(method: str, url: str, timeout: float) -> HttpError:
    return HttpError(TIMEOUT, method, url, f"no answer within {_seconds(timeout)}")


def _read(resp, method: str, url: str, max_bytes: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = resp.read(_CHUNK)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > max_bytes:
            raise HttpError(TOO_LARGE, method, url, f"answer larger than {max_bytes} bytes")
        chunks.append(chunk)


def _seconds(timeout: float) -> str:
    return f"{timeout:g}s"


def snippet(data: bytes | str, limit: int = _SNIPPET) -> str:
    """A short, one-line rendering of a body for a message."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _status_error(method: str, url: str, exc: urllib.error.HTTPError,
                  timeout: float) -> HttpError:
    try:
        body = exc.read(_SNIPPET * 20) or b""
    except (OSError, http.client.HTTPException):
        body = b""
    finally:
        exc.close()
    detail = f"HTTP {exc.code}"
    if exc.reason:
        detail += f" {exc.reason}"
    said = _error_message(body)
    if said:
        detail += f": {said}"
    return HttpError(STATUS, method, url, detail, status=exc.code, body=body)


def _error_message(body: bytes) -> str:
    """What an error body says: an OpenAI-style ``{"error": {"message"}}``, a ``detail``, or the
    text itself, shortened."""
    if not body.strip():
        return ""
    try:
        doc = json.loads(body)
    except ValueError:
        return snippet(body)
    if isinstance(doc, dict):
        err = doc.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return snippet(err["message"])
        for key in ("message", "detail", "error"):
            if isinstance(doc.get(key), str):
                return snippet(doc[key])
    return snippet(body)


def _transport_error(method: str, url: str, reason: object, timeout: float) -> HttpError:
    host = urllib.parse.urlsplit(url).netloc
    if isinstance(reason, (socket.timeout, TimeoutError)):
        return HttpError(TIMEOUT, method, url, f"no answer within {_seconds(timeout)}")
    if isinstance(reason, socket.gaierror):
        return HttpError(UNREACHABLE, method, url,
                         f"cannot resolve host {urllib.parse.urlsplit(url).hostname!r}")
    if isinstance(reason, ConnectionRefusedError):
        return HttpError(UNREACHABLE, method, url, f"connection refused: nothing listens on {host}")
    if isinstance(reason, ssl.SSLError):
        return HttpError(UNREACHABLE, method, url, f"TLS failed: {reason}")
    if isinstance(reason, (http.client.RemoteDisconnected, ConnectionResetError,
                           BrokenPipeError, ConnectionAbortedError)):
        return HttpError(UNREACHABLE, method, url, "the server closed the connection without an answer")
    if isinstance(reason, http.client.HTTPException):
        return HttpError(BAD_BODY, method, url,
                         f"not a valid HTTP answer ({type(reason).__name__}: {snippet(str(reason))})")
    if isinstance(reason, OSError):
        if reason.errno in (errno.ETIMEDOUT,):
            return HttpError(TIMEOUT, method, url, f"no answer within {_seconds(timeout)}")
        if reason.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EADDRNOTAVAIL):
            return HttpError(UNREACHABLE, method, url, f"cannot reach {host}: {reason.strerror}")
        return HttpError(UNREACHABLE, method, url,
                         f"{reason.strerror or type(reason).__name__}")
    if isinstance(reason, ValueError):
        return HttpError(BAD_URL, method, url, f"not a valid URL ({reason})")
    return HttpError(UNREACHABLE, method, url, snippet(str(reason)) or type(reason).__name__)


def _text(resp: Response, method: str) -> str:
    try:
        return resp.body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HttpError(BAD_BODY, method, resp.url,
                        f"answer is not UTF-8 text (byte {exc.start})") from None


def _json(resp: Response, method: str) -> Any:
    if not resp.body.strip():
        raise HttpError(BAD_BODY, method, resp.url,
                        f"empty answer (HTTP {resp.status}) where JSON was expected")
    try:
        return json.loads(resp.body)
    except ValueError:
        kind = f", {resp.content_type}" if resp.content_type else ""
        raise HttpError(BAD_BODY, method, resp.url,
                        f"answer is not JSON (HTTP {resp.status}{kind}): "
                        f"{snippet(resp.body)!r}") from None


def stream_lines(url: str, payload: Any, *, on_line, headers: Mapping[str, str] | None = None,
                 timeout: float, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
    """POST ``payload`` as JSON and hand each line of the answer, as it arrives, to
    ``on_line(line: bytes)`` (server-sent events, one ``data: ...`` a line).  ``timeout`` is
    the deadline of the whole exchange, as for :func:`request`; a failure is HttpError."""
    size = 0
    with _opened("POST", url, json.dumps(payload).encode(),
                 {"Content-Type": "application/json", "Accept": "text/event-stream",
                  **(headers or {})}, timeout) as resp:
        while True:
            line = resp.readline(_CHUNK)
            if not line:
                break
            size += len(line)
            if size > max_bytes:
                raise HttpError(TOO_LARGE, "POST", url, f"answer larger than {max_bytes} bytes")
            on_line(line.rstrip(b"\r\n"))
