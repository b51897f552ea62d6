"""DeepSeek-V4 DSpark on vLLM 0.34 and later: build the draft under its own quantization config.

The bug and the fix are ``draft_quant.py``'s.  vLLM 0.34.0 moved the building of a DSpark
draft's config out of ``SpeculativeConfig.__post_init__`` into a speculator config class:
``DSparkSpeculatorConfig.adapt_draft_model_config`` in
``vllm/v1/worker/gpu/spec_decode/dspark/config.py``.  For a draft that is not self-contained (the
DeepSeek-V4 and V4.1 stages that ship inside the target checkpoint) it sets the draft's
architecture, then copies the target's quantization method onto the draft
(``draft.quantization = target.quantization``) and re-inspects the architecture with
``spec.update_arch_()``.  ``default_model`` has already set ``spec.quantization`` to the
target's.  A ModelOpt NVFP4 target so still hands its draft the NVFP4 method and the ModelOpt
keys that describe the target's own layers.

The edit: the same module-level helper as ``draft_quant.py`` (reused as it is), called in that
branch just before ``spec.update_arch_()``, so the architecture info sees the normalized config
and ``spec.quantization`` names the draft's own method, as the helper's call did in
``__post_init__`` before 0.34.  The helper's argument type is imported for type checking only,
as the module imports its other config types.

Anchors: the ``architectures`` assignment naming ``"DSparkDraftModel"`` inside
``DSparkSpeculatorConfig.adapt_draft_model_config``, the one ``spec.update_arch_()`` after it in
the same block, the ``from typing import ...`` line (``import copy`` goes before it) and the
``from vllm.config import ...`` under ``if TYPE_CHECKING:``.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from patchkit.transform import sibling

_V033 = sibling(__file__, "draft_quant.py")
HELPER = _V033.HELPER
SCOPE = "DSparkSpeculatorConfig.adapt_draft_model_config"

# The module has no `from __future__ import annotations`: the annotation is a string, resolved
# by type checkers through the TYPE_CHECKING import this transform adds.
_HELPER_SOURCE = _V033._HELPER_SOURCE.replace("draft_model_config: ModelConfig",
                                              'draft_model_config: "ModelConfig"')
assert _HELPER_SOURCE != _V033._HELPER_SOURCE, "draft_quant.py's helper signature changed"

_CALL_SOURCE = (
    "# The draft shares the target checkpoint, not its quantization.\n"
    f"spec.quantization = {HELPER}(draft)\n"
)

_UPDATE_ARCH = m.SimpleStatementLine(
    body=[m.Expr(m.Call(func=m.Attribute(value=m.Name("spec"), attr=m.Name("update_arch_"))))]
)
_IMPORT_COPY = m.SimpleStatementLine(body=[m.Import(names=[m.ImportAlias(name=m.Name("copy"))])])
_FROM_TYPING = m.SimpleStatementLine(body=[m.ImportFrom(module=m.Name("typing"))])
_TYPE_CHECKING_IF = m.If(test=m.Name("TYPE_CHECKING"))
_FROM_VLLM_CONFIG = m.ImportFrom(module=m.Attribute(value=m.Name("vllm"), attr=m.Name("config")))


class NormalizeDsparkDraftQuantV034(_V033.NormalizeDsparkDraftQuant):
    path = "vllm/v1/worker/gpu/spec_decode/dspark/config.py"
    branch_scope = SCOPE
    update_arch = _UPDATE_ARCH
    update_call = "spec.update_arch_()"
    call_source = _CALL_SOURCE

    def postcondition(self, module: cst.Module) -> bool:
        adapt = self.scope(module, SCOPE)
        defined = any(isinstance(s, cst.FunctionDef) and s.name.value == HELPER
                      for s in module.body)
        return defined and self.has(adapt, m.Call(func=m.Name(HELPER)))

    def transform(self, module: cst.Module) -> cst.Module:
        module = self._call_in_branch(module)
        module = self._import_model_config(module)
        cls = self.scope(module, "DSparkSpeculatorConfig")
        top = list(module.body)
        index = next(i for i, s in enumerate(top) if s is cls)
        top[index:index] = list(cst.parse_module(_HELPER_SOURCE).body[1:])
        if not any(m.matches(s, _IMPORT_COPY) for s in top):
            typing_at = top.index(self.anchor(module, _FROM_TYPING, "the `from typing import` line"))
            top.insert(typing_at, cst.parse_statement("import copy\n"))
        return module.with_changes(body=top)

    def _import_model_config(self, module: cst.Module) -> cst.Module:
        guard = self.anchor(module, _TYPE_CHECKING_IF, "the `if TYPE_CHECKING:` block")
        imp = self.anchor(guard, _FROM_VLLM_CONFIG, "`from vllm.config import ...` under "
                                                    "TYPE_CHECKING")
        assert isinstance(imp, cst.ImportFrom) and not isinstance(imp.names, cst.ImportStar)
        names = [a.name.value for a in imp.names if isinstance(a.name, cst.Name)]
        if "ModelConfig" in names:
            return module
        aliases = [cst.ImportAlias(name=cst.Name(n)) for n in sorted({*names, "ModelConfig"})]
        return module.deep_replace(imp, imp.with_changes(names=aliases))
