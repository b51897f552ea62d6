"""The Docker border: everything patchkit asks of a Docker Engine.

The engine API: :class:`Engine` is the one way patchkit reaches an engine, and the only one
that runs the docker CLI; the SDK is imported and its failures worded in ``sdk``, the ssh
transport is ``sshlink``, an image's files are read by ``imagefiles``, and what an engine
reports comes back as the values of ``engines.facts`` (an inspected image is an
:class:`~patchkit.engines.facts.Inspected`, never inspect output).  The engine is the one
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

Every request waits at most ``timeout`` seconds of silence (the run's, which the verb hands to
``Engine.connect``): the connection, then each wait for the next bytes, never a whole stream,
so a load or export of gigabytes goes on while bytes flow.  Builds alone wait without a bound:
a compile step may be silent for minutes.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import shlex
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterable, Iterator

from patchkit.errors import CommandError, ImageError, UsageError
from patchkit.engines.facts import Inspected, Prefix, Store, Transfer, since_start, store_of
from patchkit.engines.imagefiles import ImageFiles
from patchkit.formats.archive import ArchiveFacts, complete_archive, relay
from patchkit.formats.layer import BaseImage, Layer, history_of
from patchkit.engines.sdk import border, explain, sdk, ssh_adapter_class
from patchkit.engines.sshlink import SshLink, ssh_port
from patchkit.imageref import (Platform, engine_problem, host_of, repository, split_tag,
                               unreachable)
from patchkit.timeouts import shown as shown_seconds
from patchkit.process import Piped, run

Log = Callable[[str], None]

# ------------------------------------------------------------------------ engine addresses

_MIN_API = "1.24"   # what the SDK is told before the engine has said its own

def engine_url(text: str, what: str = "engine") -> str:
    """``text`` checked to be an engine address (see ``imageref.ENGINE_FORMS``); a usage
    error otherwise."""
    problem = engine_problem(text)
    if problem:
        raise UsageError(f"{what} {text!r} is not an engine address: {problem}")
    return text if text.startswith("unix:") else text.rstrip("/")


def docker_host() -> str | None:
    """The engine ``DOCKER_HOST`` names, checked like any engine address; None when it is unset
    (the SDK's default socket)."""
    text = os.environ.get("DOCKER_HOST", "")
    return engine_url(text, "DOCKER_HOST") if text.strip() else None



LOAD_PATIENCE = 10   # see Engine._load_once


class Engine:
    """A connection to one Docker Engine.  ``cli``, when set, is how the docker CLI reaches
    the same engine (``docker -H URL``, or ``ssh NODE docker``, each word of what follows
    quoted for the node's shell): exports and loads then run as its child processes, and the
    bytes between them go through the kernel (``engines.pipes``)."""

    def __init__(self, client, host: str | None = None, cli: list[str] | None = None) -> None:
        self.client = client
        self.api = client.api
        self.host = host or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        self.cli = cli
        self._store: Store | None = None
        self._link: SshLink | None = None   # the ssh connection of an ssh:// engine
        self._version: dict | None = None
        self._info: dict | None = None

    @classmethod
    def connect(cls, host: str | None = None, *, timeout: float,
                link: SshLink | None = None) -> "Engine":
        """The engine at ``host`` (an address ``engine_url`` took), else the one DOCKER_HOST
        names, once it has answered; ``timeout`` bounds each silence of it.  ``link`` is the
        ssh connection :meth:`dial` started to ``host`` already (an ssh:// one), the
        engine's from then on; the caller ends it when this fails."""
        docker = sdk()
        host = host or docker_host()
        shown = host or "unix:///var/run/docker.sock"
        if host and host.startswith("ssh://"):
            if importlib.util.find_spec("paramiko") is None:  # the SDK's ssh transport needs it
                raise ImageError(f"DOCKER_HOST={host} needs the paramiko package, which is not "
                                 "installed: pip install 'docker[ssh]'") from None
            return cls._connect_ssh(host, timeout, link)
        try:
            client = (docker.DockerClient(base_url=host, timeout=timeout) if host
                      else docker.from_env(timeout=timeout))
            client.ping()
        except Exception as exc:  # any transport failure means the same thing here
            raise ImageError(f"no Docker Engine answers at {shown}: {explain(exc)}") from exc
        # the address the SDK took, never the CLI's own context, which may name another engine
        cli = ["docker", "-H", shown] if shutil.which("docker") else None
        return cls(client, shown, cli)

    @staticmethod
    def dial(host: str, timeout: float) -> SshLink | None:
        """For an ssh:// ``host``, its ssh connection started now (``connect`` then takes it),
        so that ssh connects while the run does what comes first; None for other engines."""
        if not host.startswith("ssh://"):
            return None
        return SshLink(*ssh_port(host, timeout), timeout)

    @classmethod
    def _connect_ssh(cls, host: str, timeout: float, link: SshLink | None) -> "Engine":
        """The engine behind ssh (the system's, so ~/.ssh/config and agents apply), over one
        ssh connection that every session shares (``sshlink.SshLink``); its first answer
        (the version, which the SDK needs anyway) is the proof that it answers, else what ssh
        said is the error."""
        docker = sdk()
        link = link or SshLink(*ssh_port(host, timeout), timeout)
        adapter = ssh_adapter_class()(link, timeout)
        try:
            client = docker.DockerClient(base_url=f"ssh://{link.dest}:{link.port}",
                                         timeout=timeout, use_ssh_client=True, version=_MIN_API)
            client.api.mount("http+docker://ssh", adapter)
            client.api._custom_adapter = adapter
            version = client.api.version(api_version=False)
            client.api._version = version["ApiVersion"]
        except Exception as exc:  # any transport failure means the same thing here
            said = adapter.complaint() or explain(exc)
            adapter.close()
            raise ImageError(f"no Docker Engine answers at {host}: {said}") from exc
        engine = cls(client, host, [*link.argv(), "docker"])
        engine._version, engine._link = version, link
        return engine

    def close(self) -> None:
        """Let the engine go (an ssh connection's session ends)."""
        try:
            self.client.close()
        except Exception:  # closing is best effort: nothing of it is needed any more
            pass

    # -- facts

    def info(self) -> dict:
        with border(f"asking the engine at {self.host} about itself"):
            return self.api.info()

    def identity(self) -> str:
        """What names this engine whatever address reached it: the ID its info gives (a
        Docker Engine's) with its host name and root directory, else its address.  An ID
        alone is not enough: engines of machines cloned from one image, or two dockerds given
        one key file, report the same ID (see ``sameness``)."""
        facts = self.sameness()
        return " ".join(facts) if facts else self.host

    def sameness(self) -> tuple[str, str, str] | None:
        """The engine's ID, host name and root directory (``docker info``'s ID, Name and
        DockerRootDir); None when its info gives no ID (Podman's compatible API)."""
        if self._info is None:
            self._info = self.info()
        info = self._info
        if not info.get("ID"):
            return None
        return (str(info.get("ID")), str(info.get("Name") or ""),
                str(info.get("DockerRootDir") or ""))

    def store(self) -> Store:
        if self._store is None:
            if self._info is None:
                self._info = self.info()
            info = self._info
            version: dict = {}
            if self._version is not None:
                version = self._version
            elif "BuildahVersion" not in info:  # Podman's info says so; its version is slow
                with border(f"asking the engine at {self.host} for its version"):
                    version = self.api.version()
            self._store = store_of(version, info)
        return self._store

    def content(self, ref: str) -> Inspected | None:
        """``ref`` inspected, with its ``config_digest`` known (see ``facts.fingerprint``), or
        None when the engine has no such image.  A containerd store's ids are manifest
        digests, so there the config is read from the engine's export of the image."""
        image = self.inspect(ref)
        if image is None:
            return None
        if self.store().ids_are_config_digests:
            iid = image.id
            digest = iid if iid.startswith("sha256:") else f"sha256:{iid}"
        else:
            facts = ArchiveFacts()
            for _ in relay(self.export(image.id), facts):
                pass
            digest = facts.config_digest(image.diff_ids)
        return dataclasses.replace(image, config_digest=digest)

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
        with border(f"listing the images of the engine at {self.host}"):
            ids = [i["Id"] for i in self.api.images(all=True)][:limit]
        for iid in ids:
            best = max(best, _common_prefix(self._diff_ids(iid), want))
            if best == len(want):
                break
        return best

    def _held_by_name(self, want: list[str], known: list["Prefix"]) -> int:
        names = sorted({n for p in known for n in p.names})
        if not names:
            return 0
        try:
            with border(f"listing the images of the engine at {self.host}"):
                found = self.api.images(filters={"reference": names})
        except ImageError:
            return 0   # a store that takes no such filter: the whole list is read instead
        by_id = {p.image_id: p.layers for p in known}
        best = 0
        for image in found:
            if image.get("Id") in by_id and self.store().ids_are_config_digests:
                best = max(best, by_id[image["Id"]])   # the config names the layers
            else:
                best = max(best, _common_prefix(self._diff_ids(image["Id"]), want))
        return best

    def prefixes(self, diff_ids: Iterable[str], size: int | None = None,
                 limit: int = 2000) -> list["Prefix"]:
        """The named images of this engine whose layers are a proper prefix of ``diff_ids``
        (an image's base, and the base's base): what another engine may hold them by.  Only
        images no bigger than ``size`` (the image's own) can be one."""
        want = list(diff_ids)
        with border(f"listing the images of the engine at {self.host}"):
            listed = [i for i in self.api.images() if size is None or (i.get("Size") or 0) <= size]
        found: list[Prefix] = []
        for image in listed[:limit]:
            names = [n for n in (image.get("RepoTags") or []) + (image.get("RepoDigests") or [])
                     if n and "<none>" not in n]
            layers = list(self._diff_ids(image["Id"])) if names else []
            if names and 0 < len(layers) < len(want) and layers == want[:len(layers)]:
                found.append(Prefix(tuple(names), image["Id"], len(layers)))
        return sorted(found, key=lambda p: -p.layers)

    def tagged(self, ref: str) -> str | None:
        """The id of the image ``ref`` names on this engine, or None."""
        image = self.inspect(ref)
        return image.id if image is not None else None

    def inspect(self, ref: str) -> Inspected | None:
        """The image ``ref`` names, or None when the engine has no such image."""
        docker = sdk()
        try:
            with border(f"inspecting {ref}"):
                image = Inspected.of(self.api.inspect_image(ref))
        except ImageError as exc:
            if isinstance(exc.__cause__, docker.errors.ImageNotFound) or (
                    isinstance(exc.__cause__, docker.errors.NotFound)):
                return None
            raise
        return self._registry_copies(image)

    def _registry_copies(self, image: Inspected) -> Inspected:
        """``image`` with only the repo digests that name a copy in a registry.  Podman names
        an image that came from no registry (built or loaded there) ``localhost/NAME``, and
        lists a digest under that name too: no registry holds it (evidence pushed or read
        there would go to a host that is not one), so Podman's store leaves it out; the image
        is then local-only, as on Docker's stores, which list no digest for such an image."""
        local = [d for d in image.repo_digests if d.split("/", 1)[0] == "localhost"]
        if not local or self.store().kind != "containers-storage":
            return image
        return dataclasses.replace(image, repo_digests=tuple(
            d for d in image.repo_digests if d not in local))

    def _diff_ids(self, ref: str) -> tuple[str, ...]:
        image = self.inspect(ref)
        return image.diff_ids if image is not None else ()

    def resolve_base(self, ref: str, platform: Platform, log: Log = lambda m: None,
                     pull: bool = True, what: str = "base image") -> BaseImage:
        """The base as the engine holds it (pulled for ``platform`` when missing), checked to be
        of that platform and pinned by its registry digest, else by its image id.  ``what``
        names it in errors."""
        image = self.inspect(ref)
        if image is None and pull and not ref.startswith("sha256:"):
            repo, tag = (ref.split("@", 1) if "@" in ref else split_tag(ref))
            log(f"pulling {ref} for {platform}")
            refused = None   # the registry's own words, when the pull's stream says no
            try:
                with border(f"pulling the base {ref}"):
                    for line in self.api.pull(repo, tag=tag, platform=str(platform), stream=True,
                                              decode=True):
                        if "error" in line:
                            refused = " ".join(str(line["error"]).split())
                            break
            except ImageError as exc:
                why = explain(exc.__cause__) if exc.__cause__ is not None else str(exc)
                raise _pull_error(what, ref, why) from exc
            if refused is not None:
                raise _pull_error(what, ref, refused)
            image = self.inspect(ref)
        if image is None:
            raise ImageError(f"{what} {ref} not found on the engine at {self.host}")
        got = image.platform
        if not got.matches(platform):
            raise ImageError(f"{what} {ref} is {got}, not {platform}")
        digest = ref.split("@", 1)[1] if "@sha256:" in ref else image.digest_in(repository(ref))
        with border(f"reading the history of {ref}"):
            raw_history = self.api.history(image.id)
        return BaseImage(name=ref, image_id=image.id, digest=digest, platform=got,
                         config=dict(image.config), diff_ids=image.diff_ids,
                         history=history_of(raw_history, len(image.diff_ids), ref),
                         config_digest=(image.id if self.store().ids_are_config_digests
                                        else None))

    # -- files of an image, without running it

    @contextmanager
    def files(self, image: str, name: str | None = None) -> Iterator["ImageFiles"]:
        """The image's filesystem, readable through a container that is created, never started,
        and removed on the way out.  ``name`` is how messages call the image (what the user
        gave), when ``image`` is its id."""
        with border(f"creating a stopped container of {image}"):
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
        attrs = self._container(name)
        if attrs is None:
            return None
        return self._log_chunks(attrs["Id"], name, since_start(attrs.get("State") or {}))

    def container_image(self, name: str) -> tuple[str, str] | None:
        """The image id container ``name`` (a name or an id) runs and its state (``running``,
        ``exited``, ...), or None when the engine has no such container."""
        attrs = self._container(name)
        if attrs is None:
            return None
        return str(attrs.get("Image") or ""), str((attrs.get("State") or {}).get("Status") or "")

    def _container(self, name: str) -> dict | None:
        """The engine's inspect of container ``name``, or None when it has no such one."""
        docker = sdk()
        try:
            with border(f"inspecting the container {name}"):
                return self.api.inspect_container(name)
        except ImageError as exc:
            if isinstance(exc.__cause__, docker.errors.NotFound):
                return None
            raise

    def _log_chunks(self, cid: str, name: str, since: float | None) -> Iterator[bytes]:
        with border(f"reading the log of the container {name}"):
            yield from self.api.logs(cid, stdout=True, stderr=True, stream=True, follow=False,
                                     **({"since": since} if since else {}))

    # -- making images

    def images_with_label(self, key: str, value: str) -> list[str]:
        with border("listing images"):
            return [i["Id"] for i in self.api.images(filters={"label": f"{key}={value}"})]

    def users(self) -> dict[str, list[str]]:
        """The containers of this engine, running or stopped, by the id of their image: their
        names."""
        with border(f"listing the containers of the engine at {self.host}"):
            listed = self.api.containers(all=True)
        out: dict[str, list[str]] = {}
        for c in listed:
            names = [n.lstrip("/") for n in c.get("Names") or ()] or [str(c.get("Id"))[:12]]
            out.setdefault(str(c.get("ImageID") or ""), []).extend(names)
        return out

    def own_bytes(self) -> dict[str, int]:
        """Each image's bytes that no other image shares (what removing it alone frees), by
        id, as the engine's disk usage tells them."""
        with border(f"asking the engine at {self.host} for its disk usage"):
            usage = self.api.df()
        out = {}
        for image in usage.get("Images") or ():
            size, shared = image.get("Size") or 0, image.get("SharedSize") or 0
            out[str(image.get("Id"))] = max(0, size - max(0, shared))
        return out

    def untag(self, ref: str) -> None:
        """``ref`` taken off its image; an image left with no name and no container goes."""
        with border(f"removing {ref} from the engine at {self.host}"):
            self.api.remove_image(ref)

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
            image = self.inspect(ref)
            if image is not None and list(image.diff_ids) == want:
                return image.id
        raise ImageError(f"the engine at {self.host} loaded the archive but holds no image of "
                         f"config {expect_id[:19]}")

    def _load_once(self, archive: bytes | Iterable[bytes]) -> list[str]:
        """One ``docker load``; the refs the engine says it loaded.  While it loads, the
        engine may be silent for long: a store that copies layers (vfs) says nothing while it
        copies the parent's files for each new layer, so each silence may last
        ``LOAD_PATIENCE`` times the timeout."""
        loaded: list[str] = []
        with border(f"loading the image into the engine at {self.host}"), self._patient():
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
            if not said and self._link is not None:   # a session over a master that broke
                said = self._link.complaint(wait=1.0)
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
        with border(f"exporting {ref} from the engine at {self.host}"):
            yield from self.api.get_image(ref)

    def tag(self, image_id: str, ref: str) -> None:
        repo, tag = split_tag(ref)
        with border(f"tagging {image_id[:19]} as {ref}"):
            if not self.api.tag(image_id, repo, tag, force=True):
                raise ImageError(f"the engine would not tag {image_id[:19]} as {ref}")

    def restore_tag(self, ref: str, previous: str | None) -> None:
        """Put ``ref`` back where it was before this run: on ``previous``, or nowhere."""
        try:
            if previous:
                self.tag(previous, ref)
            else:
                with border(f"untagging {ref}"):
                    self.api.remove_image(ref, noprune=True)
        except ImageError:
            pass  # the error being reported matters more than this cleanup

    def repo_digest(self, ref: str) -> str | None:
        image = self.inspect(ref)
        return image.digest_in(repository(ref)) if image is not None else None

    def push(self, ref: str, log: Log = lambda m: None, *,
             tally: "Transfer | None" = None) -> str:
        """Push ``ref``; returns the manifest digest the registry gave it.  The engine sends
        only the layers the registry lacks (it asks for each); ``tally`` counts them."""
        repo, tag = split_tag(ref)
        digest = None
        with border(f"pushing {ref}"):
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
        with border(f"the engine at {self.host} pulling {ref}"):
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
            with border(f"saving {ref}"), os.fdopen(fd, "wb") as out:
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
        with border(f"building {tag}"):
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
        built = self.inspect(tag)
        if built is None:
            raise ImageError(f"build of {tag} gave no image")
        return image_id or built.id

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



def _common_prefix(layers: Iterable[str], want: list[str]) -> int:
    n = 0
    for a, b in zip(layers, want):
        if a != b:
            break
        n += 1
    return n



def _daemon_said(line: str) -> str:
    """The engine's own words in a docker CLI error line."""
    return re.sub(r"^(Error response from daemon|Error|error during connect): ", "",
                  line).strip()


_MISSING = re.compile(r"not found|manifest unknown|name unknown|does not exist", re.I)


def _pull_error(what: str, ref: str, said: str) -> ImageError:
    """A pull the engine failed, by its cause: a registry that never answered is "cannot
    reach", and "not found" is said only when the registry answered so."""
    cause = unreachable(said)
    if cause is not None:
        return ImageError(f"{what} {ref}: the engine cannot reach the registry {host_of(ref)}: "
                          f"{cause}")
    if _MISSING.search(said):
        return ImageError(f"{what} {ref} not found: {said}")
    return ImageError(f"{what} {ref}: the pull failed: {said}")
