"""DeepSeek-V4.1 DSpark: fail-closed loader guards for the draft.

``vllm/models/deepseek_v41/nvidia/dspark.py`` (from vLLM 0.30.0) loads the V4.1 draft stages
(``mtp.*``) with neither of the DeepSeek-V4 draft's guards: a draft built with NVFP4 experts, or a
stage whose expert weights never loaded, runs and drafts garbage.  Its class has the DeepSeek-V4
draft's name and anchors, so this is ``dspark_guards.py`` (reused as it is: the expert coverage
check, its call at the end of ``load_weights``) with one difference, the quant-path rule:

From 0.32.0 the V4.1 quant config decides NVFP4 per expert layer: the ``mtp.*`` stages that a
ModelOpt export lists under ``ignore`` stay MXFP4 although ``moe_quant_algo`` is ``NVFP4``, which
is the intended way to serve an NVFP4 V4.1 target.  So the guard does not refuse a declared
``NVFP4``; it asks the quant config, stage by stage, what the draft is about to build
(``_is_nvfp4_expert_layer`` on each stage's expert prefix), and refuses when any stage would be
NVFP4.  A quant config without that per-layer choice (0.30.0's and 0.31.0's) applies ``moe_quant_algo`` to
every expert layer, and the guard judges it so.  The startup line's ``moe_quant_algo`` is the
override the draft's own stages get: empty for a good draft, as on DeepSeek-V4.

The guard runs before the draft model is built and counts the stages as
``DSparkDeepseekV4Model`` does; the transform checks that count is still upstream's, else fails.
"""

from __future__ import annotations

import ast

import libcst as cst
import libcst.matchers as m

from patchkit.transform import AnchorMissingError, sibling

_V4 = sibling(__file__, "dspark_guards.py")

QUANT_PATH_METHOD = '''    def _verify_draft_quant_path(self, prefix: str) -> None:
        """Refuse to build a draft whose routed experts would load as NVFP4.

        The DeepSeek-V4.1 quant config may choose NVFP4 per expert layer (the
        mtp.* stages a ModelOpt export ignores stay MXFP4): ask it for each
        stage about to be built. One without that choice applies its
        moe_quant_algo to every expert layer.
        """
        config = self.config
        quant_config = self.quant_config
        hf_quant = getattr(config, "quantization_config", None) or {}
        if not isinstance(hf_quant, dict):
            hf_quant = hf_quant.to_dict()
        algos = {
            str(getattr(quant_config, "moe_quant_algo", None) or "").upper(),
            str(hf_quant.get("moe_quant_algo") or "").upper(),
        }
        # Counted and named as DSparkDeepseekV4Model builds its stages.
        num_stages = (
            getattr(config, "n_mtp_layers", None)
            or getattr(config, "num_nextn_predict_layers", None)
            or 3
        )
        layers = f"{prefix}.model.layers" if prefix else "model.layers"
        first = config.num_hidden_layers
        per_layer = getattr(quant_config, "_is_nvfp4_expert_layer", None)
        expert_dtype = getattr(quant_config, "expert_dtype", "fp4")
        if quant_config is None or expert_dtype != "fp4":
            nvfp4_stages = []
        elif per_layer is not None:
            nvfp4_stages = [
                stage
                for stage in range(num_stages)
                if per_layer(f"{layers}.{first + stage}.ffn.experts")
            ]
        else:
            nvfp4_stages = list(range(num_stages)) if "NVFP4" in algos else []
        # The recipe's startup signal, word for word: operators grep for it.
        # Its moe_quant_algo is the override the draft's own stages get.
        logger.info(
            "DSpark draft quantization path: quant_config=%s, moe_quant_algo=%s",
            None if quant_config is None else type(quant_config).__name__,
            "NVFP4" if nvfp4_stages else "",
        )
        if nvfp4_stages:
            raise RuntimeError(
                "DSpark draft would build its routed experts as NVFP4 "
                f"(stages {', '.join(map(str, nvfp4_stages))}; quant_config="
                f"{type(quant_config).__name__}, moe_quant_algo=NVFP4), but the "
                "DeepSeek-V4.1 draft experts are MXFP4: the target's NVFP4 MoE "
                "override reached the draft's mtp.* stages."
            )
'''


def _assigned_value(source: str, name: str) -> ast.expr:
    """The value of the one ``name = ...`` in ``source``."""
    hits = [node.value for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Assign)
            and any(ast.unparse(target) == name for target in node.targets)]
    assert len(hits) == 1, (name, len(hits))
    return hits[0]


# The guard's stage count, which must stay DSparkDeepseekV4Model's.
_STAGE_COUNT = _assigned_value("class _:\n" + QUANT_PATH_METHOD, "num_stages")

_QUANT_CALL = (
    "# Fail closed before building experts in the wrong format.\n"
    f"self.{_V4.QUANT_GUARD}(prefix)\n"
)

_NUM_STAGES = m.Assign(targets=[m.AssignTarget(
    target=m.Attribute(value=m.Name("self"), attr=m.Name("num_dspark_layers")))])


class DsparkV41LoaderGuards(_V4.DsparkLoaderGuards):
    path = "vllm/models/deepseek_v41/nvidia/dspark.py"
    quant_path_method = QUANT_PATH_METHOD
    quant_call = _QUANT_CALL

    def transform(self, module: cst.Module) -> cst.Module:
        model_init = self.scope(module, "DSparkDeepseekV4Model.__init__")
        count = self.anchor(model_init, _NUM_STAGES,
                            "`self.num_dspark_layers = ...` in DSparkDeepseekV4Model.__init__")
        upstream = _assigned_value(module.code_for_node(count), "self.num_dspark_layers")
        if ast.dump(upstream) != ast.dump(_STAGE_COUNT):
            raise AnchorMissingError(
                "anchor not found: DSparkDeepseekV4Model.__init__ counting its stages as "
                f"`{ast.unparse(_STAGE_COUNT)}` (the guard repeats it); it has "
                f"`{ast.unparse(upstream)}`")
        init = self.scope(module, f"{_V4.CLASS}.__init__")
        params = [*init.params.params, *init.params.kwonly_params]
        if "prefix" not in {param.name.value for param in params}:
            raise AnchorMissingError(f"anchor not found: a `prefix` parameter of "
                                     f"{_V4.CLASS}.__init__")
        return super().transform(module)
