"""Transforms of C++/CUDA files: the anchor rules of a Python transform (count the hits,
postcondition before and after, a second run changes nothing), on the real FlashInfer 0.6.15
CUTLASS MoE header."""

from __future__ import annotations

from pathlib import Path

import pytest

from patchkit.transform import run_transform_file
from testing import flashinfer as fi
from testing import release_cache

RESTORE = f'''
from patchkit.transform import CxxTransform
from testing import flashinfer as fi

RUNNER = "CutlassMoeFCRunner::computeStridesTmaWarpSpecializedLowLatency"


class RestoreLowLatency(CxxTransform):
    path = {fi.MOE_HEADER!r}

    def postcondition(self, source):
        return not self.function(source, RUNNER).contains("TLLM_THROW")

    def transform(self, source):
        throw = self.anchor(self.function(source, RUNNER), fi.MOE_THROW, "the throw")
        text = self.replace(source, throw, fi.LOW_LATENCY_LAUNCH)
        before = self.anchor(source, fi.MOE_KERNEL_BEFORE, "the strides kernel's comment")
        assert before.start > throw.end or before.end < throw.start
        # the later edit first, so the earlier offsets hold
        return self.replace(self.read(text), before, fi.LOW_LATENCY_KERNEL + fi.MOE_KERNEL_BEFORE)
'''


@pytest.fixture(scope="module")
def header() -> str:
    return fi.moe_header(release_cache())


def run(tmp_path: Path, code: str, text: str):
    root = tmp_path / "tree"
    (root / fi.MOE_HEADER).parent.mkdir(parents=True, exist_ok=True)
    (root / fi.MOE_HEADER).write_text(text)
    t = tmp_path / "t.py"
    t.write_text(code)
    return run_transform_file(t, root, None), root / fi.MOE_HEADER


pytestmark = pytest.mark.real_vllm


def test_restores_the_builder_and_a_second_run_is_upstream(tmp_path, header):
    out, path = run(tmp_path, RESTORE, header)
    assert (out.status, out.reason) == ("applied", None), out.message
    assert path.read_text() == fi.restore_low_latency(header)
    again = run_transform_file(tmp_path / "t.py", path.parents[5], None)
    assert (again.status, again.message) == ("upstream", "postcondition already holds")
    assert path.read_text() == fi.restore_low_latency(header)


def test_a_function_defined_twice_is_an_ambiguous_anchor(tmp_path, header):
    code = RESTORE.replace('"CutlassMoeFCRunner::computeStridesTmaWarpSpecializedLowLatency"',
                           '"fusedBuildExpertMapsSortFirstTokenBlockSize"')
    out, path = run(tmp_path, code, header)
    assert (out.status, out.reason) == ("failed", "ambiguous-anchor")
    assert out.message.endswith("anchor matches 2 places: "
                                "fusedBuildExpertMapsSortFirstTokenBlockSize")
    assert path.read_text() == header


def test_a_missing_function_or_text_is_anchor_missing(tmp_path, header):
    gone = RESTORE.replace("RUNNER = \"CutlassMoeFCRunner::", "RUNNER = \"Other::")
    out, path = run(tmp_path, gone, header)
    assert (out.status, out.reason) == ("failed", "anchor-missing")
    assert out.message.endswith("anchor not found: Other::computeStridesTmaWarpSpecialized"
                                "LowLatency")
    moved = header.replace(fi.MOE_KERNEL_BEFORE, "// moved\n")
    out, path = run(tmp_path, RESTORE, moved)
    assert (out.status, out.reason) == ("failed", "anchor-missing")
    assert out.message.endswith("anchor not found: the strides kernel's comment")
    assert path.read_text() == moved


def test_a_result_with_more_syntax_errors_fails(tmp_path, header):
    broken = RESTORE.replace("fi.LOW_LATENCY_LAUNCH)", "fi.LOW_LATENCY_LAUNCH + '  int x = (;\\n')")
    out, path = run(tmp_path, broken, header)
    assert (out.status, out.reason) == ("failed", "error")
    assert "result does not compile: it leaves " in out.message
    assert path.read_text() == header


def test_a_libcst_transform_of_a_cuda_file_is_refused_at_load(tmp_path, header):
    code = ("from patchkit.transform import Transform\n"
            f"class T(Transform):\n    path = {fi.MOE_HEADER!r}\n")
    out, _ = run(tmp_path, code, header)
    assert (out.status, out.reason) == ("failed", "error")
    assert out.message.endswith(f"T edits a CUDA file ({fi.MOE_HEADER}); subclass "
                                "patchkit.transform.CxxTransform")
