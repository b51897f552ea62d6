"""The run value: the options given, else the manifest's defaults, settled in one place."""

from __future__ import annotations

import pytest

from patchkit import manifest

from patchkit.errors import Origin, SettingError, UsageError
from patchkit.imageref import Platform
from patchkit.run import Asked, Pin, run_spec
from patchkit.source import VLLM


def _manifest(tmp_path, image: str = "image:\n  base: vllm/vllm-openai:v1\n"):
    (tmp_path / "proj").mkdir()
    path = tmp_path / "proj" / "patchset.yaml"
    path.write_text("name: demo\nvllm:\n  repo: [./up, pypi, ../other]\n  ref: v1\n" + image
                    + "patches: []\n")
    return manifest.load(path)


def test_the_manifest_gives_what_the_options_leave_out(tmp_path):
    m = _manifest(tmp_path)
    run = run_spec(m, cache=tmp_path / "cache")
    assert run.pins == (
        Pin(VLLM, "v1", (str(tmp_path / "proj" / "up"), "pypi", str(tmp_path / "other"))),)
    assert (run.base, run.platform, run.variant, run.tag, run.cache) == (
        "vllm/vllm-openai:v1", Platform("linux", "arm64"), None, "demo:{ref}", tmp_path / "cache")
    # each default remembers the manifest key it came from, and its line
    assert run.base_from == Origin("base", "image.base", str(m.path), 6)
    assert run.platform_from == Origin("platform")   # the loader's default, not a key
    assert run.tag_from == Origin("tag", "image.tag", str(m.path), None)


def test_the_options_win_and_their_paths_stay_as_given(tmp_path):
    m = _manifest(tmp_path, image="image:\n  platform: linux/amd64\n")
    got = run_spec(m, ref="v2", repos=["./mine"], base="b:1", platform="linux/arm64")
    assert (got.pins, got.base, got.platform, got.tag) == (
        (Pin(VLLM, "v2", ("./mine",)),), "b:1", Platform("linux", "arm64"), "demo:{ref}")
    assert (got.ref, got.sources, got.others) == ("v2", ("./mine",), ())
    assert got.base_from == Origin("base") and got.platform_from == Origin("platform")
    assert run_spec(m).platform == Platform("linux", "amd64") and run_spec(m).base is None
    assert run_spec(m).platform_from == Origin("platform", "image.platform", str(m.path), 6)


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
    assert run_spec(m).tag == "demo:{ref}"
    assert (run_spec(m, tag="x:{ref}").tag, run_spec(m, tag="x:{ref}").tag_from) == (
        "x:{ref}", Origin("tag"))
    (tmp_path / "2").mkdir()
    m2 = _manifest(tmp_path / "2", image="image:\n  tag: mine:{version}\n")
    assert (run_spec(m2).tag, run_spec(m2).tag_from) == (
        "mine:{version}", Origin("tag", "image.tag", str(m2.path), 6))


def test_the_engine_given_is_the_runs_and_none_is_connected(tmp_path):
    engine = object()
    (tmp_path / "1").mkdir()
    run = run_spec(_manifest(tmp_path / "1"), engine=engine, timeout=7.0)
    assert run.the_engine("x") is engine and run.timeout == 7.0
    with pytest.raises(UsageError, match="this run has none"):
        run_spec(_manifest(tmp_path)).the_engine("reading the base")


def test_the_run_is_immutable(tmp_path):
    run = run_spec(_manifest(tmp_path))
    with pytest.raises(AttributeError):
        run.engine = object()


def test_a_bad_option_is_blamed_on_the_option(tmp_path):
    m = _manifest(tmp_path)
    with pytest.raises(SettingError) as bad:
        run_spec(m, base="Not A Ref")
    assert bad.value.origin == Origin("base")
    assert str(bad.value).startswith("base 'Not A Ref' is not an image reference")
    with pytest.raises(SettingError) as plat:
        run_spec(m, platform="arm64")
    assert plat.value.origin == Origin("platform")


def test_whether_a_run_reads_a_base_is_known_before_it_is_made(tmp_path):
    m = _manifest(tmp_path)
    assert not Asked().reads_base(m)
    assert Asked(repos=("image",)).reads_base(m) and Asked(ref="base").reads_base(m)
    assert Asked().reads_base(m, {"vllm": ["v2", "base"]})
