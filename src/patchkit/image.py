"""Everything patchkit asks of the Docker Engine, and the image pieces it makes by hand.

This is the only module that imports ``docker``; every SDK or API failure leaves it as a
one-line :class:`~patchkit.errors.ImageError`.  The engine is the one ``DOCKER_HOST`` names: a
local socket, a TCP endpoint, or ``ssh://user@dgx-spark`` (through the system's ssh client).

How an overlay image is made.  Its layer is written here, byte for byte: sorted entries, owner
0:0, one fixed time, whiteouts for the byte-code caches it makes stale.  Its config is the
base's config with the labels and command replaced and the layer appended.  Both go to the
engine as a ``docker load`` archive that omits the base's layers, which the engine already has
(it skips any layer whose chain it holds).  So the image id is known before the engine sees
anything (it is the sha256 of the config), the same inputs give the same id on every engine
holding the same base, and a rebuild with nothing changed finds the image already there.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import Callable, Iterable, Iterator, Sequence

from patchkit.errors import ImageError, UsageError

Log = Callable[[str], None]

# The image config fields kept from the base.  Inspect output differs between engine versions
# (Hostname, AttachStdin, Image ...); keeping only these makes the config, and so the image id,
# the same whichever engine builds it.
CONFIG_FIELDS = ("User", "ExposedPorts", "Env", "Entrypoint", "Cmd", "Volumes", "WorkingDir",
                 "Labels", "StopSignal", "Healthcheck", "OnBuild", "Shell", "ArgsEscaped")
# Caches a Python of each minor version may have written beside a module, in __pycache__.
PYC_SUFFIXES = ("", ".opt-1", ".opt-2")
PYTHON_MINORS = tuple(range(14, 7, -1))
# Prefixes searched for an installed vllm package when the image's own env says nothing better.
COMMON_PREFIXES = ("/usr/local", "/usr", "/opt/venv", "/opt/conda", "/venv", "/root/.local")


# ------------------------------------------------------------------------------------ values

@dataclass(frozen=True)
class Platform:
    os: str
    arch: str
    variant: str | None = None

    @classmethod
    def parse(cls, text: str) -> "Platform":
        parts = text.strip().lower().split("/")
        if len(parts) not in (2, 3) or not all(parts):
            raise UsageError(f"--platform {text!r}: expected OS/ARCH[/VARIANT], e.g. linux/arm64")
        arch = {"aarch64": "arm64", "x86_64": "amd64"}.get(parts[1], parts[1])
        return cls(parts[0], arch, parts[2] if len(parts) == 3 else None)

    def matches(self, other: "Platform") -> bool:
        if (self.os, self.arch) != (other.os, other.arch):
            return False
        # arm64 images often carry no variant; v8 is the only one there is.
        return not (self.variant and other.variant) or self.variant == other.variant

    def __str__(self) -> str:
        return "/".join(p for p in (self.os, self.arch, self.variant) if p)


@dataclass(frozen=True)
class BaseImage:
    """A base image as the engine holds it, resolved to what pins it."""

    name: str                      # as the user gave it
    image_id: str                  # sha256:... of its config
    digest: str | None             # sha256:... of its registry manifest, None when local-only
    platform: Platform
    config: dict                   # the container config (Env, Cmd, Labels ...)
    diff_ids: tuple[str, ...]
    history: tuple[dict, ...]      # oldest first, image-config form

    @property
    def pinned(self) -> str:
        """How the base is referenced: by registry digest, else by image id."""
        if self.digest:
            repo = _repository(self.name)
            return f"{repo}@{self.digest}"
        return self.image_id

    @property
    def pinned_by(self) -> str:
        return "digest" if self.digest else "image-id"

    def env(self, key: str) -> str | None:
        for item in self.config.get("Env") or ():
            k, _, v = item.partition("=")
            if k == key:
                return v
        return None


@dataclass(frozen=True)
class LayerEntry:
    """One entry of a hand-made layer; ``path`` is relative to the image root."""

    path: str
    kind: str = "file"             # file | dir | whiteout
    data: bytes = b""
    mode: int = 0o644

    def __post_init__(self) -> None:
        assert self.kind in ("file", "dir", "whiteout"), self.kind
        assert self.path and not self.path.startswith("/") and ".." not in self.path.split("/")


@dataclass(frozen=True)
class Layer:
    data: bytes
    diff_id: str
    files: int                     # regular files
    whiteouts: int
    content_bytes: int             # the files' own bytes, before tar headers

    @property
    def bytes(self) -> int:
        return len(self.data)


@dataclass(frozen=True)
class Package:
    """Where an image's vllm package lives, and which Python owns it."""

    site: str                      # the folder holding vllm/, absolute in the image
    python: str | None             # "3.12" when known from the path
    others: tuple[str, ...] = ()   # further installs that were found and not used

    @property
    def dir(self) -> str:
        return self.site.rstrip("/") + "/vllm"

    def path_of(self, rel: str) -> str:
        """``vllm/config/x.py`` (checkout-relative) -> its absolute path in the image."""
        return self.site.rstrip("/") + "/" + rel


@dataclass
class BuildOutcome:
    image_id: str
    reused: bool = False
    log: list[str] = field(default_factory=list)


# ------------------------------------------------------------------------- pure composition

def layer_tar(entries: Iterable[LayerEntry], mtime: int) -> Layer:
    """A layer tarball that depends on nothing but ``entries`` and ``mtime``.

    Entries are sorted by path; owners are 0:0 with no names; every time is ``mtime``.  A
    ``whiteout`` entry deletes ``path`` from the layers below (the OCI ``.wh.`` convention).
    """
    buf = io.BytesIO()
    files = whiteouts = content = 0
    named = []
    for e in entries:
        parent, _, name = e.path.rpartition("/")
        member = (parent + "/" if parent else "") + ".wh." + name if e.kind == "whiteout" else e.path
        named.append((PurePosixPath(member).parts, member, e))
    named.sort(key=lambda t: t[0])
    seen: set[str] = set()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for _, member, e in named:
            if e.path in seen:
                raise ImageError(f"the layer would hold {e.path} twice")
            seen.add(e.path)
            if e.kind == "whiteout":
                info = tarfile.TarInfo(member)
                info.mode = 0o644
                whiteouts += 1
            elif e.kind == "dir":
                info = tarfile.TarInfo(e.path)
                info.type = tarfile.DIRTYPE
                info.mode = e.mode
            else:
                info = tarfile.TarInfo(e.path)
                info.size = len(e.data)
                info.mode = e.mode
                files += 1
                content += len(e.data)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = mtime
            tar.addfile(info, io.BytesIO(e.data) if e.kind == "file" else None)
    data = buf.getvalue()
    return Layer(data, "sha256:" + hashlib.sha256(data).hexdigest(), files, whiteouts, content)


def iso_time(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def image_config(base: BaseImage, layer: Layer, *, labels: dict[str, str], created: int,
                 created_by: str, cmd: Sequence[str] | None = None,
                 entrypoint: Sequence[str] | None = None, reset_entrypoint: bool = False) -> bytes:
    """The new image's config: the base's, plus ``labels``, the command, and ``layer``.

    Serialised with sorted keys and no spaces: its sha256 is the image id.
    """
    config = {k: base.config[k] for k in CONFIG_FIELDS if base.config.get(k) not in (None, "", [], {})}
    merged = dict(config.get("Labels") or {})
    merged.update(labels)
    config["Labels"] = merged
    if reset_entrypoint:
        config.pop("Entrypoint", None)
    if entrypoint is not None:
        config["Entrypoint"] = list(entrypoint)
    if cmd is not None:
        config["Cmd"] = list(cmd)
    history = [dict(h) for h in base.history]
    history.append({"created": iso_time(created), "created_by": created_by})
    doc = {
        "architecture": base.platform.arch,
        "os": base.platform.os,
        "config": config,
        "created": iso_time(created),
        "history": history,
        "rootfs": {"type": "layers", "diff_ids": [*base.diff_ids, layer.diff_id]},
    }
    if base.platform.variant:
        doc["variant"] = base.platform.variant
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def image_id_of(config: bytes) -> str:
    return "sha256:" + hashlib.sha256(config).hexdigest()


def load_archive(config: bytes, layer: Layer, base_layers: int) -> bytes:
    """A ``docker load`` archive holding the config and the new layer only.

    The manifest still lists one path per layer; the paths of the base's layers are never
    opened, because the engine finds those layers in its store first.
    """
    cid = hashlib.sha256(config).hexdigest()
    manifest = [{"Config": f"{cid}.json", "RepoTags": None,
                 "Layers": [f"base-{i}/layer.tar" for i in range(base_layers)]
                 + [f"{layer.diff_id.split(':', 1)[1]}/layer.tar"]}]
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in ((f"{cid}.json", config),
                           (manifest[0]["Layers"][-1], layer.data),
                           ("manifest.json", json.dumps(manifest).encode())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def history_of(entries: Sequence[dict], layers: int, base_name: str) -> tuple[dict, ...]:
    """The base's history in image-config form, from the engine's history API (newest first).

    The API does not say which entries made a layer; an entry of size 0 usually did not.  When
    that guess does not add up to the base's layer count, the history is replaced by one plain
    entry per layer, which keeps ``docker history`` working on the new image.
    """
    oldest_first = list(reversed(entries))
    out = []
    for h in oldest_first:
        item = {"created": iso_time(int(h.get("Created") or 0)),
                "created_by": h.get("CreatedBy") or ""}
        if h.get("Comment"):
            item["comment"] = h["Comment"]
        if not h.get("Size"):
            item["empty_layer"] = True
        out.append(item)
    if sum(not h.get("empty_layer") for h in out) != layers:
        # Zero-size layers exist (a RUN that only made a folder): promote size-0 entries that
        # made a layer by their nature until the count is right.
        for item in out:
            if sum(not h.get("empty_layer") for h in out) >= layers:
                break
            if item.get("empty_layer") and _makes_layer(item["created_by"]):
                del item["empty_layer"]
    if sum(not h.get("empty_layer") for h in out) != layers:
        out = [{"created": iso_time(0), "created_by": f"layer {i + 1} of {base_name}"}
               for i in range(layers)]
    return tuple(out)


def _makes_layer(created_by: str) -> bool:
    text = created_by.strip()
    if "#(nop)" in text:
        return bool(re.search(r"#\(nop\)\s+(COPY|ADD)\b", text))
    return bool(re.match(r"(RUN|COPY|ADD)\b|/bin/sh -c |\|\d+ ", text))


def _repository(name: str) -> str:
    """``host:5000/a/b:tag`` or ``a/b@sha256:..`` -> ``host:5000/a/b``."""
    name = name.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name = name[: len(name) - len(last)] + last.split(":", 1)[0]
    return name


# The reference grammar of the distribution project, which the engine enforces.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN = (r"(?:localhost|\[[0-9a-fA-F:]+\]|[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
           r"(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*)(?::[0-9]+)?")
_NAME = re.compile(rf"(?:{_DOMAIN}/)?{_COMPONENT}(?:/{_COMPONENT})*")
_TAG = re.compile(r"[\w][\w.-]{0,127}")
_DIGEST = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}")


def reference_problem(ref: str, *, digest_ok: bool = True) -> str | None:
    """Why ``ref`` is not an image reference the engine would take, or None.  Checked before
    anything is built, so that a bad ``--tag`` is known before the work, not after it."""
    if not ref.strip():
        return "it is empty"
    rest, _, digest = ref.partition("@")
    if digest and not digest_ok:
        return "a tag names no digest (drop the @...)"
    if digest and not _DIGEST.fullmatch(digest):
        return f"{digest!r} is not a digest like sha256:<64 hex digits>"
    name, tag = rest, None
    last = rest.rsplit("/", 1)[-1]
    if ":" in last:
        name, tag = rest[: len(rest) - len(last)] + last.split(":", 1)[0], last.split(":", 1)[1]
    if tag is not None and not _TAG.fullmatch(tag):
        return f"the tag {tag!r} is not [A-Za-z0-9_.-], at most 128 characters"
    if len(name) > 255:
        return "the name is longer than 255 characters"
    if not _NAME.fullmatch(name):
        if _NAME.fullmatch(name.lower()):
            return "the repository name must be lowercase"
        return "it is not NAME[:TAG] (lowercase letters, digits, and . _ - / as separators)"
    return None


def split_tag(ref: str) -> tuple[str, str]:
    repo = _repository(ref)
    rest = ref[len(repo):]
    return repo, rest[1:] if rest.startswith(":") else "latest"


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
        repo = _repository(ref)
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
        repo = _repository(ref)
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

    def is_dir(self, path: str) -> bool:
        st = self.stat(path)
        return bool(st) and bool(st["mode"] & (1 << 31))

    def exists(self, path: str) -> bool:
        return self.stat(path) is not None

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


# ---------------------------------------------------------------------- the vllm package

def candidate_sites(env: dict[str, str]) -> tuple[list[str], list[str]]:
    """Where an installed ``vllm`` may be, most likely first, from the image's own env:
    folders that may hold it directly (PYTHONPATH), and prefixes with ``lib/python3.N``."""
    sites = [e.rstrip("/") for e in (env.get("PYTHONPATH") or "").split(":") if e.startswith("/")]
    prefixes: list[str] = []
    for key in ("VIRTUAL_ENV", "CONDA_PREFIX", "UV_PROJECT_ENVIRONMENT"):
        if env.get(key, "").startswith("/"):
            prefixes.append(env[key].rstrip("/"))
    for entry in (env.get("PATH") or "").split(":"):
        if entry.endswith("/bin") and entry.startswith("/"):
            prefixes.append(entry[: -len("/bin")])
    prefixes.extend(COMMON_PREFIXES)
    ordered: list[str] = []
    for p in prefixes:
        if p and p not in ordered:
            ordered.append(p)
    return sites, ordered


def find_package(files: ImageFiles, env: dict[str, str]) -> Package:
    """Where the image's ``vllm`` package is installed, found by looking, not assumed."""
    found: list[Package] = []
    sites, prefixes = candidate_sites(env)
    for site in sites:
        if files.exists(f"{site}/vllm/__init__.py"):
            found.append(Package(site, _python_of(site)))
    for prefix in prefixes:
        for minor in PYTHON_MINORS:
            lib = f"{prefix}/lib/python3.{minor}"
            if not files.exists(lib):
                continue
            for sub in ("dist-packages", "site-packages"):
                site = f"{lib}/{sub}"
                if files.exists(f"{site}/vllm/__init__.py"):
                    found.append(Package(site, f"3.{minor}"))
        debian = f"{prefix}/lib/python3/dist-packages"
        if files.exists(f"{debian}/vllm/__init__.py"):
            found.append(Package(debian, None))
    unique: list[Package] = []
    for p in found:
        if all(p.site != q.site for q in unique):
            unique.append(p)
    if not unique:
        raise ImageError(f"{files.image} has no installed vllm package (looked under "
                         f"{', '.join((sites + prefixes)[:6])} ...)")
    first = unique[0]
    return Package(first.site, first.python, tuple(p.site for p in unique[1:]))


def _python_of(site: str) -> str | None:
    m = re.search(r"/python(3\.\d+)/", site + "/")
    return m.group(1) if m else None


def installed_version(files: ImageFiles, pkg: Package, expected: str | None) -> str | None:
    """The vLLM version installed in the image: from ``vllm/_version.py``, confirmed by its
    ``dist-info``; None when neither says."""
    text = files.read(f"{pkg.dir}/_version.py")
    version = None
    if text is not None:
        m = re.search(r"""^(?:__version__|version)\s*(?::\s*\w+\s*)?=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""",
                      text.decode("utf-8", "replace"), re.M)
        if m:
            version = m.group(1)
    for guess in [v for v in (version, expected) if v]:
        meta = files.read(f"{pkg.site}/vllm-{guess}.dist-info/METADATA")
        if meta is not None:
            m = re.search(r"^Version:\s*(\S+)", meta.decode("utf-8", "replace"), re.M)
            if m:
                return m.group(1)
    return version


def stale_caches(files: ImageFiles, pkg: Package, module_path: str) -> list[str]:
    """The byte-code caches of ``module_path`` (absolute, ``.py``) present in the image."""
    p = PurePosixPath(module_path)
    cache_dir = str(p.parent / "__pycache__")
    if not files.exists(cache_dir):
        return []
    minors = [pkg.python.split(".")[1]] if pkg.python else [str(m) for m in PYTHON_MINORS]
    found = []
    for minor in minors:
        for suffix in PYC_SUFFIXES:
            cand = f"{cache_dir}/{p.stem}.cpython-3{minor}{suffix}.pyc"
            if files.exists(cand):
                found.append(cand)
    return found
