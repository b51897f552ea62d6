"""A package index on 127.0.0.1 that serves one wheel slowly: for what a download shows and
leaves behind while it runs (progress, ``kill -9``).

``TrickleIndex(dist, version, size)`` builds a real wheel of ``size`` bytes (its bulk a
compiled-looking file, which patchkit's layout leaves out) and serves it under
``/simple/<dist>/`` (PEP 503), ``chunk`` bytes every ``delay`` seconds; ``fast`` serves it at
once.  ``sent`` counts the wheel's bytes sent so far."""

from __future__ import annotations

import hashlib
import io
import os
import threading
import time
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def make_wheel(dist: str, version: str, size: int) -> tuple[str, bytes]:
    """A wheel file name and its bytes: ``<dist>/__init__.py`` and ``<dist>/_C.abi3.so``."""
    name = f"{dist.replace('-', '_')}-{version}-py3-none-any.whl"
    top = dist.replace("-", "_")
    info = f"{top}-{version}.dist-info"
    files = {f"{top}/__init__.py": f'__version__ = "{version}"\n'.encode(),
             f"{top}/_C.abi3.so": b"\x7fELF" + os.urandom(size),
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n"
                                 .encode(),
             f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                              b"Tag: py3-none-any\n",
             f"{info}/top_level.txt": f"{top}\n".encode()}
    record = "".join(f"{n},,\n" for n in files) + f"{info}/RECORD,,\n"
    files[f"{info}/RECORD"] = record.encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for n, data in files.items():
            zf.writestr(n, data)
    return name, buf.getvalue()


class TrickleIndex:
    def __init__(self, dist: str, version: str, size: int, *, chunk: int = 64 * 1024,
                 delay: float = 0.05) -> None:
        self.dist, self.chunk, self.delay = dist, chunk, delay
        self.fast = False
        self.sent = 0
        self.requests: list[str] = []
        self.wheel_name, self.wheel = make_wheel(dist, version, size)
        self.sha = hashlib.sha256(self.wheel).hexdigest()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/simple"

    def __enter__(self) -> TrickleIndex:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handler(self):
        index = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                index.requests.append(self.path)
                if self.path.rstrip("/") == f"/simple/{index.dist}":
                    body = (f'<html><body><a href="/files/{index.wheel_name}#sha256='
                            f'{index.sha}">{index.wheel_name}</a></body></html>').encode()
                    self._send(body, "text/html")
                elif self.path == f"/files/{index.wheel_name}":
                    self._trickle()
                else:
                    self.send_error(404)

            def _send(self, body: bytes, kind: str) -> None:
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _trickle(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(index.wheel)))
                self.end_headers()
                try:
                    for at in range(0, len(index.wheel), index.chunk):
                        self.wfile.write(index.wheel[at:at + index.chunk])
                        index.sent += min(index.chunk, len(index.wheel) - at)
                        if not index.fast:
                            time.sleep(index.delay)
                except (BrokenPipeError, ConnectionResetError):
                    pass   # the downloader went away

        return Handler
