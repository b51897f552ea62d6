"""The registry border: everything patchkit asks of an image registry without an engine.

This is the only module that talks to registries directly; it drives ``skopeo`` (the
containers project's registry client) as a subprocess and never speaks HTTP itself.  Every
failure leaves it as a one-line :class:`~patchkit.errors.ImageError`.

* Credentials are the usual ``~/.docker/config.json`` (``$DOCKER_CONFIG/config.json`` when
  that is set), handed to skopeo with ``--authfile``; without that file skopeo's own auth files
  apply.
* Plain-http registries: like the Docker Engine, a registry on a loopback address
  (``localhost``, ``127.0.0.0/8``, ``[::1]``) is insecure by default (TLS not required, http
  allowed); other hosts are so only when named in ``$PATCHKIT_INSECURE_REGISTRIES``
  (comma-separated ``host[:port]``) or marked ``insecure = true`` in containers'
  ``registries.conf``.
* Blobs read from a registry land in a blob folder (``sha256/<hex>``, the OCI layout's) shared by
  every base, so each blob is fetched once.  skopeo records where it saw each blob; a push to
  the same registry then mounts a blob from the repository it was read from instead of sending
  it again (a cross-repository mount), and copies it blob by blob elsewhere.
* A push writes the image as skopeo's ``dir:`` layout (the base's blobs linked from the blob
  folder, never copied) and sends the blobs first and the manifest last, with the digests
  preserved: nothing is visible under the tag until every blob is there, and the manifest
  stored is the one given.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Sequence

from patchkit import filelocks
from patchkit.errors import CommandError, ImageError
from patchkit.formats.layer import Layer, image_id_of
from patchkit.formats.manifests import (DOCKER_MANIFEST, INDEXES, MANIFESTS, OCI_INDEX,
                                        OCI_MANIFEST, RemoteImage)
from patchkit.imageref import DOCKER_HUB, Platform, host_of, repository, unreachable
from patchkit.process import run

Log = Callable[[str], None]

INSECURE_ENV = "PATCHKIT_INSECURE_REGISTRIES"
DIR_VERSION = "Directory Transport Version: 1.1\n"  # skopeo's dir: layout


# What a registry says when the name or tag is not there (as skopeo words it).
_MISSING = re.compile(r"manifest unknown|name unknown|not found|no such image", re.I)


class MissingError(ImageError):
    """The registry answered: it has no such name or tag."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail or message   # skopeo's own words


class UnreachableError(ImageError):
    """The registry did not answer (or there is no client to ask it with)."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail or message   # skopeo's own words


# What a registry that answered says when it will not serve (its ping included).
_REFUSED = re.compile(r"invalid status code|unauthorized|denied|forbidden", re.I)


def _bare_host(host: str) -> str:
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def is_insecure(host: str) -> bool:
    """Whether patchkit lets skopeo talk plain http (or unverified TLS) to ``host``."""
    bare = _bare_host(host)
    if bare == "localhost" or bare == "::1" or re.fullmatch(r"127(?:\.\d{1,3}){3}", bare):
        return True
    named = [h.strip() for h in re.split(r"[,\s]+", os.environ.get(INSECURE_ENV, "")) if h.strip()]
    return host in named or bare in named


def auth_file() -> Path | None:
    """The Docker CLI's config file with registry credentials, when there is one."""
    base = os.environ.get("DOCKER_CONFIG")
    folder = Path(base).expanduser() if base else Path.home() / ".docker"
    path = folder / "config.json"
    return path if path.is_file() else None


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _plain(name: str) -> str:
    """skopeo takes a tag or a digest, not both: ``repo:tag@sha256:..`` -> ``repo@sha256:..``."""
    if "@" in name:
        return repository(name) + "@" + name.split("@", 1)[1]
    return name


def blob_path(blobs: Path, digest: str) -> Path:
    """Where a blob lives in the shared blob folder (the OCI layout's ``<alg>/<hex>``)."""
    alg, _, hexpart = digest.partition(":")
    if not re.fullmatch(r"[a-z0-9]+", alg) or not re.fullmatch(r"[0-9a-f]{32,}", hexpart):
        raise ImageError(f"{digest!r} is not a blob digest")
    return blobs / alg / hexpart


def pick_platform(index: dict, platform: Platform, name: str) -> str:
    """The digest of ``platform``'s manifest in an index (a multi-platform image)."""
    offered = []
    matches = []
    for entry in index.get("manifests") or ():
        p = entry.get("platform") or {}
        if not p.get("architecture") or p.get("architecture") == "unknown":
            continue  # attestations and other artifacts
        got = Platform(p.get("os") or "linux", p["architecture"], p.get("variant") or None)
        offered.append(str(got))
        if got.matches(platform) and entry.get("mediaType", DOCKER_MANIFEST) in MANIFESTS:
            matches.append((got.variant == platform.variant, entry["digest"]))
    if not matches:
        has = ", ".join(sorted(set(offered))) or "none"
        raise ImageError(f"base image {name} has no {platform} image (it has: {has})")
    matches.sort(key=lambda m: not m[0])
    return matches[0][1]


class Registry:
    """skopeo, driven for the few things a build straight in a registry needs."""

    def __init__(self, skopeo: str | None = None, *, timeout: float) -> None:
        self.timeout = timeout  # the whole of a small request; blob copies go unbounded
        found = skopeo or shutil.which("skopeo")
        if not found:
            raise ImageError("--no-daemon needs skopeo, the containers project's registry client, "
                             "and it is not on PATH (Debian and Ubuntu: apt-get install skopeo)")
        self.skopeo = found

    # -- the subprocess

    def _flags(self, host: str, prefix: str = "") -> list[str]:
        flags = []
        if is_insecure(host):
            flags.append(f"--{prefix}tls-verify=false")
        auth = auth_file()
        if auth is not None:
            flags += [f"--{prefix}authfile", str(auth)]
        return flags

    def _run(self, args: Sequence[str], *, what: str, missing: str | None = None,
             text: bool = True):
        """skopeo ``args``; stdout, or None when the registry says the thing is not there and
        ``missing`` is None; otherwise a one-line ImageError starting with ``what``."""
        try:
            return run([self.skopeo, *args], text=text).stdout
        except CommandError as exc:
            detail = skopeo_message(exc.output)
            cause = unreachable(detail)
            if cause is not None and not _REFUSED.search(detail):
                # "not found" only when the registry answered
                host = next((host_of(a[len("docker://"):]) for a in args
                             if a.startswith("docker://")), "the registry")
                raise UnreachableError(f"{what}: cannot reach the registry {host}: {cause}",
                                       detail) from None
            if _MISSING.search(detail):
                if missing is None:
                    return None
                raise MissingError(f"{missing}: {detail}", detail) from None
            raise ImageError(f"{what}: {detail}") from None

    # -- reading

    def raw_manifest(self, ref: str, *, what: str, missing: str | None = None) -> bytes | None:
        """The manifest (or index) ``ref`` names, byte for byte; None when there is none."""
        host = host_of(ref)
        return self._run([*self._bounded(), "inspect", "--raw", *self._flags(host),
                          f"docker://{_plain(ref)}"], what=what, missing=missing, text=False)

    def _bounded(self) -> list[str]:
        return ["--command-timeout", f"{max(self.timeout, 0.001):g}s"]

    def digest_of(self, ref: str) -> str | None:
        """The digest of what ``ref`` names now (None: nothing); a registry that cannot be
        reached is an error."""
        raw = self.raw_manifest(ref, what=f"asking the registry of {ref} what it holds")
        return _digest(raw) if raw is not None else None

    def resolve(self, name: str, platform: Platform) -> RemoteImage:
        """``name``'s image for ``platform``: an index is followed to that platform's manifest."""
        hint = ""
        if host_of(name) == DOCKER_HUB and not name.startswith(("docker.io/", "index.docker.io/")):
            hint = (" (the name has no registry host, so it means Docker Hub; --no-daemon reads "
                    "the base from a registry: push it to one, or build through an engine)")
        raw = self.raw_manifest(name, what=f"base image {name}{hint}",
                                missing=f"base image {name} not found in its registry{hint}")
        assert raw is not None
        digest = _digest(raw)
        repo = repository(name)
        doc = _json(raw, f"the manifest of {name}")
        kind = doc.get("mediaType") or (OCI_INDEX if "manifests" in doc else OCI_MANIFEST)
        manifest_digest = digest
        if kind in INDEXES:
            manifest_digest = pick_platform(doc, platform, name)
            raw = self.raw_manifest(f"{repo}@{manifest_digest}", what=f"reading {name}",
                                    missing=f"base image {name}: its {platform} manifest is gone")
            assert raw is not None
            if _digest(raw) != manifest_digest:
                raise ImageError(f"base image {name}: the registry served a {platform} manifest "
                                 f"that is not {manifest_digest}")
            doc = _json(raw, f"the {platform} manifest of {name}")
            kind = doc.get("mediaType") or OCI_MANIFEST
        if doc.get("schemaVersion") == 1:
            raise ImageError(f"base image {name} has a schema 1 manifest, which nothing builds "
                             "on any more; push the base again with a current tool")
        if kind not in MANIFESTS or not isinstance(doc.get("config"), dict):
            raise ImageError(f"base image {name}: {kind} is not an image manifest")
        config = self._run([*self._bounded(), "inspect", "--raw", "--config",
                            *self._flags(host_of(name)),
                            f"docker://{repo}@{manifest_digest}"],
                           what=f"reading the config of {name}",
                           missing=f"base image {name}: its config is not in the registry",
                           text=False)
        if _digest(config) != doc["config"].get("digest"):
            raise ImageError(f"base image {name}: the registry served a config that is not "
                             f"{doc['config'].get('digest')}")
        return RemoteImage(name=name, repo=repo, digest=digest, manifest=doc,
                           manifest_digest=manifest_digest, config=config)

    def fetch(self, image: RemoteImage, blobs: Path, log: Log = lambda m: None) -> int:
        """Puts every layer blob of ``image`` that ``blobs`` lacks there; returns how many it
        fetched.  Blobs already there are not read again."""
        wanted = [d["digest"] for d in image.layers]
        missing = [d for d in wanted if not blob_path(blobs, d).is_file()]
        if not missing:
            return 0

        blobs.mkdir(parents=True, exist_ok=True)
        with filelocks.held(blobs.parent / "fetch.lock", f"the blob cache {blobs}", log):
            missing = [d for d in wanted if not blob_path(blobs, d).is_file()]
            if not missing:
                return 0
            log(f"reading {len(missing)} layer(s) of {image.name} from the registry")
            tmp = Path(tempfile.mkdtemp(prefix="pull-", dir=blobs.parent))
            try:
                # Into an OCI layout whose blobs are the shared folder: skopeo skips the blobs
                # that are there and checks the digest of each one it writes.
                self._run(["copy", "--quiet", *self._flags(host_of(image.repo), "src-"),
                           "--dest-shared-blob-dir", str(blobs),
                           f"docker://{image.pinned}", f"oci:{tmp / 'layout'}:base"],
                          what=f"reading the layers of {image.name}",
                          missing=f"base image {image.name}: a layer is not in the registry")
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        still = [d for d in wanted if not blob_path(blobs, d).is_file()]
        if still:
            raise ImageError(f"base image {image.name}: skopeo read it but left no blob {still[0]}")
        return len(missing)

    # -- writing

    def push_image(self, ref: str, manifest: bytes, config: bytes, made: Layer,
                   base: RemoteImage, blobs: Path, scratch: Path) -> str:
        """Pushes to ``ref`` the image of ``manifest``: ``base``'s layers (their blobs in
        ``blobs``), then ``made`` and ``config``; written as a layout in a folder under
        ``scratch`` that is removed after.  Returns the manifest digest, checked to be the
        digest of ``manifest`` itself."""
        digest = _digest(manifest)
        tmp = Path(tempfile.mkdtemp(prefix="push-", dir=scratch))
        try:
            write_layout(tmp / "image", manifest, config, made, base, blobs)
            pushed = self._push_layout(tmp / "image", ref)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        if pushed != digest:
            raise ImageError(f"the registry stored {ref} as {pushed}, not the manifest {digest} "
                             "patchkit made")
        return digest

    def _push_layout(self, layout: Path, ref: str) -> str:
        """Pushes the image in ``layout`` (skopeo's ``dir:`` layout) to ``ref``: blobs first,
        the manifest last, digests preserved.  Returns the manifest digest the tag names."""
        digest_file = layout.parent / "pushed-digest"
        self._run(["copy", "--quiet", "--preserve-digests", *self._flags(host_of(ref), "dest-"),
                   "--digestfile", str(digest_file), f"dir:{layout}", f"docker://{ref}"],
                  what=f"push of {ref} refused, the tag is unchanged",
                  missing=f"push of {ref} refused, the tag is unchanged")
        try:
            return digest_file.read_text().strip()
        except OSError:
            raise ImageError(f"push of {ref} gave no digest") from None


def write_layout(dest: Path, manifest: bytes, config: bytes, made: Layer, base: RemoteImage,
                 blobs: Path) -> None:
    """skopeo's ``dir:`` layout of an image made on ``base``: the manifest, the config and the
    new layer as files; the base's blobs as links into ``blobs``."""
    dest.mkdir()
    (dest / "version").write_text(DIR_VERSION)
    (dest / "manifest.json").write_bytes(manifest)
    (dest / image_id_of(config).split(":", 1)[1]).write_bytes(config)
    (dest / made.diff_id.split(":", 1)[1]).write_bytes(made.data)
    for d in base.layers:
        link = dest / d["digest"].split(":", 1)[1]
        if not link.exists():
            os.symlink(blob_path(blobs, d["digest"]), link)


def _json(raw: bytes, what: str) -> dict:
    try:
        doc = json.loads(raw)
    except ValueError:
        raise ImageError(f"{what} is not JSON") from None
    if not isinstance(doc, dict):
        raise ImageError(f"{what} is not a JSON object")
    return doc


def skopeo_message(output: str) -> str:
    """skopeo's own words, on one line: the message of its last ``level=fatal`` (or error)
    line, without the name of the image it already said."""
    found = None
    for line in output.splitlines():
        m = re.search(r'msg="((?:[^"\\]|\\.)*)"', line)
        if m:
            try:
                found = json.loads(f'"{m.group(1)}"')
            except ValueError:
                found = m.group(1)
        elif line.strip() and found is None and "level=" not in line:
            found = line.strip()
    text = found or output.strip() or "skopeo failed"
    text = re.sub(r'^(?:Error parsing image name|initializing source|Error initializing source) '
                  r'"[^"]*": ', "", text)
    return " ".join(text.split())


# ------------------------------------------------------------------------ referrers
#
# Artifacts beside an image (OCI 1.1): a manifest whose ``subject`` is the image's manifest.
# skopeo 1.9 neither pushes a manifest with a subject nor lists referrers, so this part speaks
# the distribution API itself, through patchkit's HTTP border: blobs (a monolithic upload),
# the artifact's manifest by digest, and where the registry has no referrers API (it answers
# a manifest push without an ``OCI-Subject`` header; Docker's registry 2.8 is one) the tag
# fallback the distribution spec defines: an image index tagged ``sha256-<hex of the subject>``
# listing the referrers, read, extended and written again.  No credentials are sent: a
# registry that wants them refuses, and the caller says so.

EMPTY_CONFIG = "application/vnd.oci.empty.v1+json"
_EMPTY = b"{}"
_ACCEPT = ", ".join((*MANIFESTS, *INDEXES))


def _api(ref: str) -> tuple[str, str]:
    """``host/repo@...`` -> (``http(s)://host/v2/repo``, the digest or tag after it)."""
    from patchkit.imageref import split_tag

    host = host_of(ref)
    if host == DOCKER_HUB:
        raise ImageError(f"{ref}: Docker Hub needs credentials, which the referrers push "
                         "does not send")
    rest = ref[len(host) + 1:]
    if "@" in rest:
        repo, at = rest.split("@", 1)
        repo = split_tag(repo)[0] if ":" in repo else repo
    else:
        repo, at = split_tag(rest)
    scheme = "http" if is_insecure(host) else "https"
    return f"{scheme}://{host}/v2/{repo}", at or "latest"


def _call(method: str, url: str, what: str, *, body: bytes | None = None,
          headers: dict | None = None, timeout: float, missing_ok: bool = False):
    from patchkit import http

    try:
        return http.request(method, url, body=body, headers=headers or {}, timeout=timeout)
    except http.HttpError as exc:
        if missing_ok and exc.status == 404:
            return None
        raise ImageError(f"{what}: {exc}") from None


def _put_blob(base: str, data: bytes, timeout: float) -> str:
    import urllib.parse

    digest = _digest(data)
    if _call("HEAD", f"{base}/blobs/{digest}", "asking for a blob", timeout=timeout,
             missing_ok=True) is not None:
        return digest
    started = _call("POST", f"{base}/blobs/uploads/", "starting a blob upload", body=b"",
                    timeout=timeout)
    where = started.headers.get("location")
    if not where:
        raise ImageError(f"POST {base}/blobs/uploads/: the registry gave no upload location")
    where = urllib.parse.urljoin(base + "/", where)
    joiner = "&" if "?" in where else "?"
    _call("PUT", f"{where}{joiner}digest={urllib.parse.quote(digest)}", "uploading a blob",
          body=data, headers={"Content-Type": "application/octet-stream"}, timeout=timeout)
    return digest


def subject_of(ref: str, timeout: float) -> dict:
    """The descriptor of the manifest ``ref`` (``host/repo@sha256:...``) names."""
    base, at = _api(ref)
    got = _call("GET", f"{base}/manifests/{at}", f"reading the manifest of {ref}",
                headers={"Accept": _ACCEPT}, timeout=timeout)
    media = got.content_type or json.loads(got.body).get("mediaType") or OCI_MANIFEST
    return {"mediaType": media, "digest": _digest(got.body), "size": len(got.body)}


def push_referrer(ref: str, artifact_type: str, payload: bytes, annotations: dict[str, str],
                  timeout: float) -> tuple[str, bool]:
    """``payload`` pushed beside the image ``ref`` names (``host/repo@sha256:...``) as an
    artifact of ``artifact_type`` whose subject is that image's manifest: the artifact
    manifest's digest, and whether the tag fallback was written (the registry has no
    referrers API).  Failure: ImageError, one line."""
    base, _ = _api(ref)
    subject = subject_of(ref, timeout)
    config = _put_blob(base, _EMPTY, timeout)
    layer = _put_blob(base, payload, timeout)
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": artifact_type,
                "config": {"mediaType": EMPTY_CONFIG, "digest": config, "size": len(_EMPTY)},
                "layers": [{"mediaType": artifact_type, "digest": layer, "size": len(payload)}],
                "subject": subject, "annotations": annotations}
    raw = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    digest = _digest(raw)
    put = _call("PUT", f"{base}/manifests/{digest}", "pushing the artifact manifest", body=raw,
                headers={"Content-Type": OCI_MANIFEST}, timeout=timeout)
    if put.headers.get("oci-subject"):
        return digest, False   # the registry indexes it itself (the referrers API)
    descriptor = {"mediaType": OCI_MANIFEST, "digest": digest, "size": len(raw),
                  "artifactType": artifact_type, "annotations": annotations}
    tag = fallback_tag(subject["digest"])
    # read, extend, write: two writers at once may lose one entry; the artifact itself stays
    index = _fallback_index(base, tag, timeout) or {"schemaVersion": 2, "mediaType": OCI_INDEX,
                                                    "manifests": []}
    if all(m.get("digest") != digest for m in index["manifests"]):
        index["manifests"].append(descriptor)
        body = json.dumps(index, sort_keys=True, separators=(",", ":")).encode()
        _call("PUT", f"{base}/manifests/{tag}", "writing the referrers tag", body=body,
              headers={"Content-Type": OCI_INDEX}, timeout=timeout)
    return digest, True


def fallback_tag(digest: str) -> str:
    """The distribution spec's referrers tag for a subject: ``<alg>-<hex>``."""
    return digest.replace(":", "-", 1)


def _fallback_index(base: str, tag: str, timeout: float) -> dict | None:
    got = _call("GET", f"{base}/manifests/{tag}", "reading the referrers tag",
                headers={"Accept": OCI_INDEX}, timeout=timeout, missing_ok=True)
    if got is None:
        return None
    index = json.loads(got.body)
    if not isinstance(index, dict) or not isinstance(index.get("manifests"), list):
        raise ImageError(f"{base}/manifests/{tag} is not an image index")
    return index


def referrers(ref: str, artifact_type: str, timeout: float) -> list[tuple[str, bytes | str]]:
    """Every artifact of ``artifact_type`` beside the image ``ref`` names: (its manifest's
    digest, its payload, or why it could not be read), through the referrers API, else the
    tag fallback.  None there: []."""
    base, at = _api(ref)
    if not at.startswith("sha256:"):
        at = subject_of(ref, timeout)["digest"]
    listed = _call("GET", f"{base}/referrers/{at}", "listing referrers",
                   headers={"Accept": OCI_INDEX}, timeout=timeout, missing_ok=True)
    try:
        index = json.loads(listed.body) if listed is not None else \
            _fallback_index(base, fallback_tag(at), timeout)
    except ValueError:
        raise ImageError(f"{ref}: the referrers list is not JSON") from None
    out: list[tuple[str, bytes | str]] = []
    for d in (index or {}).get("manifests") or ():
        if not isinstance(d, dict) or d.get("artifactType") != artifact_type:
            continue
        digest = str(d.get("digest"))
        try:
            got = _call("GET", f"{base}/manifests/{digest}", "reading an artifact",
                        headers={"Accept": OCI_MANIFEST}, timeout=timeout)
            layers = json.loads(got.body).get("layers") or []
            layer = next(x for x in layers if x.get("mediaType") == artifact_type)
            blob = _call("GET", f"{base}/blobs/{layer['digest']}", "reading an artifact's blob",
                         timeout=timeout).body
            if _digest(blob) != layer["digest"]:
                raise ImageError(f"blob {layer['digest']} does not match its digest")
            out.append((digest, blob))
        except (ImageError, ValueError, KeyError, StopIteration, AttributeError,
                TypeError) as exc:
            out.append((digest, f"artifact {digest} unreadable: {exc or type(exc).__name__}"))
    return out
