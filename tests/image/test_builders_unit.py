"""The build paths: which options each family refuses, and the one path chosen for a series.
The refusal messages themselves are asserted through build-image in test_registry_unit.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from patchkit.errors import ImageError, SettingError
from patchkit.image import build, builders
from patchkit.image.builders.protocol import Asked
from patchkit.series.checkout import Change


def _choice(*paths: str) -> build.ModeChoice:
    return build.choose_mode([Change("M", p, 0o100644, "0" * 40) for p in paths])


@pytest.mark.parametrize(("asked", "refused"), [
    (Asked(push=False, save=None, mode="overlay"), "push"),
    (Asked(push=True, save=Path("out.tar"), mode="overlay"), "save"),
    (Asked(push=True, save=None, mode="source"), "mode"),
    (Asked(push=True, save=None, mode="overlay", copy_to=("ssh://n2",)), "copy_to")])
def test_the_registry_path_takes_push_alone(asked, refused):
    builders.refuse(True, Asked(push=True, save=None, mode="overlay"))   # taken: no error
    builders.refuse(True, Asked(push=True, save=None, mode="auto"))
    with pytest.raises(SettingError) as exc:
        builders.refuse(True, asked)
    assert refused in {o.setting for o in exc.value.origins}
    builders.refuse(False, asked)   # an engine's paths take every option


def test_one_path_is_chosen_from_the_family_and_the_mode():
    overlay, source = _choice("vllm/config.py"), _choice("csrc/a.cu")
    assert builders.choose(False, overlay).name == "engine-overlay"
    assert builders.choose(False, source).name == "engine-source"
    chosen = builders.choose(True, overlay)
    assert chosen.name == "registry-overlay" and not chosen.needs_engine
    with pytest.raises(ImageError) as exc:
        builders.choose(True, source)
    assert str(exc.value) == ("a build with no engine makes overlay images only, and this "
                              "series needs "
                              "source mode (csrc/a.cu is outside the vllm package and feeds "
                              "vLLM's build): build it through an engine")


def test_every_registered_path_says_its_mode_and_family():
    for name in builders.TABLE:
        path = builders.get(name)
        assert path.name == name and path.mode in (build.OVERLAY_MODE, build.SOURCE_MODE)
    assert {b.name for b in builders.family(True)} == {"registry-overlay"}


def test_an_engine_path_says_why_it_cannot_ship_a_series():
    overlay, source = _choice("vllm/config.py"), _choice("csrc/a.cu")
    engine_overlay, engine_source = builders.get("engine-overlay"), builders.get("engine-source")
    assert engine_overlay.unfit(source) == "the series needs source mode"
    assert engine_source.unfit(overlay) == "the series needs overlay mode"
    assert engine_source.unfit(source) is None
    stacked = dataclasses.replace(source, packages=("flashinfer",))
    assert engine_overlay.unfit(stacked) == "the series needs source mode"
    assert engine_source.unfit(stacked).startswith(
        "source mode builds vLLM's Dockerfile, which does not lay the changed files of "
        "flashinfer: ")
