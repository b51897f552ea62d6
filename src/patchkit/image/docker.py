"""The Docker border: everything patchkit asks of a Docker Engine.

This is the only module that imports ``docker`` or runs the docker CLI; every SDK or API
failure leaves it as a one-line :class:`~patchkit.errors.ImageError`.  The engine is the one
``DOCKER_HOST`` names: a local socket, a TCP endpoint, or ``ssh://user@dgx-spark`` (through the
system's ssh client).

An overlay image reaches the engine as a ``docker load`` archive (``layer.load_archive``) that
omits the base's layers, which the engine already has (it skips any layer whose chain it
holds); a rebuild with nothing changed finds the image already there.  Only the classic image
store can take such a partial load: containerd's image store and Podman's containers-storage
get a complete archive instead, the base's layers as the engine exports them followed by the
new layer, streamed from the export into the load (``Store`` tells which store an engine has).

Other engines (``copy-image``, ``build-image --copy-to``) are named by URL: ``ssh://`` through
the system's ssh (so ``~/.ssh/config`` applies), ``unix://`` or ``tcp://``; ``engine_url`` is
the one parser of such addresses, ``DOCKER_HOST``'s included.

Every request waits at most ``timeout`` seconds of silence (``timeouts.DEFAULT_TIMEOUT``): the
connection, then each wait for the next bytes, never a whole stream, so a load or export of
gigabytes goes on while bytes flow.  Builds alone wait without a bound: a compile step may be
silent for minutes.
"""

from __future__ import annotations

import base64
import errno as errno_
import fcntl
import functools
import importlib.util
import io
import json
import os
import re
import math
import select
import shlex
import shutil
import socket
import tarfile
import tempfile
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import Callable, Iterable, Iterator
from urllib.parse import urlsplit

from patchkit.errors import CommandError, ImageError, UsageError
from patchkit.image.layer import (ArchiveFacts, BaseImage, ChunkReader, Layer, complete_archive,
                                  history_of, relay)
from patchkit.imageref import Platform, repository, split_tag
from patchkit.timeouts import DEFAULT_TIMEOUT, shown as shown_seconds
from patchkit.process import Piped, run, spawn

Log = Callable[[str], None]

# ----------------------------------------------------------------------------- the engine

def _docker():
    try:
        import docker
        import docker.errors
    except ImportError as exc:  # pragma: no cover - a dependency of the package
        raise ImageError(f"the docker SDK is not installed ({exc})") from exc
    return docker


def _explain(exc: BaseException) -> str:
    docker = _docker()
    if isinstance(exc, docker.errors.APIError):
        text = exc.explanation or str(exc)
        if isinstance(text, bytes):
            text = text.decode(errors="replace")
        return " ".join(str(text).split())
    return _reason(exc) or " ".join(str(exc).split()) or type(exc).__name__


_OS_WORDS = {errno_.ENOENT: "no such socket", errno_.ECONNREFUSED: "connection refused",
             errno_.EACCES: "permission denied", errno_.ECONNRESET: "the connection was reset",
             errno_.EPIPE: "the connection was cut", errno_.EHOSTUNREACH: "host unreachable",
             errno_.ENETUNREACH: "network unreachable", errno_.ENOTSOCK: "not a socket"}


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and what it wraps: causes, contexts, and exceptions among its args (requests and
    urllib3 carry the OS error there, inside a tuple's repr otherwise)."""
    seen: set[int] = set()
    todo: list[object] = [exc]
    while todo:
        e = todo.pop(0)
        if not isinstance(e, BaseException) or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [e.__cause__, e.__context__, getattr(e, "reason", None), *e.args]


def _reason(exc: BaseException) -> str:
    """A transport failure in plain words ("no such socket", "no answer within 30 s"), or ""
    when it is none patchkit knows."""
    import requests
    import urllib3.exceptions

    found = list(_causes(exc))
    for e in found:  # first: urllib3 words a refused connection as a kind of timeout
        if isinstance(e, socket.gaierror):
            return "cannot resolve the host name"
        if isinstance(e, OSError) and e.errno in _OS_WORDS:
            return _OS_WORDS[e.errno]
    for e in found:
        if isinstance(e, (requests.exceptions.Timeout, urllib3.exceptions.TimeoutError,
                          socket.timeout, TimeoutError)):
            said = re.search(r"timeout=([0-9.]+)", str(e))
            return (f"no answer within {shown_seconds(float(said.group(1)))}" if said
                    else "no answer in time")
    for e in found:
        if isinstance(e, OSError) and e.strerror:
            return e.strerror[:1].lower() + e.strerror[1:]
    return ""


@contextmanager
def _border(what: str) -> Iterator[None]:
    """SDK and transport failures -> one-line ImageError naming what was being done."""
    docker = _docker()
    import requests

    try:
        yield
    except ImageError:
        raise
    except docker.errors.NotFound as exc:
        raise ImageError(f"{what}: not found ({_explain(exc)})") from exc
    except (docker.errors.DockerException, requests.exceptions.RequestException, OSError) as exc:
        raise ImageError(f"{what}: {_explain(exc)}") from exc


# ------------------------------------------------------------------------ engine addresses

_MIN_API = "1.24"   # what the SDK is told before the engine has said its own

ENGINE_FORMS = "ssh://[user@]host[:port], unix:///path/to/socket or tcp://host:port"


def engine_url(text: str, what: str = "engine") -> str:
    """``text`` checked to be an engine address (see ENGINE_FORMS); a usage error otherwise."""
    def bad(why: str) -> UsageError:
        return UsageError(f"{what} {text!r} is not an engine address: {why}")

    try:
        url = urlsplit(text)
        port = url.port
    except ValueError as exc:
        raise bad(str(exc)) from None
    if url.scheme not in ("ssh", "unix", "tcp"):
        raise bad(f"expected {ENGINE_FORMS}")
    if url.query or url.fragment:
        raise bad("an engine address has no ?query or #fragment")
    if url.scheme == "unix":
        if url.netloc or not url.path.startswith("/"):
            raise bad("a socket is unix:///absolute/path")
        return text
    if not url.hostname or url.path not in ("", "/") or url.password:
        raise bad("expected ssh://[user@]host[:port]" if url.scheme == "ssh" else
                  "expected tcp://host:port")
    if url.scheme == "tcp" and (port is None or url.username):
        raise bad("expected tcp://host:port")
    return text.rstrip("/")


def docker_host() -> str | None:
    """The engine ``DOCKER_HOST`` names, checked like any engine address; None when it is unset
    (the SDK's default socket)."""
    text = os.environ.get("DOCKER_HOST", "")
    return engine_url(text, "DOCKER_HOST") if text.strip() else None


def _ssh_dest(url) -> str:
    return f"{url.username}@{url.hostname}" if url.username else url.hostname


def _ssh_port(host: str, timeout: float = DEFAULT_TIMEOUT) -> tuple[str, int]:
    """The ssh destination (``[user@]host``) and port of an ssh:// address: the URL's port,
    else the one the system's ssh would take (``ssh -G``, so ~/.ssh/config applies; the SDK
    would pass port 22, overriding it)."""
    if not shutil.which("ssh"):
        raise ImageError(f"{host}: an ssh:// engine needs the ssh client, which is not installed")
    url = urlsplit(host)
    dest = _ssh_dest(url)
    if url.port is not None:
        return dest, url.port
    try:
        shown = run(["ssh", "-G", dest], check=False, timeout=max(1, math.ceil(timeout)))
    except CommandError as exc:
        raise ImageError(f"no Docker Engine answers at {host}: {exc.output.strip()}") from None
    return dest, next((int(line.split()[1]) for line in shown.stdout.splitlines()
                       if line.startswith("port ") and line.split()[1].isdigit()), 22)


def _ssh_argv(dest: str, port: int, timeout: float | None) -> list[str]:
    """The system's ssh to ``dest``, ready for the command to run there."""
    wait = max(1, math.ceil(timeout or DEFAULT_TIMEOUT))  # ssh takes whole seconds
    return ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={wait}",
            "-o", "ServerAliveInterval=15", "-p", str(port), "--", dest]


class _SshStream:
    """One ssh session to a node running ``docker system dial-stdio`` there: the byte stream
    an HTTP connection to the node's engine runs over, kept open for request after request
    (the SDK's own ssh transport opens a session per request: a key exchange, some 4 KB and a
    round trip or more each).  Every read and write waits at most the timeout urllib3 sets;
    what ssh says on stderr is kept, for the one line of an error."""

    def __init__(self, dest: str, port: int, timeout: float | None) -> None:
        self.proc = spawn([*_ssh_argv(dest, port, timeout), "docker", "system", "dial-stdio"])
        self.timeout = timeout
        self._in, self._out = self.proc.stdin.fileno(), self.proc.stdout.fileno()
        for fd in (self._in, self._out):
            os.set_blocking(fd, False)
            try:   # fewer, larger hand-overs between this process and ssh
                fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, 1 << 20)
            except (OSError, AttributeError):
                pass   # a smaller pipe works too
        self._said = bytearray()
        threading.Thread(target=self._drain_stderr, daemon=True).start()
        self._reader = io.BufferedReader(_PipeReader(self), 1 << 16)

    def _drain_stderr(self) -> None:
        try:
            while chunk := self.proc.stderr.read1(4096):
                self._said = (self._said + chunk)[-4096:]
        except (OSError, ValueError):
            pass

    def complaint(self) -> str:
        """The last line ssh (or the node's shell) wrote on stderr, once it has ended."""
        try:
            self.proc.wait(timeout=2)
        except Exception:
            return ""
        lines = [t.strip() for t in self._said.decode(errors="replace").splitlines()]
        said = [t for t in lines if t]
        return said[-1] if said else (f"ssh exited with {self.proc.returncode}"
                                      if self.proc.returncode else "")

    def settimeout(self, timeout: float | None) -> None:
        self.timeout = timeout

    def gettimeout(self) -> float | None:
        return self.timeout

    def fileno(self) -> int:
        return self._out   # readable between responses only when ssh has ended

    def _wait(self, fd: int, writing: bool) -> None:
        ready = select.select([] if writing else [fd], [fd] if writing else [], [], self.timeout)
        if not any(ready):
            raise socket.timeout(f"timed out (timeout={self.timeout})")

    def sendall(self, data) -> None:
        view = memoryview(data).cast("B")
        while view:
            self._wait(self._in, True)
            try:
                view = view[os.write(self._in, view):]
            except BlockingIOError:
                continue
            except BrokenPipeError:
                raise ConnectionResetError(errno_.EPIPE, "ssh to the node has ended") from None

    send = sendall

    def recv_into(self, buf) -> int:
        while True:
            self._wait(self._out, False)
            try:
                return os.readv(self._out, [buf])
            except BlockingIOError:
                continue

    def makefile(self, mode: str = "rb", *args, **kwargs):
        # one buffer for every response, as on one socket, which closing a response leaves
        return _Unclosed(self._reader)

    def close(self) -> None:
        # ssh first: closing its stderr waits for the thread reading it, which waits for ssh
        try:
            self.proc.terminate()
            self.proc.wait(timeout=2)
        except Exception:  # it is gone, or going: nothing of it is needed any more
            self.proc.kill()
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                pipe.close()
            except OSError:
                pass


class _Unclosed:
    """A response's view of the stream's reader: closing it leaves the stream open."""

    def __init__(self, reader: io.BufferedReader) -> None:
        self._reader, self.closed = reader, False

    def __getattr__(self, name: str):
        return getattr(self._reader, name)

    def close(self) -> None:
        self.closed = True


class _PipeReader(io.RawIOBase):
    def __init__(self, stream: _SshStream) -> None:
        self.stream = stream

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        return self.stream.recv_into(buf)


@functools.cache
def _ssh_adapter_class():
    """The SDK's ssh adapter, made to keep its connections: one pool for the engine, whose
    connections run over :class:`_SshStream` sessions and are used again request after
    request (HTTP keep-alive through ``dial-stdio``)."""
    from docker.transport.sshconn import SSHConnection, SSHConnectionPool, SSHHTTPAdapter

    class Connection(SSHConnection):
        def connect(self) -> None:
            self.sock = _SshStream(*self.ssh_host, self.timeout)
            self.adapter_streams.append(self.sock)

    class Pool(SSHConnectionPool):
        def _get_conn(self, timeout=None):
            conn = super()._get_conn(timeout)
            if conn.sock is not None and not conn.is_connected:
                conn.close()   # its ssh has ended: the request opens a new session
            return conn

        def _new_conn(self):
            conn = Connection(None, self.timeout, self.ssh_host)
            conn.adapter_streams = self.streams
            return conn

    class Adapter(SSHHTTPAdapter):
        def __init__(self, dest: str, port: int, timeout: float) -> None:
            super().__init__(f"ssh://{dest}:{port}", timeout, shell_out=True)
            self.streams: list[_SshStream] = []
            self.pool = Pool(None, timeout, self.max_pool_size, (dest, port))
            self.pool.streams = self.streams

        def get_connection(self, url, proxies=None):
            return self.pool

        def complaint(self) -> str:
            return next((c for c in (s.complaint() for s in reversed(self.streams)) if c), "")

        def close(self) -> None:
            super().close()
            self.pool.close()
            for stream in self.streams:
                stream.close()

    return Adapter


# ----------------------------------------------------------------------------- image stores

@dataclass(frozen=True)
class Store:
    """Where an engine keeps its images, which decides how an image may reach it."""

    kind: str       # classic | containerd | containers-storage
    detail: str     # how it was told

    @property
    def partial_load(self) -> bool:
        """Whether a load archive may leave out the layers the engine already holds."""
        return self.kind == "classic"

    @property
    def ids_are_config_digests(self) -> bool:
        """A containerd store names an image by the digest of its manifest (or index)."""
        return self.kind != "containerd"

    def __str__(self) -> str:
        return {"classic": "the classic image store", "containerd": "containerd's image store",
                "containers-storage": "containers-storage"}[self.kind]


def store_of(version: dict, info: dict) -> Store:
    """The store an engine has, from its version and info answers."""
    for component in version.get("Components") or ():
        if component.get("Name") == "Podman Engine":
            return Store("containers-storage", f"Podman {component.get('Version') or ''}".strip())
    if "BuildahVersion" in info:  # only Podman's Docker API answers with Buildah's version
        return Store("containers-storage", f"Podman {info.get('ServerVersion') or ''}".strip())
    for pair in info.get("DriverStatus") or ():
        if len(pair) == 2 and pair[0] == "driver-type" and "containerd" in str(pair[1]):
            return Store("containerd", f"snapshotter {info.get('Driver') or pair[1]}")
    if info.get("Driver") == "overlayfs":  # containerd's snapshotter; the classic one is overlay2
        return Store("containerd", "snapshotter overlayfs")
    return Store("classic", f"storage driver {info.get('Driver') or 'unknown'}")


_STAMP = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$")


def since_start(state: dict) -> float | None:
    """The time (Unix seconds, to the microsecond) from which a container's log is its current
    start's, from its inspected ``State``; None when it never started (the whole log, empty).
    That is ``StartedAt``; but a running container that stopped before (a restart) has the
    previous run's ``FinishedAt`` before it, which the engine sets once that run's output is
    drained, so its log is read from there: a line written before the engine recorded the new
    start (a fast first line) still counts."""
    started = _epoch(state.get("StartedAt"))
    finished = _epoch(state.get("FinishedAt"))
    if started and finished and state.get("Running") and finished < started:
        return finished
    return started


def _epoch(stamp: str | None) -> float | None:
    """An RFC 3339 time as the engine writes it (``2026-12-02T01:50:00.123456789Z``), in
    Unix seconds floored to the microsecond; None for the zero time or no time."""
    found = _STAMP.match(stamp or "")
    if not found:
        return None
    whole, fraction, zone = found.groups()
    seconds = datetime.fromisoformat(whole + ("+00:00" if zone == "Z" else zone)).timestamp()
    if seconds <= 0:   # Go's zero time, 0001-01-01T00:00:00Z: never
        return None
    micros = int((fraction or ".0")[1:7].ljust(6, "0"))
    return int(seconds) + micros / 1_000_000


LOAD_PATIENCE = 10   # see Engine._load_once


class Engine:
    """A connection to one Docker Engine.  ``cli``, when set, is how the docker CLI reaches
    the same engine (``docker -H URL``, or ``ssh NODE docker``, each word of what follows
    quoted for the node's shell): exports and loads then run as its child processes, and the
    bytes between them go through the kernel (``image.stream``)."""

    def __init__(self, client, host: str | None = None, cli: list[str] | None = None) -> None:
        self.client = client
        self.api = client.api
        self.host = host or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        self.cli = cli
        self._store: Store | None = None
        self._version: dict | None = None

    @classmethod
    def connect(cls, host: str | None = None, timeout: float = DEFAULT_TIMEOUT) -> "Engine":
        """The engine at ``host`` (an address ``engine_url`` took), else the one DOCKER_HOST
        names, once it has answered; ``timeout`` bounds each silence of it."""
        docker = _docker()
        host = host or docker_host()
        shown = host or "unix:///var/run/docker.sock"
        if host and host.startswith("ssh://"):
            if importlib.util.find_spec("paramiko") is None:  # the SDK's ssh transport needs it
                raise ImageError(f"DOCKER_HOST={host} needs the paramiko package, which is not "
                                 "installed: pip install 'docker[ssh]'") from None
        if host and host.startswith("ssh://"):
            return cls._connect_ssh(host, timeout)
        try:
            client = (docker.DockerClient(base_url=host, timeout=timeout) if host
                      else docker.from_env(timeout=timeout))
            client.ping()
        except Exception as exc:  # any transport failure means the same thing here
            raise ImageError(f"no Docker Engine answers at {shown}: {_explain(exc)}") from exc
        # the address the SDK took, never the CLI's own context, which may name another engine
        cli = ["docker", "-H", shown] if shutil.which("docker") else None
        return cls(client, shown, cli)

    @classmethod
    def _connect_ssh(cls, host: str, timeout: float) -> "Engine":
        """The engine behind ssh (the system's, so ~/.ssh/config and agents apply), over one
        ssh session kept open for every request; its first answer (the version, which the
        SDK needs anyway) is the proof that it answers, else what ssh said is the error."""
        docker = _docker()
        dest, port = _ssh_port(host, timeout)
        adapter = _ssh_adapter_class()(dest, port, timeout)
        try:
            client = docker.DockerClient(base_url=f"ssh://{dest}:{port}", timeout=timeout,
                                         use_ssh_client=True, version=_MIN_API)
            client.api.mount("http+docker://ssh", adapter)
            client.api._custom_adapter = adapter
            version = client.api.version(api_version=False)
            client.api._version = version["ApiVersion"]
        except Exception as exc:  # any transport failure means the same thing here
            said = adapter.complaint() or _explain(exc)
            adapter.close()
            raise ImageError(f"no Docker Engine answers at {host}: {said}") from exc
        engine = cls(client, host, [*_ssh_argv(dest, port, timeout), "docker"])
        engine._version = version
        return engine

    def close(self) -> None:
        """Let the engine go (an ssh connection's session ends)."""
        try:
            self.client.close()
        except Exception:  # closing is best effort: nothing of it is needed any more
            pass

    # -- facts

    def info(self) -> dict:
        with _border(f"asking the engine at {self.host} about itself"):
            return self.api.info()

    def store(self) -> Store:
        if self._store is None:
            info = self.info()
            version: dict = {}
            if self._version is not None:
                version = self._version
            elif "BuildahVersion" not in info:  # Podman's info says so; its version is slow
                with _border(f"asking the engine at {self.host} for its version"):
                    version = self.api.version()
            self._store = store_of(version, info)
        return self._store

    def content(self, ref: str) -> dict | None:
        """Inspect output of ``ref`` with ``ConfigDigest`` added (see ``layer.fingerprint``), or
        None when the engine has no such image.  A containerd store's ids are manifest
        digests, so there the config is read from the engine's export of the image."""
        attrs = self.inspect(ref)
        if attrs is None:
            return None
        attrs = dict(attrs)
        if self.store().ids_are_config_digests:
            iid = attrs["Id"]
            attrs["ConfigDigest"] = iid if iid.startswith("sha256:") else f"sha256:{iid}"
        else:
            facts = ArchiveFacts()
            for _ in relay(self.export(attrs["Id"]), facts):
                pass
            layers = (attrs.get("RootFS") or {}).get("Layers") or ()
            attrs["ConfigDigest"] = facts.config_digest(layers)
        return attrs

    def layers_held(self, diff_ids: Iterable[str], known: Iterable["Prefix"] = (),
                    limit: int = 2000) -> int:
        """How many of ``diff_ids``, from the bottom, this engine holds: the longest prefix
        that some image of its store has.  ``known`` are images (by name) that hold a prefix
        on another engine: the engine is asked for those first, by name, in one request, and
        when it holds one of them that answers (the store keeps layers by chain, that is by
        prefix; only a classic store can make use of the answer, see
        ``Store.partial_load``).  Else every image of its store (the first ``limit``) is
        inspected, which every store kind answers."""
        want = list(diff_ids)
        best = self._held_by_name(want, list(known))
        if best:
            return best
        with _border(f"listing the images of the engine at {self.host}"):
            ids = [i["Id"] for i in self.api.images(all=True)][:limit]
        for iid in ids:
            layers = ((self.inspect(iid) or {}).get("RootFS") or {}).get("Layers") or ()
            best = max(best, _common_prefix(layers, want))
            if best == len(want):
                break
        return best

    def _held_by_name(self, want: list[str], known: list["Prefix"]) -> int:
        names = sorted({n for p in known for n in p.names})
        if not names:
            return 0
        try:
            with _border(f"listing the images of the engine at {self.host}"):
                found = self.api.images(filters={"reference": names})
        except ImageError:
            return 0   # a store that takes no such filter: the whole list is read instead
        by_id = {p.image_id: p.layers for p in known}
        best = 0
        for image in found:
            if image.get("Id") in by_id and self.store().ids_are_config_digests:
                best = max(best, by_id[image["Id"]])   # the config names the layers
            else:
                layers = ((self.inspect(image["Id"]) or {}).get("RootFS") or {}).get("Layers")
                best = max(best, _common_prefix(layers or (), want))
        return best

    def prefixes(self, diff_ids: Iterable[str], size: int | None = None,
                 limit: int = 2000) -> list["Prefix"]:
        """The named images of this engine whose layers are a proper prefix of ``diff_ids``
        (an image's base, and the base's base): what another engine may hold them by.  Only
        images no bigger than ``size`` (the image's own) can be one."""
        want = list(diff_ids)
        with _border(f"listing the images of the engine at {self.host}"):
            listed = [i for i in self.api.images() if size is None or (i.get("Size") or 0) <= size]
        found: list[Prefix] = []
        for image in listed[:limit]:
            names = [n for n in (image.get("RepoTags") or []) + (image.get("RepoDigests") or [])
                     if n and "<none>" not in n]
            attrs = self.inspect(image["Id"]) if names else None
            layers = list(((attrs or {}).get("RootFS") or {}).get("Layers") or ())
            if names and 0 < len(layers) < len(want) and layers == want[:len(layers)]:
                found.append(Prefix(tuple(names), image["Id"], len(layers)))
        return sorted(found, key=lambda p: -p.layers)

    def tagged(self, ref: str) -> str | None:
        """The id of the image ``ref`` names on this engine, or None."""
        return (self.inspect(ref) or {}).get("Id")

    def inspect(self, ref: str) -> dict | None:
        docker = _docker()
        try:
            with _border(f"inspecting {ref}"):
                return self.api.inspect_image(ref)
        except ImageError as exc:
            if isinstance(exc.__cause__, docker.errors.ImageNotFound) or (
                    isinstance(exc.__cause__, docker.errors.NotFound)):
                return None
            raise

    def resolve_base(self, ref: str, platform: Platform, log: Log = lambda m: None,
                     pull: bool = True) -> BaseImage:
        """The base as the engine holds it (pulled for ``platform`` when missing), checked to be
        of that platform and pinned by its registry digest, else by its image id."""
        attrs = self.inspect(ref)
        if attrs is None and pull and not ref.startswith("sha256:"):
            repo, tag = (ref.split("@", 1) if "@" in ref else split_tag(ref))
            log(f"pulling {ref} for {platform}")
            try:
                with _border(f"pulling the base {ref}"):
                    for line in self.api.pull(repo, tag=tag, platform=str(platform), stream=True,
                                              decode=True):
                        if "error" in line:
                            raise ImageError(f"base image {ref} not found: "
                                             f"{' '.join(str(line['error']).split())}")
            except ImageError as exc:
                if str(exc).startswith("base image"):
                    raise
                why = _explain(exc.__cause__) if exc.__cause__ is not None else str(exc)
                raise ImageError(f"base image {ref} not found: {why}") from exc
            attrs = self.inspect(ref)
        if attrs is None:
            raise ImageError(f"base image {ref} not found on the engine at {self.host}")
        got = Platform(attrs.get("Os") or "linux", attrs.get("Architecture") or "unknown",
                       attrs.get("Variant") or None)
        if not got.matches(platform):
            raise ImageError(f"base image {ref} is {got}, not {platform}")
        repo = repository(ref)
        digest = None
        if "@sha256:" in ref:
            digest = ref.split("@", 1)[1]
        else:
            for rd in attrs.get("RepoDigests") or ():
                if rd.split("@", 1)[0] == repo:
                    digest = rd.split("@", 1)[1]
                    break
        diff_ids = tuple((attrs.get("RootFS") or {}).get("Layers") or ())
        with _border(f"reading the history of {ref}"):
            raw_history = self.api.history(attrs["Id"])
        return BaseImage(name=ref, image_id=attrs["Id"], digest=digest, platform=got,
                         config=attrs.get("Config") or {}, diff_ids=diff_ids,
                         history=history_of(raw_history, len(diff_ids), ref),
                         config_digest=(attrs["Id"] if self.store().ids_are_config_digests
                                        else None))

    # -- files of an image, without running it

    @contextmanager
    def files(self, image: str, name: str | None = None) -> Iterator["ImageFiles"]:
        """The image's filesystem, readable through a container that is created, never started,
        and removed on the way out.  ``name`` is how messages call the image (what the user
        gave), when ``image`` is its id."""
        with _border(f"creating a stopped container of {image}"):
            created = self.api.create_container(
                image, command=["/.patchkit-never-started"], entrypoint=[],
                network_disabled=True, labels={"io.patchkit.scratch": "1"})
        cid = created["Id"]
        try:
            yield ImageFiles(self.api, cid, name or image)
        finally:
            try:
                self.api.remove_container(cid, force=True, v=True)
            except Exception:  # the container is scratch; its removal is best effort
                pass

    # -- what a container logged

    def container_log(self, name: str) -> Iterator[bytes] | None:
        """The log of container ``name`` (a name or an id) since its current start: stdout and
        stderr in the order the engine recorded them, as the chunks of bytes the engine sends
        (the caller cuts them into lines, within its bounds), or None when the engine has no
        such container.  What earlier starts of it logged is left out (``since_start``).  A log
        driver the engine cannot read back is an ImageError."""
        docker = _docker()
        try:
            with _border(f"inspecting the container {name}"):
                attrs = self.api.inspect_container(name)
        except ImageError as exc:
            if isinstance(exc.__cause__, docker.errors.NotFound):
                return None
            raise
        return self._log_chunks(attrs["Id"], name, since_start(attrs.get("State") or {}))

    def _log_chunks(self, cid: str, name: str, since: float | None) -> Iterator[bytes]:
        with _border(f"reading the log of the container {name}"):
            yield from self.api.logs(cid, stdout=True, stderr=True, stream=True, follow=False,
                                     **({"since": since} if since else {}))

    # -- making images

    def images_with_label(self, key: str, value: str) -> list[str]:
        with _border("listing images"):
            return [i["Id"] for i in self.api.images(filters={"label": f"{key}={value}"})]

    def has_image(self, image_id: str) -> bool:
        return self.inspect(image_id) is not None

    def load(self, archive: bytes | Iterable[bytes] | Callable[[], Iterable[bytes]],
             expect_id: str, diff_ids: Iterable[str] | None = None, log: Log = lambda m: None
             ) -> str:
        """``docker load`` of ``archive``: bytes, chunks streamed into the request, or a function
        that makes such a stream (then a connection that breaks is tried once more with a new
        stream: over ssh a session can drop under load).  Returns the id the engine holds the
        image by: ``expect_id`` (the config digest) where ids are config digests, else the
        loaded image whose layers are ``diff_ids``."""
        import requests

        loaded: list[str] = []
        for attempt in (1, 2):
            body = archive() if callable(archive) else archive
            try:
                loaded = self._load_once(body)
                break
            except ImageError as exc:
                broken = isinstance(exc.__cause__, requests.exceptions.ConnectionError)
                if attempt == 2 or not broken or not callable(archive):
                    raise
                log(f"the connection to {self.host} broke ({exc}); sending again")
        return self._held_as(loaded, expect_id, diff_ids)

    def _held_as(self, loaded: list[str], expect_id: str, diff_ids: Iterable[str] | None
                 ) -> str:
        if self.store().ids_are_config_digests:
            if not self.has_image(expect_id):
                raise ImageError(f"the engine at {self.host} loaded the archive but holds no "
                                 f"image {expect_id[:19]}")
            return expect_id
        want = list(diff_ids or ())
        for ref in loaded:
            attrs = self.inspect(ref)
            if attrs and list((attrs.get("RootFS") or {}).get("Layers") or ()) == want:
                return attrs["Id"]
        raise ImageError(f"the engine at {self.host} loaded the archive but holds no image of "
                         f"config {expect_id[:19]}")

    def _load_once(self, archive: bytes | Iterable[bytes]) -> list[str]:
        """One ``docker load``; the refs the engine says it loaded.  While it loads, the
        engine may be silent for long: a store that copies layers (vfs) says nothing while it
        copies the parent's files for each new layer, so each silence may last
        ``LOAD_PATIENCE`` times the timeout."""
        loaded: list[str] = []
        with _border(f"loading the image into the engine at {self.host}"), self._patient():
            for line in self.api.load_image(archive):
                if not isinstance(line, dict):
                    continue
                if line.get("error"):
                    raise ImageError(f"the engine at {self.host} refused the image: "
                                     f"{' '.join(str(line['error']).split())}")
                said = re.search(r"Loaded image(?: ID)?: (\S+)", str(line.get("stream") or ""))
                if said:
                    loaded.append(said.group(1))
        return loaded

    @contextmanager
    def _patient(self) -> Iterator[None]:
        before = getattr(self.api, "timeout", None)
        if not before:   # no bound to stretch (or a stand-in of the SDK)
            yield
            return
        self.api.timeout = before * LOAD_PATIENCE
        try:
            yield
        finally:
            self.api.timeout = before

    def load_complete(self, base: BaseImage, config: bytes, layer: Layer, expect_id: str,
                      log: Log = lambda m: None) -> str:
        """Load the whole image: the base as this engine exports it, then ``layer`` and
        ``config``, streamed from the export into the load without a file in between."""
        def archive() -> Iterator[bytes]:
            return complete_archive(self.export(base.image_id), config, layer, base.diff_ids)
        return self.load(archive, expect_id, [*base.diff_ids, layer.diff_id], log)

    def _piped(self, args: list[str], feed: bool) -> Piped:
        assert self.cli is not None
        remote = self.cli[0] == "ssh"
        cmd = [*self.cli, *(shlex.quote(a) for a in args)] if remote else [*self.cli, *args]
        try:
            return Piped(cmd, feed=feed)
        except CommandError as exc:
            raise ImageError(f"the engine at {self.host}: {exc.output.strip()}") from None

    def export_piped(self, ref: str) -> Piped:
        """``docker save ref`` running, its stdout the pipe ``fd`` (needs ``cli``)."""
        return self._piped(["save", ref], feed=False)

    def load_piped(self) -> Piped:
        """``docker load`` running on this engine, its stdin the pipe ``fd`` (needs
        ``cli``); :meth:`loaded` waits for it."""
        return self._piped(["load", "-q"], feed=True)

    def exported(self, proc: Piped, timeout: float) -> None:
        """The export ``proc`` ended well, or one line of why not."""
        code = proc.wait(timeout)
        if code is None:
            proc.end()
            raise ImageError(f"the export from the engine at {self.host} did not end within "
                             f"{shown_seconds(timeout)} of its last byte")
        if code:
            raise ImageError(f"exporting from the engine at {self.host}: "
                             f"{_daemon_said(proc.said()) or f'exit {code}'}")

    def loaded(self, proc: Piped, expect_id: str, diff_ids: Iterable[str], timeout: float,
               sent: int = 0) -> str:
        """Wait for the load ``proc`` (its input closed) to end; the id the engine holds the
        image by, as :meth:`load` returns it.  A silence of the engine while it stores the
        layers may last ``LOAD_PATIENCE`` times ``timeout``."""
        code = proc.wait(timeout * LOAD_PATIENCE)
        if code is None:
            proc.end()
            raise ImageError(f"the engine at {self.host} did not finish the load within "
                             f"{shown_seconds(timeout * LOAD_PATIENCE)} of its last byte")
        said = proc.said()
        if code == 255 and proc.cmd[0] == "ssh":
            when = f"after {sent:,} bytes of the image" if sent else "before the load began"
            raise ImageError(f"the link broke {when} (ssh: {said or 'exit 255'})")
        if code:
            raise ImageError(f"loading the image into the engine at {self.host}: "
                             f"{_daemon_said(said) or f'docker load exit {code}'}")
        text = proc.out.decode(errors="replace")
        found = re.findall(r"Loaded image(?: ID)?: (\S+)", text)
        return self._held_as(found, expect_id, diff_ids)

    def export(self, ref: str) -> Iterator[bytes]:
        """``docker save`` of ``ref`` as a stream of chunks; a failure while it streams is an
        ImageError (never an OSError, which a load reading this stream would take for its own)."""
        with _border(f"exporting {ref} from the engine at {self.host}"):
            yield from self.api.get_image(ref)

    def tag(self, image_id: str, ref: str) -> None:
        repo, tag = split_tag(ref)
        with _border(f"tagging {image_id[:19]} as {ref}"):
            if not self.api.tag(image_id, repo, tag, force=True):
                raise ImageError(f"the engine would not tag {image_id[:19]} as {ref}")

    def restore_tag(self, ref: str, previous: str | None) -> None:
        """Put ``ref`` back where it was before this run: on ``previous``, or nowhere."""
        try:
            if previous:
                self.tag(previous, ref)
            else:
                with _border(f"untagging {ref}"):
                    self.api.remove_image(ref, noprune=True)
        except ImageError:
            pass  # the error being reported matters more than this cleanup

    def repo_digest(self, ref: str) -> str | None:
        attrs = self.inspect(ref) or {}
        repo = repository(ref)
        for rd in attrs.get("RepoDigests") or ():
            if rd.split("@", 1)[0] == repo:
                return rd.split("@", 1)[1]
        return None

    def push(self, ref: str, log: Log = lambda m: None, *,
             tally: "Transfer | None" = None) -> str:
        """Push ``ref``; returns the manifest digest the registry gave it.  The engine sends
        only the layers the registry lacks (it asks for each); ``tally`` counts them."""
        repo, tag = split_tag(ref)
        digest = None
        with _border(f"pushing {ref}"):
            for line in self.api.push(repo, tag=tag, stream=True, decode=True):
                if line.get("error"):
                    raise ImageError(f"push of {ref} refused: {' '.join(str(line['error']).split())}")
                if tally is not None:
                    tally.count(line)
                aux = line.get("aux") or {}
                if aux.get("Digest"):
                    digest = aux["Digest"]
                status = line.get("status")
                if status and not line.get("progressDetail"):
                    log(f"{line.get('id', '')}: {status}".lstrip(": "))
        digest = digest or self.repo_digest(ref)
        if not digest:
            raise ImageError(f"push of {ref} gave no digest")
        return digest

    def pull(self, ref: str, log: Log = lambda m: None) -> Transfer:
        """``docker pull`` of ``ref`` (``repo:tag`` or ``repo@sha256:..``): the engine fetches
        only the layers it lacks.  Each silence of the engine is bounded by the connection's
        timeout; what moved is counted in the returned Transfer."""
        repo, tag = ref.split("@", 1) if "@" in ref else split_tag(ref)
        tally = Transfer()
        with _border(f"the engine at {self.host} pulling {ref}"):
            for line in self.api.pull(repo, tag=tag, stream=True, decode=True):
                if line.get("error"):
                    raise ImageError(f"the engine at {self.host} could not pull {ref}: "
                                     f"{' '.join(str(line['error']).split())}")
                tally.count(line)
                status = line.get("status")
                if status and not line.get("progressDetail") and line.get("id"):
                    log(f"{self.host}: {line['id']}: {status}")
        return tally

    def save(self, ref: str, path: Path) -> int:
        """``docker save`` of ``ref`` into ``path`` (atomically); returns its size."""
        path = Path(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        except OSError as exc:
            raise ImageError(f"--save {path}: cannot write there: {exc.strerror}") from None
        try:
            with _border(f"saving {ref}"), os.fdopen(fd, "wb") as out:
                for chunk in self.api.get_image(ref):
                    out.write(chunk)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return path.stat().st_size

    def build(self, context: Path, *, dockerfile: str, target: str | None, buildargs: dict,
              labels: dict, tag: str, platform: Platform, log: Log) -> str:
        """A classic-builder build through the API; returns the image id."""
        image_id = None
        last_error = None
        with _border(f"building {tag}"):
            stream = self.api.build(path=str(context), dockerfile=dockerfile, target=target,
                                    buildargs=buildargs, labels=labels, tag=tag,
                                    platform=str(platform), rm=True, forcerm=True, decode=True)
            for line in stream:
                if line.get("stream"):
                    for text in line["stream"].rstrip("\n").splitlines():
                        log(text)
                if line.get("error"):
                    last_error = " ".join(str(line["error"]).split())
                aux = line.get("aux") or {}
                if aux.get("ID"):
                    image_id = aux["ID"]
        if last_error:
            raise ImageError(f"build of {tag} failed: {last_error}")
        attrs = self.inspect(tag)
        if not attrs:
            raise ImageError(f"build of {tag} gave no image")
        return image_id or attrs["Id"]

    # -- the docker CLI, for what the SDK cannot do (BuildKit)

    def buildx_available(self) -> bool:
        if not shutil.which("docker"):
            return False
        return run(["docker", "buildx", "version"], check=False, env=self._cli_env()
                   ).returncode == 0

    def buildx_build(self, context: Path, *, dockerfile: str, target: str | None,
                     buildargs: dict, labels: dict, tag: str, platform: Platform,
                     push: bool, log: Log) -> None:
        cmd = ["docker", "buildx", "build", "--progress=plain", "--platform", str(platform),
               "-f", str(Path(context) / dockerfile), "-t", tag]
        if target:
            cmd += ["--target", target]
        for k, v in sorted(buildargs.items()):
            cmd += ["--build-arg", f"{k}={v}"]
        for k, v in sorted(labels.items()):
            cmd += ["--label", f"{k}={v}"]
        cmd += ["--push"] if push else ["--load"]
        cmd.append(str(context))
        log("$ " + " ".join(cmd))
        try:
            run(cmd, env=self._cli_env(), on_line=log)
        except CommandError as exc:
            tail = [t.strip() for t in exc.output.splitlines()][-3:]
            raise ImageError(f"docker buildx build of {tag} failed (exit {exc.returncode}): "
                             + " | ".join(t for t in tail if t)) from None

    def _cli_env(self) -> dict:
        return {"DOCKER_HOST": self.host}


@dataclass(frozen=True)
class Prefix:
    """An image that holds the first ``layers`` layers of another, and the names it has."""

    names: tuple[str, ...]
    image_id: str
    layers: int


def _common_prefix(layers: Iterable[str], want: list[str]) -> int:
    n = 0
    for a, b in zip(layers, want):
        if a != b:
            break
        n += 1
    return n


@dataclass
class Transfer:
    """What a push or a pull moved, layer by layer, as the engine's progress told it:
    ``moved`` layers went over the wire (``bytes`` of them: a push counts the layers' own
    bytes, a pull the compressed blobs it fetched), ``present`` ones the other side held."""

    moved: int = 0
    present: int = 0
    bytes: int = 0

    def __post_init__(self) -> None:
        self._sizes: dict[str, int] = {}

    _MOVED = ("Pushed", "Pull complete")
    _PRESENT = ("Layer already exists", "Already exists")

    def count(self, line: dict) -> None:
        status, lid = str(line.get("status") or ""), line.get("id")
        if not lid:
            return
        if status in self._MOVED:
            self.moved += 1
        elif status in self._PRESENT or status.startswith("Mounted from"):
            self.present += 1
        elif status in ("Pushing", "Downloading"):
            total = (line.get("progressDetail") or {}).get("total") or 0
            if total > self._sizes.get(lid, 0):
                self.bytes += total - self._sizes.get(lid, 0)
                self._sizes[lid] = total

    def to_dict(self) -> dict:
        return {"layers": self.moved, "present": self.present, "bytes": self.bytes}


def _daemon_said(line: str) -> str:
    """The engine's own words in a docker CLI error line."""
    return re.sub(r"^(Error response from daemon|Error|error during connect): ", "",
                  line).strip()


class ImageFiles:
    """Reads an image's files through a stopped container."""

    def __init__(self, api, container_id: str, image: str) -> None:
        self.api = api
        self.cid = container_id
        self.image = image
        self._kept: dict[str, bytes] = {}   # small files read on the way by names()

    def stat(self, path: str) -> dict | None:
        """``{"name", "size", "mode", "mtime", "linkTarget"}`` of ``path``, or None if absent."""
        with _border(f"looking for {path} in {self.image}"):
            res = self.api.head(self.api._url("/containers/{0}/archive", self.cid),
                                params={"path": path})
            if res.status_code == 404:
                return None
            self.api._raise_for_status(res)
            header = res.headers.get("X-Docker-Container-Path-Stat")
        if not header:
            return None
        return json.loads(base64.b64decode(header))

    def exists(self, path: str) -> bool:
        return self.stat(path) is not None

    def walk(self, folder: str, _depth: int = 0) -> Iterator[tuple[tarfile.TarInfo, bytes | None]]:
        """Every entry under ``folder`` with a regular file's bytes, from one archive the
        engine streams: never one request per file, never the whole archive in memory.

        Names start with the folder's own name (``vllm/...``; when ``folder`` is a symlink,
        which is followed, its target's name); a hard link comes with no bytes and
        ``linkname`` naming the earlier entry."""
        st = self.stat(folder)
        if st is None:
            raise ImageError(f"{self.image} has no {folder}")
        target = st.get("linkTarget")
        if target and _depth < 8:
            if not target.startswith("/"):
                target = str(PurePosixPath(folder).parent / target)
            yield from self.walk(target, _depth + 1)
            return
        with _border(f"reading {folder} from {self.image}"):
            stream, _ = self.api.get_archive(self.cid, folder, chunk_size=1 << 20)
            try:
                with tarfile.open(fileobj=io.BufferedReader(ChunkReader(stream), 1 << 20),
                                  mode="r|") as tar:
                    for member in tar:
                        data = None
                        if member.isreg():
                            fh = tar.extractfile(member)
                            data = fh.read() if fh else b""
                        yield member, data
            except tarfile.TarError as exc:
                raise ImageError(f"reading {folder} from {self.image}: the engine's archive is "
                                 f"not a tar stream ({exc})") from exc

    def names(self, folder: str) -> list[str] | None:
        """The names of ``folder``'s entries, or None when it is no folder.  The engine has
        no listing but an archive of the folder, so that archive is streamed once; the
        dist-info files met on the way (METADATA, RECORD) are kept for :meth:`read`, which
        saves one request each."""
        st = self.stat(folder)
        if st is None or not st.get("mode", 0) & (1 << 31) and not st.get("linkTarget"):
            return None
        names: set[str] = set()
        for info, data in self.walk(folder):
            parts = info.name.rstrip("/").split("/")
            if len(parts) < 2:
                continue  # the folder itself
            names.add(parts[1])
            if (data is not None and len(parts) == 3 and parts[1].endswith(".dist-info")
                    and parts[2] in ("METADATA", "RECORD")):
                self._kept[f"{folder.rstrip('/')}/{parts[1]}/{parts[2]}"] = data
        return sorted(names)

    def read(self, path: str, _depth: int = 0) -> bytes | None:
        """The bytes of the regular file at ``path`` (symlinks followed), or None if absent."""
        if path in self._kept:
            return self._kept[path]
        docker = _docker()
        try:
            with _border(f"reading {path} from {self.image}"):
                stream, st = self.api.get_archive(self.cid, path)
                data = b"".join(stream)
        except ImageError as exc:
            if isinstance(exc.__cause__, docker.errors.NotFound):
                return None
            raise
        if st.get("mode", 0) & (1 << 31):
            return None  # a directory
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            for member in tar:
                if member.issym() and _depth < 8:
                    target = st.get("linkTarget") or member.linkname
                    if not target.startswith("/"):
                        target = str(PurePosixPath(path).parent / target)
                    return self.read(target, _depth + 1)
                if member.isfile():
                    fh = tar.extractfile(member)
                    return fh.read() if fh else None
        return None
