"""Image stores, complete archives and copy-image, with the engine API faked at the border.

The fake keeps the rule each real store has: the classic store takes a load archive without the
layers it holds; containerd's store and containers-storage take only whole archives, and
containerd's store names an image by a manifest digest of its own.  The real engines are in
test_stores_docker.py.
"""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import replace
from pathlib import Path

import pytest
from testing.fakeengine import (DOCKER29_INFO, PODMAN_INFO, FakeClient, StoreAPI,
                                 tar_bytes)
from testing.progress import Said
from testing.venvbase import applied_checkout, base_fs, demo_project

from patchkit import cli
from patchkit.commands import build_image as bi
from patchkit.commands import copy_image
from patchkit.errors import ImageError, UsageError
from patchkit.formats import layer
from patchkit.formats import archive
from patchkit.engines import facts
from patchkit.engines.docker import Engine, engine_url
from patchkit.engines.facts import Inspected, store_of
from patchkit.imageref import Platform
from patchkit.manifest import Manifest


@pytest.fixture
def workdir(tmp_path) -> Path:
    return applied_checkout(tmp_path)


@pytest.fixture
def project(tmp_path) -> Manifest:
    return demo_project(tmp_path)


BASE_TAG = "reg:5000/vllm/base:0.27.1"
BASE_LAYER = layer.layer_tar([layer.LayerEntry("etc/os-release", "file", b"ID=fake\n")], 0)
def _config(diff_ids, labels=None) -> bytes:
    doc = {"architecture": "arm64", "os": "linux",
           "config": {"Env": ["PATH=/opt/venv/bin:/usr/local/bin:/usr/bin",
                              "VIRTUAL_ENV=/opt/venv"],
                      "Entrypoint": ["vllm", "serve"], "Labels": labels or {}},
           "history": [{"created": "1970-01-01T00:00:01Z", "created_by": "ADD rootfs"}],
           "rootfs": {"type": "layers", "diff_ids": list(diff_ids)}}
    return json.dumps(doc, sort_keys=True).encode()


def store_engine(kind: str = "classic", host: str = "unix:///fake.sock") -> tuple[Engine, StoreAPI]:
    """An engine holding the base of the project, as a store of ``kind`` holds it."""
    api = StoreAPI(kind)
    api.add(_config([BASE_LAYER.diff_id]), {BASE_LAYER.diff_id: BASE_LAYER.data},
            fs=base_fs(), tag=BASE_TAG, digest="sha256:" + "d" * 64)
    return Engine(FakeClient(api), host), api


# --------------------------------------------------------------------------- detection

@pytest.mark.parametrize("version,info,kind", [
    ({"Components": [{"Name": "Engine", "Version": "20.10.24"}]},
     {"Driver": "overlay2", "DriverStatus": [["Backing Filesystem", "extfs"]]}, "classic"),
    ({"Components": [{"Name": "Engine", "Version": "29.0.0"}]}, DOCKER29_INFO, "containerd"),
    ({}, {"Driver": "overlayfs", "DriverStatus": None}, "containerd"),
    ({"Components": [{"Name": "Podman Engine", "Version": "4.3.1"}]},
     {"Driver": "vfs", "DriverStatus": []}, "containers-storage"),
    ({}, PODMAN_INFO, "containers-storage"),
])
def test_the_store_is_told_from_version_and_info(version, info, kind):
    store = store_of(version, info)
    assert store.kind == kind
    assert store.partial_load == (kind == "classic")
    assert store.ids_are_config_digests == (kind != "containerd")


# ------------------------------------------------------------------------ the build path

@pytest.mark.parametrize("kind", ["classic", "containerd", "containers-storage"])
def test_every_store_gets_the_same_config_and_layer(project, workdir, kind):
    reference, ref_api = store_engine("classic")
    want = bi.run(project, bi.Request(workdir=workdir, apply=False, engine=reference)).to_dict()
    want_config = ref_api.configs[want["image_id"]]

    engine, api = store_engine(kind)
    said = Said()
    got = bi.run(project, bi.Request(workdir=workdir, apply=False, engine=engine),
                 progress=said).to_dict()
    assert got["ok"] and got["layer"]["diff_id"] == want["layer"]["diff_id"]
    # the same config, byte for byte: the same config digest whichever way it was loaded
    assert api.configs[api.tags["demo:v0.27.1"]] == want_config
    assert got["image_id"] == api.tags["demo:v0.27.1"]
    assert (got["image_id"] == want["image_id"]) == (kind != "containerd")
    with tarfile.open(fileobj=io.BytesIO(api.loaded[-1])) as tar:
        names = tar.getnames()
        man = json.load(tar.extractfile("manifest.json"))
    assert len(api.loaded) == 1 and len(man) == 1 and len(man[0]["Layers"]) == 2
    if kind == "classic":
        assert got["load"] == "partial" and api.exports == 0
        assert man[0]["Layers"][0] not in names
        assert any(line.startswith("loading the layer alone") for line in said.lines)
    else:
        assert got["load"] == "complete" and api.exports == 1
        assert man[0]["Layers"][0] in names  # the base's layer travelled with it
        assert "repositories" not in names and "index.json" not in names
        store = "containers-storage" if kind != "containerd" else "containerd's image store"
        assert (f"loading a complete archive: the engine at unix:///fake.sock keeps images in "
                f"{store}, which cannot take a partial load") in said.lines

    # unchanged: found again by its inputs, nothing loaded twice
    again = bi.run(project, bi.Request(workdir=workdir, apply=False, engine=engine)).to_dict()
    assert again["reused"] and again["image_id"] == got["image_id"] and len(api.loaded) == 1


def test_a_store_that_refuses_the_complete_archive_leaves_nothing_tagged(project, workdir):
    engine, api = store_engine("containers-storage")
    api.refuse = "payload does not match any of the supported image formats"
    with pytest.raises(ImageError) as exc:
        bi.run(project, bi.Request(workdir=workdir, apply=False, engine=engine))
    assert "payload does not match" in str(exc.value) and "\n" not in str(exc.value)
    assert "demo:v0.27.1" not in api.tags


# ---------------------------------------------------------------- the archive, streamed

def _export(kind="containers-storage"):
    _, api = store_engine(kind)
    return list(api.get_image(BASE_TAG))


@pytest.mark.parametrize("kind", ["classic", "containerd", "containers-storage"])
def test_a_complete_archive_is_the_base_export_then_the_layer_and_config(kind):
    made = layer.layer_tar([layer.LayerEntry("opt/x.py", "file", b"X = 1\n")], 5)
    config = _config([BASE_LAYER.diff_id, made.diff_id])
    facts = archive.ArchiveFacts()
    # one byte at a time: nothing depends on how the engine cuts its stream
    chunks = [bytes([b]) for chunk in _export(kind) for b in chunk]
    out = b"".join(archive.complete_archive(iter(chunks), config, made, [BASE_LAYER.diff_id], facts))
    assert facts.sent == len(out)
    with tarfile.open(fileobj=io.BytesIO(out)) as tar:
        man = json.load(tar.extractfile("manifest.json"))
        assert man == [{"Config": f"{layer.image_id_of(config)[7:]}.json", "RepoTags": None,
                        "Layers": [man[0]["Layers"][0], f"{made.diff_id[7:]}/layer.tar"]}]
        assert tar.extractfile(man[0]["Config"]).read() == config
        base = tar.getmember(man[0]["Layers"][0])
        assert tar.extractfile(base).read() == BASE_LAYER.data
        assert tar.extractfile(man[0]["Layers"][1]).read() == made.data
        assert not {"repositories", "index.json", "oci-layout"} & set(tar.getnames())


def test_a_copy_relays_the_export_and_counts_its_layer_bytes():
    facts = archive.ArchiveFacts()
    export = _export("containers-storage")
    out = b"".join(archive.relayed_export(iter(export), facts))
    assert facts.sent == len(out)
    assert facts.layer_bytes() == len(BASE_LAYER.data) and facts.layer_count() == 1
    with tarfile.open(fileobj=io.BytesIO(out)) as a, \
            tarfile.open(fileobj=io.BytesIO(b"".join(export))) as b:
        assert [(m.name, m.size, m.linkname) for m in a] == \
            [(m.name, m.size, m.linkname) for m in b]


@pytest.mark.parametrize("chunks,message", [
    (lambda e: [b"".join(e)[:9000]], "export ends"),
    (lambda e: [b"not a tar archive at all" * 40], "not a"),
    (lambda e: [tar_bytes([("a.json", b"{}")])], "has no manifest.json"),
])
def test_a_broken_export_is_one_line(chunks, message):
    made = layer.layer_tar([layer.LayerEntry("opt/x.py", "file", b"X = 1\n")], 5)
    with pytest.raises(ImageError) as exc:
        b"".join(archive.complete_archive(iter(chunks(_export())), b"{}", made,
                                        [BASE_LAYER.diff_id]))
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_an_export_of_another_image_is_refused():
    made = layer.layer_tar([layer.LayerEntry("opt/x.py", "file", b"X = 1\n")], 5)
    with pytest.raises(ImageError, match=r"holds no image of these 2 layer\(s\)"):
        b"".join(archive.complete_archive(iter(_export()), b"{}", made,
                                        [BASE_LAYER.diff_id, "sha256:" + "e" * 64]))


# -------------------------------------------------------------------------- fingerprints

def test_fingerprint_is_config_and_layers_never_the_image_id():
    image = Inspected("sha256:" + "1" * 64, ("sha256:" + "3" * 64,), Platform("linux", "arm64"),
                      config_digest="sha256:" + "2" * 64)
    fp = facts.fingerprint(image)
    assert fp.startswith("sha256:")
    assert fp == facts.fingerprint(replace(image, id="sha256:" + "9" * 64))
    assert fp != facts.fingerprint(replace(image, diff_ids=()))
    assert fp != facts.fingerprint(replace(image, config_digest="sha256:" + "4" * 64))
    with pytest.raises(ImageError):
        facts.fingerprint(replace(image, config_digest=None))


def test_a_containerd_store_fingerprints_by_the_config_it_exports():
    classic, _ = store_engine("classic")
    containerd, api = store_engine("containerd")
    here, there = classic.content(BASE_TAG), containerd.content(BASE_TAG)
    assert here.id != there.id and api.exports == 1
    assert here.config_digest == there.config_digest == here.id
    assert facts.fingerprint(here) == facts.fingerprint(there)


# ------------------------------------------------------------------------ engine addresses

@pytest.mark.parametrize("url", ["ssh://node2", "ssh://root@node2:2222", "ssh://10.0.0.2:22/",
                                 "unix:///tmp/d2.sock", "tcp://127.0.0.1:2375"])
def test_engine_addresses_that_are_taken(url):
    assert engine_url(url) == (url.rstrip("/") if not url.startswith("unix") else url)


@pytest.mark.parametrize("url,why", [
    ("node2", "expected ssh://"), ("http://node2:2375", "expected ssh://"),
    ("ssh://", "expected ssh://[user@]host[:port]"), ("ssh://node2/path", "expected ssh://"),
    ("ssh://user:pw@node2", "expected ssh://"), ("ssh://node2:port", "Port could not be cast"),
    ("tcp://127.0.0.1", "expected tcp://host:port"), ("unix://tmp/d.sock", "unix:///absolute"),
    ("ssh://node2?x=1", "no ?query"),
])
def test_bad_engine_addresses_are_usage_errors(url, why):
    with pytest.raises(UsageError) as exc:
        engine_url(url, "--to")
    assert str(exc.value).startswith(f"--to {url!r} is not an engine address: ")
    assert why in str(exc.value)


# ------------------------------------------------------------------------------ copy-image

IMAGE = "reg:5000/demo:1"


def _source(kind="classic"):
    engine, api = store_engine(kind, "unix:///source.sock")
    made = layer.layer_tar([layer.LayerEntry("opt/x.py", "file", b"X = 1\n")], 5)
    config = _config([BASE_LAYER.diff_id, made.diff_id], {"io.patchkit.test": "1"})
    iid = api.add(config, {made.diff_id: made.data}, tag=IMAGE)
    return engine, api, iid


def _targets(*kinds):
    engines = {f"unix:///node{i}.sock": store_engine(k, f"unix:///node{i}.sock")
               for i, k in enumerate(kinds)}

    def connect(url):
        if url not in engines:
            raise ImageError(f"no Docker Engine answers at {url}: [Errno 111] Connection refused")
        return engines[url][0]
    return engines, connect


def test_copy_streams_once_then_finds_the_content_present():
    source, src_api, iid = _source()
    engines, connect = _targets("classic", "containers-storage", "containerd")
    urls = list(engines)
    first = copy_image.run(IMAGE, urls, source=source, connect=connect)
    want = facts.fingerprint(source.content(IMAGE))
    assert first.ok and first.fingerprint == want
    assert [t.status for t in first.targets] == ["copied"] * 3
    for t, (url, (engine, api)) in zip(first.targets, engines.items()):
        assert t.engine == url and t.fingerprint == want
        assert facts.fingerprint(engine.content(IMAGE)) == want
        # the whole image travels: the base's layer and the image's own
        assert t.sent.layers == 2
        assert t.sent.layer_bytes == sum(len(b) for b in src_api.blobs.values())
        assert len(api.loaded) == 1
    # one export per set of layers to send: the classic store holds the base (this fake's
    # export names its layers in no engine's way, so the layer is sent all the same), the two
    # others take no partial load and share one export
    assert src_api.exports == 2

    again = copy_image.run(IMAGE, urls, source=source, connect=connect)
    assert [t.status for t in again.targets] == ["present"] * 3
    assert all(t.sent.bytes == 0 and t.sent.layer_bytes == 0 for t in again.targets)
    assert src_api.exports == 2 and all(len(api.loaded) == 1 for _, api in engines.values())
    data = again.to_dict()
    assert (data["ok"], data["image"], data["fingerprint"], data["dry_run"]) == (
        True, IMAGE, want, False)
    for u, t in zip(urls, data["targets"]):
        assert (t["engine"], t["status"], t["fingerprint"]) == (u, "present", want)
        assert t["sent"] == {"bytes": 0, "layer_bytes": 0, "layers": 0, "layers_skipped": 0,
                             "skipped_bytes": 0, "compress": "none"}
        assert t["plan"]["action"] == "present"


def test_other_content_under_the_tag_is_replaced():
    source, _, iid = _source()
    engines, connect = _targets("classic")
    (engine, api), = engines.values()
    old = api.add(_config([BASE_LAYER.diff_id], {"old": "1"}), {}, tag=IMAGE)
    report = copy_image.run(IMAGE, list(engines), source=source, connect=connect)
    assert [t.status for t in report.targets] == ["replaced"]
    assert api.tags[IMAGE] == iid and old in api.images_


def test_content_held_under_another_name_only_gets_the_tag():
    source, src_api, iid = _source()
    engines, connect = _targets("classic")
    (engine, api), = engines.values()
    api.add(src_api.configs[iid], {d: src_api.blobs[d] for d in src_api.blobs}, tag="other:1")
    report = copy_image.run(IMAGE, list(engines), source=source, connect=connect)
    assert [t.status for t in report.targets] == ["copied"] and report.targets[0].sent.bytes == 0
    assert api.tags[IMAGE] == iid and not api.loaded and src_api.exports == 0


@pytest.mark.parametrize("held_before", [False, True])
def test_a_refused_load_fails_that_target_alone_and_leaves_its_tag(held_before):
    source, _, iid = _source()
    engines, connect = _targets("containers-storage", "classic")
    (bad, bad_api), (good, good_api) = engines.values()
    old = (bad_api.add(_config([BASE_LAYER.diff_id], {"old": "1"}), {}, tag=IMAGE)
           if held_before else None)
    bad_api.refuse = "no space left on device"
    report = copy_image.run(IMAGE, list(engines), source=source, connect=connect)
    assert [t.status for t in report.targets] == ["failed", "copied"] and not report.ok
    assert report.targets[0].error.startswith(
        "loading the image into the engine at unix:///node0.sock")
    assert "no space left on device" in report.targets[0].error
    assert bad_api.tags.get(IMAGE) == old
    assert good_api.tags[IMAGE] == iid


def test_content_that_does_not_match_after_the_load_is_put_back():
    source, _, iid = _source()
    engines, connect = _targets("classic")
    (engine, api), = engines.values()
    old = api.add(_config([BASE_LAYER.diff_id], {"old": "1"}), {}, tag=IMAGE)
    stray = api.add(_config([BASE_LAYER.diff_id], {"stray": "1"}), {})
    real_load = api.load_image

    def load_then_move_the_tag(data):
        yield from real_load(data)
        api.tags[IMAGE] = stray  # as if another process had tagged something else meanwhile

    api.load_image = load_then_move_the_tag
    report = copy_image.run(IMAGE, list(engines), source=source, connect=connect)
    (t,) = report.targets
    assert t.status == "failed" and t.error.endswith("; its tag is as it was")
    assert api.tags[IMAGE] == old


def test_an_unreachable_target_fails_alone():
    source, _, _ = _source()
    engines, connect = _targets("classic")
    report = copy_image.run(IMAGE, ["tcp://127.0.0.1:9", *engines], source=source, connect=connect)
    assert [t.status for t in report.targets] == ["failed", "copied"] and not report.ok
    assert report.to_dict()["targets"][0]["error"] == (
        "no Docker Engine answers at tcp://127.0.0.1:9: [Errno 111] Connection refused")


def test_copy_refuses_bad_input_before_any_engine_is_asked():
    for image, targets, message in [
            (IMAGE, ["ftp://x"], "--to 'ftp://x' is not an engine address"),
            (IMAGE, [], "give the engines to copy to with --to ENGINE"),
            ("reg:5000/demo@sha256:" + "a" * 64, ["tcp://h:1"], "a tag names no digest"),
            ("sha256:" + "a" * 64, ["tcp://h:1"], "is an image id")]:
        with pytest.raises(UsageError, match=message.replace("(", r"\(").replace("?", r"\?")):
            copy_image.run(image, targets, connect=lambda url: pytest.fail("connected"))
    source, _, _ = _source()
    with pytest.raises(ImageError,
                       match=r"^no image reg:5000/none:1 on the engine at unix:///source.sock$"):
        copy_image.run("reg:5000/none:1", ["tcp://h:1"], source=source, connect=lambda u: None)


def test_cli_copy_image_prints_a_line_per_target_and_exits_1_on_a_failure(monkeypatch, capsys):
    source, _, _ = _source()
    engines, connect = _targets("classic")
    monkeypatch.setattr(Engine, "connect", classmethod(
        lambda cls, host=None, timeout=600, link=None: source if host is None else connect(host)))
    url = next(iter(engines))
    assert cli.main(["copy-image", IMAGE, "--to", url, "tcp://127.0.0.1:9"]) == 1
    out = capsys.readouterr().out.splitlines()
    want = facts.fingerprint(source.content(IMAGE))
    assert out[0].startswith(f"copied    {url} {want} (")
    assert "bytes sent in" in out[0] and "2 layer(s), " in out[0]
    assert out[1] == ("failed    tcp://127.0.0.1:9: no Docker Engine answers at tcp://127.0.0.1:9: "
                      "[Errno 111] Connection refused")
    assert len(out) == 2
    assert cli.main(["copy-image", IMAGE, "--to", url, "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is True and data["image"] == IMAGE and data["fingerprint"] == want
    assert [(t["engine"], t["status"], t["fingerprint"]) for t in data["targets"]] == [
        (url, "present", want)]
    assert cli.main(["copy-image", IMAGE, "--to", "ssh://", "--format", "json"]) == 2
    assert json.loads(capsys.readouterr().out)["exit_code"] == 2


def test_build_image_copy_to(project, workdir, monkeypatch, tmp_path):
    engine, api = store_engine("classic")
    engines, connect = _targets("containers-storage")
    monkeypatch.setattr(Engine, "connect",
                        classmethod(lambda cls, host=None, timeout=600: connect(host)))
    url = next(iter(engines))
    with pytest.raises(UsageError, match="--copy-to 'node2' is not an engine address"):
        bi.run(project, bi.Request(workdir=tmp_path / "never-applied", engine=engine,
                                   copy_to=["node2"]))
    summary = bi.run(project, bi.Request(workdir=workdir, apply=False, engine=engine,
                                         copy_to=[url])).to_dict()
    assert summary["ok"] is True
    (t,) = summary["copy"]["targets"]
    assert t["engine"] == url and t["status"] == "copied"
    target, target_api = engines[url]
    assert target_api.tags["demo:v0.27.1"] == summary["image_id"]
    assert t["fingerprint"] == summary["copy"]["fingerprint"] == facts.fingerprint(
        target.content("demo:v0.27.1"))
    # a copy that fails makes the run fail, with the image built and tagged here
    target_api.refuse = "disk full"
    target_api.tags.pop("demo:v0.27.1")
    target_api.images_.pop(summary["image_id"])
    failed = bi.run(project, bi.Request(workdir=workdir, apply=False, engine=engine,
                                        copy_to=[url]))
    from patchkit.render import text
    assert failed.to_dict()["ok"] is False and api.tags["demo:v0.27.1"] == summary["image_id"]
    assert text.build_image(failed).splitlines()[-1] == (
        "FAILED: demo:v0.27.1 was built, but 1 of 1 copies failed")


def test_a_connection_that_breaks_is_sent_again_once_with_a_new_stream():
    import requests

    source, src_api, iid = _source()
    engines, connect = _targets("classic")
    (engine, api), = engines.values()
    real_load = api.load_image
    calls = []

    def flaky(data):
        calls.append(1)
        if len(calls) == 1:
            next(iter(data))  # a little of the stream went, then the session dropped
            raise requests.exceptions.ConnectionError(
                "('Connection aborted.', BrokenPipeError(32, 'Broken pipe'))")
        yield from real_load(data)

    api.load_image = flaky
    said = []
    report = copy_image.run(IMAGE, list(engines), source=source, connect=connect, log=said.append)
    (t,) = report.targets
    assert t.status == "copied" and len(calls) == 2 and src_api.exports == 2
    assert t.sent.layers == 2 and t.sent.bytes == len(api.loaded[-1])
    assert any("broke" in line and "sending again" in line for line in said)
    # twice broken: one line, and nothing tagged
    calls.clear()
    api.tags.pop(IMAGE)
    api.images_.pop(iid)

    def broken(data):
        next(iter(data))
        raise requests.exceptions.ConnectionError("Connection aborted.")
        yield

    api.load_image = broken
    (t,) = copy_image.run(IMAGE, list(engines), source=source, connect=connect).targets
    assert t.status == "failed" and "Connection aborted" in t.error and IMAGE not in api.tags


def test_a_store_without_partial_loads_gets_the_whole_image_and_says_so():
    source, src_api, _ = _source()
    engines, connect = _targets("containers-storage")
    said: list[str] = []
    (t,) = copy_image.run(IMAGE, list(engines), source=source, connect=connect,
                          log=said.append).targets
    assert t.status == "copied" and (t.sent.layers, t.sent.layers_skipped) == (2, 0)
    url = next(iter(engines))
    assert f"{url}: containers-storage cannot take a partial load (\"Some layer tarfiles are " \
           "missing in the tarball\"): it holds 1 of the 2 layers, and the whole image goes " \
           "instead" in said
    assert t.plan.to_dict()["layers_present"] == 1 and t.plan.skipped == 0


@pytest.mark.parametrize("kind,kept", [
    ("containers-storage", ["127.0.0.1:5000/pk@sha256:" + "b" * 64]),
    ("classic", ["localhost/pk@sha256:" + "a" * 64, "127.0.0.1:5000/pk@sha256:" + "b" * 64]),
])
def test_podman_local_names_are_no_registry_copies(kind, kept):
    # Podman lists a digest under localhost/NAME for an image it loaded or built (seen with
    # Podman 4.3.1 after `podman load` of a docker-archive): no registry holds it, so evidence
    # is neither pushed there nor read from there.  On Docker, localhost is a registry's name.
    engine, api = store_engine(kind)
    iid = api.tags[BASE_TAG]
    api.images_[iid]["attrs"]["RepoDigests"] = ["localhost/pk@sha256:" + "a" * 64,
                                                "127.0.0.1:5000/pk@sha256:" + "b" * 64]
    assert list(engine.inspect(BASE_TAG).repo_digests) == kept
