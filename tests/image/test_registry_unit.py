"""The engine-less build's own logic: the layer file system, the manifest it pushes, the
registry border's pure parts.  No registry here; tests/image/test_nodaemon_registry_docker.py uses
the real one."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from patchkit.commands import build_image as bi
from patchkit.errors import ImageError, UsageError
from patchkit.image import layerfs
from patchkit.formats import layer
from patchkit.formats import manifests
from patchkit.engines import registry
from patchkit.image.package import find_package, installed_version, stale_caches
from patchkit.imageref import Platform
from patchkit.manifest import ImageDefaults, Manifest, VllmSource


def _tar(entries) -> bytes:
    """A layer tar from ``(name, kind, data_or_link)``: kind f, d, l (symlink), h (hardlink)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, payload in entries:
            info = tarfile.TarInfo(name)
            if kind == "d":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif kind == "l":
                info.type = tarfile.SYMTYPE
                info.linkname = payload
                tar.addfile(info)
            elif kind == "h":
                info.type = tarfile.LNKTYPE
                info.linkname = payload
                tar.addfile(info)
            else:
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    return buf.getvalue()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _layers(tmp_path: Path, *tars: bytes, compress=True) -> list[layerfs.IndexedLayer]:
    out = []
    for i, data in enumerate(tars):
        blob = gzip.compress(data, mtime=0) if compress else data
        path = tmp_path / f"blob{i}"
        path.write_bytes(blob)
        members = layerfs.index_layer(path, _digest(blob), _digest(data), tmp_path / "index",
                                      f"layer {i + 1}")
        out.append(layerfs.IndexedLayer(path, _digest(blob), members))
    return out


def test_layers_stack_as_an_engine_unpacks_them(tmp_path):
    low = _tar([("usr", "d", None), ("usr/lib", "d", None), ("usr/lib/a.py", "f", b"a1"),
                ("usr/lib/gone.py", "f", b"x"), ("usr/lib/pkg/__init__.py", "f", b"i"),
                ("usr/lib/pkg/old.py", "f", b"o"), ("./etc/conf", "f", b"c1"),
                ("usr/lib/dir_then_file/x", "f", b"x")])
    high = _tar([("usr/lib/a.py", "f", b"a2"), ("usr/lib/.wh.gone.py", "f", b""),
                 ("usr/lib/pkg/.wh..wh..opq", "f", b""), ("usr/lib/pkg/new.py", "f", b"n"),
                 ("usr/lib/dir_then_file", "f", b"now a file")])
    with layerfs.LayerFiles("img", _layers(tmp_path, low, high)) as files:
        assert files.read("/usr/lib/a.py") == b"a2"           # the upper layer wins
        assert files.read("/usr/lib/gone.py") is None          # a whiteout deletes
        assert not files.exists("/usr/lib/gone.py")
        assert files.read("/usr/lib/pkg/new.py") == b"n"
        assert not files.exists("/usr/lib/pkg/old.py")         # the opaque folder hides below
        assert not files.exists("/usr/lib/pkg/__init__.py")
        assert files.read("/etc/conf") == b"c1"                # ./ names are the same paths
        assert files.read("/usr/lib/dir_then_file") == b"now a file"
        assert not files.exists("/usr/lib/dir_then_file/x")
        assert files.exists("/usr/lib") and files.read("/usr/lib") is None  # a folder reads None
        assert not files.exists("/nowhere")


def test_symlinks_are_followed_and_hardlinks_read_their_target(tmp_path):
    low = _tar([("usr/lib/python3.11/site-packages/vllm/__init__.py", "f", b"v"),
                ("usr/lib/python3.11/site-packages/vllm/x.py", "f", b"data"),
                ("usr/lib/python3.11/site-packages/vllm/hard.py", "h",
                 "usr/lib/python3.11/site-packages/vllm/x.py"),
                ("opt/venv/lib", "l", "/usr/lib"), ("opt/rel", "l", "../usr/lib/python3.11"),
                ("opt/loop", "l", "loop"), ("opt/dangling", "l", "/no/such")])
    with layerfs.LayerFiles("img", _layers(tmp_path, low)) as files:
        assert files.read("/opt/venv/lib/python3.11/site-packages/vllm/x.py") == b"data"
        assert files.read("/opt/rel/site-packages/vllm/x.py") == b"data"
        assert files.read("/usr/lib/python3.11/site-packages/vllm/hard.py") == b"data"
        assert files.read("/opt/loop") is None                 # a loop ends, it does not hang
        assert files.exists("/opt/dangling") and files.read("/opt/dangling") is None
        # the package finder goes through the link like a process in the container would
        pkg = find_package(files, {"VIRTUAL_ENV": "/opt/venv"})
        assert pkg.site == "/opt/venv/lib/python3.11/site-packages"


def test_package_proofs_read_through_the_layers(tmp_path):
    site = "usr/local/lib/python3.11/dist-packages"
    low = _tar([(f"{site}/vllm/__init__.py", "f", b""),
                (f"{site}/vllm/_version.py", "f", b"__version__ = version = '0.27.1'\n"),
                (f"{site}/vllm-0.27.1.dist-info/METADATA", "f", b"Name: vllm\nVersion: 0.27.1\n"),
                (f"{site}/vllm/config/speculative.py", "f", b"x = 1\n"),
                (f"{site}/vllm/config/__pycache__/speculative.cpython-311.pyc", "f", b"pyc"),
                (f"{site}/vllm/config/__pycache__/speculative.cpython-311.opt-1.pyc", "f", b"pyc")])
    high = _tar([(f"{site}/vllm/config/__pycache__/.wh.speculative.cpython-311.opt-1.pyc", "f",
                  b"")])
    with layerfs.LayerFiles("img", _layers(tmp_path, low, high)) as files:
        pkg = find_package(files, {"PATH": "/usr/local/bin:/usr/bin"})
        assert pkg.dir == f"/{site}/vllm"
        assert installed_version(files, pkg, "0.27.1") == "0.27.1"
        assert stale_caches(files, pkg, f"/{site}/vllm/config/speculative.py") == [
            f"/{site}/vllm/config/__pycache__/speculative.cpython-311.pyc"]


def test_plain_and_gzip_layers_read_the_same_and_reads_far_apart_come_back(tmp_path, monkeypatch):
    monkeypatch.setattr(layerfs._Inflater, "STEP", 4096)  # many kept states in a small layer
    monkeypatch.setattr(layerfs._Inflater, "CHUNK", 512)
    import random

    rng = random.Random(7)
    payloads = {f"d/f{i:03}": bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 3000)))
                for i in range(60)}
    data = _tar([(k, "f", v) for k, v in payloads.items()])
    order = list(payloads)
    rng.shuffle(order)
    for compress in (True, False):
        where = tmp_path / ("gz" if compress else "plain")
        where.mkdir()
        with layerfs.LayerFiles("img", _layers(where, data, compress=compress)) as files:
            for name in order + order[::-1]:
                assert files.read(name) == payloads[name], name


def test_memo_keeps_the_files_read_for_the_next_run(tmp_path):
    data = _tar([("a/b.py", "f", b"hello")])
    layers = _layers(tmp_path, data)
    memo = tmp_path / "memo"
    with layerfs.LayerFiles("img", layers, memo) as files:
        assert files.read("a/b.py") == b"hello"
    layers[0].blob.write_bytes(b"")  # the blob is not opened again
    with layerfs.LayerFiles("img", layers, memo) as files:
        assert files.read("a/b.py") == b"hello"


def test_index_checks_the_blob_digest_and_the_diff_id(tmp_path):
    data = _tar([("a", "f", b"1")])
    blob = gzip.compress(data, mtime=0)
    path = tmp_path / "blob"
    path.write_bytes(blob)
    with pytest.raises(ImageError,
                       match=r"holds the tar sha256:\w+, not sha256:0+ as the image's config"):
        layerfs.index_layer(path, _digest(blob), "sha256:" + "0" * 64, tmp_path / "i",
                            "layer 1 of b")
    with pytest.raises(ImageError, match="the blob in the cache is .* it was removed"):
        layerfs.index_layer(path, "sha256:" + "1" * 64, None, tmp_path / "i", "layer 1 of b")
    assert not path.exists()


def test_index_is_made_once_and_read_back(tmp_path):
    data = _tar([("a", "f", b"1"), ("b", "l", "a")])
    path = tmp_path / "blob"
    path.write_bytes(data)
    first = layerfs.index_layer(path, _digest(data), _digest(data), tmp_path / "i", "l")
    path.write_bytes(b"garbage")  # an index that exists is trusted: the blob is not read again
    again = layerfs.index_layer(path, _digest(data), _digest(data), tmp_path / "i", "l")
    assert first == again and [m.name for m in again] == ["a", "b"]


def test_zstd_layers_are_refused_in_one_line(tmp_path):
    path = tmp_path / "blob"
    path.write_bytes(layerfs.ZSTD_MAGIC + b"\0" * 32)
    with pytest.raises(ImageError, match="zstd-compressed, which patchkit cannot read yet"):
        layerfs.index_layer(path, _digest(path.read_bytes()), None, tmp_path / "i", "layer 2 of b")


# ------------------------------------------------------------------ the pushed manifest

def _remote(media_type=registry.DOCKER_MANIFEST, **config) -> registry.RemoteImage:
    cfg = {"architecture": "arm64", "os": "linux",
           "config": {"Env": ["PATH=/usr/bin"], "Hostname": ""},
           "rootfs": {"type": "layers", "diff_ids": ["sha256:" + "a" * 64, "sha256:" + "b" * 64]},
           "history": [{"created": "2024-05-06T07:08:09.123456789Z", "created_by": "ADD x"},
                       {"created": "2024-05-06T07:08:10Z", "created_by": "ENV y",
                        "empty_layer": True},
                       {"created": "2024-05-06T09:08:10+02:00", "created_by": "RUN z",
                        "comment": "c"}]}
    cfg.update(config)
    layers = [{"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip", "size": 10,
               "digest": "sha256:" + "c" * 64},
              {"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip", "size": 20,
               "digest": "sha256:" + "d" * 64, "annotations": {"kept": "as is"}}]
    manifest = {"schemaVersion": 2, "mediaType": media_type,
                "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                           "size": 1, "digest": "sha256:" + "e" * 64}, "layers": layers}
    return registry.RemoteImage(name="reg.example:5000/base:1", repo="reg.example:5000/base",
                                digest="sha256:" + "f" * 64, manifest=manifest,
                                manifest_digest="sha256:" + "f" * 64,
                                config=json.dumps(cfg).encode())


def test_manifest_keeps_the_base_layers_and_adds_one_uncompressed_layer():
    remote = _remote()
    made = layer.layer_tar([layer.LayerEntry("x", data=b"1")], 0)
    config = b'{"config":{}}'
    doc = json.loads(manifests.image_manifest(remote, config, made))
    assert doc["mediaType"] == registry.DOCKER_MANIFEST
    assert doc["layers"][:2] == list(remote.layers)
    assert doc["layers"][2] == {"mediaType": "application/vnd.docker.image.rootfs.diff.tar",
                                "size": made.bytes, "digest": made.diff_id}
    assert doc["config"] == {"mediaType": "application/vnd.docker.container.image.v1+json",
                             "size": len(config), "digest": layer.image_id_of(config)}
    oci = json.loads(manifests.image_manifest(_remote(registry.OCI_MANIFEST), config, made))
    assert oci["layers"][2]["mediaType"] == "application/vnd.oci.image.layer.v1.tar"
    again = manifests.image_manifest(remote, config, made)
    assert manifests.image_manifest(remote, config, made) == again


def test_base_seen_from_the_registry_is_the_base_the_engine_sees():
    base = manifests.base_image(_remote(), [5, 0], Platform("linux", "arm64"))
    assert base.diff_ids == ("sha256:" + "a" * 64, "sha256:" + "b" * 64)
    assert base.digest == "sha256:" + "f" * 64
    assert base.config == {"Env": ["PATH=/usr/bin"], "Hostname": ""}
    # The engine's history API gives whole seconds and says a layer of no bytes is empty; the
    # history is rebuilt from that on the engine path, so it is here too.
    assert base.history == (
        {"created": "2024-05-06T07:08:09Z", "created_by": "ADD x"},
        {"created": "2024-05-06T07:08:10Z", "created_by": "ENV y", "empty_layer": True},
        {"created": "2024-05-06T07:08:10Z", "created_by": "RUN z", "comment": "c"})
    with pytest.raises(ImageError, match=r"base image reg.example:5000/base:1 is linux/amd64, "
                                         r"not linux/arm64"):
        manifests.base_image(_remote(architecture="amd64"), [5, 0], Platform("linux", "arm64"))


def test_times_read_as_the_engine_reads_them():
    assert manifests.unix_time("1970-01-01T00:00:01.999Z") == 1
    assert manifests.unix_time("1970-01-01T01:00:00+01:00") == 0
    assert manifests.unix_time(None) == manifests.GO_ZERO_TIME


# -------------------------------------------------------------------- the border's pure parts

def test_hosts_and_which_are_insecure(monkeypatch):
    assert registry.host_of("127.0.0.1:5055/pk/x:1") == "127.0.0.1:5055"
    assert registry.host_of("localhost/x") == "localhost"
    assert registry.host_of("vllm/vllm-openai:v0.33.0") == "docker.io"
    assert registry.host_of("ubuntu") == "docker.io"
    monkeypatch.delenv(registry.INSECURE_ENV, raising=False)
    assert registry.is_insecure("127.0.0.1:5055") and registry.is_insecure("localhost:5000")
    assert registry.is_insecure("[::1]:5000")
    assert not registry.is_insecure("registry.example:5000")
    monkeypatch.setenv(registry.INSECURE_ENV, "registry.example:5000, other.example")
    assert registry.is_insecure("registry.example:5000")
    assert registry.is_insecure("other.example:443")
    assert not registry.is_insecure("registry.example:5001")


def test_auth_file_is_the_docker_clis(monkeypatch, tmp_path):
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    assert registry.auth_file() is None
    (tmp_path / "config.json").write_text('{"auths": {}}')
    assert registry.auth_file() == tmp_path / "config.json"


def test_platform_is_picked_from_an_index():
    index = {"manifests": [
        {"mediaType": registry.OCI_MANIFEST, "digest": "sha256:amd",
         "platform": {"os": "linux", "architecture": "amd64"}},
        {"mediaType": registry.OCI_MANIFEST, "digest": "sha256:att",
         "platform": {"os": "unknown", "architecture": "unknown"}},
        {"mediaType": registry.OCI_MANIFEST, "digest": "sha256:arm",
         "platform": {"os": "linux", "architecture": "arm64", "variant": "v8"}}]}
    assert registry.pick_platform(index, Platform("linux", "arm64"), "b") == "sha256:arm"
    with pytest.raises(ImageError, match=r"base image b has no linux/s390x image \(it has: "
                                         r"linux/amd64, linux/arm64/v8\)"):
        registry.pick_platform(index, Platform("linux", "s390x"), "b")


def test_skopeo_words_come_out_on_one_line():
    out = ('time="2026-01-01T00:00:00Z" level=fatal msg="Error parsing image name '
           '\\"docker://127.0.0.1:5999/x:1\\": pinging container registry 127.0.0.1:5999: '
           'Get \\"http://127.0.0.1:5999/v2/\\": dial tcp 127.0.0.1:5999: connect: '
           'connection refused"\n')
    assert registry.skopeo_message(out) == ('pinging container registry 127.0.0.1:5999: Get '
                                            '"http://127.0.0.1:5999/v2/": dial tcp 127.0.0.1:5999: '
                                            'connect: connection refused')
    assert registry.skopeo_message("plain failure\n  more\n") == "plain failure"


def test_missing_skopeo_is_one_line(monkeypatch):
    monkeypatch.setattr(registry.shutil, "which", lambda name: None)
    with pytest.raises(ImageError, match="--no-daemon needs skopeo.*apt-get install skopeo"):
        registry.Registry(timeout=5)


# -------------------------------------------------------------------- the command's checks

def _manifest(tmp_path: Path) -> Manifest:
    return Manifest(name="pk", root=tmp_path, path=tmp_path / "patchset.yaml",
                    vllm=VllmSource(("pypi",), "v1"),
                    image=ImageDefaults("127.0.0.1:5055/b:1", "linux/arm64",
                                        "127.0.0.1:5055/t:{ref}"),
                    patches=())


@pytest.mark.parametrize("kw, message", [
    ({}, "--no-daemon builds the image in the registry, so it needs --push"),
    ({"push": True, "save": Path("x.tar")}, "--save writes an engine's 'docker load' archive"),
    ({"push": True, "mode": "source"}, "--mode source builds vLLM through an engine"),
    ({"push": True, "copy_to": ["tcp://127.0.0.1:9"]},
     "--copy-to copies from an engine, and --no-daemon has none: pull the pushed digest"),
])
def test_no_daemon_refuses_what_needs_an_engine_before_any_work(tmp_path, kw, message):
    with pytest.raises(UsageError) as exc:
        bi.run(_manifest(tmp_path), bi.Request(workdir=tmp_path / "nowhere", no_daemon=True, **kw))
    # the core names the settings; the command line words them as its options
    from patchkit.cli import worded

    said = exc.value.worded(worded) if hasattr(exc.value, "worded") else str(exc.value)
    assert said.startswith(message) and "\n" not in said
    assert exc.value.exit_code == 2


def test_installed_dists_read_through_layer_blobs_with_whiteouts(tmp_path):
    from patchkit.image import distinfo

    site = "usr/lib/python3.11/site-packages"
    meta = "Metadata-Version: 2.1\nName: {}\nVersion: {}\n"
    low = _tar([("usr", "d", None), ("usr/lib", "d", None), ("usr/lib/python3.11", "d", None),
                (site, "d", None),
                (f"{site}/torch-2.10.0.dist-info/METADATA", "f", meta.format("torch", "2.10.0").encode()),
                (f"{site}/old-1.0.dist-info/METADATA", "f", meta.format("old", "1.0").encode())])
    high = _tar([(f"{site}/.wh.torch-2.10.0.dist-info", "f", b""),
                 (f"{site}/.wh.old-1.0.dist-info", "f", b""),
                 (f"{site}/torch-2.11.0.dist-info/METADATA", "f",
                  meta.format("torch", "2.11.0").encode()),
                 (f"{site}/torch-2.11.0.dist-info/RECORD", "f",
                  b"torch/__init__.py,sha256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU,0\n")])
    with layerfs.LayerFiles("img", _layers(tmp_path, low, high)) as files:
        assert files.names(f"/{site}") == ["torch-2.11.0.dist-info"]   # whiteouts applied
        assert files.names(f"/{site}/torch-2.11.0.dist-info/METADATA") is None  # a file
        assert files.names("/nowhere") is None
        got = distinfo.installed(files, {})
    assert got.versions() == {"torch": "2.11.0"}
    assert got.get("torch").record["torch/__init__.py"].size == 0
