"""The DSpark series' acceptance floors (patchset.yaml's top-level ``acceptance:`` markers)
against rank 0's log after served traffic: the good run's 34.7% passes, the 4.4% collapse of
the draft-block mismatch fails both floors, a diagnostic launch (DEBUG logging) is held to its
own lower floor only, and rank 1 (headless, no API, no metrics lines) is not asked."""

from __future__ import annotations

from patchkit import manifest
from patchkit.serving import runtime
from testing import REPO_ROOT

SERIES = manifest.load(REPO_ROOT / "patchset.yaml")
FLOORS = [runtime.ScopedMarker(None, m) for m in SERIES.runtime if m.acceptance is not None]
FMT = ("(APIServer pid=1) {level} 05-12 10:07:12 [metrics.py:121] SpecDecoding metrics: Mean "
       "acceptance length: {length:.2f}, Accepted throughput: 3.00 tokens/s, Drafted throughput: "
       "10.00 tokens/s, Accepted: {accepted} tokens, Drafted: {drafted} tokens, Per-position "
       "acceptance rate: 0.500, 0.300, 0.200, 0.100, 0.050, Avg Draft acceptance rate: {pct:.1f}%")
STARTUP = "(APIServer pid=1) INFO:     Application startup complete."
DEBUG = "(EngineCore_DP0 pid=120) DEBUG 05-12 10:00:30 [loader.py:77] Loaded weight mtp.0.x"
RANK1 = ["INFO 05-12 10:00:12 [serve.py:225] Launching vLLM (v0.33.0) headless multiproc "
         "executor, with head node address 192.168.100.10:29501"]


def metrics(accepted: int, drafted: int = 1000, k: int = 5, level: str = "INFO") -> str:
    nan = float("nan")   # what vLLM prints over zero drafts
    return FMT.format(level=level, length=1 + accepted * k / drafted if drafted else nan,
                      accepted=accepted, drafted=drafted,
                      pct=accepted / drafted * 100 if drafted else nan)


def judge(*logs: list[str]) -> list[runtime.MarkerResult]:
    return runtime.judge(FLOORS, [runtime.Log(f"r{i}.log", lines) for i, lines in enumerate(logs)])


def test_the_series_has_a_final_and_a_diagnostic_floor():
    floors = [s.marker.acceptance for s in FLOORS]
    assert len(floors) == 2
    final, diag = floors
    assert diag.min_rate < final.min_rate and diag.min_length < final.min_length
    # both between the collapsed run (4.4%, length 1.31 at 7 tokens) and the good one (34.7%)
    assert 0.044 < diag.min_rate < final.min_rate < 0.347
    assert 1 + 0.044 * 7 < diag.min_length < final.min_length < 1 + 0.347 * 5


def test_the_good_run_passes_and_the_collapse_fails_both_floors():
    assert all(r.ok for r in judge([STARTUP, metrics(347)], RANK1))
    collapsed = judge([STARTUP, metrics(44, k=7)], RANK1)
    assert [r.ok for r in collapsed] == [False, False]
    assert all("rate 0.044" in r.message for r in collapsed)


def test_a_diagnostic_launch_is_held_to_its_own_floor():
    diag = [DEBUG, STARTUP, metrics(150, level="INFO")]     # 15%: under final, over diag
    final, low = judge(diag, RANK1)
    assert final.ok and not final.judged                    # left out: a DEBUG launch
    assert low.ok
    assert [r.ok for r in judge([STARTUP, metrics(150)], RANK1)] == [False, True]


def test_a_log_without_served_traffic_is_not_yet_judged():
    results = judge([STARTUP], RANK1)
    assert not any(r.ok for r in results) and all(r.pending for r in results)
    assert all("in r0.log (r1.log left out: " in r.message and r.message.endswith(
        "not yet judged (no spec-decode metrics lines: the server has served no drafts)")
        for r in results)


def test_zero_drafts_never_pass():
    results = judge([STARTUP, metrics(0, drafted=0)])
    assert all(not r.ok and "inconclusive" in r.message for r in results)
