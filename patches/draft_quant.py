"""DeepSeek-V4 DSpark: build the draft under its own quantization config.

DeepSeek-V4 ships its DSpark draft stages (``mtp.*``) inside the target checkpoint, so the draft
``ModelConfig`` reads the target's ``config.json``: its ``quantization_config`` and, with no
draft ``model``, the target's quantization method.  For a ModelOpt NVFP4 target that hands the
draft the NVFP4 method and ModelOpt keys that describe the target's layers only, while the draft
weights keep the native DeepSeek-V4 layout (FP8 linears, MXFP4 experts).  The draft then builds
NVFP4 experts and fails to load, or loads garbage.  Upstream tracked the method half of this in
https://github.com/vllm-project/vllm/pull/49133 (closed) and
https://github.com/vllm-project/vllm/pull/51835 (closed); neither change is in a release.

The edit, in the DeepSeek-V4 branch of ``SpeculativeConfig.__post_init__`` (just before it
re-inspects the draft architecture, so the architecture info sees the normalized config): a
module-level helper deep-copies the draft's ``quantization_config``, drops the target-only
ModelOpt keys from the copy, and makes the draft's method ``deepseek_v4_fp8``.  The target's
config object is never touched.

Anchors, chosen to survive the branch's rewrites between releases: the assignment of an
``architectures`` list naming ``"DSparkDraftModel"`` inside ``SpeculativeConfig.__post_init__``,
and the ``self.update_arch_()`` call that ends the same block.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from patchkit.transform import AnchorMissingError, Transform

HELPER = "_normalize_dsv4_dspark_draft_quant"

# Parsed behind a throwaway statement so the leading comment stays with the first statement
# instead of becoming the module header.
_HELPER_SOURCE = '''_ = None


# Keys a ModelOpt export adds to the target's quantization_config. They describe
# the target's own (NVFP4) layers; the DeepSeek-V4 DSpark draft stages in the
# same checkpoint keep the native FP8 + MXFP4 layout and must not see them.
_DSPARK_TARGET_ONLY_QUANT_KEYS = (
    "moe_quant_algo",
    "quantized_layers",
    "ignore",
    "modules_to_not_convert",
)


def _normalize_dsv4_dspark_draft_quant(
    draft_model_config: ModelConfig,
) -> str | None:
    """Give a DeepSeek-V4 DSpark draft its own quantization config.

    The draft config is read from the target checkpoint, so it carries the
    target's quantization_config and method. Work on a deep copy (the target's
    dict is never mutated), drop the target-only ModelOpt keys from it, and
    build the draft as deepseek_v4_fp8: neither plain fp8 (which expects FP8
    expert scales) nor the target's NVFP4 method. Returns the draft's method.
    """
    hf_config = draft_model_config.hf_config
    quant_cfg = getattr(hf_config, "quantization_config", None)
    if getattr(hf_config, "model_type", None) != "deepseek_v4" or quant_cfg is None:
        return draft_model_config.quantization
    if not isinstance(quant_cfg, dict):
        quant_cfg = quant_cfg.to_dict()
    draft_quant_cfg = copy.deepcopy(quant_cfg)
    for key in _DSPARK_TARGET_ONLY_QUANT_KEYS:
        draft_quant_cfg.pop(key, None)
    hf_config.quantization_config = draft_quant_cfg
    draft_model_config.quantization = "deepseek_v4_fp8"
    return draft_model_config.quantization
'''

_CALL_SOURCE = (
    "# The draft shares the target checkpoint, not its quantization.\n"
    f"self.quantization = {HELPER}(\n"
    "    self.draft_model_config\n"
    ")\n"
)

_DSPARK_ARCH = m.SimpleString('"DSparkDraftModel"') | m.SimpleString("'DSparkDraftModel'")


def _names_dspark_arch(node: cst.CSTNode) -> bool:
    return bool(m.findall(node, _DSPARK_ARCH))


_ARCH_ASSIGN = m.Assign(
    targets=[m.AssignTarget(target=m.Attribute(attr=m.Name("architectures")))],
    value=m.List() & m.MatchIfTrue(_names_dspark_arch),
)

_UPDATE_ARCH = m.SimpleStatementLine(
    body=[m.Expr(m.Call(func=m.Attribute(value=m.Name("self"), attr=m.Name("update_arch_"))))]
)


class NormalizeDsparkDraftQuant(Transform):
    path = "vllm/config/speculative.py"

    def postcondition(self, module: cst.Module) -> bool:
        post_init = self.scope(module, "SpeculativeConfig.__post_init__")
        defined = any(isinstance(s, cst.FunctionDef) and s.name.value == HELPER
                      for s in module.body)
        called = self.has(post_init, m.Call(func=m.Name(HELPER)))
        return defined and called

    # where the DSpark branch is, how it re-inspects the draft, and the call that goes before
    # that (the 0.34 sibling, a subclass, names its own)
    branch_scope = "SpeculativeConfig.__post_init__"
    update_arch = _UPDATE_ARCH
    update_call = "self.update_arch_()"
    call_source = _CALL_SOURCE

    def transform(self, module: cst.Module) -> cst.Module:
        module = self._call_in_branch(module)
        cls = self.scope(module, "SpeculativeConfig")
        helper = list(cst.parse_module(_HELPER_SOURCE).body[1:])
        top = list(module.body)
        index = next(i for i, s in enumerate(top) if s is cls)
        return module.with_changes(body=top[:index] + helper + top[index:])

    def _call_in_branch(self, module: cst.Module) -> cst.Module:
        """The helper's call, right before the one re-inspection after the DSpark architecture
        assignment, in the block that holds that assignment."""
        scope = self.scope(module, self.branch_scope)
        assign = self.anchor(scope, _ARCH_ASSIGN,
                             'the DSpark draft `architectures = ["DSparkDraftModel"]` assignment')
        block = self._block_holding(scope, assign)
        body = list(block.body)
        at = next(i for i, s in enumerate(body)
                  if isinstance(s, cst.SimpleStatementLine) and assign in s.body)
        later = [i for i in range(at + 1, len(body)) if m.matches(body[i], self.update_arch)]
        if len(later) != 1:
            raise AnchorMissingError(
                f"anchor not found: one {self.update_call} after the DSpark architecture "
                f"assignment (found {len(later)})")
        body.insert(later[0], cst.parse_statement(self.call_source))
        return module.deep_replace(block, block.with_changes(body=body))

    def _block_holding(self, scope: cst.CSTNode, assign: cst.CSTNode) -> cst.IndentedBlock:
        blocks = [b for b in self.find(scope, m.IndentedBlock())
                  if any(isinstance(s, cst.SimpleStatementLine) and assign in s.body
                         for s in b.body)]
        if len(blocks) != 1:
            raise AnchorMissingError("anchor not found: the block of the DSpark branch")
        return blocks[0]
