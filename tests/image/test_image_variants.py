"""Variants through build-image and verify --image, with the docker client faked at the border."""

from __future__ import annotations

import io
import json
import tarfile

import pytest
from testing.upstream import dedent, make_diff, make_upstream
from testing.fakeengine import FakeAPI, FakeClient
from testing.said import said
from testing.venvbase import SITE

from patchkit import manifest
from patchkit.manifest import variants
from patchkit.commands import build_image as bi
from patchkit.commands.verify import verify_image
from patchkit.errors import UsageError
from patchkit.engines.docker import Engine
from patchkit.run import run_spec

MOD = "MODE = 'plain'\n"
BASE = "reg:5000/vllm/base:0.27.1"
BASE_ID = "sha256:" + "b" * 64

MANIFEST = """\
name: demo
vllm:
  repo: {repo}
  ref: v0.27.1
image:
  base: reg:5000/vllm/base:0.27.1
  tag: demo:{{ref}}-{{variant}}
variants:
  diag: position-0 diagnostics on
patches:
  - id: fast
    summary: make the mode fast
    diff: patches/fast.diff
    verify:
      - file: vllm/mod.py
        contains: fast
  - id: diag-probe
    summary: a probe module for the diagnostic run
    overlay: overlays/diag
    variants: [diag]
    verify:
      - file: vllm/diag_probe.py
        defines: PROBE
"""


@pytest.fixture
def project(tmp_path) -> manifest.Manifest:
    up = make_upstream(tmp_path / "upstream", {"v0.27.1": {"vllm/__init__.py": "",
                                                           "vllm/mod.py": MOD}})
    root = tmp_path / "proj"
    (root / "patches").mkdir(parents=True)
    (root / "overlays/diag/vllm").mkdir(parents=True)
    (root / "patches/fast.diff").write_text(make_diff(MOD, "MODE = 'fast'\n", "vllm/mod.py"))
    (root / "overlays/diag/vllm/diag_probe.py").write_text("PROBE = True\n")
    (root / "patchset.yaml").write_text(dedent(MANIFEST).format(repo=up))
    return manifest.load(root / "patchset.yaml")


def _engine() -> tuple[Engine, FakeAPI]:
    fs = {f"{SITE}/vllm/__init__.py": b"", f"{SITE}/vllm/mod.py": MOD.encode(),
          f"{SITE}/vllm/_version.py": b"__version__ = version = '0.27.1'\n",
          f"{SITE}/vllm-0.27.1.dist-info/METADATA": b"Name: vllm\nVersion: 0.27.1\n"}
    api = FakeAPI({BASE_ID: {"attrs": {
        "Architecture": "arm64", "Os": "linux", "RepoDigests": [f"reg:5000/vllm/base@sha256:{'d' * 64}"],
        "RootFS": {"Layers": ["sha256:" + "1" * 64]},
        "Config": {"Env": ["PATH=/opt/venv/bin:/usr/bin", "VIRTUAL_ENV=/opt/venv"]}},
        "fs": fs}})
    api.tags[BASE] = BASE_ID
    return Engine(FakeClient(api), "unix:///fake.sock"), api


def _layer_files(api: FakeAPI) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(api.loaded[-1])) as outer:
        man = json.load(outer.extractfile("manifest.json"))[0]
        data = outer.extractfile(man["Layers"][-1]).read()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return [m.name for m in tar if m.isfile()]


def test_each_variant_gets_its_tag_labels_and_files(project, tmp_path):
    engine, api = _engine()
    wd = tmp_path / "wd"
    plain = bi.run(project, bi.Request(workdir=wd, engine=engine))
    assert plain.ok, plain.to_dict()
    assert plain.tag == "demo:v0.27.1" and plain.to_dict()["variant"] is None
    assert [(p["id"], p["status"]) for p in plain.patches] == [("fast", "applied"),
                                                               ("diag-probe", "skipped")]
    labels = api.inspect_image(plain.image_id)["Config"]["Labels"]
    assert labels["io.patchkit.variant"] == ""
    assert f"{SITE[1:]}/vllm/diag_probe.py" not in _layer_files(api)

    diag = bi.run(project, bi.Request(workdir=wd, engine=engine, variant="diag"))
    assert diag.ok and diag.tag == "demo:v0.27.1-diag" and diag.to_dict()["variant"] == "diag"
    assert diag.image_id != plain.image_id
    labels = api.inspect_image(diag.image_id)["Config"]["Labels"]
    assert labels["io.patchkit.variant"] == "diag"
    assert json.loads(labels["io.patchkit.patches"]) == [{"id": "fast", "status": "applied"},
                                                         {"id": "diag-probe", "status": "applied"}]
    assert f"{SITE[1:]}/vllm/diag_probe.py" in _layer_files(api)
    assert api.tags["demo:v0.27.1"] == plain.image_id  # the other variant's tag is untouched

    # --no-apply builds what the workdir is: its variant names the tag
    again = bi.run(project, bi.Request(workdir=wd, engine=engine, apply=False))
    assert (again.tag, again.image_id, again.reused) == ("demo:v0.27.1-diag", diag.image_id, True)


def test_no_apply_with_another_variant_is_refused(project, tmp_path):
    engine, api = _engine()
    wd = tmp_path / "wd"
    assert bi.run(project, bi.Request(workdir=wd, engine=engine)).ok
    with pytest.raises(UsageError, match=r"^--variant diag: .*wd was applied as the default build \(no variant\); "
                                         r"with --no-apply the workdir is used as it is$"):
        bi.run(project, bi.Request(workdir=wd, engine=engine, apply=False, variant="diag"))


def _labelled(api: FakeAPI, ref: str, labels: dict, files: dict) -> None:
    iid = "sha256:" + "e" * 64
    api.images_[iid] = {"attrs": {"Architecture": "arm64", "Os": "linux",
                                  "RootFS": {"Layers": []},
                                  "Config": {"Env": [], "Labels": labels}},
                        "fs": {f"{SITE}/vllm/{k}": v for k, v in files.items()}}
    api.tags[ref] = iid


def test_verify_image_follows_the_variant_of_its_labels(project):
    engine, api = _engine()
    files = {"__init__.py": b"", "mod.py": b"MODE = 'fast'\n", "diag_probe.py": b"PROBE = 1\n"}
    statuses = json.dumps([{"id": "fast", "status": "applied"},
                           {"id": "diag-probe", "status": "applied"}])
    _labelled(api, "demo:diag", {"io.patchkit.variant": "diag", "io.patchkit.patches": statuses,
                                 "io.patchkit.vllm.dir": f"{SITE}/vllm",
                                 "io.patchkit.vllm.installed": "0.27.1"}, files)
    assert [(r.patch, r.ok) for r in verify_image(project, "demo:diag", engine=engine)] == [
        ("fast", True), ("diag-probe", True)]
    _labelled(api, "demo:plain", {"io.patchkit.variant": "",
                                  "io.patchkit.vllm.dir": f"{SITE}/vllm"}, files)
    with pytest.raises(UsageError, match=r"^--variant diag: image demo:plain was built as the "
                                         r"default build"):
        verify_image(project, "demo:plain", engine=engine, variant="diag")
    # an image patchkit did not make: the variant asked for says which patches are in it
    _labelled(api, "other:1", {}, files)
    assert [r.patch for r in verify_image(project, "other:1", engine=engine)] == ["fast"]
    assert [r.patch for r in verify_image(project, "other:1", engine=engine, variant="diag")] == [
        "fast", "diag-probe"]


def test_a_tag_template_with_the_variant_is_checked_before_the_apply(project, tmp_path):
    with pytest.raises(UsageError) as info:
        bi.run(project, bi.Request(workdir=tmp_path / "wd", engine=object(),
                                   tag="UPPER-{variant}:{ref}", variant="diag"))
    assert said(info.value).startswith("--tag 'UPPER-diag:x' is not an image reference")
    assert not (tmp_path / "wd").exists()
    assert variants.default_tag(project, "v0.27.1", "0.27.1", run_spec(project).tag, "diag") == "demo:v0.27.1-diag"
    assert variants.default_tag(project, "v0.27.1", "0.27.1", "x/{variant}-y:{version}", None) == (
        "x/y:0.27.1")
