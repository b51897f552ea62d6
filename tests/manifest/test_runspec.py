"""The run value: the options given, else the manifest's defaults, settled in one place."""

from __future__ import annotations

import pytest

from patchkit import manifest
from patchkit.manifest.runspec import Pin, RunSpec, run_spec
from patchkit.source import VLLM


def _manifest(tmp_path, image: str = "image:\n  base: vllm/vllm-openai:v1\n"):
    (tmp_path / "proj").mkdir()
    path = tmp_path / "proj" / "patchset.yaml"
    path.write_text("name: demo\nvllm:\n  repo: [./up, pypi, ../other]\n  ref: v1\n" + image
                    + "patches: []\n")
    return manifest.load(path)


def test_the_manifest_gives_what_the_options_leave_out(tmp_path):
    m = _manifest(tmp_path)
    assert run_spec(m) == RunSpec(
        pins=(Pin(VLLM, "v1", (str(tmp_path / "proj" / "up"), "pypi", str(tmp_path / "other"))),),
        base="vllm/vllm-openai:v1", platform="linux/arm64", variant=None, tag="demo:{ref}")


def test_the_options_win_and_their_paths_stay_as_given(tmp_path):
    m = _manifest(tmp_path, image="image:\n  platform: linux/amd64\n")
    got = run_spec(m, ref="v2", repos=["./mine"], base="b:1", platform="linux/arm64",
                   variant="diag")
    assert got == RunSpec((Pin(VLLM, "v2", ("./mine",)),), "b:1", "linux/arm64", "diag",
                          tag="demo:{ref}")
    assert (got.ref, got.sources, got.others) == ("v2", ("./mine",), ())
    assert run_spec(m).platform == "linux/amd64" and run_spec(m).base is None


def test_an_empty_ref_is_kept_to_be_refused_and_no_repos_means_the_manifests(tmp_path):
    m = _manifest(tmp_path)
    assert run_spec(m, ref="").ref == ""
    assert run_spec(m, repos=()).sources == run_spec(m).sources


def test_the_image_source_alone_on_the_command_line_pins_base(tmp_path):
    m = _manifest(tmp_path)
    assert run_spec(m, repos=["image"]).ref == "base"
    assert run_spec(m, repos=["image", "image"]).ref == "base"
    # a ref given wins; another source beside image, or none given, keeps the manifest's ref
    assert run_spec(m, repos=["image"], ref="v1").ref == "v1"
    assert run_spec(m, repos=["image", "pypi"]).ref == "v1"
    assert run_spec(m, repos=["pypi"]).ref == "v1" and run_spec(m).ref == "v1"


def test_the_tag_template_is_decided_once(tmp_path):
    m = _manifest(tmp_path)
    assert (run_spec(m).tag, run_spec(m).tag_option) == ("demo:{ref}", "image.tag")
    assert (run_spec(m, tag="x:{ref}").tag, run_spec(m, tag="x:{ref}").tag_option) == (
        "x:{ref}", "--tag")
    (tmp_path / "2").mkdir()
    m2 = _manifest(tmp_path / "2", image="image:\n  tag: mine:{version}\n")
    assert run_spec(m2).tag == "mine:{version}"


def test_the_engine_given_is_the_runs_and_no_other_is_connected(tmp_path):
    engine = object()
    run = run_spec(_manifest(tmp_path), engine=engine, timeout=7.0)
    assert run.connect() is engine and run.connect() is engine and run.timeout == 7.0


def test_the_engine_is_opened_by_the_verbs_opener_once_and_only_when_needed(tmp_path):
    opened = []

    def open_engine(timeout):
        opened.append(timeout)
        return object()

    m = _manifest(tmp_path)
    run = run_spec(m, open_engine=open_engine, timeout=7.0)
    assert opened == []                      # a run that never needs an engine opens none
    engine = run.connect()
    assert run.connect() is engine and opened == [7.0]
    with pytest.raises(RuntimeError, match="no engine"):
        run_spec(m).connect()                # a verb that gave neither cannot reach one
