"""Each transform under patches/, before and after: small snippets with trailing comments and odd
formatting, the failure modes (anchor missing, anchor twice), a second run, and the real file."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path

import pytest

from patchkit import manifest
from patchkit.transform import run_transform_file

from testing import REPO_ROOT

from testing.releases import STATUSES

PATCHES = REPO_ROOT / "patches"
SPEC = "vllm/config/speculative.py"
DSPARK = "vllm/models/deepseek_v4/nvidia/dspark.py"
DSPARK41 = "vllm/models/deepseek_v41/nvidia/dspark.py"
LOADER = "vllm/v1/worker/gpu/spec_decode/dspark/utils.py"
DSPARK_CONFIG = "vllm/v1/worker/gpu/spec_decode/dspark/config.py"


def _module(name: str):
    spec = importlib.util.spec_from_file_location(f"_patch_{name}", PATCHES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _inserted(source: str) -> str:
    """A transform's source template without the throwaway statement it is parsed behind."""
    return source.split("\n", 1)[1].lstrip("\n")


def run(name: str, root: Path, rel: str, text: str):
    target = root / rel
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(textwrap.dedent(text))
    outcome = run_transform_file(PATCHES / f"{name}.py", root, None)
    return outcome, target.read_text()


def rerun_is_upstream(name: str, root: Path, rel: str) -> None:
    before = (root / rel).read_text()
    outcome = run_transform_file(PATCHES / f"{name}.py", root, None)
    assert (outcome.status, outcome.reason) == ("upstream", None), outcome
    assert (root / rel).read_text() == before


# --------------------------------------------------------------------- draft_quant

SPEC_BEFORE = """\
import copy

from vllm.config.model import ModelConfig

DraftSampleMethod = Literal["greedy", "probabilistic"]


@config
class SpeculativeConfig:
    def __post_init__(self):
        if self.method == "dspark" and (  # not the Qwen3 drafts
            "Qwen3DSparkModel" not in self.draft_model_config.architectures
        ):
            # DeepSeek-V4 DSpark reuses the full DeepSeek-V4 config
            self.draft_model_config.hf_config.model_type = "deepseek_v4"
            self.draft_model_config.hf_config.architectures = ['DSparkDraftModel']  # one arch
            self.update_arch_()   # re-inspect
        elif self.method == "eagle": self.update_arch_()
"""

SPEC_CALL = """\
            # The draft shares the target checkpoint, not its quantization.
            self.quantization = _normalize_dsv4_dspark_draft_quant(
                self.draft_model_config
            )
"""


def _spec_after(before: str, anchor_line: str) -> str:
    helper = _inserted(_module("draft_quant")._HELPER_SOURCE)
    after = before.replace(anchor_line, anchor_line + SPEC_CALL)
    return after.replace("\n\n\n@config", "\n\n\n" + helper + "\n\n@config")


def test_draft_quant_inserts_helper_and_call(tmp_path):
    outcome, after = run("draft_quant", tmp_path, SPEC, SPEC_BEFORE)
    assert outcome.status == "applied", outcome
    anchor = "            self.draft_model_config.hf_config.architectures = " \
             "['DSparkDraftModel']  # one arch\n"
    assert after == _spec_after(SPEC_BEFORE, anchor)
    rerun_is_upstream("draft_quant", tmp_path, SPEC)


def test_draft_quant_follows_the_later_branch_shape(tmp_path):
    # Later releases name V4.1 in the same assignment and set the quantization before
    # re-inspecting; the call must come after that assignment, right before update_arch_().
    later = SPEC_BEFORE.replace(
        "            self.draft_model_config.hf_config.architectures = "
        "['DSparkDraftModel']  # one arch\n",
        "            draft_hf_config.architectures = [\n"
        '                "DSparkV41DraftModel" if is_v41 else "DSparkDraftModel"\n'
        "            ]\n"
        "            self.draft_model_config.quantization = (\n"
        "                self.target_model_config.quantization\n"
        "            )\n")
    outcome, after = run("draft_quant", tmp_path, SPEC, later)
    assert outcome.status == "applied", outcome
    assert after == _spec_after(later, "                self.target_model_config.quantization\n"
                                       "            )\n")


def test_draft_quant_needs_update_arch_after_the_assignment(tmp_path):
    text = SPEC_BEFORE.replace("            self.update_arch_()   # re-inspect\n", "")
    outcome, after = run("draft_quant", tmp_path, SPEC, text)
    assert (outcome.status, outcome.reason) == ("failed", "anchor-missing"), outcome
    assert "update_arch_" in outcome.message
    assert after == text


def test_draft_quant_refuses_two_dspark_assignments(tmp_path):
    text = SPEC_BEFORE.replace(
        '        elif self.method == "eagle": self.update_arch_()\n',
        '        elif self.method == "eagle":\n'
        '            self.draft_model_config.hf_config.architectures = ["DSparkDraftModel"]\n'
        "            self.update_arch_()\n")
    outcome, after = run("draft_quant", tmp_path, SPEC, text)
    assert (outcome.status, outcome.reason) == ("failed", "ambiguous-anchor"), outcome
    assert after == text


def test_draft_quant_needs_the_speculative_config(tmp_path):
    text = SPEC_BEFORE.replace("class SpeculativeConfig:", "class DraftConfig:")
    outcome, _ = run("draft_quant", tmp_path, SPEC, text)
    assert (outcome.status, outcome.reason) == ("failed", "anchor-missing"), outcome
    assert "SpeculativeConfig" in outcome.message


# --------------------------------------------------------------------- draft_quant_v034

CONFIG_BEFORE = """\
# SPDX-License-Identifier: Apache-2.0
from typing import TYPE_CHECKING, Any

from vllm.v1.worker.gpu.spec_decode.dflash.config import DFlashSpeculatorConfig

if TYPE_CHECKING:
    from vllm.config import ParallelConfig, SpeculativeConfig


class DSparkSpeculatorConfig(DFlashSpeculatorConfig):
    @classmethod
    def adapt_draft_model_config(cls, spec: "SpeculativeConfig") -> None:
        draft = spec.draft_model_config
        if draft.speculator_config_class is None:   # bundled in the target
            draft.hf_config.architectures = [
                "DSparkV41DraftModel" if is_v41 else "DSparkDraftModel"
            ]
            draft.quantization = target.quantization
            spec.update_arch_()
        elif "MistralLarge4DSparkModel" in draft.architectures:
            spec.kv_cache_dtype = "auto"
"""

CONFIG_CALL = """\
            # The draft shares the target checkpoint, not its quantization.
            spec.quantization = _normalize_dsv4_dspark_draft_quant(draft)
"""


def test_draft_quant_v034_inserts_import_helper_and_call(tmp_path):
    outcome, after = run("draft_quant_v034", tmp_path, DSPARK_CONFIG, CONFIG_BEFORE)
    assert outcome.status == "applied", outcome
    helper = _inserted(_module("draft_quant_v034")._HELPER_SOURCE)
    assert 'draft_model_config: "ModelConfig",' in helper
    expected = (CONFIG_BEFORE
                .replace("from typing import", "import copy\nfrom typing import")
                .replace("import ParallelConfig, SpeculativeConfig",
                         "import ModelConfig, ParallelConfig, SpeculativeConfig")
                .replace("\n\n\nclass DSpark", "\n\n\n" + helper + "\n\nclass DSpark")
                .replace("            spec.update_arch_()\n",
                         CONFIG_CALL + "            spec.update_arch_()\n"))
    assert after == expected
    compile(after, DSPARK_CONFIG, "exec")
    rerun_is_upstream("draft_quant_v034", tmp_path, DSPARK_CONFIG)


def test_draft_quant_v034_keeps_an_existing_copy_import(tmp_path):
    text = CONFIG_BEFORE.replace("from typing import", "import copy\nfrom typing import")
    outcome, after = run("draft_quant_v034", tmp_path, DSPARK_CONFIG, text)
    assert outcome.status == "applied", outcome
    assert after.count("import copy\n") == 1


@pytest.mark.parametrize("drop, what", [("            spec.update_arch_()\n", "update_arch_"),
                                        ("if TYPE_CHECKING:\n", "TYPE_CHECKING")])
def test_draft_quant_v034_needs_its_anchors(tmp_path, drop, what):
    text = CONFIG_BEFORE.replace(drop, "")
    if what == "TYPE_CHECKING":
        text = text.replace("    from vllm.config import", "from vllm.config import")
    outcome, after = run("draft_quant_v034", tmp_path, DSPARK_CONFIG, text)
    assert (outcome.status, outcome.reason) == ("failed", "anchor-missing"), outcome
    assert what in outcome.message
    assert after == text


# --------------------------------------------------------------------- dspark.py transforms

DSPARK_BEFORE = """\
logger = init_logger(__name__)


class DSparkDeepseekV4ForCausalLM(nn.Module):
    has_own_lm_head = False  # aliased

    def __init__(self, *, vllm_config, prefix=""):
        super().__init__()
        self.config = vllm_config.speculative_config.draft_model_config.hf_config
        self.quant_config = vllm_config.quant_config  # the draft's
        self.model = Model(vllm_config=vllm_config,
                           prefix=prefix)

    def load_weights(self, weights):
        loaded_params = set()
        for name, _ in weights: loaded_params.add(name)
        return loaded_params  # every name
"""

SCOPE_CALL = """\
        # Before any draft layer asks its quant config for the expert format.
        _scope_draft_moe_quant_algo(self.quant_config, self.config)
"""


def test_quant_scope_inserts_helper_and_call(tmp_path):
    outcome, after = run("dspark_draft_quant_scope", tmp_path, DSPARK, DSPARK_BEFORE)
    assert outcome.status == "applied", outcome
    helper = _inserted(_module("dspark_draft_quant_scope")._HELPER_SOURCE)
    anchor = "        self.quant_config = vllm_config.quant_config  # the draft's\n"
    expected = DSPARK_BEFORE.replace(anchor, anchor + SCOPE_CALL).replace(
        "\n\n\nclass DSpark", "\n\n\n" + helper + "\n\nclass DSpark")
    assert after == expected
    rerun_is_upstream("dspark_draft_quant_scope", tmp_path, DSPARK)


def test_quant_scope_refuses_a_conditional_assignment(tmp_path):
    text = DSPARK_BEFORE.replace(
        "        self.quant_config = vllm_config.quant_config  # the draft's\n",
        "        if vllm_config.quant_config is not None:\n"
        "            self.quant_config = vllm_config.quant_config\n")
    outcome, after = run("dspark_draft_quant_scope", tmp_path, DSPARK, text)
    assert (outcome.status, outcome.reason) == ("failed", "anchor-missing"), outcome
    assert after == text


def test_guards_insert_calls_methods_and_check(tmp_path):
    outcome, after = run("dspark_guards", tmp_path, DSPARK, DSPARK_BEFORE)
    assert outcome.status == "applied", outcome
    module = _module("dspark_guards")
    function = _inserted(module._FUNCTION_SOURCE)
    methods = module.QUANT_PATH_METHOD + "\n" + module.COVERAGE_METHOD
    expected = DSPARK_BEFORE.replace(
        "        self.model = Model(",
        "        # Fail closed before building experts in the wrong format.\n"
        "        self._verify_draft_quant_path()\n"
        "        self.model = Model(").replace(
        "        return loaded_params  # every name\n",
        "        self._verify_draft_expert_coverage(loaded_params)\n"
        "        return loaded_params  # every name\n\n" + methods).replace(
        "\n\n\nclass DSpark", "\n\n\n" + function + "\n\nclass DSpark")
    assert after == expected
    rerun_is_upstream("dspark_guards", tmp_path, DSPARK)


def test_guards_refuse_two_returns_of_the_loaded_set(tmp_path):
    text = DSPARK_BEFORE.replace(
        "        loaded_params = set()\n",
        "        loaded_params = set()\n"
        "        if not weights:\n"
        "            return loaded_params\n")
    outcome, after = run("dspark_guards", tmp_path, DSPARK, text)
    assert (outcome.status, outcome.reason) == ("failed", "ambiguous-anchor"), outcome
    assert after == text


def test_guards_need_the_model_assignment(tmp_path):
    text = DSPARK_BEFORE.replace("        self.model = Model(", "        self.inner = Model(")
    outcome, after = run("dspark_guards", tmp_path, DSPARK, text)
    assert (outcome.status, outcome.reason) == ("failed", "anchor-missing"), outcome
    assert after == text


# --------------------------------------------------------------------- dspark_draft_moe_backend

LOADER_BEFORE = """\
def load_dspark_model(target_model, vllm_config):
    speculative_config = vllm_config.speculative_config
    draft_vllm_config = replace(vllm_config,
        cache_config=vllm_config.cache_config)   # odd indent
    draft_vllm_config.quant_config = get_draft_quant_config(vllm_config)
    return draft_vllm_config
"""

LOADER_OVERRIDE = """\
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
"""


def test_moe_backend_override_goes_before_the_quant_config(tmp_path):
    outcome, after = run("dspark_draft_moe_backend", tmp_path, LOADER, LOADER_BEFORE)
    assert outcome.status == "applied", outcome
    anchor = "        cache_config=vllm_config.cache_config)   # odd indent\n"
    assert after == LOADER_BEFORE.replace(anchor, anchor + LOADER_OVERRIDE)
    rerun_is_upstream("dspark_draft_moe_backend", tmp_path, LOADER)


def test_moe_backend_is_upstream_when_the_loader_applies_draft_overrides(tmp_path):
    text = LOADER_BEFORE.replace(
        "    draft_vllm_config.quant_config",
        "    draft_vllm_config = speculative_config.apply_draft_overrides(draft_vllm_config)\n"
        "    draft_vllm_config.quant_config")
    outcome, after = run("dspark_draft_moe_backend", tmp_path, LOADER, text)
    assert (outcome.status, outcome.reason) == ("upstream", None), outcome
    assert after == text


def test_moe_backend_needs_the_draft_config_at_the_top_level(tmp_path):
    text = LOADER_BEFORE.replace(
        "    draft_vllm_config = replace(vllm_config,\n",
        "    if True:\n        draft_vllm_config = replace(vllm_config,\n")
    outcome, after = run("dspark_draft_moe_backend", tmp_path, LOADER, text)
    assert (outcome.status, outcome.reason) == ("failed", "anchor-missing"), outcome
    assert after == text


# --------------------------------------------------------------------- nvfp4_ds_mla stage A

STAGE_A = {
    "vllm/utils/torch_utils.py": """\
        STR_DTYPE_TO_TORCH_DTYPE = {
            "fp8_ds_mla": torch.uint8,  # packed
            "nvfp4": torch.uint8,
        }


        def is_quantized_kv_cache(kv_cache_dtype: str) -> bool:
            return kv_cache_dtype.startswith("fp8") or kv_cache_dtype.startswith("nvfp4")
        """,
    "vllm/config/cache.py": """\
        CacheDType = Literal["auto", "fp8_ds_mla", "nvfp4", "nvfp4_4over6"]
        """,
    "vllm/v1/kv_cache_interface.py": """\
        def get_kv_quant_mode(kv_cache_dtype: str) -> KVQuantMode:
            if kv_cache_dtype == "fp8_per_token_head":
                return KVQuantMode.FP8_PER_TOKEN_HEAD
            if kv_cache_dtype.startswith("nvfp4"):   # nvfp4, nvfp4_4over6
                return KVQuantMode.NVFP4
            return KVQuantMode.NONE
        """,
    "vllm/config/vllm.py": """\
        class VllmConfig:
            @model_validator(mode="after")
            def validate_nvfp4_kv_cache_with_mla(self) -> "VllmConfig":
                if (
                    self.cache_config.cache_dtype.startswith("nvfp4")
                    and self.model_config.use_mla
                ):
                    raise ValueError("nvfp4 KV cache is not supported with MLA")
                return self
        """,
}


def _stage_a_tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(text))


def test_stage_a_follows_the_nvfp4_prefix_tests_of_0_28(tmp_path):
    _stage_a_tree(tmp_path, STAGE_A)
    outcome = run_transform_file(PATCHES / "nvfp4_ds_mla_stage_a.py", tmp_path, None)
    assert outcome.status == "applied", outcome
    mode = (tmp_path / "vllm/v1/kv_cache_interface.py").read_text()
    # ahead of the prefix test, which would take nvfp4_ds_mla too
    assert mode.index('if kv_cache_dtype == "nvfp4_ds_mla":') < mode.index(
        'if kv_cache_dtype.startswith("nvfp4"):   # nvfp4, nvfp4_4over6')
    assert (tmp_path / "vllm/config/vllm.py").read_text() == textwrap.dedent(
        STAGE_A["vllm/config/vllm.py"]).replace(
        'self.cache_config.cache_dtype.startswith("nvfp4")\n',
        'self.cache_config.cache_dtype.startswith("nvfp4") and '
        'self.cache_config.cache_dtype != "nvfp4_ds_mla"\n')
    # is_quantized_kv_cache already takes every nvfp4* dtype: left as it was
    assert (tmp_path / "vllm/utils/torch_utils.py").read_text().endswith(
        'kv_cache_dtype.startswith("nvfp4")\n')
    rerun = run_transform_file(PATCHES / "nvfp4_ds_mla_stage_a.py", tmp_path, None)
    assert (rerun.status, rerun.reason) == ("upstream", None), rerun


def test_stage_a_leaves_an_mla_check_that_names_nvfp4_alone(tmp_path):
    files = dict(STAGE_A)
    files["vllm/config/vllm.py"] = files["vllm/config/vllm.py"].replace(
        'self.cache_config.cache_dtype.startswith("nvfp4")',
        'self.cache_config.cache_dtype == "nvfp4"')
    _stage_a_tree(tmp_path, files)
    outcome = run_transform_file(PATCHES / "nvfp4_ds_mla_stage_a.py", tmp_path, None)
    assert outcome.status == "applied", outcome
    assert (tmp_path / "vllm/config/vllm.py").read_text() == textwrap.dedent(
        files["vllm/config/vllm.py"])


@pytest.mark.parametrize("rel, old, new, reason", [
    ("vllm/v1/kv_cache_interface.py", 'kv_cache_dtype.startswith("nvfp4")',
     'kv_cache_dtype.startswith("fp4")', "anchor-missing"),
    ("vllm/config/vllm.py", "and self.model_config.use_mla",
     'and self.model_config.use_mla\n                or self.cache_config.cache_dtype'
     '.startswith("nvfp4")', "ambiguous-anchor"),
])
def test_stage_a_refuses_what_it_cannot_place(tmp_path, rel, old, new, reason):
    files = dict(STAGE_A)
    files[rel] = files[rel].replace(old, new)
    _stage_a_tree(tmp_path, files)
    before = {r: (tmp_path / r).read_text() for r in files}
    outcome = run_transform_file(PATCHES / "nvfp4_ds_mla_stage_a.py", tmp_path, None)
    assert (outcome.status, outcome.reason) == ("failed", reason), outcome
    assert {r: (tmp_path / r).read_text() for r in files} == before


# --------------------------------------------------------------------- the real files

REAL = [(SPEC, ["draft_quant"]),
        (DSPARK_CONFIG, ["draft_quant_v034"]),
        (DSPARK, ["dspark_draft_quant_scope", "dspark_guards"]),
        (DSPARK41, ["dspark_v41_draft_quant_scope", "dspark_v41_guards"]),
        (LOADER, ["dspark_draft_moe_backend"])]


@pytest.mark.parametrize("rel, transforms", REAL, ids=[r for r, _ in REAL])
def test_transforms_on_the_real_release_file(patched, tmp_path, rel, transforms):
    """Run on the file as the release ships it, the transforms give what the series applied."""
    expected = STATUSES[patched.release]
    if {expected[_patch_id(name)] for name in transforms} == {"skipped"}:
        # out of range: the series leaves the release's file (if it has one) as shipped
        if (patched.tree / rel).exists():
            assert patched.text(rel) == patched.base(rel)
        return
    base = patched.base(rel)
    (tmp_path / rel).parent.mkdir(parents=True)
    (tmp_path / rel).write_text(base)
    for name in transforms:
        outcome = run_transform_file(PATCHES / f"{name}.py", tmp_path, None)
        assert outcome.status == expected[_patch_id(name)], outcome
    after = (tmp_path / rel).read_text()
    assert after == patched.text(rel)
    compile(after, rel, "exec")
    for name in transforms:
        rerun_is_upstream(name, tmp_path, rel)


def _patch_id(transform: str) -> str:
    series = manifest.load(REPO_ROOT / "patchset.yaml")
    return next(p.id for p in series.patches if p.path == f"patches/{transform}.py")
