"""Errors say where a value came from: the option given, or the manifest key at its line.
The core names the setting; the command line words it."""

from __future__ import annotations

from pathlib import Path

from testing import patchkit

IMAGE_ID = "sha256:" + "b" * 64


def _project(tmp_path: Path, base: str | None) -> Path:
    proj = tmp_path / "proj"
    proj.mkdir()
    image = f"image:\n  platform: linux/arm64\n  base: {base}\n" if base else ""
    (proj / "patchset.yaml").write_text(
        "name: demo\nvllm:\n  repo: ./up\n  ref: v1\n" + image + "patches: []\n")
    return proj


def _error(p) -> str:
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert p.stderr.count("\n") == 1, p.stderr
    return p.stderr.strip()


def test_a_bad_base_from_the_manifest_is_blamed_on_image_base_and_its_line(tmp_path):
    # no registry, no engine: the base is refused before anything is reached
    proj = _project(tmp_path, IMAGE_ID)
    said = _error(patchkit("build-image", "--no-daemon", "--push", "--tag", "reg:5000/d:1",
                           cwd=proj))
    assert said == (f"patchkit build-image: error: image.base at patchset.yaml:7 {IMAGE_ID} is "
                    "an engine's image id; --no-daemon reads the base from a registry: name it "
                    "as host/repository:tag")
    assert "--base" not in said


def test_the_same_bad_base_given_as_an_option_is_blamed_on_the_option(tmp_path):
    proj = _project(tmp_path, "vllm/vllm-openai:v1")
    said = _error(patchkit("build-image", "--no-daemon", "--push", "--tag", "reg:5000/d:1",
                           "--base", IMAGE_ID, cwd=proj))
    assert said.startswith(f"patchkit build-image: error: --base {IMAGE_ID} is an engine's "
                           "image id; --no-daemon reads the base")
    assert "image.base" not in said


def test_a_base_that_is_no_reference_is_blamed_on_the_option(tmp_path):
    proj = _project(tmp_path, None)
    said = _error(patchkit("apply", "--base", "Not A Ref", cwd=proj))
    assert said.startswith("patchkit apply: error: --base 'Not A Ref' is not an image reference")


def test_a_missing_base_names_both_the_option_and_the_key(tmp_path):
    proj = _project(tmp_path, None)
    said = _error(patchkit("apply", "--vllm-repo", "image", cwd=proj))
    assert said == ("patchkit apply: error: the vLLM source 'image' is the vllm package of a "
                    "base image: give --base IMAGE or set image.base in patchset.yaml")
