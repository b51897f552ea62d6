"""DSpark: build the draft with the speculative config's ``moe_backend``.

``SpeculativeConfig.moe_backend`` ("MoE backend to use for the draft model") is honoured by the
EAGLE-style loaders but not by ``load_dspark_model``, which hands the draft the target's
``--moe-backend``.  With an NVFP4 target on ``flashinfer_b12x`` (an NVFP4-only MoE kernel) the
MXFP4 DeepSeek-V4 draft then asks the MXFP4 oracle for ``flashinfer_b12x`` and cannot be built.
This overlays the draft's ``moe_backend`` on the draft ``VllmConfig`` right after it is made,
before the draft quant config is set (``replace`` re-runs the config's post-init, which would
reset it).  Unchanged upstream from 0.27.1 to 0.33.0; 0.33.0 has
``SpeculativeConfig.apply_draft_overrides`` for the EAGLE loader, and a loader that calls it
counts as upstream here.

Anchor: the top-level ``draft_vllm_config = replace(...)`` statement of ``load_dspark_model``.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from patchkit.transform import AnchorMissingError, Transform

FUNCTION = "load_dspark_model"

_OVERRIDE_SOURCE = '''def _():
    # The draft's experts may need another MoE kernel than the target's: an
    # MXFP4 draft cannot run an NVFP4-only backend chosen for the target.
    if speculative_config.moe_backend is not None:
        draft_vllm_config = replace(
            draft_vllm_config,
            kernel_config=replace(
                draft_vllm_config.kernel_config,
                moe_backend=speculative_config.moe_backend,
            ),
        )
'''

_DRAFT_CONFIG = m.SimpleStatementLine(body=[m.Assign(
    targets=[m.AssignTarget(target=m.Name("draft_vllm_config"))],
    value=m.Call(func=m.Name("replace")))])


class DsparkDraftMoeBackend(Transform):
    path = "vllm/v1/worker/gpu/spec_decode/dspark/utils.py"

    def postcondition(self, module: cst.Module) -> bool:
        func = self.scope(module, FUNCTION)
        return (self.has(func, m.Arg(keyword=m.Name("moe_backend")))
                or self.has(func, m.Call(func=m.Attribute(attr=m.Name("apply_draft_overrides")))))

    def transform(self, module: cst.Module) -> cst.Module:
        func = self.scope(module, FUNCTION)
        line = self.anchor(func, _DRAFT_CONFIG, f"`draft_vllm_config = replace(...)` in {FUNCTION}")
        block = func.body
        body = list(block.body)
        at = next((i for i, s in enumerate(body) if s is line), None)
        if at is None:
            raise AnchorMissingError(f"anchor not found: `draft_vllm_config = replace(...)` at "
                                     f"the top level of {FUNCTION}")
        override = cst.parse_module(_OVERRIDE_SOURCE).body[0].body.body[0]
        body.insert(at + 1, override)
        return module.deep_replace(block, block.with_changes(body=body))
