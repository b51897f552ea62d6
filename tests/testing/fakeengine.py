"""A Docker Engine in memory, for the unit tests of the image paths: the slice of the SDK's
low-level client (``docker.APIClient``) that the engine border (``patchkit.engines.docker`` and
``patchkit.engines.imagefiles``) calls, faked under that border so that the border's own
translation of SDK errors and streams is what the tests exercise.

* ``FakeAPI`` -- images by id (inspect output and a filesystem each), tags, stopped
  containers whose files can be read, loads; ``FakeClient`` wraps it as ``Engine`` expects.
* ``StoreAPI`` -- ``FakeAPI`` with the rules of one kind of image store: the classic store
  takes a load archive without the layers it holds; containerd's store and containers-storage
  take only whole archives, and containerd's store names an image by a manifest digest of its
  own; each exports in its own layout.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import tarfile

import docker.errors

from patchkit.formats import layer

PODMAN_INFO = {"Driver": "vfs", "DriverStatus": [], "BuildahVersion": "1.28.2",
               "ServerVersion": "4.3.1"}
DOCKER29_INFO = {"Driver": "overlayfs", "DriverStatus": [["driver-type",
                                                          "io.containerd.snapshotter.v1"]]}


def tar_bytes(members: list[tuple]) -> bytes:
    """``(name, bytes)`` files and ``(name, "->", target)`` symlinks, as a tar archive."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for m in members:
            info = tarfile.TarInfo(m[0])
            if len(m) == 3:
                info.type, info.linkname = tarfile.SYMTYPE, m[2]
                tar.addfile(info)
            else:
                info.size = len(m[1])
                tar.addfile(info, io.BytesIO(m[1]))
    return buf.getvalue()


def chunked(data: bytes, size: int = 7000):
    for i in range(0, len(data), size):
        yield data[i:i + size]


DIR = object()


class FakeResponse:
    def __init__(self, status, stat=None):
        self.status_code = status
        self.headers = {}
        if stat is not None:
            self.headers["X-Docker-Container-Path-Stat"] = base64.b64encode(json.dumps(stat).encode())


class FakeAPI:
    """The slice of docker.APIClient that patchkit.image calls, over in-memory images."""

    def __init__(self, images: dict, containerd: bool = False):
        self.images_ = images            # id -> {"attrs": ..., "fs": {path: bytes | DIR}}
        self.tags: dict[str, str] = {}
        self.containers: dict[str, str] = {}
        self.loaded: list[bytes] = []
        self.containerd = containerd

    def _image(self, ref):
        iid = self.tags.get(ref, ref)
        if iid not in self.images_:
            raise docker.errors.ImageNotFound(f"no such image: {ref}")
        return iid

    def info(self):
        status = [["driver-type", "io.containerd.snapshotter.v1"]] if self.containerd else []
        return {"DriverStatus": status}

    def version(self):
        return {"Components": [{"Name": "Engine", "Version": "20.10.24"}]}

    def inspect_image(self, ref):
        iid = self._image(ref)
        attrs = dict(self.images_[iid]["attrs"], Id=iid)
        attrs["RepoTags"] = [t for t, i in self.tags.items() if i == iid]
        return attrs

    def history(self, ref):
        return [{"Created": 1, "CreatedBy": "ADD rootfs", "Size": 5}]

    def pull(self, repo, tag=None, **kw):
        yield {"error": f"manifest for {repo}:{tag} not found"}

    def images(self, filters=None, all=False):
        if not filters:
            return [{"Id": i} for i in self.images_]
        key, _, value = filters["label"].partition("=")
        return [{"Id": i} for i, img in self.images_.items()
                if ((img["attrs"].get("Config") or {}).get("Labels") or {}).get(key) == value]

    def create_container(self, image, **kw):
        cid = f"c{len(self.containers)}"
        self.containers[cid] = self._image(image)
        return {"Id": cid}

    def remove_container(self, cid, **kw):
        self.containers.pop(cid, None)

    def _url(self, fmt, *args):
        return fmt.format(*args)

    def _raise_for_status(self, res):
        assert res.status_code == 200

    def _fs(self, cid):
        return self.images_[self.containers[cid]]["fs"]

    def _stat(self, fs, path):
        path = path.rstrip("/")
        if path in fs:
            return {"name": path.rsplit("/", 1)[-1], "size": 0, "linkTarget": "",
                    "mode": (1 << 31) if fs[path] is DIR else 0o644}
        if any(p.startswith(path + "/") for p in fs):
            return {"name": path.rsplit("/", 1)[-1], "size": 0, "mode": 1 << 31, "linkTarget": ""}
        return None

    def head(self, url, params):
        cid = url.split("/")[2]
        st = self._stat(self._fs(cid), params["path"])
        return FakeResponse(200, st) if st else FakeResponse(404)

    def get_archive(self, cid, path):
        fs = self._fs(cid)
        st = self._stat(fs, path)
        if st is None:
            raise docker.errors.NotFound(f"no {path}")
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            if fs.get(path, DIR) is not DIR:
                info = tarfile.TarInfo(path.rsplit("/", 1)[-1])
                info.size = len(fs[path])
                tar.addfile(info, io.BytesIO(fs[path]))
        return iter([buf.getvalue()]), st

    def load_image(self, data):
        self.loaded.append(data)
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            man = json.load(tar.extractfile("manifest.json"))[0]
            config = tar.extractfile(man["Config"]).read()
            doc = json.loads(config)
            self.images_[layer.image_id_of(config)] = {
                "attrs": {"Config": doc["config"], "Architecture": doc["architecture"],
                          "Os": doc["os"], "RootFS": {"Layers": doc["rootfs"]["diff_ids"]}},
                "fs": {}}
        yield {"stream": "Loaded image ID: x\n"}

    def tag(self, image_id, repo, tag, force=False):
        self.tags[f"{repo}:{tag}"] = image_id
        return True

    def remove_image(self, ref, noprune=False):
        self.tags.pop(ref, None)

    def push(self, repo, tag=None, **kw):
        yield {"status": "The push refers to repository"}
        yield {"error": "denied: requested access to the resource is denied"}


class FakeClient:
    def __init__(self, api):
        self.api = api


class StoreAPI(FakeAPI):
    """FakeAPI with the export, the load rules and the ids of one kind of store."""

    def __init__(self, kind: str = "classic"):
        super().__init__({}, containerd=kind == "containerd")
        self.kind = kind
        self.blobs: dict[str, bytes] = {}     # diff_id -> layer, the layers the engine holds
        self.configs: dict[str, bytes] = {}   # image id -> config
        self.exports = 0
        self.refuse: str | None = None

    def info(self):
        return {"classic": {"Driver": "vfs", "DriverStatus": []}, "containerd": DOCKER29_INFO,
                "containers-storage": PODMAN_INFO}[self.kind]

    def id_of(self, config: bytes) -> str:
        if self.kind == "containerd":  # the digest of a manifest the store wrote
            return "sha256:" + hashlib.sha256(b"manifest of " + config).hexdigest()
        return layer.image_id_of(config)

    def add(self, config: bytes, layers: dict[str, bytes], fs=None, tag=None, digest=None) -> str:
        iid = self.id_of(config)
        doc = json.loads(config)
        self.blobs.update(layers)
        self.configs[iid] = config
        self.images_[iid] = {"attrs": {
            "Architecture": doc["architecture"], "Os": doc["os"], "Config": doc["config"],
            "RootFS": {"Type": "layers", "Layers": doc["rootfs"]["diff_ids"]},
            "RepoDigests": [f"{tag.rsplit(':', 1)[0]}@{digest}"] if digest else []},
            "fs": fs or {}}
        if tag:
            self.tags[tag] = iid
        return iid

    def history(self, ref):
        return [{"Created": 1, "CreatedBy": "ADD rootfs", "Size": 5}]

    def get_image(self, ref):
        self.exports += 1
        iid = self._image(ref)
        config = self.configs[iid]
        diff_ids = json.loads(config)["rootfs"]["diff_ids"]
        members, paths = [], []
        for i, d in enumerate(diff_ids):
            hexd = d.split(":", 1)[1]
            if self.kind == "containers-storage":   # Podman's layout
                members += [(f"{hexd}.tar", self.blobs[d]),
                            (f"v1-{i}/layer.tar", "->", f"../{hexd}.tar")]
                paths.append(f"{hexd}.tar")
            elif self.kind == "containerd":          # an OCI layout beside manifest.json
                members.append((f"blobs/sha256/{hexd}", self.blobs[d]))
                paths.append(f"blobs/sha256/{hexd}")
            else:
                members.append((f"v1-{i}/layer.tar", self.blobs[d]))
                paths.append(f"v1-{i}/layer.tar")
        cname = (f"blobs/sha256/{layer.image_id_of(config)[7:]}" if self.kind == "containerd"
                 else f"{layer.image_id_of(config)[7:]}.json")
        members.append((cname, config))
        tags = [ref] if ref in self.tags else []
        members.append(("manifest.json", json.dumps(
            [{"Config": cname, "RepoTags": tags, "Layers": paths}]).encode()))
        if self.kind == "containerd":
            members += [("index.json", b'{"manifests": []}'), ("oci-layout", b"{}")]
        else:
            members.append(("repositories", b"{}"))
        yield from chunked(tar_bytes(members))

    def load_image(self, data):
        raw = data if isinstance(data, bytes) else b"".join(data)
        self.loaded.append(raw)
        if self.refuse:
            raise docker.errors.APIError(self.refuse)
        with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
            named = {m.name: m for m in tar.getmembers()}
            man = json.load(tar.extractfile("manifest.json"))[0]
            config = tar.extractfile(man["Config"]).read()
            diff_ids = json.loads(config)["rootfs"]["diff_ids"]
            got = {}
            for path, diff_id in zip(man["Layers"], diff_ids):
                member = named.get(path)
                if member is not None and member.issym():
                    linked = f"{path.rsplit('/', 1)[0]}/{member.linkname}"
                    member = named.get(linked.split("/../")[-1])
                if member is None:
                    if self.kind == "classic" and diff_id in self.blobs:
                        continue
                    raise docker.errors.APIError("Some layer tarfiles are missing in the tarball")
                blob = tar.extractfile(member).read()
                if "sha256:" + hashlib.sha256(blob).hexdigest() != diff_id:
                    raise docker.errors.APIError(f"invalid diffID for {path}")
                got[diff_id] = blob
        iid = self.add(config, got)
        for t in man.get("RepoTags") or ():
            self.tags[t] = iid
        yield {"stream": f"Loaded image ID: {iid}\n"}

    def remove_image(self, ref, noprune=False):
        if ref not in self.tags:
            raise docker.errors.ImageNotFound(f"no such image: {ref}")
        self.tags.pop(ref)
