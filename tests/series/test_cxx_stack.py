"""A patch of our own to the real FlashInfer 0.6.15 CUTLASS MoE header, applied through the CLI
beside vLLM and proven by C++ assertions; the same assertions fail the pristine header."""

from __future__ import annotations

import difflib
import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from testing import SRC, one_error, patchkit, release_cache
from testing import flashinfer as fi

pytestmark = pytest.mark.real_vllm

ENTRY = """\
  - id: fi-low-latency
    summary: restore the low-latency descriptor builder in place of a throw
    package: flashinfer
    diff: patches/flashinfer/fi-low-latency.diff
""" + fi.LOW_LATENCY_VERIFY


@pytest.fixture(scope="module")
def header() -> str:
    fi.ensure_releases(release_cache(), ("v0.6.15",))
    return fi.moe_header(release_cache())


def _diff(before: str, after: str) -> str:
    return "".join(difflib.unified_diff(before.splitlines(True), after.splitlines(True),
                                        f"a/{fi.MOE_HEADER}", f"b/{fi.MOE_HEADER}"))


def _project(tmp_path: Path, diff: str) -> Path:
    proj = fi.make_stack(tmp_path, ENTRY)
    (proj / "patches" / "flashinfer" / "fi-low-latency.diff").write_text(diff)
    return proj


def _env() -> dict[str, str]:
    return dict(os.environ, PATCHKIT_CACHE_DIR=str(release_cache()))


def test_the_patched_header_is_applied_and_proven(tmp_path, header):
    proj = _project(tmp_path, _diff(header, fi.restore_low_latency(header)))
    p = patchkit("apply", "--format", "json", cwd=proj, env=_env())
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    mine = [a for a in report["verify"] if a["patch"] == "fi-low-latency"]
    assert [a["ok"] for a in mine] == [True] * 4
    assert mine[2]["message"] == ("computeStridesTmaWarpSpecializedLowLatencyKernel calls "
                                  "cudaGridDependencySynchronize")
    applied = proj / ".patchkit" / "flashinfer" / fi.MOE_HEADER
    assert applied.read_text() == fi.restore_low_latency(header)


def test_a_patch_that_keeps_the_throw_fails_its_assertions(tmp_path, header):
    # a change elsewhere in the header: the throw stays, and the assertions say so
    kept = header.replace(fi.MOE_KERNEL_BEFORE, "// Setup per call.\n", 1)
    proj = _project(tmp_path, _diff(header, kept))
    p = patchkit("apply", "--format", "json", cwd=proj, env=_env())
    assert p.returncode == 1, p.stderr
    report = json.loads(p.stdout)
    mine = [a for a in report["verify"] if a["patch"] == "fi-low-latency"]
    assert [a["ok"] for a in mine] == [False] * 4
    assert mine[0]["message"] == ("CutlassMoeFCRunner::computeStridesTmaWarpSpecializedLowLatency "
                                  "contains 'TLLM_THROW', which it must not")
    assert not (proj / ".patchkit" / "flashinfer").exists()   # nothing half-made


def test_a_grammar_that_cannot_load_is_one_line_and_exit_2(tmp_path, header):
    # a header no run has judged before (a comment of its own at the end): the assertions'
    # results are kept by content, so only new text needs the grammar
    fresh = fi.restore_low_latency(header) + f"// {secrets.token_hex(8)}\n"
    proj = _project(tmp_path, _diff(header, fresh))
    shim = tmp_path / "shim" / "tree_sitter_cuda"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('the binding is broken')\n")
    env = dict(_env(), PYTHONPATH=f"{shim.parent}{os.pathsep}{SRC}")
    p = subprocess.run([sys.executable, "-m", "patchkit", "apply"], cwd=proj, env=env,
                       text=True, capture_output=True, check=False)
    assert p.returncode == 2, p.stderr
    assert one_error(p) == (
        "patchkit apply: error: cannot load the tree-sitter grammar for CUDA files "
        "(tree_sitter_cuda: ImportError: the binding is broken); install it with `pip install "
        "tree-sitter tree-sitter-cuda`")
    assert not (proj / ".patchkit" / "flashinfer").exists()
    p = subprocess.run([sys.executable, "-m", "patchkit", "validate"], cwd=proj, env=env,
                       text=True, capture_output=True, check=False)
    assert p.returncode == 2 and "cannot load the tree-sitter grammar for CUDA" in one_error(p)


def test_flashinfer_csrc_outside_its_wheel_folder_needs_a_source_build(tmp_path, header):
    # the wheel ships its CUDA sources under flashinfer/data/csrc; a repository-root csrc/ path
    # is what a FlashInfer git checkout holds, and no wheel does
    diff = _diff(header, fi.restore_low_latency(header)).replace(
        fi.MOE_HEADER, "csrc/fused_moe/cutlass_backend/cutlass_fused_moe_kernels.cuh")
    proj = _project(tmp_path, diff)
    text = (proj / "patchset.yaml").read_text().replace(fi.LOW_LATENCY_VERIFY, "")
    (proj / "patchset.yaml").write_text(text)
    p = patchkit("apply", cwd=proj, env=_env())
    assert p.returncode == 2, p.stderr
    assert one_error(p) == (
        "patchkit apply: error: patch fi-low-latency: csrc/fused_moe/cutlass_backend/cutlass_fused_moe"
        "_kernels.cuh is compiled code not in flashinfer's source (pypi: it holds flashinfer/ as "
        "the package installs it, no build tree); a change to it needs a source build of "
        "flashinfer from a git repository")
    assert not (proj / ".patchkit").exists() or not any((proj / ".patchkit").iterdir())


def test_the_report_names_the_jit_modules_the_patched_header_feeds(tmp_path, header):
    proj = _project(tmp_path, _diff(header, fi.restore_low_latency(header)))
    p = patchkit("apply", "--format", "json", cwd=proj, env=_env())
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["jit_modules"] == {"flashinfer": {fi.MOE_HEADER:
                                                                  fi.MOE_MODULES}}


NORM = "flashinfer/data/include/flashinfer/norm.cuh"
NORM_ENTRY = f"""\
  - id: fi-norm
    summary: a change to FlashInfer's RMSNorm header
    package: flashinfer
    diff: patches/flashinfer/fi-norm.diff
    verify:
      - file: {NORM}
        in: flashinfer::norm::RMSNorm
        contains: vec_size
"""


def _norm_project(tmp_path: Path, edit) -> Path:
    import zipfile

    from patchkit import source

    wheel = source.pypi._wheel(release_cache(), "0.6.15", lambda msg: None, fi.FI_PACKAGE)
    with zipfile.ZipFile(wheel) as zf:
        before = zf.read(NORM).decode("utf-8")
    lines = before.split("\n")
    edit(lines)
    diff = "".join(difflib.unified_diff(before.splitlines(True),
                                        "\n".join(lines).splitlines(True),
                                        f"a/{NORM}", f"b/{NORM}"))
    proj = fi.make_stack(tmp_path, NORM_ENTRY)
    (proj / "patches" / "flashinfer" / "fi-norm.diff").write_text(diff)
    return proj


def test_a_brace_that_breaks_the_namespace_points_at_the_change(tmp_path, header):
    """An unbalanced '{' at line 117 of norm.cuh: the assertion's scope is read outside
    flashinfer::; the failure names the error node nearest to the change and points at it."""
    def brace(lines):
        lines[116] += " {"

    proj = _norm_project(tmp_path, brace)
    p = patchkit("apply", cwd=proj, env=_env())
    assert p.returncode == 1, p.stderr
    line = next(ln for ln in p.stdout.splitlines() if "[fi-norm]" in ln)
    assert line.startswith(f"{NORM}:117:")
    assert ("scope flashinfer::norm::RMSNorm not found: norm::RMSNorm at line 114 is read "
            "outside flashinfer::, because of the syntax error node nearest to the change at "
            "line 117 (lines 16 to ") in line
    assert "the file defines" not in line


def test_apply_says_which_jit_module_a_patch_feeds(tmp_path, header):
    def comment(lines):
        lines[116] += "  // tuned"

    proj = _norm_project(tmp_path, comment)
    p = patchkit("apply", cwd=proj, env=_env())
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"fi-norm feeds flashinfer's JIT module norm (through {NORM})" in p.stdout.splitlines()
