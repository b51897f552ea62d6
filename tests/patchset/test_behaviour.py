"""What the patched vLLM code does, run piecewise against stubs (no torch, no GPU).

Each test lifts the patched definition out of the real patched file and calls it, so a patch
that applies but does the wrong thing fails here, on every release the fixture covers.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import enum
import subprocess
import sys
import types
import typing
from types import SimpleNamespace

import pytest

from patchkit import manifest
from patchkit.series.assertions import run_assertions

from testing import REPO_ROOT
from testing.lift import Logger, find, lift

ATTN = "vllm/models/deepseek_v4/attention.py"
COMPRESSOR = "vllm/models/deepseek_v4/compressor.py"
SPARSE_MLA = "vllm/models/deepseek_v4/sparse_mla.py"
SWA = "vllm/v1/attention/backends/mla/sparse_swa.py"
KVI = "vllm/v1/kv_cache_interface.py"
TORCH_UTILS = "vllm/utils/torch_utils.py"
CACHE = "vllm/config/cache.py"
VLLM_CONFIG = "vllm/config/vllm.py"
SPEC = "vllm/config/speculative.py"
DSPARK_CONFIG = "vllm/v1/worker/gpu/spec_decode/dspark/config.py"
DSPARK = "vllm/models/deepseek_v4/nvidia/dspark.py"
QUANT = "vllm/models/deepseek_v4/quant_config.py"
LOADER = "vllm/v1/worker/gpu/spec_decode/dspark/utils.py"


class _Dtype:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"torch.{self.name}"


class _Torch:
    """Any ``torch.<dtype>`` is a distinct sentinel, the same object on every read."""

    def __getattr__(self, name: str) -> _Dtype:
        dtype = _Dtype(name)
        setattr(self, name, dtype)
        return dtype


TORCH = _Torch()


@pytest.fixture
def kv_quant_mode(patched, monkeypatch):
    """KVQuantMode and a namespace to lift its helpers into.  From 0.33.0 get_kv_quant_mode
    first asks vllm.config.cache for a plugin dtype handler; none is registered here."""
    cache = types.ModuleType("vllm.config.cache")
    cache.get_kv_cache_dtype_handler = lambda name: None
    for name, module in (("vllm", types.ModuleType("vllm")),
                         ("vllm.config", types.ModuleType("vllm.config")),
                         ("vllm.config.cache", cache)):
        monkeypatch.setitem(sys.modules, name, module)
    ns: dict = {"IntEnum": enum.IntEnum}
    return lift(patched.text(KVI), "KVQuantMode", ns), ns


# --------------------------------------------------------------------- stage A: the dtype


def test_nvfp4_ds_mla_is_stored_as_uint8(patched):
    table = lift(patched.text(TORCH_UTILS), "STR_DTYPE_TO_TORCH_DTYPE", {"torch": TORCH})
    assert table["nvfp4_ds_mla"] is TORCH.uint8
    assert table["nvfp4_ds_mla"] is table["fp8_ds_mla"]


def test_nvfp4_ds_mla_is_an_accepted_cache_dtype(patched):
    cache_dtype = lift(patched.text(CACHE), "CacheDType", {"Literal": typing.Literal})
    assert "nvfp4_ds_mla" in typing.get_args(cache_dtype)


@pytest.mark.parametrize("dtype", ["fp8_ds_mla", "nvfp4_ds_mla"])
def test_nvfp4_ds_mla_counts_as_quantized_like_fp8_ds_mla(patched, kv_quant_mode, dtype):
    mode, ns = kv_quant_mode
    get_mode = lift(patched.text(KVI), "get_kv_quant_mode", ns)
    # torch_utils has its own copy up to 0.32.0; from 0.33.0 it lives next to the mode.
    home = KVI if patched.since("v0.33.0") else TORCH_UTILS
    is_quantized = lift(patched.text(home), "is_quantized_kv_cache", ns)
    assert is_quantized(dtype) and not is_quantized("auto")
    # The runner asks the backend for the packed shape only when the mode is not NONE, and
    # the generic NVFP4 mode (which 0.28.0 gives every "nvfp4*" dtype) sizes NVFP4 pages.
    assert get_mode(dtype) not in (mode.NONE, mode.NVFP4)
    assert get_mode("auto") == mode.NONE
    assert get_mode("nvfp4") == mode.NVFP4


def test_the_mla_check_lets_nvfp4_ds_mla_through(patched):
    """VllmConfig refuses an nvfp4 KV cache on an MLA model; from 0.28.0 by prefix, which would
    refuse nvfp4_ds_mla (DeepSeek-V4 is an MLA model) before stage B's resolver runs."""
    check = lift(patched.text(VLLM_CONFIG), "VllmConfig.validate_nvfp4_kv_cache_with_mla", {})

    def config(cache_dtype, use_mla=True):
        # 0.34.0 also refuses nvfp4_ds_mla under decode context parallelism: none here
        return SimpleNamespace(cache_config=SimpleNamespace(cache_dtype=cache_dtype),
                               model_config=SimpleNamespace(use_mla=use_mla),
                               parallel_config=SimpleNamespace(decode_context_parallel_size=1))

    for allowed in (config("nvfp4_ds_mla"), config("fp8_ds_mla"), config("nvfp4", False)):
        assert check(allowed) is allowed
    with pytest.raises(ValueError, match="not supported with MLA"):
        check(config("nvfp4"))
    if patched.since("v0.28.0"):  # nvfp4_4over6 is new in 0.28.0; still refused on MLA
        with pytest.raises(ValueError, match="not supported with MLA"):
            check(config("nvfp4_4over6"))


# --------------------------------------------------------------------- stage B: the resolver


def _resolver(patched):
    log = Logger()
    return lift(patched.text(ATTN), "_resolve_dsv4_kv_cache_dtype",
                {"torch": TORCH, "logger": log}), log


@pytest.mark.parametrize("requested", ["nvfp4", "nvfp4_ds_mla"])
def test_resolver_maps_nvfp4_to_nvfp4_ds_mla_and_rewrites_the_cache_config(patched, requested):
    resolve, _ = _resolver(patched)
    cache_config = SimpleNamespace(cache_dtype=requested)
    assert resolve(True, requested, cache_config) == ("nvfp4_ds_mla", TORCH.uint8)
    assert cache_config.cache_dtype == "nvfp4_ds_mla"
    assert resolve(True, requested, None) == ("nvfp4_ds_mla", TORCH.uint8)


@pytest.mark.parametrize("requested", ["fp8", "fp8_e4m3", "fp8_ds_mla"])
def test_resolver_keeps_fp8_behaviour(patched, requested):
    resolve, _ = _resolver(patched)
    cache_config = SimpleNamespace(cache_dtype=requested)
    assert resolve(True, requested, cache_config) == ("fp8_ds_mla", TORCH.uint8)
    assert cache_config.cache_dtype == "fp8_ds_mla"
    plain = SimpleNamespace(cache_dtype=requested)
    assert resolve(False, requested, plain) == (requested, TORCH.float8_e4m3fn)
    assert plain.cache_dtype == requested
    assert resolve(False, "auto", None) == ("auto", TORCH.bfloat16)


def test_resolver_still_refuses_other_dtypes_for_the_ds_mla_layout(patched):
    resolve, _ = _resolver(patched)
    with pytest.raises(ValueError if patched.since("v0.30.0") else AssertionError):
        resolve(True, "bfloat16", SimpleNamespace(cache_dtype="bfloat16"))


# --------------------------------------------------------------------- stage C: the envelope
#
# Up to 0.27.1 the backends' get_kv_cache_shape and the specs' real_page_size_bytes size the
# cache from the dtype string; from 0.28.0 pages follow the spec's state_content_bytes, which the
# DeepSeek-V4 layers pass, and from 0.29.0 the cache shape does too.  Each release is checked in
# its own form.


def _sized_by_spec(patched) -> bool:
    return patched.since("v0.28.0")


def _shaped_by_spec(patched) -> bool:
    return patched.since("v0.29.0")


@pytest.mark.parametrize("rel, backends", [
    # the main MLA backend was DeepseekV4FlashMLABackend up to 0.27.1
    (SPARSE_MLA, {"v0.27.1": "DeepseekV4FlashMLABackend", "v0.28.0": "DeepseekV4SparseMLABackend"}),
    (SWA, {"v0.27.1": "DeepseekSparseSWABackend", "v0.28.0": "DeepseekSparseSWABackend"})])
def test_cache_shapes_give_nvfp4_ds_mla_584_bytes_per_token(patched, rel, backends):
    if _shaped_by_spec(patched):
        assert "def get_kv_cache_shape" not in patched.text(rel)
        return  # the shape is the spec's: see test_specs_carry_the_envelope
    backend = backends[patched.release]
    shape = lift(patched.text(rel), f"{backend}.get_kv_cache_shape", {})
    assert shape(10, 64, 1, 512, "nvfp4_ds_mla") == (10, 64, 584)
    assert shape(10, 64, 1, 512, "nvfp4_ds_mla") == shape(10, 64, 1, 512, "fp8_ds_mla")
    assert shape(10, 64, 1, 512, "auto") == (10, 64, 512)


def _spec(mode, dtype_str, model_version="deepseek_v4"):
    return SimpleNamespace(cache_dtype_str=dtype_str, model_version=model_version,
                           storage_block_size=64, block_size=256, num_kv_heads=1,
                           head_size=512, dtype=TORCH.uint8, kv_quant_mode=mode.FP8_PER_TENSOR)


@pytest.mark.parametrize("spec", ["MLAAttentionSpec", "SlidingWindowMLASpec"])
def test_page_sizes_give_nvfp4_ds_mla_the_deepseek_v4_envelope(patched, kv_quant_mode, spec):
    mode, ns = kv_quant_mode
    if _sized_by_spec(patched):
        size = lift(patched.text(KVI), "AttentionSpec.state_content_size_bytes", ns)
        assert size(SimpleNamespace(state_content_bytes=584)) == 584
        return  # which spec carries 584: test_specs_carry_the_envelope
    ns["get_dtype_size"] = lambda dtype: 1
    page = lift(patched.text(KVI), f"{spec}.real_page_size_bytes", ns)
    assert page(_spec(mode, "nvfp4_ds_mla")) == 64 * 584
    assert page(_spec(mode, "nvfp4_ds_mla")) == page(_spec(mode, "fp8_ds_mla"))
    # Only DeepSeek-V4 has the envelope.
    assert page(_spec(mode, "nvfp4_ds_mla", model_version=None)) != 64 * 584


class _Recorder:
    """Stands in for a KV-cache spec class: keeps the keyword arguments it was built with."""

    def __init__(self, **kwargs: object) -> None:
        self.kwargs = kwargs


def _spec_kwargs(patched, rel, dotted, layer, cache_dtype):
    vllm_config = SimpleNamespace(cache_config=SimpleNamespace(cache_dtype=cache_dtype,
                                                               block_size=256))
    ns = {"torch": TORCH, "MLAAttentionSpec": _Recorder, "SlidingWindowMLASpec": _Recorder,
          "get_kv_quant_mode": lambda dtype: None}
    return lift(patched.text(rel), dotted, ns)(layer, vllm_config).kwargs


def _layers(cache_dtype):
    cache_config = SimpleNamespace(cache_dtype=cache_dtype, block_size=256)
    common = dict(cache_config=cache_config, block_size=64, head_dim=512, dtype=TORCH.uint8)
    # The SWA cache's own envelope attributes exist from 0.30.0 on, bounded_replay from 0.31.0.
    swa = dict(window_size=128, bounded_replay=False, packed_bytes_per_token=584,
               packed_page_alignment=576, packed_block_stride_alignment=None)
    return {
        (SWA, "DeepseekV4SWACache.get_kv_cache_spec"): SimpleNamespace(**common, **swa),
        (COMPRESSOR, "CompressorStateCache.get_kv_cache_spec"):
            SimpleNamespace(**common, state_dim=1024, sliding_window=8),
        (ATTN, "DeepseekV4IndexerCache.get_kv_cache_spec"):
            SimpleNamespace(**common, compress_ratio=4),
        (ATTN, "DeepseekV4Attention.get_kv_cache_spec"):
            SimpleNamespace(**common, compress_ratio=4, kv_cache_dtype=cache_dtype,
                            kv_cache_torch_dtype=TORCH.bfloat16),
    }


@pytest.mark.parametrize("cache_dtype, alignment", [("nvfp4_ds_mla", 576), ("fp8_ds_mla", 576),
                                                    ("bfloat16", 512)])
def test_nvfp4_ds_mla_pages_are_aligned_like_fp8_ds_mla(patched, cache_dtype, alignment):
    for (rel, dotted), layer in _layers(cache_dtype).items():
        assert _spec_kwargs(patched, rel, dotted, layer, cache_dtype)["alignment"] == alignment, \
            dotted


def test_specs_carry_the_envelope(patched):
    """The main MLA layer stores nvfp4_ds_mla packed in uint8, like fp8_ds_mla; from 0.28.0
    the MLA and SWA specs also carry its 584 bytes per token."""
    key = (ATTN, "DeepseekV4Attention.get_kv_cache_spec")
    swa_key = (SWA, "DeepseekV4SWACache.get_kv_cache_spec")
    for cache_dtype in ("nvfp4_ds_mla", "fp8_ds_mla"):
        main = _spec_kwargs(patched, *key, _layers(cache_dtype)[key], cache_dtype)
        assert main["dtype"] is TORCH.uint8 and main["cache_dtype_str"] == cache_dtype
        if _sized_by_spec(patched):
            assert main["state_content_bytes"] == 584
            swa = _spec_kwargs(patched, *swa_key, _layers(cache_dtype)[swa_key], cache_dtype)
            assert swa["state_content_bytes"] == 584
    plain = _spec_kwargs(patched, *key, _layers("bfloat16")[key], "bfloat16")
    assert plain["dtype"] is TORCH.bfloat16
    if _sized_by_spec(patched):
        assert plain["state_content_bytes"] is None


# --------------------------------------------------------------------- draft quantization


MODELOPT_TARGET_QUANT = {
    "quant_method": "fp8",
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "scale_fmt": "ue8m0",
    "weight_block_size": [128, 128],
    "quant_algo": "MIXED_PRECISION",
    "moe_quant_algo": "NVFP4",
    "quantized_layers": {"layers.0.ffn.experts": {"quant_algo": "NVFP4"}},
    "ignore": ["lm_head"],
    "modules_to_not_convert": ["mtp"],
}
TARGET_ONLY = ("moe_quant_algo", "quantized_layers", "ignore", "modules_to_not_convert")


def _draft_config_home(patched) -> tuple[str, str, str]:
    """Where the release builds the DSpark draft's config: (file, scope, the re-inspection
    call).  0.34.0 moved it from SpeculativeConfig.__post_init__ to the DSpark speculator
    config class."""
    if patched.since("v0.34.0"):
        return DSPARK_CONFIG, "DSparkSpeculatorConfig.adapt_draft_model_config", \
            "spec.update_arch_()"
    return SPEC, "SpeculativeConfig.__post_init__", "self.update_arch_()"


def _normalize(patched, ns=None):
    ns = {"copy": copy} if ns is None else ns
    home, _scope, _update = _draft_config_home(patched)
    lift(patched.text(home), "_DSPARK_TARGET_ONLY_QUANT_KEYS", ns)
    return lift(patched.text(home), "_normalize_dsv4_dspark_draft_quant", ns)


def test_normalization_drops_target_only_keys_from_a_copy(patched):
    normalize = _normalize(patched)
    target_quant = copy.deepcopy(MODELOPT_TARGET_QUANT)
    # The draft's config may hold the very dict the target's does.
    draft = SimpleNamespace(hf_config=SimpleNamespace(model_type="deepseek_v4",
                                                      quantization_config=target_quant),
                            quantization="modelopt_fp4")
    assert normalize(draft) == "deepseek_v4_fp8"
    assert draft.quantization == "deepseek_v4_fp8"
    draft_quant = draft.hf_config.quantization_config
    assert draft_quant is not target_quant
    assert not set(TARGET_ONLY) & set(draft_quant)
    assert draft_quant == {k: v for k, v in MODELOPT_TARGET_QUANT.items() if k not in TARGET_ONLY}
    assert target_quant == MODELOPT_TARGET_QUANT  # the target's config is untouched


def test_normalization_leaves_other_drafts_alone(patched):
    normalize = _normalize(patched)
    unquantized = SimpleNamespace(hf_config=SimpleNamespace(model_type="deepseek_v4"),
                                  quantization=None)
    assert normalize(unquantized) is None and unquantized.quantization is None
    quant = copy.deepcopy(MODELOPT_TARGET_QUANT)
    other = SimpleNamespace(hf_config=SimpleNamespace(model_type="deepseek_v41",
                                                      quantization_config=quant),
                            quantization="fp8")
    assert normalize(other) == "fp8"
    assert other.hf_config.quantization_config is quant and quant == MODELOPT_TARGET_QUANT


def test_normalization_runs_in_the_dspark_branch_before_the_arch_is_reinspected(patched):
    home, scope, update_call = _draft_config_home(patched)
    branch_owner = find(patched.text(home), scope)
    for block in ast.walk(branch_owner):
        body = getattr(block, "body", None)
        if not isinstance(body, list):
            continue
        calls = [i for i, s in enumerate(body)
                 if isinstance(s, ast.Assign) and isinstance(s.value, ast.Call)
                 and getattr(s.value.func, "id", None) == "_normalize_dsv4_dspark_draft_quant"]
        if calls:
            text = [ast.unparse(s) for s in body]
            arch = [i for i, t in enumerate(text) if "architectures" in t
                    and "DSparkDraftModel" in t]
            update = [i for i, t in enumerate(text) if t == update_call]
            assert arch and update and arch[0] < calls[0] < update[-1], text
            return
    pytest.fail("no call to _normalize_dsv4_dspark_draft_quant in a block")


def _has_speculator_config(patched) -> bool:
    """Whether the release builds the DSpark draft's config in its speculator config class
    (0.34.0 and later); before, the release has no such file and the tests of the
    SpeculativeConfig branch above cover it."""
    if patched.since("v0.34.0"):
        return True
    assert not (patched.tree / DSPARK_CONFIG).exists()
    return False


def _adapt_draft_model_config(patched):
    """The release's own DSparkSpeculatorConfig.adapt_draft_model_config (0.34.0 and later),
    with the patched module's helper beside it."""
    ns = {"copy": copy}
    _normalize(patched, ns)
    return lift(patched.text(DSPARK_CONFIG), "DSparkSpeculatorConfig.adapt_draft_model_config",
                ns)


def _dspark_spec(target_model_type: str, target_quant: dict):
    """A SpeculativeConfig as 0.34.0's DSpark path hands it over: the draft's hf_config read
    from the target checkpoint (the same quantization_config dict), ``spec.quantization``
    already the target's (``default_model``)."""
    target = SimpleNamespace(hf_config=SimpleNamespace(model_type=target_model_type,
                                                       quantization_config=target_quant),
                             quantization="modelopt_fp4")
    draft = SimpleNamespace(speculator_config_class=None, architectures=[],
                            hf_config=SimpleNamespace(model_type=target_model_type,
                                                      quantization_config=target_quant,
                                                      architectures=["DeepseekV4ForCausalLM"]),
                            quantization="modelopt_fp4")
    seen: list[tuple] = []
    spec = SimpleNamespace(draft_model_config=draft, target_model_config=target,
                           quantization="modelopt_fp4", kv_cache_dtype=None)
    spec.update_arch_ = lambda: seen.append((list(draft.hf_config.architectures),
                                             draft.quantization,
                                             dict(draft.hf_config.quantization_config)))
    return spec, seen


def test_v034_draft_config_gets_its_own_quantization(patched):
    if not _has_speculator_config(patched):
        return
    adapt = _adapt_draft_model_config(patched)
    target_quant = copy.deepcopy(MODELOPT_TARGET_QUANT)
    spec, seen = _dspark_spec("deepseek_v4", target_quant)
    adapt(None, spec)
    draft = spec.draft_model_config
    own = {k: v for k, v in MODELOPT_TARGET_QUANT.items() if k not in TARGET_ONLY}
    assert draft.quantization == spec.quantization == "deepseek_v4_fp8"
    assert draft.hf_config.quantization_config == own
    # the architecture is re-inspected once, on the draft's own config
    assert seen == [(["DSparkDraftModel"], "deepseek_v4_fp8", own)]
    # the target keeps its method and its ModelOpt keys
    assert spec.target_model_config.quantization == "modelopt_fp4"
    assert target_quant == MODELOPT_TARGET_QUANT
    assert spec.target_model_config.hf_config.quantization_config is target_quant


def test_v034_v41_draft_keeps_the_release_behaviour(patched):
    if not _has_speculator_config(patched):
        return
    adapt = _adapt_draft_model_config(patched)
    target_quant = copy.deepcopy(MODELOPT_TARGET_QUANT)
    spec, seen = _dspark_spec("deepseek_v41", target_quant)
    adapt(None, spec)
    assert spec.draft_model_config.hf_config.architectures == ["DSparkV41DraftModel"]
    assert spec.draft_model_config.quantization == spec.quantization == "modelopt_fp4"
    assert spec.draft_model_config.hf_config.quantization_config is target_quant
    assert target_quant == MODELOPT_TARGET_QUANT and len(seen) == 1


def test_v034_unpatched_draft_inherits_the_targets_method(patched):
    """The bug, on the release's own code: without the patch an NVFP4 target's method and
    ModelOpt keys reach the draft."""
    if not _has_speculator_config(patched):
        return
    adapt = lift(patched.base(DSPARK_CONFIG), "DSparkSpeculatorConfig.adapt_draft_model_config",
                 {})
    spec, _seen = _dspark_spec("deepseek_v4", copy.deepcopy(MODELOPT_TARGET_QUANT))
    adapt(None, spec)
    assert spec.draft_model_config.quantization == "modelopt_fp4"
    assert "moe_quant_algo" in spec.draft_model_config.hf_config.quantization_config


def _lazy_quant_config_cls(patched, current_hf_config):
    ns = {"get_current_vllm_config":
          lambda: SimpleNamespace(model_config=SimpleNamespace(hf_config=current_hf_config))}
    resolve = lift(patched.text(QUANT), "DeepseekV4FP8Config._resolve_moe_overrides", ns)
    getter = lift(patched.text(QUANT), "DeepseekV4FP8Config.moe_quant_algo", ns)

    class DeepseekV4FP8Config:
        """DeepseekV4FP8Config's lazy moe_quant_algo, as the release ships it."""

        def __init__(self) -> None:
            self._resolved_moe_quant_algo = None

        _resolve_moe_overrides = resolve
        moe_quant_algo = property(getter)

        def get_name(self) -> str:
            return "deepseek_v4_fp8"

    return DeepseekV4FP8Config


def test_draft_moe_quant_algo_comes_from_the_draft_config(patched):
    target = SimpleNamespace(quantization_config=copy.deepcopy(MODELOPT_TARGET_QUANT))
    draft = SimpleNamespace(quantization_config={
        k: v for k, v in MODELOPT_TARGET_QUANT.items() if k not in TARGET_ONLY})
    quant_config_cls = _lazy_quant_config_cls(patched, current_hf_config=target)
    scope = lift(patched.text(DSPARK), "_scope_draft_moe_quant_algo", {})

    leaked = quant_config_cls()
    assert leaked.moe_quant_algo == "NVFP4"  # what the draft saw without the fix

    scoped = quant_config_cls()
    scope(scoped, draft)
    assert scoped.moe_quant_algo == ""

    already = quant_config_cls()
    assert already.moe_quant_algo == "NVFP4"
    scope(already, draft)
    assert already.moe_quant_algo == "NVFP4"  # a resolved value is left for the guard
    scope(None, draft)  # no quant config: nothing to do


# --------------------------------------------------------------------- loader guards


class _QuantConfig:
    def __init__(self, algo: str, name: str = "deepseek_v4_fp8") -> None:
        self.moe_quant_algo = algo
        self.name = name

    def get_name(self) -> str:
        return self.name


def _quant_guard(patched):
    log = Logger()
    return lift(patched.text(DSPARK), "DSparkDeepseekV4ForCausalLM._verify_draft_quant_path",
                {"logger": log}), log


def test_quant_guard_refuses_an_nvfp4_draft(patched):
    guard, log = _quant_guard(patched)
    draft = SimpleNamespace(config=SimpleNamespace(quantization_config=MODELOPT_TARGET_QUANT),
                            quant_config=_QuantConfig("NVFP4"))
    with pytest.raises(RuntimeError, match="DSpark draft would build its routed experts as NVFP4"):
        guard(draft)
    assert log.lines == [
        "DSpark draft quantization path: quant_config=_QuantConfig, moe_quant_algo=NVFP4"]
    declared_only = SimpleNamespace(
        config=SimpleNamespace(quantization_config={"moe_quant_algo": "nvfp4"}),
        quant_config=_QuantConfig(""))
    with pytest.raises(RuntimeError, match="MXFP4"):
        guard(declared_only)


def test_quant_guard_passes_an_mxfp4_draft_with_the_recipes_startup_line(patched):
    guard, log = _quant_guard(patched)
    clean = {k: v for k, v in MODELOPT_TARGET_QUANT.items() if k not in TARGET_ONLY}
    target = SimpleNamespace(quantization_config=copy.deepcopy(MODELOPT_TARGET_QUANT))
    # The release's own lazy quant config, its moe_quant_algo scoped to the draft as patched.
    quant_config = _lazy_quant_config_cls(patched, current_hf_config=target)()
    draft_config = SimpleNamespace(quantization_config=clean)
    lift(patched.text(DSPARK), "_scope_draft_moe_quant_algo", {})(quant_config, draft_config)
    assert guard(SimpleNamespace(config=draft_config, quant_config=quant_config)) is None
    assert log.lines == [
        "DSpark draft quantization path: quant_config=DeepseekV4FP8Config, moe_quant_algo="]
    unquantized = SimpleNamespace(config=SimpleNamespace(), quant_config=None)
    assert guard(unquantized) is None
    assert log.lines[1:] == [
        "DSpark draft quantization path: quant_config=None, moe_quant_algo="]


def _weights(stages, *, without=()):
    names = set()
    for stage in range(stages):
        names |= {f"model.layers.{stage}.ffn.experts.w13_weight",
                  f"model.layers.{stage}.ffn.experts.w2_weight",
                  f"model.layers.{stage}.ffn.shared_experts.gate_up_proj.weight",
                  f"model.layers.{stage}.ffn.shared_experts.down_proj.weight",
                  f"model.layers.{stage}.attn.wo_a.weight"}
    return {n for n in names if not any(n.startswith(w) for w in without)}


def _coverage_guard(patched):
    ns: dict = {}
    lift(patched.text(DSPARK), "_dspark_missing_expert_families", ns)
    return lift(patched.text(DSPARK),
                "DSparkDeepseekV4ForCausalLM._verify_draft_expert_coverage", ns)


def test_coverage_guard_names_missing_shared_experts(patched):
    guard = _coverage_guard(patched)
    draft = SimpleNamespace(model=SimpleNamespace(layers=[object()] * 3))
    weights = _weights(3, without=("model.layers.1.ffn.shared_experts.",))
    with pytest.raises(RuntimeError) as info:
        guard(draft, weights)
    message = str(info.value)
    assert "stage 1: shared experts (.shared_experts.)" in message
    assert "stage 0" not in message and "stage 2" not in message and "routed" not in message


def test_coverage_guard_counts_fused_shared_experts(patched):
    guard = _coverage_guard(patched)
    draft = SimpleNamespace(model=SimpleNamespace(layers=[object()]))
    fused = _weights(1, without=("model.layers.0.ffn.shared_experts.",)) | {
        "model.layers.0.ffn.experts.shared_l1_weight",
        "model.layers.0.ffn.experts.shared_l2_weight"}
    assert guard(draft, fused) is None
    only_fused_shared = {n for n in fused if "shared_" in n}
    with pytest.raises(RuntimeError, match="stage 0: routed experts"):
        guard(draft, only_fused_shared)


def test_coverage_guard_does_not_count_shared_experts_as_routed(patched):
    guard = _coverage_guard(patched)
    draft = SimpleNamespace(model=SimpleNamespace(layers=[object()] * 2))
    weights = _weights(2, without=("model.layers.0.ffn.experts.",))
    with pytest.raises(RuntimeError, match=r"stage 0: routed experts \(\.experts\.\)"):
        guard(draft, weights)
    assert guard(draft, _weights(2)) is None


# --------------------------------------------------------------------- draft MoE backend


@dataclasses.dataclass(frozen=True)
class _Kernel:
    moe_backend: str


@dataclasses.dataclass(frozen=True)
class _Vllm:
    kernel_config: _Kernel
    quant_config: object = None


def _moe_override(patched):
    func = find(patched.text(LOADER), "load_dspark_model")
    body = func.body
    text = [ast.unparse(s) for s in body]
    override = [i for i, t in enumerate(text) if t.startswith("if speculative_config.moe_backend")]
    made = [i for i, t in enumerate(text) if t.startswith("draft_vllm_config = replace(")]
    quant = [i for i, t in enumerate(text) if t.startswith("draft_vllm_config.quant_config =")]
    assert len(override) == 1 and made and quant, text
    # After the draft config exists, before its quant config is set (replace() resets it).
    assert made[0] < override[0] < quant[0]
    return compile(ast.Module(body=[body[override[0]]], type_ignores=[]), LOADER, "exec")


@pytest.mark.parametrize("draft_backend, expected", [("b12x", "b12x"), (None, "flashinfer_b12x")])
def test_draft_gets_its_own_moe_backend(patched, draft_backend, expected):
    code = _moe_override(patched)
    ns = {"replace": dataclasses.replace,
          "speculative_config": SimpleNamespace(moe_backend=draft_backend),
          "draft_vllm_config": _Vllm(_Kernel("flashinfer_b12x"))}
    exec(code, ns)
    assert ns["draft_vllm_config"].kernel_config.moe_backend == expected


# --------------------------------------------------------------------- the assertions


def test_assertions_of_applied_patches_fail_on_the_upstream_tree(patched):
    series = manifest.load(REPO_ROOT / "patchset.yaml")
    applied = [p for p in series.patches if patched.statuses[p.id] == "applied"]
    assert applied
    results = run_assertions(applied, lambda rel: _or_none(patched.base, rel))
    passing = [r for r in results if r.ok]
    assert not passing, passing


def _or_none(read, rel):
    try:
        return read(rel)
    except subprocess.CalledProcessError:  # not in the upstream tree
        return None
