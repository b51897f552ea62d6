"""A prebuilt JIT module in the base that would be loaded instead of compiling a patched source:
refused in one line naming the module and the file, or with `rebuild: jit` left out of the
image by a whiteout of its folder."""

from __future__ import annotations

import pytest

from patchkit.errors import ImageError, ManifestError
from patchkit.image import build, distinfo, prebuilt
from testing.checkout import applied, changed
from testing.flashinfer import MOE_HEADER as HEADER, MOE_MODULES as MODULES
from testing.imagetree import FI, SITE, TreeFiles, dist

SO = b"\x7fELF\x02\x01\x01" + b"\0" * 9 + b"\x03\0\xb7\0"   # an aarch64 shared object's start


def installed(*modules: str) -> tuple[TreeFiles, distinfo.Installed]:
    cache = {f"flashinfer_jit_cache/jit_cache/{m}/{m}.so": SO for m in modules}
    cache["flashinfer_jit_cache/__init__.py"] = b""
    files = TreeFiles({**dist("flashinfer-python", "0.6.15", FI),
                       **dist("flashinfer-jit-cache", "0.6.15+cu130", cache)})
    return files, distinfo.installed(files, {})


def leave_out(base: tuple[TreeFiles, distinfo.Installed], packages, name: str):
    return prebuilt.leave_out(base[0], base[1], {}, packages, name)


def tree(rebuild: tuple[str, ...] = ()) -> build.PackageTree:
    return build.PackageTree("flashinfer", "flashinfer-python", applied({HEADER: MODULES}), (),
                             SITE, rebuild)


def test_a_prebuilt_module_of_a_patched_header_is_refused_naming_both():
    with pytest.raises(ImageError) as err:
        leave_out(installed("fused_moe_120", "norm"), [tree()], "base:arm64")
    assert str(err.value) == (
        f"base base:arm64 ships the prebuilt JIT module fused_moe_120 (flashinfer-jit-cache "
        f"0.6.15+cu130, {SITE}/flashinfer_jit_cache/jit_cache/fused_moe_120), which flashinfer "
        f"loads instead of compiling the patched {HEADER}; say `rebuild: jit` on the patch to "
        "leave it out of the image, or ship the rebuilt module as an artifact")


def test_rebuild_jit_leaves_every_shadowing_module_out():
    entries = leave_out(installed("fused_moe_120", "fused_moe_100", "norm"), [tree((HEADER,))],
                        "base:arm64")
    assert [(e.path, e.kind) for e in entries] == [
        (f"{SITE}/flashinfer_jit_cache/jit_cache/fused_moe_100".lstrip("/"), "whiteout"),
        (f"{SITE}/flashinfer_jit_cache/jit_cache/fused_moe_120".lstrip("/"), "whiteout")]


def test_modules_the_patches_do_not_feed_or_a_base_without_the_cache_pass():
    assert leave_out(installed("norm", "sampling"), [tree()], "b") == []
    files = TreeFiles(dist("flashinfer-python", "0.6.15", FI))
    assert leave_out((files, distinfo.installed(files, {})), [tree()], "b") == []


def test_rebuild_takes_one_word(tmp_path, monkeypatch):
    from patchkit import manifest
    from testing.project import make_project

    proj = make_project(tmp_path)
    text = (proj / "patchset.yaml").read_text()
    (proj / "patchset.yaml").write_text(text.replace("    diff: patches/table.diff\n",
                                                     "    diff: patches/table.diff\n"
                                                     "    rebuild: jti\n", 1))
    monkeypatch.chdir(proj)
    with pytest.raises(ManifestError) as err:
        manifest.load("patchset.yaml")
    assert "rebuild: unknown word 'jti'; expected one of jit; did you mean 'jit'?" in str(err.value)
    (proj / "patchset.yaml").write_text(text.replace("    diff: patches/table.diff\n",
                                                     "    diff: patches/table.diff\n"
                                                     "    rebuild: jit\n", 1))
    with pytest.raises(ManifestError) as err:     # vLLM compiles nothing at run time
        manifest.load("patchset.yaml")
    assert err.value.exit_code == 2 and "\n" not in str(err.value)
    assert ("rebuild: jit: package vllm (vllm) has no JIT rules: patchkit knows of no module "
            "it compiles at run time (only flashinfer-python has them)") in str(err.value)


def shipped(blob: str, modules: dict[str, list[str]] | None = None) -> build.PackageTree:
    return build.PackageTree("flashinfer", "flashinfer-python",
                             applied({HEADER: MODULES} if modules is None else modules),
                             (changed(HEADER, blob), changed("flashinfer/sampling.py", "b" * 40)),
                             SITE)


def test_the_jit_cache_has_a_place_that_depends_on_the_patched_sources():
    one = prebuilt.workspace([shipped("1" * 40)], None)
    assert list(one) == ["FLASHINFER_WORKSPACE_BASE"]
    place = one["FLASHINFER_WORKSPACE_BASE"]
    assert place.startswith("/root/.cache/patchkit-jit/") and len(place.rsplit("/", 1)[1]) == 16
    assert prebuilt.workspace([shipped("1" * 40)], "root") == one          # the same sources
    assert prebuilt.workspace([shipped("2" * 40)], None) != one            # other contents
    assert prebuilt.workspace([shipped("1" * 40)], "1000")["FLASHINFER_WORKSPACE_BASE"] \
        .startswith("/tmp/.cache/patchkit-jit/")                           # not root: writable
    assert prebuilt.workspace([shipped("1" * 40, {})], None) == {}         # no module fed


def test_the_image_config_sets_it_over_the_bases_value():
    import json

    from patchkit.formats import layer
    from patchkit.imageref import Platform

    base = layer.BaseImage("base:arm64", "sha256:" + "b" * 64, None, Platform.parse("linux/arm64"),
                           {"Env": ["PATH=/usr/bin", "FLASHINFER_WORKSPACE_BASE=/cache"]}, (), ())
    made = layer.layer_tar([], 0)
    config = json.loads(layer.image_config(base, made, labels={}, created=0, created_by="x",
                                           env={"FLASHINFER_WORKSPACE_BASE": "/root/.cache/p"}))
    assert config["config"]["Env"] == ["PATH=/usr/bin", "FLASHINFER_WORKSPACE_BASE=/root/.cache/p"]
