"""DeepSeek-V4 DSpark: fail-closed loader guards for the draft.

Two ways the draft used to go wrong silently, each now a RuntimeError with a message that names
the cause:

* ``_verify_draft_quant_path``, called in ``DSparkDeepseekV4ForCausalLM.__init__`` just before
  the draft layers are built: logs the recipe's startup signal through the module's vLLM logger,
  ``DSpark draft quantization path: quant_config=<class name>, moe_quant_algo=<algo>``, and
  refuses ``moe_quant_algo == "NVFP4"``, either declared by the draft's config or resolved by its
  quant config.  The DeepSeek-V4 draft experts are MXFP4; built as NVFP4 they load wrong scales
  and draft garbage (acceptance collapses, nothing is logged).
* ``_verify_draft_expert_coverage``, called at the end of ``load_weights``: every draft stage must
  have loaded both its routed (``.experts.``) and shared (``.shared_experts.``) expert weights,
  else the error names each missing family per stage.  A stage without them would run with
  uninitialized experts.

The pure check lives in a module-level function, ``_dspark_missing_expert_families``.  From
0.33.0 the mega-MoE expert module can load the shared experts itself, under
``...experts.shared_*`` names; those count as shared.

Anchors: the module's ``logger = init_logger(...)``, the ``self.model = ...`` assignment at the
top level of ``DSparkDeepseekV4ForCausalLM.__init__`` and the final ``return loaded_params`` of
``DSparkDeepseekV4ForCausalLM.load_weights``; the methods are appended to the class.
``dspark_v41_guards.py`` reuses this transform for DeepSeek-V4.1's draft, whose class has the same
name and anchors, with its own quant-path method.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from patchkit.transform import AnchorMissingError, Transform

CLASS = "DSparkDeepseekV4ForCausalLM"
QUANT_GUARD = "_verify_draft_quant_path"
COVERAGE_GUARD = "_verify_draft_expert_coverage"
COVERAGE_CHECK = "_dspark_missing_expert_families"

_FUNCTION_SOURCE = '''_ = None


def _dspark_missing_expert_families(
    loaded_params: Iterable[str], num_stages: int
) -> list[str]:
    """Name each (stage, expert family) of the draft that loaded no weight.

    Shared experts fused into the routed-expert module (mega MoE) load as
    ``...experts.shared_*`` and count as shared.
    """
    missing = []
    for stage in range(num_stages):
        prefix = f"model.layers.{stage}."
        routed = shared = False
        for name in loaded_params:
            if not name.startswith(prefix):
                continue
            if ".shared_experts." in name or ".experts.shared_" in name:
                shared = True
            elif ".experts." in name:
                routed = True
        if not routed:
            missing.append(f"stage {stage}: routed experts (.experts.)")
        if not shared:
            missing.append(f"stage {stage}: shared experts (.shared_experts.)")
    return missing
'''

# The methods appended to the class, each indented as in a class body.
QUANT_PATH_METHOD = '''    def _verify_draft_quant_path(self) -> None:
        """Refuse to build a draft whose routed experts would load as NVFP4."""
        hf_quant = getattr(self.config, "quantization_config", None) or {}
        if not isinstance(hf_quant, dict):
            hf_quant = hf_quant.to_dict()
        method = None if self.quant_config is None else self.quant_config.get_name()
        resolved = getattr(self.quant_config, "moe_quant_algo", None)
        declared = hf_quant.get("moe_quant_algo")
        # The recipe's startup signal, word for word: operators grep for it.
        logger.info(
            "DSpark draft quantization path: quant_config=%s, moe_quant_algo=%s",
            None if self.quant_config is None else type(self.quant_config).__name__,
            resolved or "",
        )
        if any(str(algo or "").upper() == "NVFP4" for algo in (resolved, declared)):
            raise RuntimeError(
                "DSpark draft would build its routed experts as NVFP4 "
                f"(quantization={method}, moe_quant_algo=NVFP4), but the "
                "DeepSeek-V4 draft experts are MXFP4: the draft was given the "
                "target's quantization config instead of its own."
            )
'''

COVERAGE_METHOD = '''    def _verify_draft_expert_coverage(self, loaded_params: set[str]) -> None:
        """Refuse a draft stage that loaded no routed or no shared experts."""
        missing = _dspark_missing_expert_families(
            loaded_params, len(self.model.layers)
        )
        if missing:
            raise RuntimeError(
                "DSpark draft expert weights were not loaded for "
                + "; ".join(missing)
                + ". Check that the checkpoint carries the mtp.* draft stages."
            )
'''

_QUANT_CALL = (
    "# Fail closed before building experts in the wrong format.\n"
    f"self.{QUANT_GUARD}()\n"
)
_COVERAGE_CALL = f"self.{COVERAGE_GUARD}(loaded_params)\n"

_SELF_MODEL_ASSIGN = m.SimpleStatementLine(body=[m.Assign(
    targets=[m.AssignTarget(target=m.Attribute(value=m.Name("self"), attr=m.Name("model")))])])
_RETURN_LOADED = m.SimpleStatementLine(body=[m.Return(value=m.Name("loaded_params"))])
_MODULE_LOGGER = m.Assign(targets=[m.AssignTarget(target=m.Name("logger"))],
                          value=m.Call(func=m.Name("init_logger")))


def _calls_self(name: str) -> m.BaseMatcherNode:
    return m.Call(func=m.Attribute(value=m.Name("self"), attr=m.Name(name)))


class DsparkLoaderGuards(Transform):
    path = "vllm/models/deepseek_v4/nvidia/dspark.py"
    # What a model with another quant-path rule (DeepSeek-V4.1) replaces.
    quant_path_method = QUANT_PATH_METHOD
    quant_call = _QUANT_CALL

    def postcondition(self, module: cst.Module) -> bool:
        init = self.scope(module, f"{CLASS}.__init__")
        load = self.scope(module, f"{CLASS}.load_weights")
        cls = self.scope(module, CLASS)
        methods = {s.name.value for s in _body(cls) if isinstance(s, cst.FunctionDef)}
        return (
            any(isinstance(s, cst.FunctionDef) and s.name.value == COVERAGE_CHECK
                for s in module.body)
            and {QUANT_GUARD, COVERAGE_GUARD} <= methods
            and self.has(init, _calls_self(QUANT_GUARD))
            and self.has(load, _calls_self(COVERAGE_GUARD))
        )

    def transform(self, module: cst.Module) -> cst.Module:
        # The quant-path guard logs through the module's own vLLM logger.
        self.anchor(module, _MODULE_LOGGER, f"`logger = init_logger(...)` in {self.path}")
        init = self.scope(module, f"{CLASS}.__init__")
        module = self._insert_before(module, init, _SELF_MODEL_ASSIGN, self.quant_call,
                                     f"`self.model = ...` in {CLASS}.__init__")
        load = self.scope(module, f"{CLASS}.load_weights")
        module = self._insert_before(module, load, _RETURN_LOADED, _COVERAGE_CALL,
                                     f"`return loaded_params` in {CLASS}.load_weights")

        cls = self.scope(module, CLASS)
        methods = [method.with_changes(leading_lines=[cst.EmptyLine(indent=False)])
                   for method in _body(cst.parse_module(
                       "class _:\n" + self.quant_path_method + "\n" + COVERAGE_METHOD
                   ).body[0])]
        new_cls = cls.with_changes(body=cls.body.with_changes(
            body=list(cls.body.body) + methods))
        module = module.deep_replace(cls, new_cls)

        cls = self.scope(module, CLASS)
        top = list(module.body)
        index = next(i for i, s in enumerate(top) if s is cls)
        function = list(cst.parse_module(_FUNCTION_SOURCE).body[1:])
        return module.with_changes(body=top[:index] + function + top[index:])

    def _insert_before(self, module: cst.Module, func: cst.CSTNode,
                       matcher: m.BaseMatcherNode, stmt: str, what: str) -> cst.Module:
        line = self.anchor(func, matcher, what)
        block = func.body
        body = list(block.body)
        at = next((i for i, s in enumerate(body) if s is line), None)
        if at is None:
            # Nested, it would run on one path only; a guard must run on every build.
            raise AnchorMissingError(f"anchor not found: {what}, at the function's top level")
        body.insert(at, cst.parse_statement(stmt))
        return module.deep_replace(block, block.with_changes(body=body))


def _body(node: cst.CSTNode) -> list[cst.CSTNode]:
    return list(node.body.body)
