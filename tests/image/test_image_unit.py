"""The image module's own logic, with the docker client faked at the module's border."""

from __future__ import annotations

import hashlib
import io
import json
import sys
import tarfile
from pathlib import Path

import docker.errors
import pytest
from testing.fakeengine import FakeAPI, FakeClient
from testing.said import said
from testing.venvbase import SITE, SPEC_V1, SPEC_V2, applied_checkout, base_fs, demo_project

from patchkit import versions
from patchkit.commands import build_image as bi
from patchkit.commands.verify import verify_image
from patchkit import imageref as reference
from patchkit.image import build
from patchkit.formats import layer
from patchkit.image.builders import engine_source
from patchkit.engines.docker import Engine
from patchkit.series.checkout import Change
from patchkit.errors import ImageError, UsageError
from patchkit.manifest import ImageDefaults, Manifest, VllmSource, variants
from patchkit.run import run_spec

def _summary(report):
    """``(exit code, --format json object)`` of a build-image run."""
    return (0 if report.ok else 1), report.to_dict()


# --------------------------------------------------------------------------- pure pieces

def _members(made: layer.Layer) -> list[tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(made.data)) as tar:
        return tar.getmembers()


def test_layer_is_sorted_owned_by_root_and_timed_once_whatever_the_input_order():
    entries = [layer.LayerEntry("usr/lib/vllm/z.py", data=b"z"),
               layer.LayerEntry("usr/lib/vllm/a/__pycache__/m.cpython-312.pyc", "whiteout"),
               layer.LayerEntry("usr/lib/vllm/a", "dir", mode=0o755),
               layer.LayerEntry("usr/lib/vllm/a/m.py", data=b"m = 1\n", mode=0o755)]
    one = layer.layer_tar(entries, 1234)
    two = layer.layer_tar(list(reversed(entries)), 1234)
    assert one.data == two.data and one.diff_id == two.diff_id
    assert one.diff_id == "sha256:" + hashlib.sha256(one.data).hexdigest()
    members = _members(one)
    assert [m.name for m in members] == ["usr/lib/vllm/a", "usr/lib/vllm/a/__pycache__/.wh.m.cpython-312.pyc",
                                         "usr/lib/vllm/a/m.py", "usr/lib/vllm/z.py"]
    assert {(m.uid, m.gid, m.uname, m.gname, m.mtime) for m in members} == {(0, 0, "", "", 1234)}
    assert [m.mode for m in members] == [0o755, 0o644, 0o755, 0o644]
    assert (one.files, one.whiteouts, one.content_bytes) == (2, 1, 7)
    assert layer.layer_tar(entries, 1235).diff_id != one.diff_id


def test_layer_refuses_a_path_twice():
    with pytest.raises(ImageError, match="twice"):
        layer.layer_tar([layer.LayerEntry("a/b.py", data=b"1"), layer.LayerEntry("a/b.py", "whiteout")], 0)


def _base(**kw) -> layer.BaseImage:
    values = dict(name="reg:5000/vllm/base:1", image_id="sha256:" + "b" * 64,
                  digest="sha256:" + "d" * 64, platform=reference.Platform("linux", "arm64"),
                  config={"Env": ["PATH=/opt/venv/bin:/usr/bin"], "Entrypoint": ["vllm", "serve"],
                          "Cmd": None, "Labels": {"keep": "1", "mine": "base"}, "Hostname": "x"},
                  diff_ids=("sha256:" + "1" * 64,),
                  history=({"created": "2020-01-01T00:00:00Z", "created_by": "ADD x"},))
    values.update(kw)
    return layer.BaseImage(**values)


def test_config_keeps_the_base_adds_labels_command_and_layer():
    made = layer.layer_tar([layer.LayerEntry("f", data=b"x")], 0)
    raw = layer.image_config(_base(), made, labels={"mine": "new"}, created=86400,
                          created_by="patchkit", cmd=["/usr/local/bin/patchkit-serve"],
                          reset_entrypoint=True)
    doc = json.loads(raw)
    assert raw == json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    assert doc["architecture"] == "arm64" and doc["os"] == "linux"
    assert doc["config"]["Labels"] == {"keep": "1", "mine": "new"}
    assert "Entrypoint" not in doc["config"] and "Hostname" not in doc["config"]
    assert doc["config"]["Cmd"] == ["/usr/local/bin/patchkit-serve"]
    assert doc["rootfs"]["diff_ids"] == ["sha256:" + "1" * 64, made.diff_id]
    assert doc["created"] == "1970-01-02T00:00:00Z"
    assert doc["history"][-1] == {"created": "1970-01-02T00:00:00Z", "created_by": "patchkit"}
    assert layer.image_id_of(raw) == "sha256:" + hashlib.sha256(raw).hexdigest()


def test_history_marks_empty_entries_and_falls_back_when_it_cannot_count():
    api = [{"Created": 3, "CreatedBy": "/bin/sh -c #(nop)  CMD [\"x\"]", "Size": 0},
           {"Created": 2, "CreatedBy": "RUN mkdir /x # buildkit", "Size": 0},
           {"Created": 1, "CreatedBy": "/bin/sh -c #(nop) ADD file:abc in / ", "Size": 10}]
    two = layer.history_of(api, 2, "b")
    assert [h.get("empty_layer", False) for h in two] == [False, False, True]
    assert two[0]["created"] == "1970-01-01T00:00:01Z"
    fallback = layer.history_of(api, 3, "b")
    assert [h["created_by"] for h in fallback] == ["layer 1 of b", "layer 2 of b", "layer 3 of b"]


@pytest.mark.parametrize("ref,repo,tag", [("reg:5000/a/b:1", "reg:5000/a/b", "1"),
                                          ("reg:5000/a/b", "reg:5000/a/b", "latest"),
                                          ("a/b@sha256:" + "0" * 64, "a/b", "latest")])
def test_split_tag_knows_registry_ports(ref, repo, tag):
    assert reference.split_tag(ref) == (repo, tag)


def test_platform_parse_and_match():
    assert str(reference.Platform.parse("linux/aarch64")) == "linux/arm64"
    assert reference.Platform.parse("linux/arm64").matches(reference.Platform("linux", "arm64", "v8"))
    assert not reference.Platform.parse("linux/arm64").matches(reference.Platform("linux", "amd64"))
    with pytest.raises(UsageError, match="OS/ARCH"):  # a bad flag: exit 2
        reference.Platform.parse("arm64")


def _c(path, status="M"):
    return Change(status, path, 0o100644 if status != "D" else 0, "0" * 40)


def test_mode_overlay_for_python_of_the_package_and_source_for_native_code():
    choice = build.choose_mode([_c("vllm/config/speculative.py"), _c("tests/test_spec.py"),
                             _c("docs/x.md"), _c("vllm/configs/moe.json", "A")])
    assert choice.mode == "overlay"
    assert [c.path for c in choice.shipped] == ["vllm/config/speculative.py", "vllm/configs/moe.json"]
    assert choice.not_shipped == ("tests/test_spec.py", "docs/x.md")
    src = build.choose_mode([_c("vllm/config/speculative.py"), _c("csrc/attention/mla.cu")])
    assert src.mode == "source"
    assert src.reason == "csrc/attention/mla.cu is outside the vllm package and feeds vLLM's build"
    assert build.choose_mode([_c("vllm/kernels/x.cuh")]).reason.startswith("vllm/kernels/x.cuh is not Python")
    assert build.choose_mode([_c("setup.py")]).mode == "source"
    with pytest.raises(ImageError, match="--mode overlay cannot ship this series: csrc/a.cu"):
        build.choose_mode([_c("csrc/a.cu")], "overlay")


def test_buildkit_syntax_is_detected_with_its_line():
    assert engine_source.buildkit_need("FROM x AS a\nRUN make\nCOPY a /b\n") is None
    assert engine_source.buildkit_need("FROM x\nRUN --mount=type=cache,target=/c make\n") == \
        "line 2: RUN --mount=type=cache,target=/c make"
    assert engine_source.buildkit_need("# syntax=docker/dockerfile:1\nFROM x\n").startswith("line 1")
    assert engine_source.buildkit_need("FROM x\nCOPY --link a /b\n") == "line 2: COPY --link a /b"


def test_same_release_ignores_local_build_labels():
    assert versions.same_release("0.27.1+cu130", "0.27.1")
    assert not versions.same_release("0.27.1rc1", "0.27.1")
    assert versions.expected(None, "v0.33.0") == "0.33.0"
    assert versions.expected(None, "main") is None


@pytest.fixture
def workdir(tmp_path) -> Path:
    return applied_checkout(tmp_path)


@pytest.fixture
def project(tmp_path) -> Manifest:
    return demo_project(tmp_path)


def _engine(fs=None, arch="arm64", containerd=False) -> tuple[Engine, FakeAPI]:
    base_id = "sha256:" + "b" * 64
    api = FakeAPI({base_id: {"attrs": {
        "Architecture": arch, "Os": "linux",
        "RepoDigests": ["reg:5000/vllm/base@sha256:" + "d" * 64],
        "RootFS": {"Layers": ["sha256:" + "1" * 64]},
        "Config": {"Env": ["PATH=/opt/venv/bin:/usr/local/bin:/usr/bin", "VIRTUAL_ENV=/opt/venv"],
                   "Entrypoint": ["vllm", "serve"]}},
        "fs": fs if fs is not None else base_fs()}}, containerd=containerd)
    api.tags["reg:5000/vllm/base:0.27.1"] = base_id
    return Engine(FakeClient(api), "unix:///fake.sock"), api


def _layer_of(api: FakeAPI) -> list[tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(api.loaded[-1])) as outer:
        man = json.load(outer.extractfile("manifest.json"))[0]
        data = outer.extractfile(man["Layers"][-1]).read()
        assert man["Layers"][0] == "base-0/layer.tar" and len(outer.getmembers()) == 3
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return [(m.name, tar.extractfile(m).read() if m.isfile() else None) for m in tar]


def test_overlay_lays_exactly_the_patched_files_into_the_found_package(project, workdir):
    engine, api = _engine()
    code, summary = _summary(bi.run(project, bi.Request(workdir=workdir, apply=False,
                                                        engine=engine)))
    assert code == 0
    site = SITE.lstrip("/")
    assert _layer_of(api) == [
        (f"{site}/vllm/config/__pycache__/.wh.speculative.cpython-312.opt-1.pyc", b""),
        (f"{site}/vllm/config/__pycache__/.wh.speculative.cpython-312.pyc", b""),
        (f"{site}/vllm/config/speculative.py", SPEC_V2.encode()),
        (f"{site}/vllm/dspark", None),
        (f"{site}/vllm/dspark/guard.py", b"GUARD = True\n"),
        (f"{site}/vllm/utils/.wh.old.py", b""),
        (f"{site}/vllm/utils/__pycache__/.wh.old.cpython-312.pyc", b""),
        ("usr/local/bin/patchkit-serve", b"#!/bin/sh\nexec vllm serve \"$@\"\n"),
    ]
    assert summary["tag"] == "demo:v0.27.1"
    assert api.tags["demo:v0.27.1"] == summary["image_id"]
    assert summary["not_shipped"] == ["tests/test_guard.py"]
    assert summary["base"]["digest"] == "sha256:" + "d" * 64
    assert summary["vllm"]["dir"] == f"{SITE}/vllm"
    assert (summary["layer"]["files"], summary["layer"]["whiteouts"]) == (3, 4)
    labels = api.inspect_image(summary["image_id"])["Config"]["Labels"]
    assert labels["io.patchkit.vllm.repo"] == "https://example.invalid/vllm.git"
    # built outside a git repository: no commit nor repository of the patchset to name
    assert "org.opencontainers.image.revision" not in labels
    assert "org.opencontainers.image.source" not in labels
    assert labels["org.opencontainers.image.base.digest"] == "sha256:" + "d" * 64
    assert json.loads(labels["io.patchkit.patches"]) == [{"id": "p1", "status": "applied"},
                                                         {"id": "p2", "status": "upstream"}]
    config = api.inspect_image(summary["image_id"])["Config"]
    assert config["Cmd"] == ["/usr/local/bin/patchkit-serve"] and "Entrypoint" not in config

    # Nothing changed: found by its inputs, nothing loaded again.
    code, again = _summary(bi.run(project, bi.Request(workdir=workdir, apply=False,
                                                      engine=engine)))
    assert again["reused"] is True and again["image_id"] == summary["image_id"]
    assert len(api.loaded) == 1


def test_an_image_built_from_ours_is_not_taken_for_ours(project, workdir):
    # `FROM demo:v0.27.1` + a step: the child inherits our labels, inputs key included
    engine, api = _engine()
    code, summary = _summary(bi.run(project, bi.Request(workdir=workdir, apply=False,
                                                        engine=engine)))
    ours = api.images_[summary["image_id"]]
    child = {"attrs": dict(ours["attrs"], RootFS={"Layers": [
        *ours["attrs"]["RootFS"]["Layers"], "sha256:" + "c" * 64]}), "fs": {}}
    api.images_ = {"sha256:" + "0" * 64: child, **api.images_}  # listed first
    code, again = _summary(bi.run(project, bi.Request(workdir=workdir, apply=False,
                                                      engine=engine)))
    assert code == 0 and again["reused"] is True and again["image_id"] == summary["image_id"]
    assert again["layer"]["diff_id"] == ours["attrs"]["RootFS"]["Layers"][-1]
    del api.images_[summary["image_id"]]  # only the child is left: a new image is made
    code, third = _summary(bi.run(project, bi.Request(workdir=workdir, apply=False,
                                                      engine=engine)))
    assert code == 0 and third["reused"] is False and len(api.loaded) == 2


@pytest.mark.parametrize("fs,message", [
    (base_fs(version="0.33.0"), "base reg:5000/vllm/base:0.27.1 holds vLLM 0.33.0, not 0.27.1"),
    (base_fs(spec=SPEC_V1 + "# edited\n"),
     "base reg:5000/vllm/base:0.27.1: vllm/config/speculative.py is not the pristine file of "
     "vLLM v0.27.1"),
    ({**base_fs(), f"{SITE}/vllm/dspark/guard.py": b"X = 1\n"},
     "base reg:5000/vllm/base:0.27.1 already has vllm/dspark/guard.py"),
    ({k: v for k, v in base_fs().items() if "old.py" not in k},
     "base reg:5000/vllm/base:0.27.1 has no vllm/utils/old.py"),
    ({"/usr/bin/python3": b""},
     "reg:5000/vllm/base:0.27.1 has no installed vllm package"),  # named as given, not by id
])
def test_a_base_that_is_not_the_pristine_release_is_refused_and_nothing_tagged(
        project, workdir, fs, message):
    engine, api = _engine(fs)
    with pytest.raises(ImageError) as exc:
        bi.run(project, bi.Request(workdir=workdir, apply=False, engine=engine))
    assert message in str(exc.value) and "\n" not in str(exc.value)
    assert "demo:v0.27.1" not in api.tags and not api.loaded


def test_wrong_architecture_and_missing_base_are_one_line(project, workdir):
    engine, api = _engine(arch="amd64")
    with pytest.raises(ImageError, match=r"^base image reg:5000/vllm/base:0.27.1 is linux/amd64, "
                                         r"not linux/arm64$"):
        bi.run(project, bi.Request(workdir=workdir, apply=False, engine=engine))
    engine, api = _engine()
    with pytest.raises(ImageError, match=r"^base image reg:5000/other:1 not found: manifest for"):
        bi.run(project, bi.Request(workdir=workdir, apply=False, engine=engine,
                                   base="reg:5000/other:1"))
    assert not api.loaded and "demo:v0.27.1" not in api.tags


def test_refused_push_puts_the_tag_back(project, workdir):
    engine, api = _engine()
    with pytest.raises(ImageError, match=r"^push of demo:v0.27.1 refused: denied"):
        bi.run(project, bi.Request(workdir=workdir, apply=False, engine=engine, push=True))
    assert "demo:v0.27.1" not in api.tags


def test_a_save_where_nothing_can_be_written_is_one_line_and_untags(project, workdir):
    engine, api = _engine()
    (workdir.parent / "afile").write_text("")
    with pytest.raises(ImageError, match=r"^--save .*afile/out.tar: cannot write there: "):
        bi.run(project, bi.Request(workdir=workdir, apply=False, engine=engine,
                                   save=workdir.parent / "afile" / "out.tar"))
    assert "demo:v0.27.1" not in api.tags


def test_no_engine_is_one_line():
    with pytest.raises(ImageError, match=r"^no Docker Engine answers at unix:///nonexistent/pk.sock: "):
        Engine.connect("unix:///nonexistent/pk.sock", timeout=5)


def test_an_ssh_engine_without_paramiko_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "paramiko", None)  # as if it were not installed
    with pytest.raises(ImageError) as info:
        Engine.connect("ssh://user@127.0.0.1:9", timeout=5)
    assert str(info.value) == ("DOCKER_HOST=ssh://user@127.0.0.1:9 needs the paramiko package, "
                               "which is not installed: pip install 'docker[ssh]'")


def test_verify_image_reads_the_package_files(tmp_path):
    from patchkit.manifest import Assertion, Patch

    fs = base_fs(spec=SPEC_V2)
    engine, api = _engine(fs)
    patch = Patch(id="p1", summary="s", kind="diff", path="p.diff",
                  verify=(Assertion("vllm/config/speculative.py", "SpeculativeConfig", "defines",
                                    "draft_quant"),
                          Assertion("vllm/missing.py", None, "defines", "X")))
    m = Manifest(name="demo", root=tmp_path, path=tmp_path / "patchset.yaml",
                 vllm=VllmSource(("x",), "v0.27.1"), image=ImageDefaults(), patches=(patch,))
    results = verify_image(m, "reg:5000/vllm/base:0.27.1", engine=engine)
    assert [r.ok for r in results] == [True, False]
    assert not api.containers  # the scratch container is removed


def test_verify_image_of_a_missing_image_is_one_line(tmp_path):
    engine, _ = _engine()
    m = Manifest(name="demo", root=tmp_path, path=tmp_path / "patchset.yaml",
                 vllm=VllmSource(("x",), "v0.27.1"), image=ImageDefaults(), patches=())
    with pytest.raises(ImageError, match=r"^image reg:5000/none:1 not found: manifest for"):
        verify_image(m, "reg:5000/none:1", engine=engine)


@pytest.mark.parametrize("ref,problem", [
    ("UPPER:x", "the repository name must be lowercase"),
    ("ghcr.io/Org/x:1", "the repository name must be lowercase"),
    ("a b c", "it is not NAME[:TAG]"),
    ("", "it is empty"),
    ("x:release/0.27", "it is not NAME[:TAG]"),
    ("a:b:c", "the tag 'b:c' is not"),
    ("repo@sha256:abc", "is not a digest"),
])
def test_bad_references_are_named(ref, problem):
    assert problem in reference.reference_problem(ref)


@pytest.mark.parametrize("ref", ["qa/dspark:v0.27.1", "127.0.0.1:5055/pk-test/vllm-base:0.27.1",
                                 "vllm/vllm-openai", "localhost:5000/a/b_c.d-e:1.0",
                                 "x@sha256:" + "a" * 64, "sha256:" + "b" * 64, "[::1]:5000/x:y"])
def test_good_references_pass(ref):
    assert reference.reference_problem(ref) is None


def _refused_before_the_apply(project, tmp_path, **kw) -> str:
    """build_image with apply=True on a manifest whose source does not exist: a flag refused
    first never reaches the apply (which would fail on the source)."""
    with pytest.raises(UsageError) as info:
        bi.run(project, bi.Request(workdir=tmp_path / "wd", engine=object(), **kw))
    assert "\n" not in str(info.value)
    assert not (tmp_path / "wd").exists()
    return said(info.value)


def test_bad_tag_base_and_platform_are_refused_before_the_apply(project, tmp_path):
    assert _refused_before_the_apply(project, tmp_path, tag="UPPER:{ref}") == (
        "--tag 'UPPER:x' is not an image reference: the repository name must be lowercase")
    assert _refused_before_the_apply(project, tmp_path, tag="") == (
        "--tag '' is not an image reference: it is empty")
    assert _refused_before_the_apply(project, tmp_path, tag="x@sha256:" + "a" * 64).startswith(
        "--tag 'x@sha256:")
    assert _refused_before_the_apply(project, tmp_path, base="Not A Ref").startswith(
        "--base 'Not A Ref' is not an image reference: ")
    assert _refused_before_the_apply(project, tmp_path, platform="arm64").startswith(
        "--platform 'arm64': expected OS/ARCH")


def test_no_apply_with_a_ref_or_repo_is_a_conflict(project, workdir):
    for kw in ({"ref": "v0.33.0"}, {"repos": ["pypi"]}):
        with pytest.raises(UsageError, match="with --no-apply the workdir is used as it is"):
            bi.run(project, bi.Request(workdir=workdir, apply=False, engine=object(), **kw))


def test_a_branch_ref_makes_a_valid_tag(project):
    assert variants.default_tag(project, "release/0.27", "0.27.1", run_spec(project).tag) == (
        "demo:release-0.27")
    assert reference.reference_problem("demo:release-0.27") is None


def test_a_workdir_whose_borrowed_objects_are_gone_is_one_line(project, tmp_path):
    from testing.upstream import make_upstream, sh

    up = make_upstream(tmp_path / "mirror", {"v1": {"vllm/__init__.py": "X = 1\n"}})
    wd = tmp_path / "wd"
    sh("git", "clone", "-q", "--shared", str(up), str(wd))
    sh("git", "tag", "patchkit/base", cwd=wd)
    (wd / ".git" / "patchkit-report.json").write_text('{"ok": true, "vllm": {"ref": "v1"}}')
    import shutil

    shutil.rmtree(up)
    with pytest.raises(UsageError) as info:
        bi.run(project, bi.Request(workdir=wd, apply=False, engine=object()))
    assert str(info.value) == (f"{wd} borrows its git objects from {up / '.git' / 'objects'}, "
                               "which is gone (was the cache deleted?); run 'patchkit apply --discard' "
                               "again")


def test_verify_image_of_a_bad_reference_is_a_usage_error(tmp_path):
    m = Manifest(name="demo", root=tmp_path, path=tmp_path / "patchset.yaml",
                 vllm=VllmSource(("x",), "v0.27.1"), image=ImageDefaults(), patches=())
    with pytest.raises(UsageError) as info:
        verify_image(m, "BAD REF", engine=object())
    assert said(info.value).startswith("--image 'BAD REF' is not an image reference: ")


def test_a_pull_the_engine_refuses_is_named_once(project, workdir, monkeypatch):
    engine, api = _engine()

    def refused(repo, tag=None, **kw):
        raise docker.errors.NotFound("manifest for reg:5000/other:1 not found: manifest unknown")
        yield  # a generator, as the SDK's pull

    monkeypatch.setattr(api, "pull", refused)
    with pytest.raises(ImageError) as info:
        bi.run(project, bi.Request(workdir=workdir, apply=False, engine=engine,
                                   base="reg:5000/other:1"))
    assert str(info.value) == ("base image reg:5000/other:1 not found: manifest for "
                               "reg:5000/other:1 not found: manifest unknown")


# ------------------------------------------------------------------------------ a container's start

def test_a_containers_current_start_is_read_from_its_state():
    from datetime import datetime, timezone

    from patchkit.engines.facts import since_start

    started = "2026-12-02T01:50:00.123456789Z"
    at = datetime(2026, 12, 2, 1, 50, tzinfo=timezone.utc).timestamp()
    # an exited container: its FinishedAt is this start's end; the fraction floored to the µs
    assert since_start({"StartedAt": started, "FinishedAt": "2026-12-02T01:51:00Z",
                        "Running": False}) == pytest.approx(at + 0.123456, abs=1e-7)
    # running after a restart: from the previous run's end, which the engine set once that
    # run's output was drained
    assert since_start({"StartedAt": started, "FinishedAt": "2026-12-02T01:49:59.5Z",
                        "Running": True}) == at - 0.5
    # running, never stopped before: Go's zero time
    assert since_start({"StartedAt": started, "FinishedAt": "0001-01-01T00:00:00Z",
                        "Running": True}) == pytest.approx(at + 0.123456, abs=1e-7)
    assert since_start({"StartedAt": "2026-12-02T03:50:00+02:00"}) == at
    # created, never started: the whole log (there is none)
    assert since_start({"StartedAt": "0001-01-01T00:00:00Z"}) is None
    assert since_start({}) is None


def test_image_serve_gives_the_command_and_environment(project, workdir):
    """``image.serve``: the command (the base's ENTRYPOINT cleared) and the environment; the
    same settings give the same image, others another."""
    from dataclasses import replace

    from patchkit.manifest.model import Serve
    from patchkit.render.text import build_image as shown

    (project.root / "build" / "serve.sh").unlink()
    asked = Serve(("python3", "-m", "vllm.entrypoints.openai.api_server", "--port", "8000"),
                  (("HF_HUB_OFFLINE", "1"), ("PATH", "/opt/mine/bin")))
    m = replace(project, image=replace(project.image, serve=asked))
    engine, api = _engine()
    report = bi.run(m, bi.Request(workdir=workdir, apply=False, engine=engine))
    summary = report.to_dict()
    config = api.inspect_image(summary["image_id"])["Config"]
    assert config["Cmd"] == list(asked.command) and "Entrypoint" not in config
    assert "HF_HUB_OFFLINE=1" in config["Env"] and "PATH=/opt/mine/bin" in config["Env"]
    assert not any(e.startswith("PATH=/opt/venv") for e in config["Env"])
    assert summary["serves"] == {"from": "image.serve", "command": list(asked.command)}
    assert "  serves: python3 -m vllm.entrypoints.openai.api_server --port 8000 (from " \
           "image.serve)" in shown(report)

    other = replace(m, image=replace(m.image, serve=replace(asked, env=())))
    again = bi.run(other, bi.Request(workdir=workdir, apply=False, engine=engine)).to_dict()
    assert again["image_id"] != summary["image_id"] and not again["reused"]


def test_an_image_that_keeps_the_bases_command_says_so_in_one_line(project, workdir):
    from patchkit.render.text import build_image as shown

    (project.root / "build" / "serve.sh").unlink()
    engine, api = _engine()
    report = bi.run(project, bi.Request(workdir=workdir, apply=False, engine=engine))
    summary = report.to_dict()
    config = api.inspect_image(summary["image_id"])["Config"]
    assert config["Entrypoint"] == ["vllm", "serve"] and "Cmd" not in config
    assert summary["serves"] == {"from": "base", "command": ["vllm", "serve"]}
    said = [line for line in shown(report).splitlines() if "serves" in line]
    assert said == ["  serves: the base's command, unchanged (vllm serve): the patchset gives no "
                    "image.serve.command nor build/serve.sh (docs/serving.md)"]
