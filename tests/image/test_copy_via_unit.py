"""copy-image --via: the registry value, where the image goes in it, and the usage errors,
before any engine or registry is asked.  The real push and pulls are in test_copy_via_docker.py.
"""

from __future__ import annotations

import json

import pytest

from patchkit import cli
from patchkit.nodes import transfer as copy_image
from patchkit.errors import UsageError


@pytest.mark.parametrize("text, value", [
    ("127.0.0.1:5055", "127.0.0.1:5055"),
    ("127.0.0.1:5055/", "127.0.0.1:5055"),
    ("registry.lan/cluster/spark", "registry.lan/cluster/spark"),
    ("localhost:5000/pk", "localhost:5000/pk"),
    ("[::1]:5000", "[::1]:5000"),
])
def test_registries_that_are_taken(text, value):
    assert copy_image.check_via(text) == value


@pytest.mark.parametrize("text", [
    "http://127.0.0.1:5055", "registry", "registry/cluster", "127.0.0.1:5055/Upper",
    "127.0.0.1:5055/a:tag", "127.0.0.1:5055/a@sha256:" + "a" * 64, "", "reg:port"])
def test_bad_registries_are_one_usage_line(text):
    with pytest.raises(UsageError) as exc:
        copy_image.check_via(text)
    assert str(exc.value) == (f"--via {text!r} is not a registry: expected host[:port][/prefix], "
                              "e.g. 127.0.0.1:5000 or registry.lan:5000/cluster")


@pytest.mark.parametrize("image, ref", [
    ("dsv4-flash-dspark:v0.33.0", "reg:5000/dsv4-flash-dspark:v0.33.0"),
    ("team/app", "reg:5000/team/app:latest"),
    ("127.0.0.1:5055/pk-test/x:1", "reg:5000/pk-test/x:1"),
    ("docker.io/library/busybox:1", "reg:5000/library/busybox:1"),
    ("ghcr.io/o/app:2", "reg:5000/o/app:2"),
])
def test_the_image_keeps_its_path_and_tag_under_the_registry(image, ref):
    assert copy_image.via_ref("reg:5000", image) == ref
    assert copy_image.via_ref("reg:5000/c", image) == ref.replace("reg:5000/", "reg:5000/c/")


def test_cli_bad_via_exits_2_before_any_engine(monkeypatch, capsys):
    from patchkit.engines.docker import Engine

    monkeypatch.setattr(Engine, "connect", classmethod(lambda *a, **k: pytest.fail("connected")))
    code = cli.main(["copy-image", "demo:1", "--to", "ssh://node2", "--via", "http://reg:5000",
                     "--format", "json"])
    assert code == 2
    assert json.loads(capsys.readouterr().out)["error"].startswith(
        "--via 'http://reg:5000' is not a registry")


@pytest.mark.parametrize("extra, word", [(["--dry-run"], "--dry-run"),
                                         (["--compress", "gzip"], "--compress")])
def test_via_with_a_direct_copy_option_exits_2_before_any_engine(monkeypatch, capsys, extra,
                                                                   word):
    from patchkit.engines.docker import Engine

    monkeypatch.setattr(Engine, "connect", classmethod(lambda *a, **k: pytest.fail("connected")))
    code = cli.main(["copy-image", "demo:1", "--to", "ssh://node2", "--via", "127.0.0.1:5055",
                     *extra, "--format", "json"])
    assert code == 2
    assert json.loads(capsys.readouterr().out)["error"].startswith(
        f"--via 127.0.0.1:5055 goes without {word}")


def test_a_transfer_counts_layers_moved_and_held_and_their_bytes_once():
    from patchkit.engines.facts import Transfer

    pull = Transfer()
    for line in [{"status": "Pulling from pk/app", "id": "1"},
                 {"status": "Already exists", "id": "aa"},
                 {"status": "Pulling fs layer", "progressDetail": {}, "id": "bb"},
                 {"status": "Downloading", "progressDetail": {"current": 10, "total": 900},
                  "id": "bb"},
                 {"status": "Downloading", "progressDetail": {"current": 900, "total": 900},
                  "id": "bb"},
                 {"status": "Pull complete", "progressDetail": {}, "id": "bb"},
                 {"status": "Digest: sha256:" + "c" * 64}]:
        pull.count(line)
    assert pull.to_dict() == {"layers": 1, "present": 1, "bytes": 900}
    push = Transfer()
    for line in [{"status": "Preparing", "id": "aa"}, {"status": "Mounted from pk/base", "id": "aa"},
                 {"status": "Layer already exists", "id": "cc"},
                 {"status": "Pushing", "progressDetail": {"current": 5, "total": 70}, "id": "bb"},
                 {"status": "Pushed", "progressDetail": {}, "id": "bb"}]:
        push.count(line)
    assert push.to_dict() == {"layers": 1, "present": 2, "bytes": 70}


def test_the_text_says_what_the_push_sent_then_what_each_target_pulled():
    from patchkit.render import copy as render

    fp = "sha256:" + "f" * 64
    data = {"via": {"ref": "reg:5000/app:1", "digest": "sha256:" + "d" * 64, "layers": 1,
                    "present": 1, "bytes": 256000, "seconds": 0.9},
            "targets": [{"engine": "ssh://n2", "status": "copied", "fingerprint": fp,
                         "sent": {"bytes": 0}, "seconds": 3.2,
                         "pulled": {"layers": 1, "present": 1, "bytes": 54113}},
                        {"engine": "ssh://n3", "status": "failed", "error": "the engine at "
                         "ssh://n3 could not pull reg:5000/app@sha256:d: denied"}]}
    assert render.text(data).splitlines() == [
        f"pushed    reg:5000/app:1@sha256:{'d' * 64} (256,000 layer bytes (1 layer(s)) sent, 1 "
        "held by the registry already, in 0.9 s)",
        f"copied    ssh://n2 {fp} (pulled 54,113 bytes (1 layer(s), 1 held already) in 3.2 s)",
        "failed    ssh://n3: the engine at ssh://n3 could not pull reg:5000/app@sha256:d: denied"]
