"""Fixtures of the image tests: the real engines, the registry, and arm64 vLLM bases.

They need the services of .ci/services.sh: the Docker Engine (DOCKER_HOST), a registry on
PK_REGISTRY, Podman's Docker-compatible API (PK_PODMAN_HOST) and a second Docker Engine behind
sshd (PK_NODE2, an ssh:// URL; PK_NODE2_SOCKET, its own socket).  Outside CI a missing service
skips the tests that need it; under CI=true it fails them.
"""

from __future__ import annotations

import os
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

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


@pytest.fixture(scope="session")
def podman_client():
    """A Docker SDK client on Podman's Docker-compatible API."""
    import docker

    host = os.environ.get("PK_PODMAN_HOST")
    if not host:
        _unavailable("PK_PODMAN_HOST is not set: no Podman service")
    try:
        client = docker.DockerClient(base_url=host, timeout=900)
        client.ping()
    except Exception as exc:
        _unavailable(f"no Podman at {host}: {exc}")
    yield client
    client.close()


@dataclass
class Node:
    """The second node, as a user names it (``url``, ``ssh://host:port``) and as a test may
    look at it behind ssh's back (``direct``, a client on its engine's own socket)."""

    url: str
    client: object   # docker.DockerClient through the system ssh
    socket: str | None
    direct: object   # docker.DockerClient on ``socket``, or None


@pytest.fixture(scope="session")
def node2():
    """The second Docker Engine, reached through the system ssh (so ~/.ssh/config applies)."""
    import docker

    url = os.environ.get("PK_NODE2")
    if not url:
        _unavailable("PK_NODE2 is not set: no second engine behind ssh")
    socket = os.environ.get("PK_NODE2_SOCKET") or None
    try:
        # The SDK's own ssh transport (paramiko) ignores ~/.ssh/config's host key settings;
        # use_ssh_client runs the system ssh, as the docker CLI does.
        client = docker.DockerClient(base_url=url, use_ssh_client=True, timeout=900)
        client.ping()
    except Exception as exc:
        _unavailable(f"no engine at {url}: {exc}")
    direct = None
    if socket:
        try:
            direct = docker.DockerClient(base_url=socket, timeout=900)
            direct.ping()
        except Exception as exc:
            client.close()
            _unavailable(f"no engine at {socket} (PK_NODE2_SOCKET): {exc}")
    yield Node(url=url, client=client, socket=socket, direct=direct)
    client.close()
    if direct is not None:
        direct.close()


@pytest.fixture(scope="session")
def dev_base(docker_client, registry) -> dict:
    """The dev-build base: vLLM 0.31.0's sources reporting ``0.31.1.dev7+g<sha>``, where
    <sha> is the v0.31.0 commit of patchkit's PyPI source (baseimage.ensure_dev_base)."""
    import baseimage

    return baseimage.ensure_dev_base(docker_client, registry,
                                     log=lambda m: print(m, file=sys.stderr))


@pytest.fixture(scope="session")
def vendor_base(docker_client, registry) -> dict:
    """The vendor base: vLLM 0.31.0's sources with the vendor's edits (``info["edits"]``),
    reporting ``0.31.0+nv25.11`` (baseimage.ensure_vendor_base)."""
    import baseimage

    return baseimage.ensure_vendor_base(docker_client, registry,
                                        log=lambda m: print(m, file=sys.stderr))
