"""The JIT modules FlashInfer builds from a file, read from the real 0.6.15 wheel's own module
definitions and the include graph of the sources it ships."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from patchkit.image import lockfile
from patchkit import jitrules
from patchkit.series import jit
from testing import flashinfer as fi
from testing import release_cache

pytestmark = pytest.mark.real_vllm


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    fi.moe_header(release_cache())   # the wheel, downloaded once into the shared cache
    wheel = next((release_cache() / "pypi" / "wheels").glob("flashinfer_python-0.6.15-*.whl"))
    root = tmp_path_factory.mktemp("fi")
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(root, [n for n in zf.namelist() if n.startswith("flashinfer/")])
    return root


def test_the_cutlass_moe_header_feeds_the_fused_moe_modules_alone(tree):
    found = jit.modules_for(tree, "flashinfer-python", [fi.MOE_HEADER])
    assert found == {fi.MOE_HEADER: fi.MOE_MODULES}


def test_a_header_and_a_source_of_the_norm_module(tree):
    norm_h = "flashinfer/data/include/flashinfer/norm.cuh"
    norm_cu = "flashinfer/data/csrc/norm.cu"
    found = jit.modules_for(tree, "flashinfer_python", [norm_h, norm_cu])
    assert found[norm_cu] == ["norm"]
    assert "norm" in found[norm_h]
    assert all("fused_moe" not in m for m in found[norm_h])


def test_python_files_and_other_packages_name_no_module(tree):
    assert jit.modules_for(tree, "flashinfer-python", [fi.FI_FILE]) == {}
    assert jit.modules_for(tree, "vllm", [fi.MOE_HEADER]) == {}


def test_a_shared_header_feeds_every_module_that_reaches_it(tree):
    graph = jit.Graph(tree, jitrules.rules_for("flashinfer-python"))
    cute = graph.modules_of("flashinfer/data/cutlass/include/cute/tensor.hpp")
    assert set(fi.MOE_MODULES) <= set(cute) and "norm" not in cute
    # the name of a module made per architecture is expanded from its callers
    names = {m.name for m in graph.modules}
    assert {"fp4_quantization_90", "fp4_quantization_120"} <= names
    # a module whose name is made at run time is named by the function that defines it
    assert "gen_customize_batch_prefill_module:{uri}" in names


def test_the_lock_keeps_the_modules_of_each_patched_file(tmp_path):
    lock = lockfile.Lock("base", "sha256:" + "0" * 64, {
        "flashinfer": lockfile.Pinned("0.6.15", "c" * 40, "pypi",
                                      {fi.MOE_HEADER: tuple(fi.MOE_MODULES)})})
    text = lock.render().decode()
    assert f'"{fi.MOE_HEADER}" = ["fused_moe_89", "fused_moe_90",' in text
    path = tmp_path / "patchset.lock"
    path.write_text(text)
    assert lockfile.Lock.read(path) == lock


def test_the_image_labels_name_the_modules(tmp_path):
    import json

    from patchkit import manifest
    from patchkit.image import labels
    from patchkit.report import ApplyReport, PackageInfo
    from testing.project import make_project

    class Applied:   # what run_labels reads of an applied checkout
        report = ApplyReport(PackageInfo("v1", "c" * 40, "1.0.0"), None,
                             jit_modules={"flashinfer": {fi.MOE_HEADER: fi.MOE_MODULES}})
        vllm, base = report.vllm, "c" * 40

        def tree_id(self) -> str:
            return "e" * 40

    m = manifest.load(make_project(tmp_path) / "patchset.yaml")
    made = labels.run_labels(m, Applied(), mode="overlay", created=0, digest="x")
    assert json.loads(made[labels.JIT_MODULES_LABEL]) == {
        "flashinfer": {fi.MOE_HEADER: fi.MOE_MODULES}}
