"""The Docker border: everything patchkit asks of a Docker Engine.

This is the only module that imports ``docker`` or runs the docker CLI; every SDK or API
failure leaves it as a one-line :class:`~patchkit.errors.ImageError`.  The engine is the one
``DOCKER_HOST`` names: a local socket, a TCP endpoint, or ``ssh://user@dgx-spark`` (through the
system's ssh client).

An overlay image reaches the engine as a ``docker load`` archive (``layer.load_archive``) that
omits the base's layers, which the engine already has (it skips any layer whose chain it
holds); a rebuild with nothing changed finds the image already there.
"""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Callable, Iterator

from patchkit.errors import ImageError
from patchkit.image.layer import BaseImage, history_of
from patchkit.imageref import Platform, repository, split_tag

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
    return " ".join(str(exc).split()) or type(exc).__name__


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


class Engine:
    """A connection to one Docker Engine."""

    def __init__(self, client, host: str | None = None) -> None:
        self.client = client
        self.api = client.api
        self.host = host or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"

    @classmethod
    def connect(cls, host: str | None = None, timeout: int = 600) -> "Engine":
        docker = _docker()
        host = host or os.environ.get("DOCKER_HOST") or None
        shown = host or "unix:///var/run/docker.sock"
        if host and host.startswith("ssh://"):
            try:
                import paramiko  # noqa: F401  the SDK loads its ssh transport only with it
            except ImportError:
                raise ImageError(f"DOCKER_HOST={host} needs the paramiko package, which is not "
                                 "installed: pip install 'docker[ssh]'") from None
        try:
            if host:
                # ssh:// goes through the system's ssh, so ~/.ssh/config and agents apply.
                client = docker.DockerClient(base_url=host, timeout=timeout,
                                             use_ssh_client=host.startswith("ssh://"))
            else:
                client = docker.from_env(timeout=timeout)
            client.ping()
        except Exception as exc:  # any transport failure means the same thing here
            raise ImageError(f"no Docker Engine answers at {shown}: {_explain(exc)}") from exc
        return cls(client, shown)

    # -- facts

    def info(self) -> dict:
        with _border(f"asking the engine at {self.host} about itself"):
            return self.api.info()

    def uses_containerd_store(self) -> bool:
        status = self.info().get("DriverStatus") or []
        return any(len(p) == 2 and p[0] == "driver-type" and "containerd" in p[1] for p in status)

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
                         history=history_of(raw_history, len(diff_ids), ref))

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

    def container_log(self, name: str) -> Iterator[str] | None:
        """The log of container ``name`` (a name or an id): stdout and stderr in the order the
        engine recorded them, line by line (UTF-8, bad bytes replaced), or None when the engine
        has no such container.  A log driver the engine cannot read back is an ImageError."""
        docker = _docker()
        try:
            with _border(f"inspecting the container {name}"):
                cid = self.api.inspect_container(name)["Id"]
        except ImageError as exc:
            if isinstance(exc.__cause__, docker.errors.NotFound):
                return None
            raise
        return self._log_lines(cid, name)

    def _log_lines(self, cid: str, name: str) -> Iterator[str]:
        pending = b""
        with _border(f"reading the log of the container {name}"):
            for chunk in self.api.logs(cid, stdout=True, stderr=True, stream=True,
                                       follow=False):
                pending += chunk
                *whole, pending = pending.split(b"\n")
                for line in whole:
                    yield line.decode("utf-8", errors="replace")
        if pending:
            yield pending.decode("utf-8", errors="replace")

    # -- making images

    def images_with_label(self, key: str, value: str) -> list[str]:
        with _border("listing images"):
            return [i["Id"] for i in self.api.images(filters={"label": f"{key}={value}"})]

    def has_image(self, image_id: str) -> bool:
        return self.inspect(image_id) is not None

    def load(self, archive: bytes, expect_id: str) -> None:
        with _border("loading the image into the engine"):
            for line in self.api.load_image(archive):
                if isinstance(line, dict) and line.get("error"):
                    raise ImageError(f"the engine refused the image: {line['error']}")
        if not self.has_image(expect_id):
            raise ImageError(f"the engine loaded the archive but holds no image {expect_id[:19]}")

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

    def push(self, ref: str, log: Log = lambda m: None) -> str:
        """Push ``ref``; returns the manifest digest the registry gave it."""
        repo, tag = split_tag(ref)
        digest = None
        with _border(f"pushing {ref}"):
            for line in self.api.push(repo, tag=tag, stream=True, decode=True):
                if line.get("error"):
                    raise ImageError(f"push of {ref} refused: {' '.join(str(line['error']).split())}")
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
        proc = subprocess.run(["docker", "buildx", "version"], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=self._cli_env())
        return proc.returncode == 0

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
        tail: list[str] = []
        with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=self._cli_env()) as proc:
            assert proc.stdout is not None
            for text in proc.stdout:
                log(text.rstrip("\n"))
                tail = (tail + [text.strip()])[-3:]
        if proc.returncode:
            raise ImageError(f"docker buildx build of {tag} failed (exit {proc.returncode}): "
                             + " | ".join(t for t in tail if t))

    def _cli_env(self) -> dict:
        env = dict(os.environ)
        env["DOCKER_HOST"] = self.host
        return env


class _Chunks(io.RawIOBase):
    """The chunks of an HTTP body as a readable stream, for ``tarfile``'s stream mode."""

    def __init__(self, chunks) -> None:
        self._chunks = iter(chunks)
        self._left = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        while not self._left:
            try:
                self._left = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(buf), len(self._left))
        buf[:n] = self._left[:n]
        self._left = self._left[n:]
        return n


class ImageFiles:
    """Reads an image's files through a stopped container."""

    def __init__(self, api, container_id: str, image: str) -> None:
        self.api = api
        self.cid = container_id
        self.image = image

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
                with tarfile.open(fileobj=io.BufferedReader(_Chunks(stream), 1 << 20),
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

    def read(self, path: str, _depth: int = 0) -> bytes | None:
        """The bytes of the regular file at ``path`` (symlinks followed), or None if absent."""
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
