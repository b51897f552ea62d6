"""Assertions on C, C++ and CUDA sources, judged on tree-sitter's syntax tree: every predicate
both ways, scopes by name, `Class::method` and namespace, overloads, error nodes inside and
outside the scope, and the real FlashInfer 0.6.15 CUTLASS MoE header with a patch of our own."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from patchkit.manifest import Assertion, Patch
from patchkit.report import AssertionResult
from patchkit import syntax
from patchkit.series.assertions import run_assertions, tree_reader
from patchkit.syntax import GrammarError, cxx
from testing import flashinfer as fi
from testing import release_cache

CUDA_SOURCE = textwrap.dedent('''\
    #include "moe.h"
    #define MAX_EXPERTS 256
    namespace tk { namespace moe {
    template <int N>
    struct Runner {
      int width() const { return N; }
      void run(int* out);
      int scratch_;
    };

    template <int N>
    void Runner<N>::run(int* out) {
      auto* buffer = allocate<int>(N);
      helper::fill(buffer, "fill the buffer", 0x10);
      this->sync();
      kernel<<<1, N>>>(out);
      TLLM_THROW("not supported");
    }

    __global__ void kernel(int* out) {
      cudaGridDependencySynchronize();
      out[threadIdx.x] = MAX_EXPERTS;
    }

    int twice(int x) { return 2 * x; }
    float twice(float x) { return 2.f * x; }
    }}  // namespace tk::moe
    ''')


def check(predicate: str, value: str, scope: str | None = None, *, negate: bool = False,
          source: str = CUDA_SOURCE, name: str = "k.cu") -> AssertionResult:
    assertion = Assertion(file=name, scope=scope, predicate=predicate, value=value)
    if negate:
        assertion = Assertion(file=name, scope=scope, predicate="not", value=None,
                              negated=assertion)
    patch = Patch(id="p", summary="s", kind="diff", path="x.diff", verify=(assertion,))
    [result] = run_assertions([patch], {name: source}.get)
    return result


def test_the_language_is_chosen_by_suffix():
    assert syntax.for_file("a/b.cu") is cxx.CUDA
    assert syntax.for_file("a/b.cuh") is cxx.CUDA
    assert all(syntax.for_file(f"x{s}") is cxx.CPP for s in (".cc", ".cpp", ".hpp", ".h"))
    assert syntax.for_file("x.c") is cxx.C
    assert syntax.for_file("x.py").name == "Python"


@pytest.mark.parametrize("scope", ["tk::moe::Runner::run", "Runner::run", "moe::Runner::run",
                                   "Runner<N>::run", "Runner<8>::run"])
def test_a_method_defined_outside_its_class_is_found_by_any_tail_of_its_name(scope):
    result = check("calls", "helper::fill", scope)
    assert result.ok, result.message
    assert (result.line, result.message) == (14, f"{scope} calls helper::fill")


def test_calls_match_a_tail_and_ignore_template_arguments():
    assert check("calls", "fill", "Runner::run").ok
    assert check("calls", "allocate", "Runner::run").ok          # allocate<int>(N)
    assert check("calls", "sync", "Runner::run").ok              # this->sync()
    assert check("calls", "this->sync", "Runner::run").ok
    assert check("calls", "kernel", "Runner::run").ok            # a kernel launch
    result = check("calls", "cudaGridDependencySynchronize", "Runner::run")
    assert not result.ok
    assert result.message == ("no call to cudaGridDependencySynchronize in Runner::run; calls "
                              "there: allocate, helper::fill, this.sync, kernel, TLLM_THROW")
    assert check("calls", "cudaGridDependencySynchronize", "kernel").ok


def test_contains_strings_names_and_numbers():
    assert check("contains", "fill the buffer", "Runner::run").ok
    assert check("contains", "TLLM_THROW", "Runner::run").ok
    assert check("contains", "0x10", "Runner::run").ok
    assert check("contains", "MAX_EXPERTS", "kernel").ok
    result = check("contains", "TLLM_THROW", "kernel")
    assert not result.ok and result.message.startswith("no string or name 'TLLM_THROW' in kernel")
    comment = check("contains", "namespace", None)   # comments and keywords are not names
    assert not comment.ok


def test_not_both_ways():
    failed = check("contains", "TLLM_THROW", "Runner::run", negate=True)
    assert not failed.ok
    assert failed.message == "Runner::run contains 'TLLM_THROW', which it must not"
    assert failed.line == 17
    held = check("contains", "TLLM_THROW", "kernel", negate=True)
    assert held.ok and held.message == "no string or name 'TLLM_THROW' in kernel"


def test_defines_in_the_file_a_class_and_a_function():
    assert check("defines", "MAX_EXPERTS").ok                        # a macro
    assert check("defines", "Runner").ok
    assert check("defines", "tk::moe::Runner::run").ok
    assert check("defines", "width", "Runner").ok                   # a method in its class
    assert check("defines", "scratch_", "Runner").ok                # a member
    assert check("defines", "buffer", "Runner::run").ok             # a local
    missing = check("defines", "cache", "Runner")
    assert not missing.ok
    assert missing.message == ("cache is not defined in Runner; defined there: width, "
                               "scratch_")
    assert not check("defines", "run", "Runner").ok                 # declared, not defined


def test_a_scope_that_names_nothing_says_what_is_there():
    result = check("contains", "x", "Runner::rn")
    assert not result.ok
    assert result.message.startswith("scope Runner::rn not found (did you mean "
                                     "tk::moe::Runner::run?); the file defines: tk::moe::Runner, ")


def test_a_scope_that_names_two_definitions_fails_and_says_where():
    result = check("contains", "x", "twice")
    assert not result.ok
    assert result.message == ("scope twice names 2 definitions (lines 25, 26): an overload or a "
                              "definition repeated under #if; an assertion needs exactly one")
    assert result.line == 25


BROKEN = textwrap.dedent('''\
    void good(int x) {
      use(x);
    }
    GET_WS_PTR(int*, x) = ws + 1 +;
    void bad(int x) {
      int y = (x + ;
      use(y);
    }
    ''')


def test_error_nodes_elsewhere_do_not_matter_and_inside_are_named():
    assert check("calls", "use", "good", source=BROKEN, name="b.cpp").ok
    result = check("calls", "use", "bad", source=BROKEN, name="b.cpp")
    assert not result.ok
    assert result.message.startswith("bad does not parse: syntax error nodes at lines 6, 7; ")
    negated = check("contains", "TLLM_THROW", "bad", negate=True, source=BROKEN, name="b.cpp")
    assert not negated.ok          # what did not parse proves no absence either


def test_c_sources_use_the_c_grammar():
    source = "static int add(int a, int b) { return helper(a) + b; }\n"
    assert check("calls", "helper", "add", source=source, name="m.c").ok
    assert not check("calls", "other", "add", source=source, name="m.c").ok


def test_an_unloadable_grammar_is_one_usage_error(monkeypatch):
    broken = cxx.Cxx("CUDA", cxx._Grammar("tree_sitter_no_such_grammar", "tree-sitter-cuda"))
    monkeypatch.setitem(syntax.TABLE, ".cu", (__name__, "_BROKEN"))
    monkeypatch.setitem(globals(), "_BROKEN", broken)
    with pytest.raises(GrammarError) as err:
        check("calls", "x", "f")
    assert err.value.exit_code == 2
    assert str(err.value).startswith("cannot load the tree-sitter grammar for CUDA files "
                                     "(tree_sitter_no_such_grammar: ModuleNotFoundError")
    assert "\n" not in str(err.value)


# -- the real FlashInfer 0.6.15 header --------------------------------------------------------

@pytest.fixture(scope="module")
def header() -> str:
    return fi.moe_header(release_cache())


def _judge(tmp_path: Path, text: str, assertions: list[Assertion]) -> list[AssertionResult]:
    path = tmp_path / fi.MOE_HEADER
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    patch = Patch(id="fi-low-latency", summary="s", kind="diff", path="x.diff",
                  verify=tuple(assertions))
    return run_assertions([patch], tree_reader(tmp_path))


def _restored_assertions() -> list[Assertion]:
    f = fi.MOE_HEADER
    runner = "CutlassMoeFCRunner::computeStridesTmaWarpSpecializedLowLatency"
    kernel = "computeStridesTmaWarpSpecializedLowLatencyKernel"
    contains = Assertion(f, runner, "contains", "TLLM_THROW")
    return [Assertion(f, runner, "not", None, negated=contains),
            Assertion(f, "CutlassMoeFCRunner<T, WeightType>::"
                         "computeStridesTmaWarpSpecializedLowLatency", "calls",
                      "cudaLaunchKernelEx"),
            Assertion(f, kernel, "calls", "cudaGridDependencySynchronize"),
            Assertion(f, f"tensorrt_llm::kernels::cutlass_kernels::{kernel}", "calls",
                      "computeTmaWarpSpecializedInputPointers")]


@pytest.mark.real_vllm
def test_the_restored_low_latency_builder_passes_on_the_patched_header(tmp_path, header):
    tree = cxx.CUDA.parse(header, fi.MOE_HEADER)
    assert tree.root.has_error   # the real header leaves error nodes on macro-heavy lines
    results = _judge(tmp_path, fi.restore_low_latency(header), _restored_assertions())
    assert [r.message for r in results if not r.ok] == []
    assert [r.ok for r in results] == [True] * 4


@pytest.mark.real_vllm
def test_the_same_assertions_fail_on_the_pristine_header(tmp_path, header):
    results = _judge(tmp_path, header, _restored_assertions())
    assert [r.ok for r in results] == [False] * 4
    throw = results[0]
    assert throw.message == ("CutlassMoeFCRunner::computeStridesTmaWarpSpecializedLowLatency "
                             "contains 'TLLM_THROW', which it must not")
    assert header.splitlines()[throw.line - 1] == fi.MOE_THROW.rstrip("\n")
    assert results[1].message.startswith(
        "no call to cudaLaunchKernelEx in CutlassMoeFCRunner<T, WeightType>::"
        "computeStridesTmaWarpSpecializedLowLatency; calls there: TLLM_THROW")
    assert results[2].message.startswith(
        "scope computeStridesTmaWarpSpecializedLowLatencyKernel not found (did you mean "
        "tensorrt_llm::kernels::cutlass_kernels::CutlassMoeFCRunner::"
        "computeStridesTmaWarpSpecializedLowLatency?)")


@pytest.mark.real_vllm
def test_the_function_the_real_header_defines_twice_is_named_as_such(tmp_path, header):
    f = fi.MOE_HEADER
    [result] = _judge(tmp_path, header, [
        Assertion(f, "fusedBuildExpertMapsSortFirstTokenBlockSize", "contains", "func")])
    assert not result.ok
    first, second = (n + 1 for n, line in enumerate(header.splitlines())
                     if line.startswith("bool fusedBuildExpertMapsSortFirstTokenBlockSize("))
    assert result.message.startswith(
        f"scope fusedBuildExpertMapsSortFirstTokenBlockSize names 2 definitions (lines "
        f"{first}, {second}): ")


@pytest.mark.real_vllm
def test_a_scope_misread_after_a_syntax_error_names_the_error_near_it_not_itself(tmp_path):
    """An unbalanced '{' at line 117 of FlashInfer 0.6.15's norm.cuh: the parser reads
    RMSNorm outside flashinfer::. The message says so and names the error node nearest to it;
    it never lists norm::RMSNorm as something else the file defines, and points near the edit,
    not at the macro's error node at line 766 that the pristine header has too."""
    import zipfile

    from patchkit import source

    wheel = source.pypi._wheel(release_cache(), "0.6.15", lambda msg: None, fi.FI_PACKAGE)
    member = "flashinfer/data/include/flashinfer/norm.cuh"
    with zipfile.ZipFile(wheel) as zf:
        lines = zf.read(member).decode("utf-8").split("\n")
    lines[116] += " {"
    [result] = _judge_file(tmp_path, member, "\n".join(lines), [
        Assertion(member, "flashinfer::norm::RMSNorm", "calls", "cudaLaunchKernelEx")])
    assert not result.ok
    assert result.message.startswith(
        "scope flashinfer::norm::RMSNorm not found: norm::RMSNorm at line 114 is read outside "
        "flashinfer::, because of the syntax error node nearest to it (lines 16 to ")
    assert "the file defines" not in result.message
    assert result.line == 114
    [other] = _judge_file(tmp_path, member, "\n".join(lines), [
        Assertion(member, "flashinfer::norm::Nope", "calls", "x")])
    assert other.message.startswith("scope flashinfer::norm::Nope not found; the file "
                                    "defines: norm::RMSNormKernel, norm::RMSNorm, ")
    assert "a definition inside a syntax error node is not seen (error nodes at lines 16, 766)" \
        in other.message


def _judge_file(tmp_path: Path, member: str, text: str,
                assertions: list[Assertion]) -> list[AssertionResult]:
    path = tmp_path / member
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    patch = Patch(id="fi-norm", summary="s", kind="diff", path="x.diff", verify=tuple(assertions))
    return run_assertions([patch], tree_reader(tmp_path))
