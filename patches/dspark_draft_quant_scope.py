"""DeepSeek-V4 DSpark: resolve the draft's MoE quant override from the draft's config.

``DeepseekV4FP8Config`` decides whether routed experts are NVFP4 or MXFP4 from
``moe_quant_algo``, which it reads lazily from the *current* model config and memoizes.  While
``load_dspark_model`` builds the draft, the current config keeps the target's ``model_config``
(DSpark needs it for the target-layer metadata), so an NVFP4 target makes the MXFP4 draft build
NVFP4 experts even after the draft's own ``quantization_config`` was normalized (patch
``draft-quant-normalization``).  This resolves the draft quant config's override from the
draft's own ``hf_config`` before any draft layer exists.  It never overrides a value that was
already resolved, so a quant config shared with the target is left alone (the loader guard then
refuses it).  Same lazy read upstream in every release checked (0.27.1 to 0.33.0).

Anchors: ``DSparkDeepseekV4ForCausalLM.__init__`` and its ``self.quant_config = ...``
assignment; the helper goes in front of the class.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from patchkit.transform import AnchorMissingError, Transform

HELPER = "_scope_draft_moe_quant_algo"
CLASS = "DSparkDeepseekV4ForCausalLM"

_HELPER_SOURCE = '''_ = None


def _scope_draft_moe_quant_algo(quant_config, draft_hf_config) -> None:
    """Resolve the draft quant config's moe_quant_algo from the draft's config.

    DeepseekV4FP8Config reads moe_quant_algo from the current model config on
    first use. While the draft is built that is still the target's, so an NVFP4
    target would make the MXFP4 draft build NVFP4 experts. A value resolved
    already is kept: the draft quant path guard judges it.
    """
    if getattr(quant_config, "_resolved_moe_quant_algo", "") is not None:
        return
    quant_cfg = getattr(draft_hf_config, "quantization_config", None) or {}
    if not isinstance(quant_cfg, dict):
        quant_cfg = quant_cfg.to_dict()
    algo = str(quant_cfg.get("moe_quant_algo") or "").upper()
    quant_config._resolved_moe_quant_algo = algo
'''

_CALL_SOURCE = (
    "# Before any draft layer asks its quant config for the expert format.\n"
    f"{HELPER}(self.quant_config, self.config)\n"
)

_SELF_QUANT_CONFIG = m.Attribute(value=m.Name("self"), attr=m.Name("quant_config"))
_QUANT_ASSIGN = m.SimpleStatementLine(
    body=[m.Assign(targets=[m.AssignTarget(target=_SELF_QUANT_CONFIG)])])


class ScopeDraftMoeQuantAlgo(Transform):
    path = "vllm/models/deepseek_v4/nvidia/dspark.py"

    def postcondition(self, module: cst.Module) -> bool:
        init = self.scope(module, f"{CLASS}.__init__")
        defined = any(isinstance(s, cst.FunctionDef) and s.name.value == HELPER
                      for s in module.body)
        return defined and self.has(init, m.Call(func=m.Name(HELPER)))

    def transform(self, module: cst.Module) -> cst.Module:
        init = self.scope(module, f"{CLASS}.__init__")
        line = self.anchor(init, _QUANT_ASSIGN, f"`self.quant_config = ...` in {CLASS}.__init__")
        block = init.body
        body = list(block.body)
        if not any(s is line for s in body):
            # Nested, it would run conditionally; the fix must run on every build.
            raise AnchorMissingError("anchor not found: `self.quant_config = ...` at the top "
                                     f"level of {CLASS}.__init__")
        at = next(i for i, s in enumerate(body) if s is line)
        body.insert(at + 1, cst.parse_statement(_CALL_SOURCE))
        module = module.deep_replace(block, block.with_changes(body=body))

        cls = self.scope(module, CLASS)
        top = list(module.body)
        index = next(i for i, s in enumerate(top) if s is cls)
        helper = list(cst.parse_module(_HELPER_SOURCE).body[1:])
        return module.with_changes(body=top[:index] + helper + top[index:])
