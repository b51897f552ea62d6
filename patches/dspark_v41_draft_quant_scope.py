"""DeepSeek-V4.1 DSpark: resolve the draft's MoE quant override from the draft's config.

``vllm/models/deepseek_v41/`` (from vLLM 0.30.0) has its own ``DeepseekV4FP8Config`` with the
same lazy ``moe_quant_algo`` as DeepSeek-V4's: read on first use from the *current* model config,
which while ``load_dspark_model`` builds the draft is still the target's.  From 0.32.0 the V4.1
config keeps the experts a ModelOpt export lists under ``ignore`` (the bundled ``mtp.*`` stages)
in MXFP4, but that list is the draft's and the algorithm is still the target's: a draft whose own
config declares no NVFP4 override (a draft config without the ModelOpt keys, no ``ignore``) is
built with NVFP4 experts all the same.  This is the DeepSeek-V4 fix
(``dspark_draft_quant_scope.py``, reused as it is) on the V4.1 draft, whose class has the same
name and the same ``self.quant_config = ...`` anchor.  When the draft reads the target's own
checkpoint config, both configs say the same and nothing changes.
"""

from __future__ import annotations

from patchkit.transform import sibling

_V4 = sibling(__file__, "dspark_draft_quant_scope.py")


class ScopeDraftMoeQuantAlgoV41(_V4.ScopeDraftMoeQuantAlgo):
    path = "vllm/models/deepseek_v41/nvidia/dspark.py"
