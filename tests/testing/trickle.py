"""A package index on 127.0.0.1 that serves one wheel slowly: for what a download shows and
leaves behind while it runs (progress, ``kill -9``).

``TrickleIndex(dist, version, size, more=(...))`` builds a real wheel of ``size`` bytes per
version (its bulk a compiled-looking file, which patchkit's layout leaves out) and serves them
under ``/simple/<dist>/`` (PEP 503), ``chunk`` bytes every ``delay`` seconds each; ``fast``
serves at once.  ``sent`` counts the wheels' bytes sent so far, ``most_at_once`` the most
wheels sent side by side; ``pip_env()`` points pip at it.  ``pinned_project`` is a project that
downloads vLLM from it."""

from __future__ import annotations

import hashlib
import io
import os
import threading
import time
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


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


def pinned_project(tmp: Path, version: str) -> Path:
    """A project at ``tmp/proj`` pinning vLLM ``version`` from PyPI, with no patches."""
    proj = tmp / "proj"
    proj.mkdir()
    (proj / "patchset.yaml").write_text(
        f"name: demo\nvllm:\n  repo: pypi\n  ref: v{version}\npatches: []\n")
    return proj


class TrickleIndex:
    def __init__(self, dist: str, version: str, size: int, *, chunk: int = 64 * 1024,
                 delay: float = 0.05, more: tuple[str, ...] = ()) -> None:
        self.dist, self.chunk, self.delay = dist, chunk, delay
        self.fast = False
        self.sent = 0
        self.active = self.most_at_once = 0   # wheels being sent now, and the most at once
        self.requests: list[str] = []
        self.wheels = dict(make_wheel(dist, v, size) for v in (version, *more))
        self.wheel_name = next(iter(self.wheels))
        self.wheel = self.wheels[self.wheel_name]
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/simple"

    def pip_env(self) -> dict[str, str]:
        """This process's environment, with pip on this index alone (no config, no cache)."""
        return dict(os.environ, PIP_INDEX_URL=self.url, PIP_CONFIG_FILE=os.devnull,
                    PIP_NO_CACHE_DIR="1")

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
                    links = "".join(f'<a href="/files/{n}#sha256='
                                    f'{hashlib.sha256(w).hexdigest()}">{n}</a>'
                                    for n, w in index.wheels.items())
                    self._send(f"<html><body>{links}</body></html>".encode(), "text/html")
                elif self.path.startswith("/files/") and self.path[7:] in index.wheels:
                    self._trickle(index.wheels[self.path[7:]])
                else:
                    self.send_error(404)

            def _send(self, body: bytes, kind: str) -> None:
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _trickle(self, wheel: bytes) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(wheel)))
                self.end_headers()
                with index.lock:
                    index.active += 1
                    index.most_at_once = max(index.most_at_once, index.active)
                try:
                    for at in range(0, len(wheel), index.chunk):
                        self.wfile.write(wheel[at:at + index.chunk])
                        with index.lock:
                            index.sent += min(index.chunk, len(wheel) - at)
                        if not index.fast:
                            time.sleep(index.delay)
                except (BrokenPipeError, ConnectionResetError):
                    pass   # the downloader went away
                finally:
                    with index.lock:
                        index.active -= 1

        return Handler
