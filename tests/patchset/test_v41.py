"""DeepSeek-V4.1's DSpark draft (vllm/models/deepseek_v41, from vLLM 0.30.0), on each release.

The draft model class is lifted whole out of the patched release file and built and loaded
against stubs (no torch, no GPU): its own ``__init__`` and ``load_weights`` run, with the
release's own ``DeepseekV4FP8Config`` quant-path methods.  The last part probes what V4.1 does
right upstream: its ``nvfp4_ds_mla`` KV cache, which no patch touches.
"""

from __future__ import annotations

import ast
import copy
import fnmatch
import re
import sys
import types
from collections.abc import Iterable
from types import SimpleNamespace

import pytest

from patchkit.transform import run_transform_file

from testing import REPO_ROOT
from testing.lift import Logger, find, lift

DSPARK41 = "vllm/models/deepseek_v41/nvidia/dspark.py"
QUANT41 = "vllm/models/deepseek_v41/quant_config.py"
ATTN41 = "vllm/models/deepseek_v41/attention.py"
V41_PATCHES = ("dspark-v41-draft-quant-scope", "dspark-v41-loader-guards")
STARTUP_LINE = "DSpark draft quantization path: quant_config=DeepseekV4FP8Config, moe_quant_algo="
NUM_HIDDEN_LAYERS = 43
STAGES = 3


def _has_v41(patched) -> bool:
    """V4.1 from 0.30.0; before it the V4.1 patches are out of range and the file is absent."""
    statuses = {patched.statuses[p] for p in V41_PATCHES}
    if not patched.since("v0.30.0"):
        assert statuses == {"skipped"}, statuses
        assert not (patched.tree / DSPARK41).exists()
        return False
    assert statuses == {"applied"}, statuses
    return True


def _per_layer(patched) -> bool:
    """From 0.32.0 the V4.1 quant config chooses NVFP4 per expert layer (ModelOpt ``ignore``)."""
    return patched.since("v0.32.0")


class _Tensor:
    pass


class _Torch:
    """``torch.Tensor`` is a class (annotations use ``Tensor | None``); any dtype a sentinel."""

    Tensor = _Tensor

    def __getattr__(self, name: str) -> str:
        return f"torch.{name}"


# A ModelOpt NVFP4 export of V4.1: FP8 linears, NVFP4 routed experts in the target, and the
# bundled draft stages (mtp.*) left in their native MXFP4 by `ignore`.
V41_TARGET_QUANT = {
    "quant_method": "fp8",
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "scale_fmt": "ue8m0",
    "weight_block_size": [128, 128],
    "quant_algo": "MIXED_PRECISION",
    "moe_quant_algo": "NVFP4",
    "ignore": ["lm_head", "mtp.*"],
}


def _hf_config(quant: dict | None) -> SimpleNamespace:
    config = SimpleNamespace(num_hidden_layers=NUM_HIDDEN_LAYERS, num_nextn_predict_layers=STAGES,
                             n_routed_experts=2, num_attention_heads=4, vocab_size=16,
                             hidden_size=8, expert_dtype="fp4")
    if quant is not None:
        config.quantization_config = copy.deepcopy(quant)
    return config


@pytest.fixture
def quant_config_for(patched, monkeypatch):
    """The release's V4.1 DeepseekV4FP8Config quant path (its lazy expert_dtype and
    moe_quant_algo, and from 0.32.0 its per-layer NVFP4 choice), built from a draft config while
    ``target`` is the current model config, as when load_dspark_model builds the draft."""
    log = Logger()
    vllm_logger = types.ModuleType("vllm.logger")
    vllm_logger.init_logger = lambda name: log
    for name, module in (("vllm", types.ModuleType("vllm")), ("vllm.logger", vllm_logger)):
        monkeypatch.setitem(sys.modules, name, module)

    def make(draft_quant: dict | None, target: SimpleNamespace, expert_dtype: str = "fp4"):
        text = patched.text(QUANT41)
        target.expert_dtype = expert_dtype
        current = SimpleNamespace(model_config=SimpleNamespace(hf_config=target,
                                                               hf_text_config=target))
        ns = {"get_current_vllm_config": lambda: current, "re": re, "fnmatch": fnmatch}
        lift(text, "_DEEPSEEK_V4_EXPERT_DTYPES", ns)
        attrs = {
            name: lift(text, f"DeepseekV4FP8Config.{name}", ns)
            for name in ("_resolve_moe_overrides", "expert_dtype", "moe_quant_algo")
        }
        attrs["expert_dtype"] = property(attrs["expert_dtype"])
        attrs["moe_quant_algo"] = property(attrs["moe_quant_algo"])
        attrs["get_name"] = lambda self: "deepseek_v4_fp8"
        if _per_layer(patched):
            lift(text, "_EXPERTS_LAYER_RE", ns)
            attrs["_is_nvfp4_expert_layer"] = lift(
                text, "DeepseekV4FP8Config._is_nvfp4_expert_layer", ns)
        quant_config = type("DeepseekV4FP8Config", (), attrs)()
        quant_config._resolved_expert_dtype = None
        quant_config._resolved_moe_quant_algo = None
        quant_config.weight_block_size = (draft_quant or {}).get("weight_block_size")
        # As from_config keeps it (0.32.0 and later): the draft config's own `ignore`.
        ignore = (draft_quant or {}).get("ignore")
        quant_config._modelopt_ignore = tuple(
            p for p in ignore if isinstance(p, str)) if isinstance(ignore, list) else ()
        return quant_config

    make.log = log
    return make


class _Param:
    def __init__(self, name: str, calls: list[str]) -> None:
        self.name = name
        self.calls = calls

    def weight_loader(self, *args: object, **kwargs: object) -> bool:
        self.calls.append(self.name)
        return True


class _Module:
    """Stands in for torch.nn.Module: the parameters a test gives it."""

    params: dict[str, _Param] = {}

    def __init__(self) -> None:
        pass

    def named_parameters(self):
        return iter(self.params.items())


# 0.34.0 also loads every stage's WKV into one cross-layer projection
CONTEXT_WKV = "model.context_wkv_proj.weight"


class _Weight:
    """A checkpoint tensor, as far as the loader looks at one."""

    def __init__(self, dtype: str = "torch.bfloat16") -> None:
        self.dtype = dtype

    def detach(self) -> _Weight:
        return _Weight(self.dtype)


def _param_names(stages: int) -> list[str]:
    names = [CONTEXT_WKV]
    for s in range(stages):
        layer = f"model.layers.{s}"
        names += [f"{layer}.ffn.experts.routed_experts.w13_weight",
                  f"{layer}.ffn.experts.routed_experts.w2_weight",
                  f"{layer}.ffn.experts.routed_experts.w13_weight_scale",
                  f"{layer}.ffn.shared_experts.gate_up_proj.weight",
                  f"{layer}.ffn.shared_experts.down_proj.weight",
                  f"{layer}.attn.fused_wqa_wkv.weight",
                  f"{layer}.ffn.gate.weight"]
    return names


def checkpoint(stages: int = STAGES, without: tuple[str, ...] = ()) -> list[tuple[str, object]]:
    """The draft stages as a V4.1 checkpoint names them, plus a target tensor the draft skips."""
    names = ["model.layers.0.attn.wq_a.weight"]
    for s in range(stages):
        for e in range(2):
            names += [f"mtp.{s}.ffn.experts.{e}.{w}.weight" for w in ("w1", "w2", "w3")]
        names += [f"mtp.{s}.ffn.experts.0.w1.scale"]
        names += [f"mtp.{s}.ffn.shared_experts.{w}.weight" for w in ("w1", "w2", "w3")]
        names += [f"mtp.{s}.attn.wq_a.weight", f"mtp.{s}.attn.wkv.weight",
                  f"mtp.{s}.ffn.gate.weight"]
    names = [n for n in names if not any(n.startswith(w) for w in without)]
    return [(n, _Weight()) for n in names]


def _expert_mapping(model, ckpt_gate_proj_name, ckpt_down_proj_name, ckpt_up_proj_name,
                    num_experts):
    """RoutedExperts.make_expert_params_mapping's shape: (param, checkpoint, expert, shard)."""
    return [(f"experts.routed_experts.{'w2_' if shard == ckpt_down_proj_name else 'w13_'}",
             f"experts.{expert}.{shard}.", expert, shard)
            for expert in range(num_experts)
            for shard in (ckpt_gate_proj_name, ckpt_down_proj_name, ckpt_up_proj_name)]


class _Experts:
    def __init__(self, fused_shared: bool) -> None:
        self.has_fused_shared_experts = fused_shared

    def load_shared_expert_weight(self, name: str, loaded_weight: object) -> str:
        # As DeepGemmMegaMoEExperts names the shared experts it loads itself.
        part = "shared_l2_weight" if ".w2." in name else "shared_l1_weight"
        return f"{name.partition('shared_experts.')[0]}experts.{part}"


def draft_class(patched, *, fused_shared: bool = False):
    """DSparkDeepseekV4ForCausalLM of the patched release file, among stubs; ``built`` lists
    the prefixes the draft model was built under (the guard runs before)."""
    text = patched.text(DSPARK41)
    log = Logger()
    built: list[str] = []

    class DraftModel:
        def __init__(self, *, vllm_config, prefix):
            built.append(prefix)
            config = vllm_config.speculative_config.draft_model_config.hf_config
            ffn = SimpleNamespace(use_mega_moe=False, use_native_mega_moe=False,
                                  experts=_Experts(fused_shared),
                                  finalize_mega_moe_weights=lambda: None)
            self.layers = [SimpleNamespace(ffn=ffn, attn=SimpleNamespace())
                           for _ in range(config.num_nextn_predict_layers)]
            self.confidence_head = None

    def extract_layer_index(name: str) -> int:
        return int(re.search(r"layers\.(\d+)\.", name).group(1))

    ns = {
        "nn": SimpleNamespace(Module=_Module), "torch": _Torch(), "Iterable": Iterable,
        "VllmConfig": object, "re": re, "logger": log,
        "_linear_scale_param_name": lambda vllm_config, expert_dtype: "weight_scale_inv",
        "_use_sequence_parallel": lambda vllm_config: False,
        "DSparkDeepseekV4Model": DraftModel,
        "maybe_prefix": lambda prefix, name: f"{prefix}.{name}" if prefix else name,
        "ParallelLMHead": lambda *args, **kwargs: None,
        "LogitsProcessor": lambda *args, **kwargs: None,
        "fused_moe_make_expert_params_mapping": _expert_mapping,
        "make_deepseek_v4_expert_params_mapping": lambda n: _expert_mapping(
            None, "w1", "w2", "w3", n),
        "extract_layer_index": extract_layer_index,
        "DeepseekV4Model": SimpleNamespace(
            _pad_shared_expert_weight=lambda quant_config, name, weight: weight),
        "default_weight_loader": lambda param, weight: None,
        "get_tensor_model_parallel_world_size": lambda: 1,   # 0.31.0
        "get_tensor_model_parallel_rank": lambda: 0,
    }
    for name in ("_EXPERT_SCALE_RE", "_scope_draft_moe_quant_algo",
                 "_dspark_missing_expert_families"):
        lift(text, name, ns)
    if patched.since("v0.34.0"):
        # 0.34.0 loads each draft layer's WKV into one cross-layer projection too, with a
        # helper it imports from the DeepSeek-V4 draft
        v4 = patched.text("vllm/models/deepseek_v4/nvidia/dspark.py")
        for name in ("_CONTEXT_WKV_RE", "_duplicate_context_wkv_weights"):
            lift(v4, name, ns)
    cls = lift(text, "DSparkDeepseekV4ForCausalLM", ns)
    cls.log, cls.built = log, built
    return cls


def build(cls, hf_config, quant_config, prefix: str = ""):
    vllm_config = SimpleNamespace(
        speculative_config=SimpleNamespace(
            draft_model_config=SimpleNamespace(hf_config=hf_config)),
        quant_config=quant_config,
        additional_config={})   # 0.34.0: no dspark_fused_markov
    return cls(vllm_config=vllm_config, prefix=prefix)


def load(draft, weights, stages: int = STAGES):
    calls: list[str] = []
    _Module.params = {name: _Param(name, calls) for name in _param_names(stages)}
    return draft.load_weights(weights), calls


# --------------------------------------------------------------------- the quant path


def test_v41_draft_of_a_modelopt_nvfp4_target_takes_the_mxfp4_path(patched, quant_config_for):
    if not _has_v41(patched):
        return
    target = _hf_config(V41_TARGET_QUANT)
    draft_config = _hf_config(V41_TARGET_QUANT)   # the draft reads the target's checkpoint
    quant_config = quant_config_for(V41_TARGET_QUANT, target)
    cls = draft_class(patched)
    if not _per_layer(patched):
        # 0.31.0 applies moe_quant_algo to every expert layer, the mtp.* stages included.
        with pytest.raises(RuntimeError, match=r"as NVFP4 \(stages 0, 1, 2;"):
            build(cls, draft_config, quant_config)
        assert cls.built == []
        return
    build(cls, draft_config, quant_config)
    assert cls.log.lines == [STARTUP_LINE]
    assert cls.built == ["model"]
    # The release's own expert dtype line, which the recipe also looks for.
    assert quant_config_for.log.lines == ["DeepSeek V4 expert_dtype resolved to 'fp4'"]


@pytest.mark.parametrize("ignore, stages", [(["lm_head"], "0, 1, 2"), (None, "0, 1, 2"),
                                            (["lm_head", "mtp.0.*"], "1, 2")])
def test_v41_draft_refuses_nvfp4_experts(patched, quant_config_for, ignore, stages):
    if not _has_v41(patched):
        return
    quant = {k: v for k, v in V41_TARGET_QUANT.items() if k != "ignore"}
    if ignore is not None:
        quant["ignore"] = ignore
    if not _per_layer(patched):
        stages = "0, 1, 2"  # 0.31.0: every expert layer
    cls = draft_class(patched)
    with pytest.raises(RuntimeError) as info:
        build(cls, _hf_config(quant), quant_config_for(quant, _hf_config(quant)), prefix="draft")
    assert str(info.value) == (
        f"DSpark draft would build its routed experts as NVFP4 (stages {stages}; quant_config="
        "DeepseekV4FP8Config, moe_quant_algo=NVFP4), but the DeepSeek-V4.1 draft experts are "
        "MXFP4: the target's NVFP4 MoE override reached the draft's mtp.* stages.")
    assert cls.built == []  # refused before any draft layer exists
    assert cls.log.lines == [
        "DSpark draft quantization path: quant_config=DeepseekV4FP8Config, moe_quant_algo=NVFP4"]


def test_v41_draft_with_its_own_config_ignores_the_targets_moe_algo(patched, quant_config_for):
    """A draft config without the ModelOpt keys, next to an NVFP4 target: unpatched, the lazy
    read takes the target's NVFP4 and, with no `ignore` of the draft's, every stage is NVFP4."""
    if not _has_v41(patched):
        return
    own = {k: v for k, v in V41_TARGET_QUANT.items()
           if k not in ("moe_quant_algo", "ignore", "quant_algo")}
    target = _hf_config(V41_TARGET_QUANT)
    leaked = quant_config_for(own, target)
    assert leaked.moe_quant_algo == "NVFP4"   # what upstream resolves for this draft
    cls = draft_class(patched)
    build(cls, _hf_config(own), quant_config_for(own, target))
    assert cls.log.lines == [STARTUP_LINE]
    assert cls.built == ["model"]


def test_v41_draft_guard_passes_fp8_experts_and_unquantized_drafts(patched, quant_config_for):
    if not _has_v41(patched):
        return
    cls = draft_class(patched)
    fp8 = quant_config_for(V41_TARGET_QUANT, _hf_config(V41_TARGET_QUANT), expert_dtype="fp8")
    build(cls, _hf_config({"moe_quant_algo": "NVFP4"}), fp8)
    build(cls, _hf_config(None), None)
    assert cls.log.lines == [
        STARTUP_LINE, "DSpark draft quantization path: quant_config=None, moe_quant_algo="]
    assert len(cls.built) == 2


# --------------------------------------------------------------------- the expert weights


@pytest.fixture
def good_draft(patched, quant_config_for):
    if not _has_v41(patched):
        return None
    own = {k: v for k, v in V41_TARGET_QUANT.items() if k not in ("moe_quant_algo", "ignore")}
    return lambda **kw: build(draft_class(patched, **kw), _hf_config(own),
                              quant_config_for(own, _hf_config(V41_TARGET_QUANT)))


def test_v41_draft_loads_every_stage(patched, good_draft):
    if good_draft is None:
        return
    draft = good_draft()
    loaded, calls = load(draft, checkpoint())
    expected = set(_param_names(STAGES)) - (set() if patched.since("v0.34.0") else {CONTEXT_WKV})
    assert loaded == expected and sorted(set(calls)) == sorted(loaded)
    assert type(draft).log.lines[-1] == f"DSpark draft model loaded: {len(loaded)} params"


@pytest.mark.parametrize("without, missing", [
    (("mtp.1.ffn.shared_experts.",), "stage 1: shared experts (.shared_experts.)"),
    (("mtp.2.ffn.experts.",), "stage 2: routed experts (.experts.)"),
    (("mtp.0.ffn.experts.", "mtp.0.ffn.shared_experts."),
     "stage 0: routed experts (.experts.); stage 0: shared experts (.shared_experts.)"),
])
def test_v41_draft_refuses_a_stage_missing_its_experts(patched, good_draft, without, missing):
    if good_draft is None:
        return
    with pytest.raises(RuntimeError) as info:
        load(good_draft(), checkpoint(without=without))
    assert str(info.value) == (f"DSpark draft expert weights were not loaded for {missing}. "
                               "Check that the checkpoint carries the mtp.* draft stages.")


def test_v41_draft_counts_shared_experts_the_mega_moe_module_loads(patched, good_draft):
    if good_draft is None:
        return
    load_weights = ast.unparse(find(patched.text(DSPARK41),
                                    "DSparkDeepseekV4ForCausalLM.load_weights"))
    if not patched.since("v0.33.0"):  # fused shared experts from 0.33.0
        assert "has_fused_shared_experts" not in load_weights
        return
    loaded, _ = load(good_draft(fused_shared=True), checkpoint())
    assert "model.layers.2.ffn.experts.shared_l1_weight" in loaded
    assert not any(".shared_experts." in name for name in loaded)


# --------------------------------------------------------------------- the transform's own checks

V41_BEFORE = """\
logger = init_logger(__name__)


class DSparkDeepseekV4Model(nn.Module):
    def __init__(self, *, vllm_config, prefix=""):
        config = vllm_config.speculative_config.draft_model_config.hf_config
        self.num_dspark_layers = (
            getattr(config, "n_mtp_layers", None)
            or getattr(config, "num_nextn_predict_layers", None)
            or 3
        )


class DSparkDeepseekV4ForCausalLM(nn.Module):
    def __init__(self, *, vllm_config, prefix=""):
        self.config = vllm_config.speculative_config.draft_model_config.hf_config
        self.quant_config = vllm_config.quant_config
        self.model = DSparkDeepseekV4Model(vllm_config=vllm_config, prefix=prefix)

    def load_weights(self, weights):
        loaded_params = set()
        return loaded_params
"""


def _run_guards(tmp_path, text):
    target = tmp_path / DSPARK41
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    outcome = run_transform_file(REPO_ROOT / "patches" / "dspark_v41_guards.py", tmp_path, None)
    return outcome, target.read_text()


def test_v41_guards_pass_the_prefix_and_rerun_as_upstream(tmp_path):
    outcome, after = _run_guards(tmp_path, V41_BEFORE)
    assert outcome.status == "applied", outcome
    assert ("        self._verify_draft_quant_path(prefix)\n"
            "        self.model = DSparkDeepseekV4Model(") in after
    assert "    def _verify_draft_quant_path(self, prefix: str) -> None:\n" in after
    assert "self._verify_draft_expert_coverage(loaded_params)\n        return loaded_params" in after
    compile(after, DSPARK41, "exec")
    again = run_transform_file(REPO_ROOT / "patches" / "dspark_v41_guards.py", tmp_path, None)
    assert (again.status, (tmp_path / DSPARK41).read_text()) == ("upstream", after)


@pytest.mark.parametrize("old, new, says", [
    ("            or 3\n", "            or 4\n", "counting its stages"),
    ('    def __init__(self, *, vllm_config, prefix=""):\n        self.config',
     "    def __init__(self, *, vllm_config):\n        self.config", "a `prefix` parameter"),
    ("logger = init_logger(__name__)", "log = init_logger(__name__)", "logger = init_logger"),
])
def test_v41_guards_fail_where_the_guard_would_be_wrong(tmp_path, old, new, says):
    text = V41_BEFORE.replace(old, new)
    assert text != V41_BEFORE
    outcome, after = _run_guards(tmp_path, text)
    assert (outcome.status, outcome.reason) == ("failed", "anchor-missing"), outcome
    assert says in outcome.message
    assert after == text


# --------------------------------------------------------------------- nvfp4_ds_mla: upstream


def _v41_resolver(patched):
    log = Logger()
    return lift(patched.text(ATTN41), "_resolve_dsv4_kv_cache_dtype",
                {"torch": _Torch(), "logger": log}), log


def _v41_has_nvfp4_ds_mla(patched) -> bool:
    """V4.1's own nvfp4_ds_mla records from 0.31.0; 0.30.0's V4.1 knows fp8_ds_mla alone."""
    if patched.since("v0.31.0"):
        return True
    assert "nvfp4_ds_mla" not in patched.text(ATTN41)
    return False


def test_v41_resolves_nvfp4_ds_mla_itself(patched):
    """No patch touches V4.1's KV cache: its resolver keeps nvfp4_ds_mla packed in uint8 and
    writes it back onto the cache config; the compressed-cache spec has its own record."""
    if not _has_v41(patched):
        return
    assert patched.text(ATTN41) == patched.base(ATTN41)
    resolve, log = _v41_resolver(patched)
    if not _v41_has_nvfp4_ds_mla(patched):
        # 0.30.0: the fp8_ds_mla record only, as V4's resolver without stage B.
        with pytest.raises(ValueError, match="only supports fp8 kv-cache, got nvfp4_ds_mla"):
            resolve(True, "nvfp4_ds_mla", SimpleNamespace(cache_dtype="nvfp4_ds_mla"))
        fp8 = SimpleNamespace(cache_dtype="fp8")
        assert resolve(True, "fp8", fp8) == ("fp8_ds_mla", "torch.uint8")
        assert fp8.cache_dtype == "fp8_ds_mla"
        return
    cache_config = SimpleNamespace(cache_dtype="nvfp4_ds_mla")
    assert resolve(True, "nvfp4_ds_mla", cache_config) == ("nvfp4_ds_mla", "torch.uint8")
    assert cache_config.cache_dtype == "nvfp4_ds_mla"
    assert log.lines == ["Using DeepSeek's nvfp4_ds_mla KV cache format."]
    # auto follows the layer's preferred record (mega attention prefers nvfp4_ds_mla)
    auto = SimpleNamespace(cache_dtype="auto")
    assert resolve(True, "auto", auto, "nvfp4_ds_mla") == ("nvfp4_ds_mla", "torch.uint8")
    assert auto.cache_dtype == "nvfp4_ds_mla"
    # Unlike V4 with stage B, the bare `nvfp4` is not an alias, and plain rows refuse it.
    with pytest.raises(ValueError, match="only support fp8 kv-cache, got nvfp4"):
        resolve(True, "nvfp4", SimpleNamespace(cache_dtype="nvfp4"))
    with pytest.raises(ValueError, match="packed FlashMLA DeepSeek V4.1 KV cache"):
        resolve(False, "nvfp4_ds_mla", None)


def test_v41_kv_spec_stores_nvfp4_ds_mla_packed_with_its_own_record(patched):
    if not _has_v41(patched) or not _v41_has_nvfp4_ds_mla(patched):
        return
    captured = {}

    def spec(**kwargs):
        captured.update(kwargs)
        return kwargs

    ns = {"torch": _Torch(), "MLAAttentionSpec": spec, "get_kv_quant_mode": lambda dtype: dtype}
    get_spec = lift(patched.text(ATTN41), "DeepseekV4Attention.get_kv_cache_spec", ns)
    layer = SimpleNamespace(is_kv_source=True, kv_cache_dtype="nvfp4_ds_mla", head_dim=512,
                            kv_cache_torch_dtype="torch.bfloat16", compress_ratio=4,
                            kv_page_alignment=512, compressed_bytes_per_token=288)
    get_spec(layer, SimpleNamespace(cache_config=SimpleNamespace(block_size=256)))
    assert captured["dtype"] == "torch.uint8"
    assert captured["cache_dtype_str"] == "nvfp4_ds_mla"
    assert captured["alignment"] == 512
    assert captured["state_content_bytes"] == 288
    # The 288-byte NVFP4 compressed record, and the refusal off SM100 (GB10 is SM12x).
    init = ast.unparse(find(patched.text(ATTN41), "DeepseekV4Attention.__init__"))
    assert "288 if self.kv_cache_dtype == 'nvfp4_ds_mla'" in init
    assert "nvfp4_ds_mla needs the V4.1 KV records, which FlashMLA decodes only on SM100." in init
