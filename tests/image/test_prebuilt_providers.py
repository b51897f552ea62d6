"""FlashInfer 0.7's prebuilt modules, found as 0.7 finds them: ``flashinfer/data/aot/<X>`` first,
then the JIT-cache providers the ``flashinfer_jit_cache`` shim lists from their entry points,
each counted only when its version passes FlashInfer's check (or the base disables it) and one of
its architectures runs on the target (``image.cuda_arch``, or the base's
``FLASHINFER_CUDA_ARCH_LIST``).  The rule table is checked against the real 0.7.4 and 0.6.15
wheels; the bases are in-memory images laid out as pip installs the distributions."""

from __future__ import annotations

import importlib.util
import itertools
import logging
import sys
import zipfile

import pytest

from patchkit.errors import ImageError, ManifestError, UsageError
from patchkit.image import build, distinfo, prebuilt
from patchkit import jitrules
from testing import jitcache
from testing.checkout import applied, changed
from testing.imagetree import FI, SITE, TreeFiles, dist
from testing.stackbase import flashinfer_wheel

NORM = "flashinfer/data/include/flashinfer/norm.cuh"
SO = b"\x7fELF\x02\x01\x01" + b"\0" * 9 + b"\x03\0\xb7\0"   # an aarch64 shared object's start
PROVIDERS = f"{SITE}/flashinfer_jit_cache/providers"


def base(*parts: dict[str, bytes], version: str = "0.7.4", aot: tuple[str, ...] = ()
         ) -> tuple[TreeFiles, distinfo.Installed]:
    own = dict(FI)
    own.update({f"flashinfer/data/aot/{m}/{m}.so": SO for m in aot})
    files = dist("flashinfer-python", version, own)
    for part in parts:
        files.update({f"{SITE}/{rel}": data for rel, data in part.items()})
    tree = TreeFiles(files)
    return tree, distinfo.installed(tree, {})


def patched(rebuild: tuple[str, ...] = (), arch: str = "121a") -> build.PackageTree:
    return build.PackageTree("flashinfer", "flashinfer-python", applied({NORM: ["norm"]}),
                             (changed(NORM, "1" * 40),), SITE, rebuild, arch)


def leave_out(image, env=None, packages=None, shipped=frozenset(), log=None):
    return prebuilt.leave_out(image[0], image[1], env or {}, packages or [patched()], "b:1",
                              log or (lambda m: None), shipped)


GB10 = (jitcache.shim("0.7.4+cu130"), jitcache.provider("sm121a", {"norm": SO, "sampling": SO},
                                                         "0.7.4+cu130"))


def test_a_provider_for_gb10_is_refused_naming_module_file_and_provider():
    with pytest.raises(ImageError) as err:
        leave_out(base(*GB10))
    assert str(err.value) == (
        "base b:1 ships the prebuilt JIT module norm (provider sm121a of "
        "flashinfer-jit-cache-sm121a 0.7.4+cu130 for sm121a, "
        f"{PROVIDERS}/sm121a/jit_cache/norm), which flashinfer loads instead of compiling the "
        f"patched {NORM}; say `rebuild: jit` on the patch to leave it out of the image, or ship "
        "the rebuilt module as an artifact")


def test_rebuild_jit_whites_out_exactly_that_module_folder():
    entries = leave_out(base(*GB10), packages=[patched((NORM,))])
    assert [(e.path, e.kind) for e in entries] == [
        (f"{PROVIDERS}/sm121a/jit_cache/norm".lstrip("/"), "whiteout")]


@pytest.mark.parametrize("arch, refused", [
    ("sm121a", True), ("sm120f", True), ("sm120", True), ("sm121", True), ("sm120a", False),
    ("sm90a", False), ("sm100a", False)])
def test_only_a_provider_whose_architecture_runs_on_gb10_counts(arch, refused):
    image = base(jitcache.shim("0.7.4"), jitcache.provider(arch, {"norm": SO}, "0.7.4"))
    said: list[str] = []
    if refused:
        with pytest.raises(ImageError, match=f"provider {arch} of flashinfer-jit-cache-{arch}"):
            leave_out(image)
    else:
        assert leave_out(image, log=said.append) == []
        assert (f"flashinfer: not counted: provider {arch} of flashinfer-jit-cache-{arch} 0.7.4 "
                f"for {arch}: none of its architectures runs on sm121a (image.cuda_arch)") in said


def test_the_target_is_the_manifests_or_the_bases_arch_list():
    hopper = base(jitcache.shim("0.7.4"), jitcache.provider("sm90a", {"norm": SO}, "0.7.4"))
    assert leave_out(hopper) == []                                    # GB10 by default
    with pytest.raises(ImageError, match="provider sm90a"):
        leave_out(hopper, packages=[patched(arch="90a")])             # image.cuda_arch: 90a
    with pytest.raises(ImageError, match="provider sm90a"):
        leave_out(hopper, env={"FLASHINFER_CUDA_ARCH_LIST": "9.0"})   # FlashInfer reads it first
    gb10 = base(*GB10)
    assert leave_out(gb10, env={"FLASHINFER_CUDA_ARCH_LIST": "9.0a 10.0"}) == []
    with pytest.raises(UsageError) as err:
        leave_out(gb10, env={"FLASHINFER_CUDA_ARCH_LIST": "sm121a"})
    assert err.value.exit_code == 2 and "FLASHINFER_CUDA_ARCH_LIST='sm121a'" in str(err.value)


def test_the_aot_folder_wins_with_no_architecture_and_rebuild_leaves_out_both():
    image = base(*GB10, aot=("norm",))
    with pytest.raises(ImageError) as err:
        leave_out(image)
    assert (f"norm (the AOT folder of flashinfer-python 0.7.4, {SITE}/flashinfer/data/aot/norm)"
            in str(err.value))
    only_aot = base(aot=("norm",))
    with pytest.raises(ImageError, match="the AOT folder"):
        leave_out(only_aot, env={"FLASHINFER_CUDA_ARCH_LIST": "9.0a"})
    entries = leave_out(image, packages=[patched((NORM,))])
    assert [e.path for e in entries] == [f"{SITE}/flashinfer/data/aot/norm".lstrip("/"),
                                         f"{PROVIDERS}/sm121a/jit_cache/norm".lstrip("/")]


def test_versions_are_checked_as_flashinfer_does_unless_the_base_disables_it():
    stale = base(jitcache.shim("0.7.4+cu130"), jitcache.provider("sm121a", {"norm": SO},
                                                                  "0.7.3+cu130"))
    said: list[str] = []
    assert leave_out(stale, log=said.append) == []
    assert any("its version does not match flashinfer-python 0.7.4" in s for s in said)
    off = {"FLASHINFER_DISABLE_VERSION_CHECK": "1"}
    with pytest.raises(ImageError, match="flashinfer-jit-cache-sm121a 0.7.3"):
        leave_out(stale, env=off)
    other_shim = base(jitcache.shim("0.7.4+cu129"), GB10[1])     # the provider is +cu130
    assert leave_out(other_shim) == []
    old_shim = base(jitcache.shim("0.7.3"), GB10[1])             # the shim itself is ignored
    said.clear()
    assert leave_out(old_shim, log=said.append) == []
    assert any("flashinfer-jit-cache 0.7.3 does not match" in s for s in said)
    with pytest.raises(ImageError):
        leave_out(old_shim, env=off)
    assert leave_out(base(GB10[1])) == []                        # no shim: no provider is read


def test_a_module_the_manifest_does_not_list_or_a_listed_one_missing_is_not_loaded():
    unlisted = base(jitcache.shim("0.7.4"), jitcache.provider("sm121a", {"norm": SO}, "0.7.4",
                                                                listed=["sampling"]))
    assert leave_out(unlisted) == []
    missing = base(jitcache.shim("0.7.4"), jitcache.provider("sm121a", {"sampling": SO}, "0.7.4",
                                                               listed=["norm", "sampling"]))
    assert leave_out(missing) == []


@pytest.mark.parametrize("manifest, said", [
    (b"{not json", "does not parse: Expecting property name"),
    (b"[1, 2]", "does not parse: a JSON object is expected, got list"),
    (b'{"schema_version": 2}', "does not parse: schema_version is 2; FlashInfer 0.7 reads 1"),
    (b'{"schema_version": 1, "distribution": "d", "version": "0.7.4", '
     b'"cuda_architectures": ["sm121a"]}', "does not parse: no modules"),
    (b'{"schema_version": 1, "distribution": "d", "version": "0.7.4", '
     b'"cuda_architectures": ["gb10"], "modules": ["norm"]}', "'gb10' is not a CUDA architecture"),
])
def test_a_provider_manifest_that_does_not_parse_is_one_line_exit_2(manifest, said):
    image = base(jitcache.shim("0.7.4"), jitcache.provider("sm121a", {"norm": SO}, "0.7.4",
                                                             manifest=manifest))
    with pytest.raises(prebuilt.ProviderError) as err:
        leave_out(image)
    text = str(err.value)
    assert err.value.exit_code == 2 and "\n" not in text
    assert text.startswith("provider sm121a of flashinfer-jit-cache-sm121a 0.7.4 (base b:1): "
                           f"{PROVIDERS}/sm121a/manifest.json")
    assert said in text


def test_an_artifact_that_ships_the_module_counts_as_rebuilt():
    member = "flashinfer_jit_cache/providers/sm121a/jit_cache/norm/norm.so"
    assert leave_out(base(*GB10), shipped={("flashinfer-jit-cache-sm121a", member)}) == []


def test_the_06_rule_stays_for_06_bases():
    cache = jitcache.installed_dist("flashinfer-jit-cache", "0.6.15+cu130", {
        "flashinfer_jit_cache/__init__.py": b"", "flashinfer_jit_cache/jit_cache/norm/norm.so": SO})
    with pytest.raises(ImageError) as err:
        leave_out(base(cache, version="0.6.15"))
    assert (f"(flashinfer-jit-cache 0.6.15+cu130, {SITE}/flashinfer_jit_cache/jit_cache/norm)"
            in str(err.value))
    # 0.6 reads data/aot only without the shim, and neither providers nor architectures
    assert leave_out(base(cache, GB10[1], version="0.6.15", aot=()),
                     packages=[patched((NORM,))])[0].path.endswith("jit_cache/norm")
    with pytest.raises(ImageError, match="the AOT folder of flashinfer-python 0.6.15"):
        leave_out(base(version="0.6.15", aot=("norm",)))
    assert leave_out(base(GB10[1], version="0.6.15")) == []
    with_shim = base(cache, version="0.6.15", aot=("norm",))
    assert [e.path for e in leave_out(with_shim, packages=[patched((NORM,))])] == [
        f"{SITE}/flashinfer_jit_cache/jit_cache/norm".lstrip("/")]


def test_the_cubins_stay_where_the_base_kept_them():
    image = base(*GB10)
    tree = patched()
    env = prebuilt.cache_env(image[0], image[1], {}, None, [tree])
    assert env["FLASHINFER_WORKSPACE_BASE"].startswith("/root/.cache/patchkit-jit/")
    assert env["FLASHINFER_CUBIN_DIR"] == "/root/.cache/flashinfer/cubins"
    moved = {"FLASHINFER_WORKSPACE_BASE": "/ws"}
    assert prebuilt.cache_env(image[0], image[1], moved, None, [tree])[
        "FLASHINFER_CUBIN_DIR"] == "/ws/.cache/flashinfer/cubins"
    given = {"FLASHINFER_CUBIN_DIR": "/cubins"}
    assert prebuilt.cache_env(image[0], image[1], given, None, [tree])[
        "FLASHINFER_CUBIN_DIR"] == "/cubins"
    packaged = base(*GB10, jitcache.cubin("0.7.4"))
    assert prebuilt.cache_env(packaged[0], packaged[1], {}, None, [tree])[
        "FLASHINFER_CUBIN_DIR"] == f"{SITE}/flashinfer_cubin/cubins"
    stale = base(*GB10, jitcache.cubin("0.6.13"))    # FlashInfer 0.7 ignores it
    assert prebuilt.cache_env(stale[0], stale[1], {}, None, [tree])[
        "FLASHINFER_CUBIN_DIR"] == "/root/.cache/flashinfer/cubins"
    user = TreeFiles({**image[0].files, "/etc/passwd": b"svc:x:1000:1000::/home/svc:/bin/sh\n"})
    where = prebuilt.places(user, image[1], {}, "svc", "flashinfer-python")
    assert where == prebuilt.Places("/home/svc/.cache/flashinfer",
                                    "/home/svc/.cache/flashinfer/cubins",
                                    "FLASHINFER_WORKSPACE_BASE default")


def test_an_image_is_judged_module_by_module():
    image = base(*GB10)
    wanted = {"flashinfer": ("flashinfer-python", "121a")}
    found, _ = prebuilt.prove(image[0], image[1], {}, wanted, {"flashinfer": {NORM: ["norm"]}},
                              "hand:made")
    assert [p.ok for p in found] == [False]
    assert found[0].message("hand:made") == (
        f"the patched {NORM} feeds JIT module norm, and image hand:made still holds it prebuilt "
        f"(provider sm121a of flashinfer-jit-cache-sm121a 0.7.4+cu130 for sm121a, "
        f"{PROVIDERS}/sm121a/jit_cache/norm), which flashinfer loads instead of compiling the "
        "patched source")
    clean = base(GB10[0], jitcache.provider("sm121a", {"sampling": SO}, "0.7.4+cu130",
                                            listed=["norm", "sampling"]))
    found, _ = prebuilt.prove(clean[0], clean[1], {}, wanted, {"flashinfer": {NORM: ["norm"]}},
                              "built")
    assert [p.ok for p in found] == [True]


# ------------------------------------------------------------- the rule table, from the releases

def _wheel_text(version: str, member: str) -> str:
    with zipfile.ZipFile(flashinfer_wheel(version)) as zf:
        return zf.read(member).decode()


def test_the_rule_table_says_what_the_real_releases_do(tmp_path):
    rules = jitrules.rules_for("flashinfer-python")
    new, old = rules.series("0.7.4"), rules.series("0.6.15")
    assert (new.series, old.series) == ("0.7", "0.6")
    assert rules.series("0.7.2.post1") is new and rules.series("0.7.3") is new
    env7 = _wheel_text("0.7.4", "flashinfer/jit/env.py")
    core7 = _wheel_text("0.7.4", "flashinfer/jit/core.py")
    env6 = _wheel_text("0.6.15", "flashinfer/jit/env.py")
    for text, rule in ((env7, new), (env6, old)):
        for name in (rule.version_check_env, rule.cubin_env, rule.workspace_env):
            assert f'"{name}"' in text
    # 0.7: data/aot, then the shim's providers; a version or a +local one; the same as the shim's
    assert '_package_root / "data" / "aot"' in env7 and "get_jit_cache_providers()" in env7
    assert 'package_version.startswith(f"{flashinfer_version}+")' in env7
    assert "package_version != shim_version" in env7
    # 0.6: the shim's own folder, its version a prefix
    assert "get_jit_cache_dir()" in env6 and \
        "not flashinfer_jit_cache_version.startswith(flashinfer_version)" in env6
    # the log line of a cold build, in the release's own format
    record = logging.LogRecord("flashinfer.jit", logging.INFO, "core.py", 635,
                               "Building JIT module %s; this can take several minutes on "
                               "first use.", ("norm",), None)
    assert '"Building JIT module %s; this can take several minutes on "' in core7
    line = logging.Formatter("%(asctime)s - %(levelname)s - %(filename)s:%(lineno)d - "
                             "flashinfer.jit: %(message)s").format(record)
    import re

    assert re.search(jitrules.built_pattern("norm"), line)
    assert not re.search(jitrules.built_pattern("norm"), line.replace("norm;", "norm_fp8;"))
    assert re.search(jitrules.built_pattern("norm"),
                     "[2/2] c++ norm.cuda.o -shared -o /w/.cache/flashinfer/0.7.4/121a/"
                     "cached_ops/norm/norm.so")


def test_architecture_compatibility_is_flashinfers(tmp_path, monkeypatch):
    source = tmp_path / "_cuda_architecture.py"
    source.write_text(_wheel_text("0.7.4", "flashinfer/jit/_cuda_architecture.py"))
    spec = importlib.util.spec_from_file_location("fi_cuda_architecture", source)
    real = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "fi_cuda_architecture", real)
    spec.loader.exec_module(real)
    archs = [jitrules.CudaArch(major, minor, suffix)
             for (major, minor), suffix in itertools.product(sorted(jitrules.KNOWN_CAPABILITIES),
                                                             ("", "a", "f"))]
    for binary, device in itertools.product(archs, archs):
        want = real.cuda_binary_target_compatibility_score(str(binary), str(device)) is not None
        assert binary.runs_on(device) == want, (binary, device)


def test_image_cuda_arch_is_one_flashinfer_knows(tmp_path, monkeypatch):
    from patchkit import manifest
    from testing.project import make_project

    proj = make_project(tmp_path)
    text = (proj / "patchset.yaml").read_text()
    monkeypatch.chdir(proj)
    assert manifest.load("patchset.yaml").image.cuda_arch == "121a"
    assert "\npatches:\n" in text
    for good in ("120f", "sm90a", "12.1a", "120"):
        (proj / "patchset.yaml").write_text(text.replace(
            "\npatches:\n", f"\nimage:\n  cuda_arch: {good}\npatches:\n", 1))
        assert manifest.load("patchset.yaml").image.cuda_arch == good
    (proj / "patchset.yaml").write_text(text.replace(
        "\npatches:\n", "\nimage:\n  cuda_arch: gb10\npatches:\n", 1))
    with pytest.raises(ManifestError) as err:
        manifest.load("patchset.yaml")
    assert err.value.exit_code == 2
    assert ("image.cuda_arch: 'gb10' is not a CUDA architecture FlashInfer knows (like 121a for "
            "GB10, 120f, 100a, 90a)") in str(err.value)


def test_a_marker_requires_that_the_module_was_built_in_the_releases_wording(tmp_path,
                                                                             monkeypatch):
    from patchkit import manifest
    from patchkit.serving import runtime
    from testing.project import make_project

    proj = make_project(tmp_path)
    text = (proj / "patchset.yaml").read_text()
    (proj / "patchset.yaml").write_text(text.replace(
        "    diff: patches/table.diff\n",
        "    diff: patches/table.diff\n    runtime:\n      - jit_built: norm\n", 1))
    monkeypatch.chdir(proj)
    m = manifest.load("patchset.yaml")
    patch = m.patches[0]
    assert patch.runtime[0].jit_built == "norm"
    cold = ("2026-12-06 03:00:00,000 - INFO - core.py:635 - flashinfer.jit: Building JIT module "
            "norm; this can take several minutes on first use.")
    for lines, ok in (([cold], True), (["ninja: Entering directory `/root/.cache/patchkit-jit/a/"
                                        ".cache/flashinfer/0.7.4/121a/cached_ops/norm'"], True),
                      (["INFO vLLM API server started"], False),
                      ([cold.replace("norm;", "rmsnorm;")], False)):
        result, = runtime.assess(runtime.markers_of(m, {patch.id}),
                                 [runtime.Log("server.log", lines)]).results
        assert result.ok is ok, (lines, result.message)
    assert "saying that JIT module norm was built from source, not loaded prebuilt" in \
        patch.runtime[0].describe()
    (proj / "patchset.yaml").write_text(text.replace(
        "    diff: patches/table.diff\n",
        "    diff: patches/table.diff\n    runtime:\n      - jit_built: norm.cuh\n"
        "        log: x\n", 1))
    with pytest.raises(ManifestError, match="log and jit_built together"):
        manifest.load("patchset.yaml")


def test_a_module_an_artifact_ships_is_the_rebuilt_one_in_an_image():
    image = base(*GB10)
    member = "flashinfer_jit_cache/providers/sm121a/jit_cache/norm/norm.so"
    found, _ = prebuilt.prove(image[0], image[1], {}, {"flashinfer": ("flashinfer-python", "121a")},
                              {"flashinfer": {NORM: ["norm"]}}, "i",
                              {("flashinfer-jit-cache-sm121a", member)})
    assert [p.ok for p in found] == [True]


def test_a_provider_without_manifest_json_is_read_from_what_its_entry_point_returns():
    files = jitcache.provider("sm121a", {"norm": SO}, "0.7.4")
    package = "flashinfer_jit_cache/providers/sm121a"
    del files[f"{package}/manifest.json"]
    files[f"{package}/__init__.py"] = (
        b"import pathlib\n\n\ndef get_provider():\n    return {\n        'schema_version': 1,\n"
        b"        'distribution': 'flashinfer-jit-cache-sm121a', 'version': '0.7.4',\n"
        b"        'cuda_architectures': ['12.1a'], 'modules': ['norm'],\n"
        b"        'jit_cache_dir': str(pathlib.Path(__file__).parent / 'jit_cache'),\n    }\n")
    image = base(jitcache.shim("0.7.4"), files)
    with pytest.raises(ImageError, match=f"sm121a, {PROVIDERS}/sm121a/jit_cache/norm\\)"):
        leave_out(image)
    files[f"{package}/__init__.py"] = b"def get_provider():\n    return load()\n"
    with pytest.raises(prebuilt.ProviderError) as err:
        leave_out(base(jitcache.shim("0.7.4"), files))
    assert err.value.exit_code == 2
    assert ("no manifest.json in " f"{PROVIDERS}/sm121a, and flashinfer_jit_cache.providers."
            "sm121a:get_provider returns no mapping written out") in str(err.value)
