"""An engine's pull from a registry that never answers says "cannot reach" and its cause;
"not found" only when the registry answered (the real engine and registry)."""

from __future__ import annotations

import socket

import pytest

from patchkit.errors import ImageError
from patchkit.engines.docker import Engine
from patchkit.timeouts import DEFAULT_TIMEOUT
from patchkit.imageref import Platform

ARM = Platform("linux", "arm64")
pytestmark = [pytest.mark.docker]


def closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_an_engine_pull_from_a_closed_port_says_cannot_reach(docker_client):
    host = closed_port()
    engine = Engine.connect(timeout=DEFAULT_TIMEOUT)
    try:
        with pytest.raises(ImageError) as exc:
            engine.resolve_base(f"{host}/pk/base:1", ARM)
    finally:
        engine.close()
    assert str(exc.value) == (f"base image {host}/pk/base:1: the engine cannot reach the "
                              f"registry {host}: connection refused")


def test_an_engine_pull_of_a_missing_tag_says_not_found(docker_client, registry):
    engine = Engine.connect(timeout=DEFAULT_TIMEOUT)
    try:
        with pytest.raises(ImageError) as exc:
            engine.resolve_base(f"{registry}/pk-test/no-such-base:1", ARM)
    finally:
        engine.close()
    assert str(exc.value).startswith(f"base image {registry}/pk-test/no-such-base:1 not found: ")


def test_an_engine_pull_from_a_name_that_does_not_resolve_says_cannot_reach(docker_client):
    engine = Engine.connect(timeout=DEFAULT_TIMEOUT)
    try:
        with pytest.raises(ImageError) as exc:
            engine.resolve_base("nowhere.invalid/pk/base:1", ARM)
    finally:
        engine.close()
    assert str(exc.value) == ("base image nowhere.invalid/pk/base:1: the engine cannot reach the "
                              "registry nowhere.invalid: its host name does not resolve (DNS)")
