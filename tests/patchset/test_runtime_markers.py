"""The DSpark patchset's runtime markers against startup logs of a two-node launch.

The logs are built from the recipe's own signal lines, in vLLM's log format, as each node writes
them (rank 0 serves the API, rank 1 runs headless): a good DeepSeek-V4 launch, a good
DeepSeek-V4.1 one (which keeps its KV cache as fp8_ds_mla on GB10), and broken ones, each with
the one fault users report.  A broken log must fail for the patch that fixes that fault, and
for no other, with the line.  Which patches are in is each release's, as the series applies.
"""

from __future__ import annotations

import json

import pytest

from patchkit import manifest, versions
from patchkit.serving import runtime
from testing import REPO_ROOT, patchkit

from testing.releases import RELEASES, since

SERIES = manifest.load(REPO_ROOT / "patchset.yaml")

# The recipe's signals, word for word.
QUANT_PATH = ("DSpark draft quantization path: quant_config=DeepseekV4FP8Config, "
              "moe_quant_algo=")
EXPERT_DTYPE = "DeepSeek V4 expert_dtype resolved to 'fp4'"
KV_LINE = ("Using nvfp4_ds_mla data type to store kv cache. It reduces the GPU memory footprint "
           "and boosts the performance. Meanwhile, it may cause accuracy drop without a proper "
           "scaling factor")
STARTUP = "INFO:     Application startup complete."
WEIGHT_SCALE = "w1_weight_scale_2 must match w3_weight_scale_2. Accuracy may be affected."
MXFP4_BACKEND = ("ValueError: moe_backend='flashinfer_b12x' is not supported for MXFP4 MoE. "
                 "Expected one of ['auto', 'triton', 'marlin', 'b12x', 'flashinfer_trtllm']")
NVFP4_GUARD = ("RuntimeError: DSpark draft would build its routed experts as NVFP4 "
               "(quantization=deepseek_v4_fp8, moe_quant_algo=NVFP4), but the DeepSeek-V4 draft "
               "experts are MXFP4: the draft was given the target's quantization config instead "
               "of its own.")
V41_NVFP4_GUARD = ("RuntimeError: DSpark draft would build its routed experts as NVFP4 (stages "
                   "0, 1, 2; quant_config=DeepseekV4FP8Config, moe_quant_algo=NVFP4), but the "
                   "DeepSeek-V4.1 draft experts are MXFP4: the target's NVFP4 MoE override "
                   "reached the draft's mtp.* stages.")
COVERAGE_GUARD = ("RuntimeError: DSpark draft expert weights were not loaded for stage 1: "
                  "routed experts (.experts.). Check that the checkpoint carries the mtp.* draft "
                  "stages.")
RESOLVER_REFUSAL = ("ValueError: DeepseekV4 fp8_ds_mla layout only supports fp8 kv-cache, got "
                    "nvfp4_ds_mla. Please set `--kv-cache-dtype fp8` or select a backend that "
                    "supports bfloat16 KV cache.")
# vLLM 0.33.0's periodic spec-decode metrics line (vllm/v1/spec_decode/metrics.py) once smoke's
# traffic is served: the good DSpark figure, 34.7% at num_speculative_tokens=5.
SPEC_METRICS = ("(APIServer pid=1) INFO 05-12 10:07:12 [metrics.py:121] SpecDecoding metrics: "
                "Mean acceptance length: 2.74, Accepted throughput: 34.70 tokens/s, Drafted "
                "throughput: 100.00 tokens/s, Accepted: 347 tokens, Drafted: 1000 tokens, "
                "Per-position acceptance rate: 0.710, 0.460, 0.270, 0.190, 0.105, Avg Draft "
                "acceptance rate: 34.7%")
SKIPPED_WEIGHT = ("(Worker_TP0 pid=201) DEBUG 05-12 10:03:20 [dspark.py:520] Skipping unknown "
                  "DSpark weight: mtp.1.ffn.experts.7.w1.weight")
WORKER_DIED = ("(EngineCore_DP0 pid=120) ERROR 05-12 10:02:41 [multiproc_executor.py:381] Worker "
               "proc VllmWorker-0 died unexpectedly (exit code: -9), shutting down executor.")


def rank0(model: str = "v4") -> list[str]:
    arch, draft = ("DeepseekV4ForCausalLM", "DSparkDraftModel") if model == "v4" else (
        "DeepseekV41ForCausalLM", "DSparkV41DraftModel")
    kv = KV_LINE if model == "v4" else KV_LINE.replace("nvfp4_ds_mla", "fp8_ds_mla")
    return [
        "INFO 05-12 10:00:00 [__init__.py:239] Automatically detected platform cuda.",
        "(APIServer pid=1) INFO 05-12 10:00:02 [launcher.py:367] vLLM server version 0.33.0, "
        "serving model /models/DeepSeek-V4-Flash-NVFP4",
        f"(APIServer pid=1) INFO 05-12 10:00:09 [model.py:744] Resolved architecture: {arch}",
        "(APIServer pid=1) INFO 05-12 10:00:09 [model.py:1863] Using max model len 524288",
        f"(APIServer pid=1) INFO 05-12 10:00:10 [cache.py:478] {kv}",
        f"(APIServer pid=1) INFO 05-12 10:00:11 [model.py:744] Resolved architecture: {draft}",
        "(EngineCore_DP0 pid=120) INFO 05-12 10:00:20 [core.py:97] Initializing a V1 LLM engine "
        "(v0.33.0) with config: model='/models/DeepSeek-V4-Flash-NVFP4', speculative_config="
        "SpeculativeConfig(method='dspark', num_spec_tokens=5)",
        f"(Worker_TP0 pid=201) INFO 05-12 10:01:40 [quant_config.py:107] {EXPERT_DTYPE}",
        f"(Worker_TP0 pid=201) INFO 05-12 10:03:12 [dspark.py:418] {QUANT_PATH}",
        "(Worker_TP0 pid=201) INFO 05-12 10:04:30 [gpu_model_runner.py:3200] Model loading took "
        "71.2 GiB memory and 190.3 seconds",
        "(EngineCore_DP0 pid=120) INFO 05-12 10:05:02 [kv_cache_utils.py:1148] GPU KV cache "
        "size: 1,048,576 tokens, Maximum concurrency for 524,288 tokens per request: 2.00x",
        "(APIServer pid=1) INFO 05-12 10:06:01 [api_server.py:2011] Starting vLLM API server 0 "
        "on http://0.0.0.0:8000",
        "(APIServer pid=1) INFO:     Started server process [1]",
        "(APIServer pid=1) INFO:     Waiting for application startup.",
        f"(APIServer pid=1) {STARTUP}",
        SPEC_METRICS,
    ]


def rank1(model: str = "v4") -> list[str]:
    arch, draft = ("DeepseekV4ForCausalLM", "DSparkDraftModel") if model == "v4" else (
        "DeepseekV41ForCausalLM", "DSparkV41DraftModel")
    kv = KV_LINE if model == "v4" else KV_LINE.replace("nvfp4_ds_mla", "fp8_ds_mla")
    return [
        "INFO 05-12 10:00:00 [__init__.py:239] Automatically detected platform cuda.",
        f"INFO 05-12 10:00:08 [model.py:744] Resolved architecture: {arch}",
        f"INFO 05-12 10:00:09 [cache.py:478] {kv}",
        f"INFO 05-12 10:00:10 [model.py:744] Resolved architecture: {draft}",
        "INFO 05-12 10:00:12 [serve.py:225] Launching vLLM (v0.33.0) headless multiproc "
        "executor, with head node address 192.168.100.10:29501 for torch.distributed process "
        "group.",
        f"(Worker_TP1 pid=88) INFO 05-12 10:01:41 [quant_config.py:107] {EXPERT_DTYPE}",
        f"(Worker_TP1 pid=88) INFO 05-12 10:03:13 [dspark.py:418] {QUANT_PATH}",
        "(Worker_TP1 pid=88) INFO 05-12 10:04:31 [gpu_model_runner.py:3200] Model loading took "
        "71.2 GiB memory and 191.0 seconds",
    ]


def recipe_only() -> list[str]:
    """The recipe's signal lines and nothing else: no architecture, no node roles."""
    return [QUANT_PATH, EXPERT_DTYPE, KV_LINE, STARTUP, SPEC_METRICS]


def markers_for(release: str) -> list[runtime.ScopedMarker]:
    return runtime.markers_of(SERIES, runtime.patches_in(SERIES, {}, release[1:]))


def judge(release: str, **logs: list[str]) -> list[runtime.MarkerResult]:
    return runtime.judge(markers_for(release),
                         [runtime.Log(f"{name}.log", lines) for name, lines in logs.items()])


def failed(results) -> set[str | None]:
    return {r.patch for r in results if not r.ok}


def is_in(patch_id: str, release: str) -> bool:
    return versions.in_range(SERIES.patch(patch_id).vllm, release[1:])[0]


def kv_stages(release: str) -> set[str]:
    return {p.id for p in SERIES.patches if p.id.startswith("nvfp4-ds-mla-stage")
            and is_in(p.id, release)}


def with_line(lines: list[str], after: str, new: str) -> list[str]:
    at = next(i for i, line in enumerate(lines) if after in line)
    return lines[:at + 1] + [new] + lines[at + 1:]


def without(lines: list[str], text: str) -> list[str]:
    return [line for line in lines if text not in line]


def replaced(lines: list[str], old: str, new: str) -> list[str]:
    return [line.replace(old, new) for line in lines]


# ------------------------------------------------------------------------------ good launches

@pytest.mark.parametrize("release", RELEASES)
def test_every_patch_in_has_markers(release):
    """Each fix proves itself at runtime, not only in the files."""
    scoped = markers_for(release)
    have = {s.patch for s in scoped}
    ids = runtime.patches_in(SERIES, {}, release[1:])
    assert have == ids | {None}, ids - have


@pytest.mark.parametrize("release", RELEASES)
def test_a_good_v4_launch_holds_on_both_nodes_and_each(release):
    assert not failed(judge(release, rank0=rank0(), rank1=rank1()))
    assert not failed(judge(release, rank0=rank0()))
    alone = judge(release, rank1=rank1())
    assert not failed(alone)
    # Rank 1 serves no API: the startup line is not asked of it.
    startup = next(r for r in alone if r.log == "Application startup complete")
    assert not startup.judged


@pytest.mark.parametrize("release", RELEASES)
def test_the_recipes_lines_alone_hold(release):
    assert not failed(judge(release, recipe=recipe_only()))


@pytest.mark.parametrize("release", [r for r in RELEASES if since(r, "v0.30.0")])
def test_a_good_v41_launch_holds_without_the_v4_kv_line(release):
    """DeepSeek-V4.1 keeps its own KV records (fp8_ds_mla on GB10): the V4 KV stages' line is
    not asked of it, though those patches are in the image."""
    results = judge(release, rank0=rank0("v41"), rank1=rank1("v41"))
    assert not failed(results)
    assert not any("nvfp4_ds_mla" in line for line in rank0("v41") + rank1("v41"))
    kv = [r for r in results if r.patch in kv_stages(release) and r.log.startswith("Using")]
    assert kv and all(not r.judged for r in kv)


# ------------------------------------------------------------------------------ broken launches

def _broken_v4():
    """(name, rank 0, rank 1, the patches that must fail, the offending line or None)."""
    return [
        ("weight-scale warning: the draft on the NVFP4 path",
         with_line(rank0(), "expert_dtype", "(Worker_TP0 pid=201) WARNING 05-12 10:02:10 "
                   f"[modelopt.py:1059] {WEIGHT_SCALE}"), rank1(),
         {"draft-quant-normalization", "draft-quant-normalization-v034",
          "dspark-draft-quant-scope"}, WEIGHT_SCALE),
        ("the draft got the target's MoE backend",
         with_line(without(rank0(), "startup"), "expert_dtype", f"(Worker_TP0 pid=201) "
                   f"{MXFP4_BACKEND}"), rank1(),
         {"dspark-draft-moe-backend", None}, MXFP4_BACKEND),
        ("the guard refused an NVFP4 draft",
         with_line(rank0(), "expert_dtype", f"(Worker_TP0 pid=201) {NVFP4_GUARD}"), rank1(),
         {"dspark-loader-guards"}, NVFP4_GUARD),
        ("the draft resolved the target's moe_quant_algo",
         replaced(rank0(), QUANT_PATH, QUANT_PATH + "NVFP4"),
         replaced(rank1(), QUANT_PATH, QUANT_PATH + "NVFP4"),
         {"dspark-draft-quant-scope", "dspark-loader-guards"}, QUANT_PATH + "NVFP4"),
        ("a draft stage without its expert weights",
         rank0(), with_line(rank1(), "quantization path", f"(Worker_TP1 pid=88) "
                            f"{COVERAGE_GUARD}"),
         {"dspark-loader-guards"}, COVERAGE_GUARD),
        ("no quant-path line: the guard is not in the running code",
         without(rank0(), "quantization path"), without(rank1(), "quantization path"),
         {"dspark-loader-guards"}, None),
        ("no fp4 expert dtype: the draft was not built by DeepseekV4FP8Config",
         without(rank0(), "expert_dtype"), without(rank1(), "expert_dtype"),
         {"draft-quant-normalization", "draft-quant-normalization-v034"}, None),
        ("a worker died", with_line(rank0(), "quantization path", WORKER_DIED), rank1(),
         {None}, WORKER_DIED),
        ("a draft tensor skipped (a DEBUG line)",
         rank0(), with_line(rank1(), "quantization path", SKIPPED_WEIGHT.replace("TP0", "TP1")),
         {None}, SKIPPED_WEIGHT.replace("TP0", "TP1")),
        ("rank 0 never finished starting", without(rank0(), "startup complete"), rank1(),
         {None}, None),
    ]


BROKEN_V4 = _broken_v4()


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("name, r0, r1, patches, line", BROKEN_V4,
                         ids=[case[0] for case in BROKEN_V4])
def test_a_broken_v4_launch_fails_for_the_right_patch(release, name, r0, r1, patches, line):
    results = judge(release, rank0=r0, rank1=r1)
    expected = {p for p in patches if p is None or is_in(p, release)}
    assert failed(results) == expected, [r.message for r in results if not r.ok]
    if line:
        where = "rank0.log" if line in "\n".join(r0) else "rank1.log"
        lines = r0 if where == "rank0.log" else r1
        number = next(i for i, text in enumerate(lines, 1) if line in text)
        shown = [f for r in results if not r.ok for f in r.failure_lines()]
        assert any(f.startswith(f"{where}:{number}: [") and f.endswith(lines[number - 1])
                   for f in shown), shown


@pytest.mark.parametrize("release", RELEASES)
def test_the_v4_kv_line_missing_fails_the_kv_stages(release):
    r0, r1 = without(rank0(), "data type to store kv cache"), without(rank1(), "store kv cache")
    assert failed(judge(release, rank0=r0, rank1=r1)) == kv_stages(release)


@pytest.mark.parametrize("release", RELEASES)
def test_the_unpatched_kv_resolver_fails_stage_b(release):
    r0 = with_line(without(rank0(), "startup complete"), "Resolved architecture: DSpark",
                   f"(APIServer pid=1) {RESOLVER_REFUSAL}")
    stage_b = {p for p in kv_stages(release) if "stage-b" in p}
    assert failed(judge(release, rank0=r0, rank1=rank1())) == stage_b | {None}
    shown = [f for r in judge(release, rank0=r0) for f in r.failure_lines()]
    assert f"rank0.log:7: [{stage_b.pop()}] forbidden" in "\n".join(shown)


@pytest.mark.parametrize("release", [r for r in RELEASES if since(r, "v0.30.0")])
def test_a_broken_v41_launch_fails_its_own_patches(release):
    guard = with_line(rank0("v41"), "expert_dtype", f"(Worker_TP0 pid=201) {V41_NVFP4_GUARD}")
    assert failed(judge(release, rank0=guard, rank1=rank1("v41"))) == {"dspark-v41-loader-guards"}
    warning = with_line(rank0("v41"), "expert_dtype", "(Worker_TP0 pid=201) WARNING 05-12 "
                        f"10:02:10 [modelopt.py:1059] {WEIGHT_SCALE}")
    assert failed(judge(release, rank0=warning)) == {"dspark-v41-draft-quant-scope"}


@pytest.mark.parametrize("release", RELEASES)
def test_the_recipes_lines_with_one_fault(release):
    """Logs without the architecture line judge both models' markers: a fault still fails
    the patch that fixes it (and its DeepSeek-V4.1 twin, which shares the line)."""
    for fault, patches in ((WEIGHT_SCALE, {"draft-quant-normalization",
                                           "draft-quant-normalization-v034",
                                           "dspark-draft-quant-scope",
                                           "dspark-v41-draft-quant-scope"}),
                           (MXFP4_BACKEND, {"dspark-draft-moe-backend"}),
                           (NVFP4_GUARD, {"dspark-loader-guards", "dspark-v41-loader-guards"})):
        expected = {p for p in patches if is_in(p, release)}
        assert failed(judge(release, recipe=recipe_only() + [fault])) == expected, fault


# ------------------------------------------------------------------------------ restarts

def assessed(release: str, **logs: list[str]) -> runtime.Judgment:
    return runtime.assess(markers_for(release),
                          [runtime.Log(f"{name}.log", lines) for name, lines in logs.items()])


@pytest.mark.parametrize("release", RELEASES)
def test_both_nodes_restarted_after_a_fault_hold_on_their_last_start(release):
    """Each node's log holds a failed start and then a good one, as a restart appends it: the
    verdict is the good start's, and each log names the line where it begins (rank 0: its
    version line; rank 1: the first config line after its headless launch)."""
    broken0 = with_line(without(rank0(), "startup"), "expert_dtype",
                        f"(Worker_TP0 pid=201) {MXFP4_BACKEND}")
    broken1 = with_line(rank1(), "quantization path", f"(Worker_TP1 pid=88) {COVERAGE_GUARD}")
    judged = assessed(release, rank0=broken0 + rank0(), rank1=broken1 + rank1())
    assert not failed(judged.results), [r.message for r in judged.results if not r.ok]
    assert [(s.log, s.count, s.line) for s in judged.starts] == [
        ("rank0.log", 2, len(broken0) + 2), ("rank1.log", 2, len(broken1) + 2)]
    assert (broken0 + rank0())[len(broken0) + 1].endswith("vLLM server version 0.33.0, serving "
                                                          "model /models/DeepSeek-V4-Flash-NVFP4")
    assert "Resolved architecture" in (broken1 + rank1())[len(broken1) + 1]
    # the same starts the other way round fail for the patches that fix those faults
    results = judge(release, rank0=rank0() + broken0, rank1=rank1() + broken1)
    assert failed(results) == {p for p in ("dspark-draft-moe-backend", "dspark-loader-guards",
                                           None) if p is None or is_in(p, release)}


@pytest.mark.parametrize("release", RELEASES)
def test_the_guards_line_only_before_the_restart_fails(release):
    """The restarted server no longer logs the guard's quant-path line (an image without the
    guard): the earlier start's lines do not count, and the failure says where they are."""
    later = without(rank0(), "quantization path")
    results = judge(release, rank0=rank0() + later, rank1=rank1() + without(rank1(),
                                                                           "quantization path"))
    assert failed(results) == {"dspark-loader-guards"}
    [row] = [r for r in results if not r.ok]
    # each restart's first line, the platform's, is logged before its start line
    assert row.message.endswith(f": only in an earlier start (lines 1-{len(rank0()) + 1} of "
                                f"rank0.log, lines 1-{len(rank1()) + 1} of rank1.log)")


# ------------------------------------------------------------------------------ the command

def test_verify_the_applied_checkout_with_both_nodes_logs(patched, tmp_path):
    (tmp_path / "rank0.log").write_text("\n".join(rank0()) + "\n")
    (tmp_path / "rank1.log").write_text("\n".join(rank1()) + "\n")
    broken = with_line(rank0(), "expert_dtype", f"(Worker_TP0 pid=201) {MXFP4_BACKEND}")
    (tmp_path / "broken0.log").write_text("\n".join(broken) + "\n")

    def verify(*logs: str):
        args = [a for log in logs for a in ("--log", str(tmp_path / log))]
        return patchkit("verify", "--tree", str(patched.tree), "--manifest",
                        str(REPO_ROOT / "patchset.yaml"), *args, "--format", "json", cwd=tmp_path)

    good = verify("rank0.log", "rank1.log")
    assert good.returncode == 0, good.stdout + good.stderr
    report = json.loads(good.stdout)
    skipped = {pid for pid, status in patched.statuses.items() if status == "skipped"}
    assert skipped and not skipped & {r["patch"] for r in report["runtime"]}
    bad = verify("broken0.log", "rank1.log")
    assert bad.returncode == 1
    [row] = [r for r in json.loads(bad.stdout)["runtime"] if not r["ok"]]
    number = next(i for i, line in enumerate(broken, 1) if "MXFP4 MoE" in line)
    assert row["patch"] == "dspark-draft-moe-backend"
    assert row["lines"] == [f"{tmp_path / 'broken0.log'}:{number}: {broken[number - 1]}"]
