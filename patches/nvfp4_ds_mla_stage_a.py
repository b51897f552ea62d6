"""nvfp4_ds_mla, stage A: a KV-cache dtype vLLM knows, stored and quantized like fp8_ds_mla.

* ``STR_DTYPE_TO_TORCH_DTYPE`` maps ``"nvfp4_ds_mla"`` to ``torch.uint8`` (next to
  ``fp8_ds_mla``);
* ``CacheDType`` lists it, so ``--kv-cache-dtype nvfp4_ds_mla`` parses and ``CacheConfig``
  accepts it (stage B writes it back onto the cache config);
* it counts as quantized wherever ``fp8_ds_mla`` does: ``is_quantized_kv_cache`` in
  ``vllm/utils/torch_utils.py``, and ``get_kv_quant_mode``, which gives it fp8_ds_mla's mode.
  The model runner asks the attention backend for the packed cache shape only when the mode is
  not ``NONE``, and the generic NVFP4 mode would size pages with the NVFP4 formula;
* the MLA check of ``VllmConfig`` lets it through: from 0.28.0 that check refuses every
  ``nvfp4*`` dtype on an MLA model (``startswith("nvfp4")``), nvfp4_ds_mla included, where
  0.27.1 refused only ``nvfp4``.

0.28.0 and 0.29.0 test ``kv_cache_dtype.startswith("nvfp4")`` (for ``nvfp4_4over6``) where
0.27.1 tested ``== "nvfp4"``, in ``get_kv_quant_mode`` and ``is_quantized_kv_cache``: the
fp8_ds_mla branch goes ahead of that test, which would otherwise give nvfp4_ds_mla the generic
NVFP4 mode, and ``is_quantized_kv_cache`` already accepts it.

From 0.30.0 upstream has all of this (``nvfp4_ds_mla`` with its own ``NVFP4_DS_MLA`` mode, and
``is_quantized_kv_cache`` accepting every ``nvfp4*`` dtype, and the MLA check sparing the
``*_ds_mla`` dtypes; in 0.33.0 ``is_quantized_kv_cache`` left ``torch_utils``): every
postcondition then holds and the patch reports ``upstream``.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from patchkit.transform import Transform

NEW = '"nvfp4_ds_mla"'
_FP8_DS_MLA = m.SimpleString('"fp8_ds_mla"')
_NEW = m.SimpleString(NEW)


def _assigned(module: cst.Module, name: str) -> cst.CSTNode:
    return Transform.anchor(module, m.Assign(targets=[m.AssignTarget(target=m.Name(name))]),
                            f"the assignment of {name}")


def _function(module: cst.Module, name: str) -> cst.FunctionDef | None:
    hits = [s for s in module.body if isinstance(s, cst.FunctionDef) and s.name.value == name]
    return hits[0] if len(hits) == 1 else None


class DtypeTable(Transform):
    path = "vllm/utils/torch_utils.py"

    def postcondition(self, module: cst.Module) -> bool:
        table = _assigned(module, "STR_DTYPE_TO_TORCH_DTYPE")
        return self.has(table, m.DictElement(key=_NEW))

    def transform(self, module: cst.Module) -> cst.Module:
        table = self.anchor(_assigned(module, "STR_DTYPE_TO_TORCH_DTYPE"), m.Dict(),
                            "the dict of STR_DTYPE_TO_TORCH_DTYPE")
        fp8 = self.anchor(table, m.DictElement(key=_FP8_DS_MLA),
                          'the "fp8_ds_mla" entry of STR_DTYPE_TO_TORCH_DTYPE')
        # Same value (torch.uint8) and layout as the fp8_ds_mla entry, right after it.
        entry = fp8.with_changes(key=cst.SimpleString(NEW))
        return _insert_after(module, table, fp8, entry, "elements")


class TorchQuantized(Transform):
    path = "vllm/utils/torch_utils.py"

    def postcondition(self, module: cst.Module) -> bool:
        func = _function(module, "is_quantized_kv_cache")
        if func is None:
            return True  # moved out of torch_utils (0.33.0); QuantMode covers it there
        return (self.has(func, _NEW) or self.has(func, m.Call(
            func=m.Attribute(attr=m.Name("startswith")), args=[m.Arg(m.SimpleString('"nvfp4"'))])))

    def transform(self, module: cst.Module) -> cst.Module:
        func = self.scope(module, "is_quantized_kv_cache")
        test = self.anchor(func, m.Comparison(
            left=m.Name("kv_cache_dtype"),
            comparisons=[m.ComparisonTarget(m.Equal(), m.SimpleString('"nvfp4"'))]),
            'kv_cache_dtype == "nvfp4" in is_quantized_kv_cache')
        new = cst.parse_expression('kv_cache_dtype in ("nvfp4", "nvfp4_ds_mla")')
        return module.deep_replace(test, new)


class CacheDTypes(Transform):
    path = "vllm/config/cache.py"

    def postcondition(self, module: cst.Module) -> bool:
        return self.has(_assigned(module, "CacheDType"), _NEW)

    def transform(self, module: cst.Module) -> cst.Module:
        literal = self.anchor(_assigned(module, "CacheDType"), m.Subscript(),
                              "the Literal[...] of CacheDType")
        fp8 = self.anchor(literal, m.SubscriptElement(slice=m.Index(_FP8_DS_MLA)),
                          '"fp8_ds_mla" in CacheDType')
        entry = fp8.with_changes(slice=cst.Index(cst.SimpleString(NEW)))
        return _insert_after(module, literal, fp8, entry, "slice")


_MODE_SOURCE = '''def _():
    if kv_cache_dtype == "nvfp4_ds_mla":
        # Quantized like fp8_ds_mla, and not the generic NVFP4 mode (so ahead of
        # the nvfp4 test): the DeepSeek-V4 specs size its pages, and the runner
        # only asks the backend for the packed shape when the mode is not NONE.
        return KVQuantMode.FP8_PER_TENSOR
'''

# `kv_cache_dtype == "nvfp4"` (0.27.1) or `kv_cache_dtype.startswith("nvfp4")` (0.28.0, 0.29.0)
_NVFP4_TEST = (
    m.Comparison(left=m.Name("kv_cache_dtype"),
                 comparisons=[m.ComparisonTarget(m.Equal(), m.SimpleString('"nvfp4"'))])
    | m.Call(func=m.Attribute(value=m.Name("kv_cache_dtype"), attr=m.Name("startswith")),
             args=[m.Arg(m.SimpleString('"nvfp4"'))]))


class QuantMode(Transform):
    path = "vllm/v1/kv_cache_interface.py"

    def postcondition(self, module: cst.Module) -> bool:
        return self.has(self.scope(module, "get_kv_quant_mode"), _NEW)

    def transform(self, module: cst.Module) -> cst.Module:
        func = self.scope(module, "get_kv_quant_mode")
        nvfp4 = self.anchor(func, m.If(test=_NVFP4_TEST),
                            "the nvfp4 test (`== \"nvfp4\"` or `.startswith(\"nvfp4\")`) "
                            "in get_kv_quant_mode")
        branch = cst.parse_module(_MODE_SOURCE).body[0].body.body[0]
        return _insert_before(module, func.body, nvfp4, branch, "body")


_STARTSWITH_NVFP4 = m.Call(func=m.Attribute(attr=m.Name("startswith")),
                           args=[m.Arg(m.SimpleString('"nvfp4"'))])


class MlaCheck(Transform):
    """VllmConfig refuses an nvfp4 KV cache on MLA models: from 0.28.0 by prefix, which takes
    nvfp4_ds_mla too; 0.30.0 spares the ``*_ds_mla`` dtypes itself."""

    path = "vllm/config/vllm.py"
    _SCOPE = "VllmConfig.validate_nvfp4_kv_cache_with_mla"

    def postcondition(self, module: cst.Module) -> bool:
        func = self.scope(module, self._SCOPE)
        return not self.has(func, _STARTSWITH_NVFP4) or self.has(
            func, m.SimpleString('"_ds_mla"') | _NEW)

    def transform(self, module: cst.Module) -> cst.Module:
        func = self.scope(module, self._SCOPE)
        test = self.anchor(func, _STARTSWITH_NVFP4,
                           'cache_dtype.startswith("nvfp4") in ' + self._SCOPE)
        spared = cst.BooleanOperation(
            left=test, operator=cst.And(),
            right=cst.Comparison(left=test.func.value, comparisons=[
                cst.ComparisonTarget(cst.NotEqual(), cst.SimpleString(NEW))]))
        return module.deep_replace(test, spared)


def _insert_after(module: cst.Module, owner: cst.CSTNode, anchor: cst.CSTNode,
                  new: cst.CSTNode, field: str, offset: int = 1) -> cst.Module:
    items = list(getattr(owner, field))
    at = next(i for i, item in enumerate(items) if item is anchor)
    items.insert(at + offset, new)
    return module.deep_replace(owner, owner.with_changes(**{field: items}))


def _insert_before(module: cst.Module, owner: cst.CSTNode, anchor: cst.CSTNode,
                   new: cst.CSTNode, field: str) -> cst.Module:
    return _insert_after(module, owner, anchor, new, field, offset=0)
