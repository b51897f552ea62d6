"""Fixtures of the image tests: the real Docker Engine, the registry, and arm64 vLLM bases.

They need the services of .ci/services.sh (DOCKER_HOST, a registry on PK_REGISTRY).  Outside CI
a missing engine skips the docker tests; under CI=true it fails them.
"""

from __future__ import annotations

import os
import sys
import urllib.request
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # baseimage, imageproject (the shared fixtures: tests/testing)

from imageproject import OTHER_RELEASE, REGISTRY, RELEASE  # noqa: E402


def _unavailable(why: str):
    if os.environ.get("CI") == "true":
        pytest.fail(f"{why} (CI runs .ci/services.sh first)")
    pytest.skip(why)


@pytest.fixture(scope="session")
def docker_client():
    import docker

    try:
        client = docker.from_env(timeout=900)
        client.ping()
    except Exception as exc:
        _unavailable(f"no Docker Engine at {os.environ.get('DOCKER_HOST', '(default)')}: {exc}")
    return client


@pytest.fixture(scope="session")
def registry(docker_client) -> str:
    try:
        urllib.request.urlopen(f"http://{REGISTRY}/v2/", timeout=5).read()
    except Exception as exc:
        _unavailable(f"no registry at {REGISTRY}: {exc}")
    return REGISTRY


@pytest.fixture(scope="session")
def bases(docker_client, registry) -> dict:
    """``{version: ensure_base info}`` for both test releases (built once, then cached)."""
    import baseimage

    out = {}
    for version in (RELEASE, OTHER_RELEASE):
        out[version] = baseimage.ensure_base(docker_client, version,
                                             f"{registry}/pk-test/vllm-base:{version}",
                                             log=lambda m: print(m, file=sys.stderr))
    return out
