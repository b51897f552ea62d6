"""A launch checked at startup, before any traffic, and a server stopped as a person stops it:
neither is a failed launch.

The acceptance floor of a log with no spec-decode metrics line is ``not yet judged`` (exit 5),
a failure with ``--require-traffic``; a log with traffic is judged on its figures, which the
JSON report gives as numbers.  A start is judged up to its stop, whose first line is taken from
the real releases' sources; a death logged before it still fails.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from testing import patchkit
from testing.project import MANIFEST, make_project

from patchkit import manifest
from patchkit.serving import runtime
from testing import REPO_ROOT

SERIES = manifest.load(REPO_ROOT / "patchset.yaml")

# Lines in vLLM 0.33.0's own words (launcher.py, core.py, async_llm.py, metrics.py).
VERSION = ("(APIServer pid=1) INFO 05-12 10:00:02 [launcher.py:367] vLLM server version 0.33.0, "
           "serving model /models/m")
STARTUP = "(APIServer pid=1) INFO:     Application startup complete."
METRICS = ("(APIServer pid=1) INFO 05-12 10:07:12 [metrics.py:121] SpecDecoding metrics: "
           "Mean acceptance length: 2.74, Accepted throughput: 34.70 tokens/s, Drafted "
           "throughput: 100.00 tokens/s, Accepted: 347 tokens, Drafted: 1000 tokens, "
           "Per-position acceptance rate: 0.710, 0.460, 0.270, 0.190, 0.105, Avg Draft "
           "acceptance rate: 34.7%")
TRIGGERED = ("(APIServer pid=1) INFO 05-12 11:00:00 [launcher.py:256] [shutdown] API server: "
             "shutdown triggered")
STOP_STEPS = [
    "(EngineCore_DP0 pid=120) INFO 05-12 11:00:00 [core.py:1526] [shutdown] EngineCore: trigger "
    "received signal=SIGINT",
    "(APIServer pid=1) INFO 05-12 11:00:00 [launcher.py:273] [shutdown] API server: stopping "
    "engine client mode=abort timeout=0s",
    "(APIServer pid=1) INFO 05-12 11:00:01 [core_client.py:792] [shutdown] MPClient: start "
    "timeout=0",
    "(APIServer pid=1) ERROR 05-12 11:00:01 [async_llm.py:957] AsyncLLM output_handler failed.",
    "(APIServer pid=1) Traceback (most recent call last):",
    '(APIServer pid=1)   File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/'
    'async_llm.py", line 913, in output_handler',
    "(APIServer pid=1) vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an "
    "issue. See stack trace (above) for the root cause.",
    "(APIServer pid=1) INFO 05-12 11:00:02 [launcher.py:306] [shutdown] API server: shutting "
    "down FastAPI HTTP server",
    "(APIServer pid=1) INFO:     Shutting down",
]
DIED = ("(EngineCore_DP0 pid=120) ERROR 05-12 10:30:41 [core.py:1580] EngineCore encountered a "
        "fatal error.")


def series_judgment(*logs: list[str]) -> runtime.Judgment:
    """The DSpark series' top-level markers (startup, deaths, the two acceptance floors)."""
    return runtime.assess(runtime.markers_of(SERIES, set()),
                          [runtime.Log(f"r{i}.log", lines) for i, lines in enumerate(logs)])


# ------------------------------------------------------------------------------ the verdicts

def test_a_startup_log_passes_its_markers_and_leaves_the_floors_not_yet_judged():
    judged = series_judgment([VERSION, STARTUP])
    floors = [r for r in judged.results if r.pending]
    assert len(floors) == 2 and all(not r.ok for r in floors)
    assert all(r.ok for r in judged.results if not r.pending)
    assert all(r.message.endswith("not yet judged (no spec-decode metrics lines: the server "
                                  "has served no drafts)") for r in floors)


def test_a_log_with_traffic_is_judged_as_before():
    judged = series_judgment([VERSION, STARTUP, METRICS])
    assert all(r.ok and not r.pending for r in judged.results)
    floor = next(r for r in judged.results if r.acceptance is not None)
    assert floor.acceptance.accepted == 347 and floor.acceptance.draft_tokens == 1000
    assert [str(h) for h in floor.metrics] == [f"r0.log:3: {METRICS}"]


def test_a_server_stopped_with_sigint_is_no_failed_launch():
    log = [VERSION, STARTUP, METRICS, TRIGGERED, *STOP_STEPS]
    judged = series_judgment(log)
    assert all(r.ok for r in judged.results), [r.message for r in judged.results if not r.ok]
    [start] = judged.starts
    assert start.stop == 4 and start.stop_text == "[shutdown] API server: shutdown triggered"
    assert start.note() == ("r0.log: the server was stopped at line 4 ([shutdown] API server: "
                            "shutdown triggered); what it logged from there on is not judged")


def test_the_engine_core_may_log_the_signal_first():
    log = [VERSION, STARTUP, METRICS, *STOP_STEPS]   # Ctrl-C reaches every process of the group
    judged = series_judgment(log)
    assert all(r.ok for r in judged.results)
    assert judged.starts[0].stop == 4
    assert "trigger received signal=SIGINT" in judged.starts[0].stop_text


def test_a_death_before_the_stop_still_fails():
    judged = series_judgment([VERSION, STARTUP, METRICS, DIED, TRIGGERED, *STOP_STEPS])
    [dead] = [r for r in judged.results if not r.ok]
    assert dead.absent and dead.found == 1 and dead.hits[0].number == 4


def test_a_death_is_no_stop():
    # the client's cleanup after an engine core died says "[shutdown]" too: it is a death
    died = ("(APIServer pid=1) WARNING 05-12 10:30:42 [core_client.py:870] [shutdown] MPClient: "
            "engine core exited unexpectedly; starting cleanup")
    judged = series_judgment([VERSION, STARTUP, METRICS, died, *STOP_STEPS[3:]])
    assert judged.starts[0].stop is None
    assert any(not r.ok and "EngineDeadError" in r.message for r in judged.results)


def test_a_restart_after_a_stop_is_judged_in_full():
    log = [VERSION, STARTUP, METRICS, TRIGGERED, *STOP_STEPS, VERSION, STARTUP, DIED]
    judged = series_judgment(log)
    assert judged.starts[0].stop is None and judged.starts[0].count == 2
    assert any(not r.ok and "fatal error" in r.message for r in judged.results)


def test_required_lines_after_the_stop_do_not_count():
    judged = series_judgment([VERSION, TRIGGERED, STARTUP])
    [missing] = [r for r in judged.results if not r.ok and not r.pending]
    assert "Application startup complete" in missing.log


@pytest.mark.real_vllm
@pytest.mark.parametrize("release", ["v0.27.1", "v0.28.0", "v0.29.0", "v0.30.0", "v0.31.0",
                                     "v0.32.0", "v0.33.0"])
def test_the_stop_lines_are_the_real_releases_words(real_vllm, release):
    """Every supported release logs each stop line the rule reads, with these format strings,
    and its death line "[shutdown] MPClient: engine core exited unexpectedly" is no stop."""
    from patchkit.source import pypi
    from testing.upstream import sh

    repo, tag = pypi.ensure_release(real_vllm, release)
    words = {"[shutdown] API server: shutdown triggered": "[shutdown] API server: shutdown "
                                                         "triggered",
             "[shutdown] EngineCore: trigger received signal=%s": "[shutdown] EngineCore: "
                                                                  "trigger received signal=SIGTERM",
             "Received %d signal.": "Received 15 signal."}
    for fmt, line in words.items():
        assert sh("git", "grep", "-l", "-F", fmt, tag, "--", "vllm", cwd=repo), fmt
        assert runtime._STOP.search(f"INFO 05-12 11:00:00 [x.py:1] {line}"), line
    death = "[shutdown] MPClient: engine core exited unexpectedly; starting cleanup"
    assert sh("git", "grep", "-l", "-F", death, tag, "--", "vllm", cwd=repo)
    assert not runtime._STOP.search(death)


# ------------------------------------------------------------------------------ the command

FLOOR_MANIFEST = MANIFEST + """\
runtime:
  - log: 'Application startup complete'
  - log: 'EngineDeadError|encountered a fatal error'
    absent: true
  - acceptance: {{min: 0.25, min_length: 2.0}}
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    proj = make_project(tmp_path_factory.mktemp("startup"), FLOOR_MANIFEST)
    applied = patchkit("apply", cwd=proj)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    (proj / "startup.log").write_text("\n".join([VERSION, STARTUP]) + "\n")
    (proj / "served.log").write_text("\n".join([VERSION, STARTUP, METRICS]) + "\n")
    (proj / "stopped.log").write_text("\n".join([VERSION, STARTUP, METRICS, TRIGGERED,
                                                 *STOP_STEPS]) + "\n")
    (proj / "died.log").write_text("\n".join([VERSION, STARTUP, DIED, TRIGGERED, *STOP_STEPS])
                                   + "\n")
    return proj


def verify(proj: Path, *args: str):
    return patchkit("verify", "--tree", ".patchkit/vllm", *args, cwd=proj)


def test_verify_of_a_startup_log_exits_5_not_yet_judged(project):
    out = verify(project, "--log", "startup.log")
    assert out.returncode == 5, out.stdout + out.stderr
    assert out.stdout.splitlines()[-2:] == [
        "not yet judged: [series] acceptance rate at least 0.25 and mean length at least 2 in "
        "startup.log: not yet judged (no spec-decode metrics lines: the server has served no "
        "drafts)",
        "NOT YET JUDGED: 2/3 runtime markers hold in startup.log (1 not yet judged: no traffic "
        "served yet; verify again after smoke, or give --require-traffic)"]
    report = json.loads(verify(project, "--log", "startup.log", "--format", "json").stdout)
    assert report["ok"] is False and report["status"] == "not yet judged"
    assert [r["pending"] for r in report["runtime"]] == [False, False, True]


def test_require_traffic_makes_it_a_failure(project):
    out = verify(project, "--log", "startup.log", "--require-traffic")
    assert out.returncode == 1
    assert out.stdout.splitlines()[-2:] == [
        "[series] acceptance rate at least 0.25 and mean length at least 2 in startup.log: "
        "failed: no spec-decode metrics lines, and traffic was required (the server has served "
        "no drafts)",
        "FAILED: 2/3 runtime markers hold in startup.log"]
    assert "not yet judged" not in out.stdout.lower()
    report = json.loads(verify(project, "--log", "startup.log", "--require-traffic",
                               "--format", "json").stdout)
    assert report["status"] == "failed"
    assert [r["pending"] for r in report["runtime"]] == [False, False, False]


def test_a_served_log_passes_and_gives_its_figures_as_numbers(project):
    out = verify(project, "--log", "served.log", "--require-traffic", "--format", "json")
    assert out.returncode == 0, out.stdout
    report = json.loads(out.stdout)
    assert report["status"] == "ok"
    figures = report["runtime"][2]["acceptance"]
    assert figures == {"rate": 0.347, "mean_length": 2.74,
                       "per_position": [0.71, 0.46, 0.27, 0.19, 0.105], "drafts": None,
                       "draft_tokens": 1000, "drafted": 1000, "accepted": 347,
                       "lines": [f"served.log:3: {METRICS}"]}


def test_a_stopped_server_passes_and_a_death_before_its_stop_fails(project):
    out = verify(project, "--log", "stopped.log")
    assert out.returncode == 0, out.stdout
    assert ("note: stopped.log: the server was stopped at line 4 ([shutdown] API server: "
            "shutdown triggered); what it logged from there on is not judged") in out.stdout
    died = verify(project, "--log", "died.log")
    assert died.returncode == 1
    assert "died.log:3: [series] forbidden 'EngineDeadError|encountered a fatal error'" \
        in died.stdout
