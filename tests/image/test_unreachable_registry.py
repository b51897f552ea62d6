"""A registry that never answers is said as such, with its cause, and "not found" only when a
registry answered: through skopeo (the --no-daemon path) and through an engine's pull.  Real
skopeo against a closed port, a name that does not resolve, and a port that accepts and never
speaks; tests/image/test_unreachable_pull_docker.py pulls through an engine."""

from __future__ import annotations

import contextlib
import socket
import threading

import pytest

from patchkit.errors import ImageError
from patchkit.engines.registry import Registry
from patchkit.imageref import Platform, unreachable

ARM = Platform("linux", "arm64")


def closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


@contextlib.contextmanager
def silent_port():
    """A port that accepts connections and never says a word."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue
    th = threading.Thread(target=accept, daemon=True)
    th.start()
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        th.join()
        for c in held:
            c.close()
        server.close()


@pytest.mark.parametrize("said, cause", [
    ('pinging container registry 127.0.0.1:1: Get "https://127.0.0.1:1/v2/": dial tcp '
     '127.0.0.1:1: connect: connection refused', "connection refused"),
    ('Get "https://nowhere.invalid/v2/": dial tcp: lookup nowhere.invalid on 10.0.0.2:53: no '
     'such host', "its host name does not resolve (DNS)"),
    ('Get "https://10.9.9.9/v2/": dial tcp 10.9.9.9:443: i/o timeout', "no answer in time"),
    ('pinging container registry h: Get "https://h/v2/": context deadline exceeded',
     "no answer in time"),
    ("no answer within 30 s", "no answer in time"),   # the SDK's wait on an engine's pull
    ('Get "https://h:5000/v2/": http: server gave HTTP response to HTTPS client', "HTTP"),
])
def test_each_unreachable_wording_has_its_cause(said, cause):
    assert cause in unreachable(said)


@pytest.mark.parametrize("said", [
    "reading manifest 1 in 127.0.0.1:5055/pk/x: manifest unknown: manifest unknown",
    "manifest for 127.0.0.1:5055/pk/x:1 not found: manifest unknown: manifest unknown",
    "pull access denied for x, repository does not exist or may require 'docker login'",
])
def test_a_registry_that_answered_is_not_unreachable(said):
    assert unreachable(said) is None


def _said(name: str, timeout: float = 20) -> str:
    with pytest.raises(ImageError) as exc:
        Registry(timeout=timeout).resolve(name, ARM)
    text = str(exc.value)
    assert "\n" not in text and "not found" not in text
    return text


def test_skopeo_connection_refused():
    host = closed_port()
    assert _said(f"{host}/pk/base:1") == (f"base image {host}/pk/base:1: cannot reach the "
                                          f"registry {host}: connection refused")


def test_skopeo_dns_failure():
    assert _said("nowhere.invalid/pk/base:1") == (
        "base image nowhere.invalid/pk/base:1: cannot reach the registry nowhere.invalid: its "
        "host name does not resolve (DNS)")


def test_skopeo_timeout():
    with silent_port() as host:
        assert _said(f"{host}/pk/base:1", timeout=2) == (
            f"base image {host}/pk/base:1: cannot reach the registry {host}: no answer in time "
            "(a timeout)")

