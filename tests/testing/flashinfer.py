"""Real FlashInfer releases from PyPI (``flashinfer-python`` wheels are pure Python), a real
patch written against FlashInfer 0.6.15, and a patchset project that pins vLLM (the engine's
fixture upstream) and FlashInfer side by side.

``FI_PATCH`` hoists the activations of the sm12x fused-MoE micro kernel into a module constant
and refuses a ``swiglu_limit`` at or below zero, which would clamp every gate to nothing.  The
file is the same in 0.6.15 and 0.6.16, so the patch applies on both.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from patchkit import manifest, source
from testing.project import make_project

FI_RELEASES = ("v0.6.15", "v0.6.16")
FI_FILE = "flashinfer/fused_moe/cute_dsl/blackwell_sm12x/moe_micro_kernel.py"
FI_PACKAGE = manifest.identity("flashinfer", "flashinfer-python")

FI_PATCH = """\
--- a/flashinfer/fused_moe/cute_dsl/blackwell_sm12x/moe_micro_kernel.py
+++ b/flashinfer/fused_moe/cute_dsl/blackwell_sm12x/moe_micro_kernel.py
@@ -130,6 +130,7 @@ from .moe_activation import gated_activation_f32, is_gated_activation
 
 _SF_VEC_SIZE = 16
 _COMPACT_STATIC_TILE_M = 128
+_SUPPORTED_ACTIVATIONS = frozenset({"silu", "relu2", "gelu_tanh", "swigluoai_uninterleave"})
 
 
 @cute.jit
@@ -374,8 +375,12 @@ class MoEMicroKernel:
         share_expert_scales: bool = False,
         single_token: bool = False,
     ):
-        if activation not in {"silu", "relu2", "gelu_tanh", "swigluoai_uninterleave"}:
+        if activation not in _SUPPORTED_ACTIVATIONS:
             raise ValueError(f"unsupported activation {activation!r}")
+        # A limit at or below zero clamps every gate to nothing: the kernel would run and
+        # return zeros instead of failing.
+        if swiglu_limit is not None and swiglu_limit <= 0:
+            raise ValueError(f"swiglu_limit must be positive, got {swiglu_limit!r}")
         self._dense_cls = DenseGemmKernel
         self.acc_dtype = cutlass.Float32
         self.sf_vec_size = sf_vec_size
"""


# A guard on the kernel's scale-vector size, written against 0.6.17: it applies there (and on
# 0.6.16), and 0.6.18, which teaches the kernel MXFP4 (32 elements per scale), rewrote the
# line it holds on, so it fails with a conflict there.  The two releases are adjacent on PyPI.
FI_TILE_RELEASES = ("v0.6.17", "v0.6.18")
FI_TILE_PATCH = """\
--- a/flashinfer/fused_moe/cute_dsl/blackwell_sm12x/moe_micro_kernel.py
+++ b/flashinfer/fused_moe/cute_dsl/blackwell_sm12x/moe_micro_kernel.py
@@ -394,6 +394,9 @@
         self.share_input_across_experts = share_input_across_experts
         self.share_expert_scales = share_expert_scales
         self.single_token = single_token
+        # The kernel's tiles and quantizer hold NVFP4 alone: 16 elements per scale.
+        if sf_vec_size != 16:
+            raise ValueError(f"sf_vec_size must be 16, got {sf_vec_size!r}")
         tile_k = sf_vec_size * 8
         self.tile_shape_mnk = (mma_tiler_mn[0], mma_tiler_mn[1], tile_k)
         self.sa_tile_shape_mk = (max(128, mma_tiler_mn[0]), tile_k)
"""

FI_TILE_ENTRY = """\
  - id: fi-nvfp4-only
    summary: refuse a scale-vector size other than NVFP4's 16
    package: flashinfer
    diff: patches/flashinfer/fi-nvfp4-only.diff
    flashinfer: "<0.6.18"
    verify:
      - file: flashinfer/fused_moe/cute_dsl/blackwell_sm12x/moe_micro_kernel.py
        in: MoEMicroKernel.__init__
        contains: "sf_vec_size must be 16, got "
"""


# The top-k fast path of the sampler always deterministic; written against 0.6.15, whose call
# 0.6.16 rewrote (``_radix_top_k``), so the diff conflicts there.
TOPK_FILE = "flashinfer/sampling.py"
TOPK_PATCH = """\
diff --git a/flashinfer/sampling.py b/flashinfer/sampling.py
index 3a807f8..c17cd12 100644
--- a/flashinfer/sampling.py
+++ b/flashinfer/sampling.py
@@ -1385,9 +1385,8 @@ def _top_k_first_fast_path(
 
     # deterministic=True makes top-k reproducible (its radix deterministic-collect path is
     # stable even at ties). We do not enforce a tie break that requires 128KB smem/block.
-    values, gathered_indices = _topk_mod.top_k(
-        x, top_k, sorted=True, deterministic=deterministic
-    )
+    # Ties broken the same way on every run: the same seed must give the same tokens.
+    values, gathered_indices = _topk_mod.top_k(x, top_k, sorted=True, deterministic=True)
     values = values.float()
     if from_logits:
         # softmax over the k retained logits == top-k-masked softmax over the full vocab.
"""

TOPK_ENTRY = """\
  - id: fi-topk-deterministic
    summary: break top-k ties the same way on every run of the fast path
    package: flashinfer
    diff: patches/flashinfer/fi-topk-deterministic.diff
"""


def patched(pristine: str) -> str:
    """What FI_PATCH makes of the pristine file, written out by other means than the diff."""
    out = pristine.replace(
        "_COMPACT_STATIC_TILE_M = 128\n",
        "_COMPACT_STATIC_TILE_M = 128\n_SUPPORTED_ACTIVATIONS = frozenset({\"silu\", \"relu2\", "
        "\"gelu_tanh\", \"swigluoai_uninterleave\"})\n", 1)
    old = ('        if activation not in {"silu", "relu2", "gelu_tanh", "swigluoai_uninterleave"}:\n'
           '            raise ValueError(f"unsupported activation {activation!r}")\n')
    assert pristine.count(old) == 1
    return out.replace(old, (
        "        if activation not in _SUPPORTED_ACTIVATIONS:\n"
        '            raise ValueError(f"unsupported activation {activation!r}")\n'
        "        # A limit at or below zero clamps every gate to nothing: the kernel would run and\n"
        "        # return zeros instead of failing.\n"
        "        if swiglu_limit is not None and swiglu_limit <= 0:\n"
        '            raise ValueError(f"swiglu_limit must be positive, got {swiglu_limit!r}")\n'))


def ensure_releases(cache: Path, refs: tuple[str, ...] = FI_RELEASES) -> Path:
    """FlashInfer's ``refs`` (default FI_RELEASES) laid out in ``cache``'s PyPI upstream,
    through the pypi source (downloaded once; later runs find them there)."""
    for ref in refs:
        source.resolve(["pypi"], ref, cache, package=FI_PACKAGE)
    return cache


PACKAGES = """\
packages:
  flashinfer:
    dist: flashinfer-python
    repo: [pypi]
    ref: v0.6.15
patches:
"""

FI_ENTRY = """\
  - id: fi-moe-activations
    summary: one table of activations; refuse a swiglu_limit at or below zero
    package: flashinfer
    diff: patches/flashinfer/fi-moe-activations.diff
    flashinfer: ">=0.6.15"
    verify:
      - file: flashinfer/fused_moe/cute_dsl/blackwell_sm12x/moe_micro_kernel.py
        in: MoEMicroKernel.__init__
        contains: _SUPPORTED_ACTIVATIONS
      - file: flashinfer/fused_moe/cute_dsl/blackwell_sm12x/moe_micro_kernel.py
        defines: _SUPPORTED_ACTIVATIONS
"""


def make_stack(tmp: Path, extra: str = "") -> Path:
    """The engine's project (vLLM from its fixture upstream) with FlashInfer 0.6.15 from PyPI
    beside it: FI_PATCH as a flashinfer patch, and the vLLM transform ``fast-mode`` held on
    FlashInfer below 0.6.16.  ``extra`` is more patch entries, appended."""
    proj = make_project(tmp)
    (proj / "patches" / "flashinfer").mkdir()
    (proj / "patches" / "flashinfer" / "fi-moe-activations.diff").write_text(FI_PATCH)
    text = (proj / "patchset.yaml").read_text().replace("patches:\n", PACKAGES)
    text = text.replace("    transform: patches/fast.py\n",
                        "    transform: patches/fast.py\n    flashinfer: \"<0.6.16\"\n")
    (proj / "patchset.yaml").write_text(text + FI_ENTRY + extra)
    return proj


def git_history(cache: Path, dest: Path, refs: tuple[str, ...]) -> Path:
    """A bare git repository at ``dest`` in which FlashInfer's releases ``refs`` (laid out in
    ``cache``'s PyPI upstream) follow one another on one line, each a commit tagged as its
    release: the history a FlashInfer checkout from git has, cut to its releases.  It borrows
    the cache's objects."""
    upstream = source.pypi.repo_path(cache, FI_PACKAGE)
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(dest)], check=True)
    (dest / "objects" / "info" / "alternates").write_text(str(upstream / "objects") + "\n")
    parent: list[str] = []
    for n, ref in enumerate(refs):
        tree = _git(upstream, "rev-parse", f"{ref}^{{tree}}")
        when = f"2026-0{n + 1}-01T00:00:00+00:00"
        commit = _git(dest, "commit-tree", tree, *parent, "-m", f"Release {ref[1:]}",
                      env={"GIT_AUTHOR_NAME": "FlashInfer", "GIT_AUTHOR_EMAIL": "fi@example.com",
                           "GIT_COMMITTER_NAME": "FlashInfer",
                           "GIT_COMMITTER_EMAIL": "fi@example.com",
                           "GIT_AUTHOR_DATE": when, "GIT_COMMITTER_DATE": when})
        _git(dest, "update-ref", f"refs/tags/{ref}", commit)
        parent = ["-p", commit]
    _git(dest, "update-ref", "refs/heads/main", parent[1])
    return dest


def _git(repo: Path, *args: str, env: dict[str, str] | None = None) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}).stdout.strip()


# -- compiled code ---------------------------------------------------------------------------

# The CUTLASS MoE header that DGX Spark builds patch: in 0.6.15 the low-latency path of
# `computeStridesTmaWarpSpecializedLowLatency` is a throw, and `fusedBuildExpertMapsSortFirst
# TokenBlockSize` is defined twice (two templates of one name).
MOE_HEADER = "flashinfer/data/csrc/fused_moe/cutlass_backend/cutlass_fused_moe_kernels.cuh"
# the JIT modules 0.6.15 builds from it (its own module definitions)
MOE_MODULES = ["fused_moe_89", "fused_moe_90", "fused_moe_100", "fused_moe_103", "fused_moe_120"]
MOE_THROW = '  TLLM_THROW("Min latency mode is no longer supported");\n'
MOE_KERNEL_BEFORE = "// TODO Some of this setup could be cached\n"

# A kernel of our own that fills both GEMMs' problem shapes, strides and pointers for the
# experts this rank holds, one thread per expert; an expert that received no token gets an
# empty problem.
LOW_LATENCY_KERNEL = """\
// Low latency: every token goes to every active expert, so the offsets are implied.
template <class T, class WeightType, class OutputType, class ScaleBiasType>
__global__ void computeStridesTmaWarpSpecializedLowLatencyKernel(
    TmaWarpSpecializedGroupedGemmInput layout_info1,
    TmaWarpSpecializedGroupedGemmInput layout_info2, int64_t num_tokens, int64_t gemm1_n,
    int64_t gemm1_k, int64_t gemm2_n, int64_t gemm2_k, int const num_experts, T const* input1,
    T const* input2, WeightType const* weights1, WeightType const* weights2,
    ScaleBiasType const* bias1, ScaleBiasType const* bias2, OutputType* output1,
    OutputType* output2, int const* num_active_experts_per, int const* active_expert_global_ids,
    int start_expert) {
#if (defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900))
  cudaGridDependencySynchronize();
#endif
  int const expert = blockIdx.x * blockDim.x + threadIdx.x;
  if (expert >= num_experts) {
    return;
  }
  bool const is_active = expert < num_active_experts_per[0];
  int64_t const gemm_m = is_active ? num_tokens : 0;
  int64_t const weight_index = is_active ? active_expert_global_ids[expert] - start_expert : 0;
  layout_info1.shape_info.problem_shapes[expert] =
      TmaWarpSpecializedGroupedGemmInput::ProblemShape::UnderlyingProblemShape(gemm1_n, gemm_m,
                                                                               gemm1_k);
  layout_info2.shape_info.problem_shapes[expert] =
      TmaWarpSpecializedGroupedGemmInput::ProblemShape::UnderlyingProblemShape(gemm2_n, gemm_m,
                                                                               gemm2_k);
  computeTmaWarpSpecializedInputStrides(layout_info1, gemm_m, gemm1_n, gemm1_k, expert);
  computeTmaWarpSpecializedInputStrides(layout_info2, gemm_m, gemm2_n, gemm2_k, expert);
  computeTmaWarpSpecializedInputPointers(layout_info1, gemm_m, gemm1_n, gemm1_k,
                                         expert * num_tokens, weight_index, input1, weights1,
                                         nullptr, bias1, output1, nullptr, nullptr, expert);
  computeTmaWarpSpecializedInputPointers(layout_info2, gemm_m, gemm2_n, gemm2_k,
                                         expert * num_tokens, weight_index, input2, weights2,
                                         nullptr, bias2, output2, nullptr, nullptr, expert);
}

"""

LOW_LATENCY_LAUNCH = """\
  int const threads = std::min(1024, num_experts);
  int const blocks = (num_experts + threads - 1) / threads;
  cudaLaunchConfig_t config;
  config.gridDim = blocks;
  config.blockDim = threads;
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  cudaLaunchAttribute attrs[1];
  attrs[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[0].val.programmaticStreamSerializationAllowed = enable_pdl;
  config.numAttrs = 1;
  config.attrs = attrs;
  cudaLaunchKernelEx(
      &config,
      computeStridesTmaWarpSpecializedLowLatencyKernel<T, WeightType, UnfusedGemmOutputType,
                                                       ScaleBiasType>,
      layout_info1, layout_info2, num_tokens, gemm1_n, gemm1_k, gemm2_n, gemm2_k, num_experts,
      input1, input2, weights1, weights2, bias1, bias2, output1, output2, num_active_experts_per,
      active_expert_global_ids, start_expert);
  return std::make_pair(layout_info1, layout_info2);
"""


def restore_low_latency(pristine: str) -> str:
    """The 0.6.15 header with the low-latency descriptor builder back in place of the throw."""
    assert pristine.count(MOE_THROW) == 1 and pristine.count(MOE_KERNEL_BEFORE) == 1
    out = pristine.replace(MOE_KERNEL_BEFORE, LOW_LATENCY_KERNEL + MOE_KERNEL_BEFORE)
    return out.replace(MOE_THROW, LOW_LATENCY_LAUNCH)


def moe_header(cache: Path, version: str = "0.6.15") -> str:
    """The pristine header as the real wheel ships it (downloaded once into ``cache``)."""
    import zipfile

    wheel = source.pypi._wheel(cache, version, lambda msg: None, FI_PACKAGE)
    with zipfile.ZipFile(wheel) as zf:
        return zf.read(MOE_HEADER).decode("utf-8")


LOW_LATENCY_VERIFY = f"""\
    verify:
      - file: {MOE_HEADER}
        in: CutlassMoeFCRunner::computeStridesTmaWarpSpecializedLowLatency
        not_contains: TLLM_THROW
      - file: {MOE_HEADER}
        in: CutlassMoeFCRunner<T, WeightType>::computeStridesTmaWarpSpecializedLowLatency
        calls: cudaLaunchKernelEx
      - file: {MOE_HEADER}
        in: computeStridesTmaWarpSpecializedLowLatencyKernel
        calls: cudaGridDependencySynchronize
      - file: {MOE_HEADER}
        in: tensorrt_llm::kernels::cutlass_kernels::computeStridesTmaWarpSpecializedLowLatencyKernel
        not: {{contains: TLLM_THROW}}
"""
