"""Fixtures of the image tests: the real engines, the registry, and arm64 vLLM bases.

They need the services of .ci/services.sh: the Docker Engine (DOCKER_HOST), a registry on
PK_REGISTRY, Podman's Docker-compatible API (PK_PODMAN_HOST) and a second Docker Engine behind
sshd (PK_NODE2, an ssh:// URL; PK_NODE2_SOCKET, its own socket) and a third one behind an sshd of
its own (PK_NODE3, PK_NODE3_SOCKET), each on a port the script found free, all written into
$PK_SERVICES_ENV (default $PK_SERVICES_ROOT/services.env, /tmp/patchkit-tests/services.env)
for the shell that runs pytest to source (`make test` does).  The nodes are reached through the
`ssh` that file puts first on PATH, which reads the suite's own ssh config.  Outside CI a
missing service skips the tests that need it; under CI=true it fails them.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import urllib.request
from dataclasses import dataclass

import pytest

from testing.imageproject import REGISTRY, RELEASE


def _service(var: str) -> str:
    """Where a service of .ci/services.sh is: its variable, as the script wrote it."""
    value = os.environ.get(var)
    if not value:
        _unavailable(f"{var} is not set: source what .ci/services.sh wrote "
                     "($PK_SERVICES_ROOT/services.env)")
    return value


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
    if not REGISTRY:
        _service("PK_REGISTRY")
    try:
        urllib.request.urlopen(f"http://{REGISTRY}/v2/", timeout=5).read()
    except Exception as exc:
        _unavailable(f"no registry at {REGISTRY}: {exc}")
    return REGISTRY


@pytest.fixture(scope="session")
def bases(docker_client, registry) -> dict:
    """``{RELEASE: ensure_base info}``: the base of the release the test patchset is applied to
    (built once, then cached).  A base of another release, for the refusals, is the vendor's
    (``vendor_base``: 0.31.0's sources), which other tests need anyway: each base is a full
    build of a release's files."""
    from testing import baseimage

    return {RELEASE: baseimage.ensure_base(docker_client, RELEASE,
                                           f"{registry}/pk-test/vllm-base:{RELEASE}",
                                           log=lambda m: print(m, file=sys.stderr))}


@pytest.fixture(scope="session")
def podman_client():
    """A Docker SDK client on Podman's Docker-compatible API."""
    import docker

    host = _service("PK_PODMAN_HOST")
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
    socket: str      # unix:// of the node's engine
    direct: object   # docker.DockerClient on ``socket``


def _close_ssh_connections() -> None:
    """Ends the ssh processes of the Docker SDK's ssh:// connections.  With use_ssh_client the
    SDK makes a connection pool per request and leaves it to the garbage collector; closing a
    connection whose ssh has already ended (the engine closed it) raises BrokenPipeError,
    printed as a traceback when the interpreter exits.  Here they are closed quietly."""
    from docker.transport.sshconn import SSHConnectionPool

    for pool in [o for o in gc.get_objects() if isinstance(o, SSHConnectionPool)]:
        queue = pool.pool
        while queue is not None and not queue.empty():
            conn = queue.get(block=False)
            if conn is not None:
                with contextlib.suppress(OSError):
                    conn.close()


@contextlib.contextmanager
def _node(n: int):
    """Node ``n`` of .ci/services.sh, reached through the `ssh` on PATH (the suite's, which
    reads the suite's ssh config), and on its engine's own socket."""
    import docker

    url = _service(f"PK_NODE{n}")
    socket = _service(f"PK_NODE{n}_SOCKET")
    try:
        # The SDK's own ssh transport (paramiko) reads no ssh config and refuses a host missing
        # from known_hosts; use_ssh_client runs `ssh` from PATH, as the docker CLI does.
        client = docker.DockerClient(base_url=url, use_ssh_client=True, timeout=900)
        client.ping()
    except Exception as exc:
        _unavailable(f"no engine at {url}: {exc}")
    try:
        direct = docker.DockerClient(base_url=socket, timeout=900)
        direct.ping()
    except Exception as exc:
        client.close()
        _unavailable(f"no engine at {socket} (PK_NODE{n}_SOCKET): {exc}")
    yield Node(url=url, client=client, socket=socket, direct=direct)
    client.close()
    direct.close()
    _close_ssh_connections()


@pytest.fixture(scope="session")
def node2():
    """The second Docker Engine, behind an sshd on 127.0.0.1."""
    with _node(2) as node:
        yield node


@pytest.fixture(scope="session")
def node3():
    """The third Docker Engine, behind an sshd of its own on 127.0.0.1."""
    with _node(3) as node:
        yield node


@pytest.fixture(scope="session")
def dev_base(docker_client, registry) -> dict:
    """The dev-build base: vLLM 0.31.0's sources reporting ``0.31.1.dev7+g<sha>``, where
    <sha> is the v0.31.0 commit of patchkit's PyPI source (baseimage.ensure_dev_base)."""
    from testing import baseimage

    return baseimage.ensure_dev_base(docker_client, registry,
                                     log=lambda m: print(m, file=sys.stderr))


@pytest.fixture(scope="session")
def vendor_base(docker_client, registry) -> dict:
    """The vendor base: vLLM 0.31.0's sources with the vendor's edits (``info["edits"]``),
    reporting ``0.31.0+nv25.11`` (baseimage.ensure_vendor_base)."""
    from testing import baseimage

    return baseimage.ensure_vendor_base(docker_client, registry,
                                        log=lambda m: print(m, file=sys.stderr))
