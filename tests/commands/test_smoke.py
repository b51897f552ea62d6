"""``patchkit smoke`` against a stand-in of vLLM's OpenAI-compatible server.

vLLM itself cannot serve on this machine (it needs a GPU), so each test starts
``testing.standin_vllm``, a small server on 127.0.0.1 that answers ``/health``, ``/v1/models``,
``/v1/chat/completions`` and ``/metrics`` with the JSON and metric shapes of vLLM 0.33.0 (the
metrics rendered by ``prometheus_client``, as vLLM renders them), and sets one fault at a time.
The core (``commands.smoke.run``) is checked for values, the CLI for exit codes and lines.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from testing import patchkit
from testing.standin_vllm import ANSWER, MODEL, Behaviour, refusing_port, serve

from patchkit import cli, http
from patchkit.commands import smoke
from patchkit.commands.smoke import Long, run
from patchkit.errors import UsageError
from patchkit.render.smoke import render_text
from patchkit.serving import metrics
from patchkit.serving.garble import degenerate
from patchkit.serving.metrics import (ACCEPTED_TOKENS, DRAFT_TOKENS, MetricsFormatError,
                                      counter_total, parse_metrics)

CHAT = "/v1/chat/completions"


def by_name(report) -> dict:
    return {c.name: c for c in report.checks}


def main(capsys, *args: str) -> tuple[int, list[str], str]:
    code = cli.main(["smoke", *args])
    out = capsys.readouterr()
    return code, out.out.splitlines(), out.err


# ------------------------------------------------------------------------ the core: a good server

def test_good_server_every_check_passes_with_the_exact_rate():
    with serve() as s:
        report = run(s.url, min_acceptance=0.7)
        chat_bodies = [body for _, _, body in s.requests(CHAT)]
    assert report.ok
    assert [(c.name, c.ok, c.ran) for c in report.checks] == [
        ("health", True, True), ("models", True, True), ("chat", True, True),
        ("acceptance", True, True)]
    assert report.model == MODEL          # the only model listed
    assert report.answer == ANSWER
    assert report.acceptance == 18 / 24   # summed over the two engines' series
    assert "18 of 24 draft tokens" in by_name(report)["acceptance"].message
    [body] = chat_bodies
    assert body["model"] == MODEL and body["temperature"] == 0
    assert 0 < body["max_tokens"] <= 64 and body["stream"] is False
    assert body["messages"][0]["role"] == "user"


def test_without_min_acceptance_metrics_are_not_read():
    with serve() as s:
        report = run(s.url)
        paths = [p for _, p, _ in s.requests()]
    assert report.ok and report.acceptance is None
    assert [c.name for c in report.checks] == ["health", "models", "chat"]
    assert paths == ["/health", "/v1/models", CHAT]


def test_the_rate_is_the_change_over_the_request_not_the_totals():
    with serve(Behaviour(draft_tokens=40, accepted_tokens=10)) as s:
        assert run(s.url, min_acceptance=0.2).acceptance == 0.25
        s.behaviour.draft_tokens, s.behaviour.accepted_tokens = 30, 27
        second = run(s.url, min_acceptance=0.8)   # totals now 37/70; this request 27/30
    assert second.ok and second.acceptance == pytest.approx(0.9)


@pytest.mark.parametrize("engines", [1, 3])
def test_series_of_every_engine_are_summed(engines):
    with serve(Behaviour(engines=engines, draft_tokens=31, accepted_tokens=20)) as s:
        report = run(s.url, min_acceptance=0.5)
    assert report.ok and report.acceptance == 20 / 31


def test_counts_that_land_after_the_answer_are_waited_for():
    # vLLM records a step's counters just after it hands the outputs on: here the first read
    # after the answer is still the old one
    with serve(Behaviour(late_metrics=True)) as s:
        report = run(s.url, min_acceptance=0.7)
    assert report.ok and report.acceptance == 0.75


def test_a_trailing_v1_or_slash_is_the_same_server():
    with serve() as s:
        for url in (s.url + "/", s.url + "/v1", s.url + "/v1/"):
            report = run(url)
            assert report.ok and report.url == s.url


def test_an_api_key_is_sent_as_a_bearer_token():
    with serve(Behaviour(api_key="s3cret")) as s:
        without = run(s.url)
        with_key = run(s.url, api_key="s3cret")
    assert with_key.ok
    assert not without.ok
    assert "HTTP 401" in by_name(without)["models"].message


def test_reasoning_without_content_counts_as_an_answer():
    with serve(Behaviour(content=None, reasoning="The user asks about France's capital")) as s:
        report = run(s.url)
    assert report.ok
    assert "reasoning" in by_name(report)["chat"].message


# ------------------------------------------------------------------------ the core: faults

def test_health_500_fails_and_nothing_else_is_asked():
    with serve(Behaviour(health_status=500)) as s:
        report = run(s.url, min_acceptance=0.5)
        paths = [p for _, p, _ in s.requests()]
    health = by_name(report)["health"]
    assert not report.ok and not health.ok and "500" in health.message
    assert report.unreachable is None     # something answered
    rest = report.checks[1:]
    assert [c.name for c in rest] == ["models", "chat", "acceptance"]
    assert all(not c.ok and not c.ran and c.message.startswith("not run: ") for c in rest)
    assert paths == ["/health"]


def test_model_missing_names_what_is_listed():
    with serve(Behaviour(models=["other/model"])) as s:
        report = run(s.url, model=MODEL)
        asked = s.requests(CHAT)
    models = by_name(report)["models"]
    assert not models.ok
    assert repr(MODEL) in models.message and "'other/model'" in models.message
    assert not by_name(report)["chat"].ran and asked == []


def test_no_model_listed_fails():
    with serve(Behaviour(models=[])) as s:
        report = run(s.url)
    assert not by_name(report)["models"].ok
    assert "no model" in by_name(report)["models"].message


def test_two_models_without_model_fails_naming_both_and_model_picks_one():
    with serve(Behaviour(models=["a/one", "b/two"])) as s:
        report = run(s.url)
        picked = run(s.url, model="b/two")
        [(_, _, body)] = s.requests(CHAT)
    models = by_name(report)["models"]
    assert not models.ok and "'a/one'" in models.message and "'b/two'" in models.message
    assert report.model is None
    assert picked.ok and picked.model == "b/two" and body["model"] == "b/two"


@pytest.mark.parametrize("fault, words", [
    ({"content": ""}, "empty content"),
    ({"content": "  \n\t "}, "whitespace-only content"),
    ({"content": None}, "no content"),
    ({"choices": False}, "empty choices"),
    ({"drop_choices": True}, "no choices"),
    ({"content": "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"}, "garbled"),
    ({"content": "Paris. Paris. Paris. Paris. Paris."}, "garbled"),
    ({"content": "The capital \ufffd\ufffd is"}, "undecodable"),
])
def test_an_answer_without_real_content_fails(fault, words):
    with serve(Behaviour(**fault)) as s:
        report = run(s.url, min_acceptance=0.5)
    chat = by_name(report)["chat"]
    assert not report.ok and not chat.ok and chat.ran
    assert words in chat.message
    # the request was answered, so its acceptance is still measured and reported
    assert by_name(report)["acceptance"].ran and report.acceptance == 0.75


def test_a_garbled_answer_fails_and_acceptance_is_not_run():
    with serve(Behaviour(garbled={CHAT})) as s:
        report = run(s.url, min_acceptance=0.5)
    chat = by_name(report)["chat"]
    assert not chat.ok and "not JSON" in chat.message and CHAT in chat.message
    acceptance = by_name(report)["acceptance"]
    assert not acceptance.ran and "not run" in acceptance.message
    assert report.acceptance is None


def test_chat_error_status_says_what_the_server_said():
    with serve(Behaviour(statuses={CHAT: 500})) as s:
        report = run(s.url)
    chat = by_name(report)["chat"]
    assert not chat.ok and "HTTP 500" in chat.message and "Internal Server Error" in chat.message


def test_low_acceptance_fails_with_the_rate():
    with serve(Behaviour(draft_tokens=24, accepted_tokens=3)) as s:
        report = run(s.url, min_acceptance=0.5)
    acceptance = by_name(report)["acceptance"]
    assert not report.ok and not acceptance.ok
    assert report.acceptance == 3 / 24
    assert "3 of 24" in acceptance.message and "below 0.5" in acceptance.message
    assert [c.ok for c in report.checks[:3]] == [True, True, True]


def test_a_rate_exactly_met_passes():
    with serve(Behaviour(draft_tokens=20, accepted_tokens=10)) as s:
        assert run(s.url, min_acceptance=0.5).ok


def test_no_draft_tokens_says_spec_decode_did_not_run():
    with serve(Behaviour(draft_tokens=0, accepted_tokens=0)) as s:
        report = run(s.url, min_acceptance=0.1)
    acceptance = by_name(report)["acceptance"]
    assert not acceptance.ok and "spec decode did not run" in acceptance.message
    assert report.acceptance is None


def test_no_spec_decode_counters_says_spec_decode_did_not_run():
    with serve(Behaviour(spec_decode=False)) as s:
        report = run(s.url, min_acceptance=0.1)
    acceptance = by_name(report)["acceptance"]
    assert not acceptance.ok and "spec decode did not run" in acceptance.message
    assert DRAFT_TOKENS in acceptance.message


def test_garbled_metrics_fail_acceptance():
    with serve(Behaviour(garbled={"/metrics"})) as s:
        report = run(s.url, min_acceptance=0.1)
    acceptance = by_name(report)["acceptance"]
    assert by_name(report)["chat"].ok
    assert not acceptance.ok and "not Prometheus text" in acceptance.message


def test_metrics_error_status_fails_acceptance():
    with serve(Behaviour(statuses={"/metrics": 503})) as s:
        report = run(s.url, min_acceptance=0.1)
    assert "HTTP 503" in by_name(report)["acceptance"].message


def test_a_hung_health_times_out():
    with serve(Behaviour(hang={"/health"})) as s:
        report = run(s.url, timeout=0.3)
    health = by_name(report)["health"]
    assert not health.ok and "no answer within 0.3s" in health.message
    assert report.unreachable is None
    assert [c.ran for c in report.checks] == [True, False, False]


def test_a_hung_chat_times_out_and_acceptance_is_not_run():
    with serve(Behaviour(hang={CHAT})) as s:
        report = run(s.url, min_acceptance=0.5, timeout=0.3)
    chat = by_name(report)["chat"]
    assert not chat.ok and "no answer within 0.3s" in chat.message and CHAT in chat.message
    assert not by_name(report)["acceptance"].ran


def test_nothing_listening_is_unreachable():
    with refusing_port() as port:
        report = run(f"http://127.0.0.1:{port}", min_acceptance=0.5)
    assert not report.ok
    assert report.unreachable and "connection refused" in report.unreachable
    assert f"127.0.0.1:{port}" in report.unreachable
    assert render_text(report).count("\n") == 0


@pytest.mark.parametrize("url", ["localhost:8000", "ftp://host/x", "http://", "", "host",
                                 "http://h:notaport", "file:///etc/passwd"])
def test_a_bad_url_is_a_usage_error(url):
    with pytest.raises(http.HttpError) as info:
        run(url)
    assert info.value.exit_code == 2 and "\n" not in str(info.value)


@pytest.mark.parametrize("rate", [-0.1, 1.5, math.nan])
def test_a_rate_outside_0_to_1_is_a_usage_error(rate):
    with pytest.raises(UsageError):
        run("http://127.0.0.1:1", min_acceptance=rate)


# ------------------------------------------------------------------------ Prometheus text

EXPOSITION = r'''# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 100.0
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="m"} 20.5 1700000000000
vllm:spec_decode_num_draft_tokens_created{engine="0",model_name="m"} 1.7e+09
vllm:spec_decode_num_accepted_tokens_total{ model_name="a \"q\" \\ b\n}", engine="0", } 7
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 7
# a comment that is neither HELP nor TYPE

vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="m"} 3
vllm:gpu_cache_usage_perc NaN
python_info{implementation="CPython",major="3"} 1.0
vllm:spec_decode_num_accepted_tokens_total{engine="1"} 3.0 # {trace_id="abc"} 1.0
# EOF
'''


def test_parse_metrics_reads_labels_escapes_timestamps_and_exemplars():
    samples = parse_metrics(EXPOSITION)
    assert counter_total(samples, DRAFT_TOKENS) == 120.5
    assert counter_total(samples, ACCEPTED_TOKENS) == 10   # not the _per_pos series
    assert counter_total(samples, "vllm:absent_total") is None
    odd = [s for s in samples if s.name == ACCEPTED_TOKENS][0]
    assert dict(odd.labels) == {"model_name": 'a "q" \\ b\n}', "engine": "0"}
    assert math.isnan([s for s in samples if s.name == "vllm:gpu_cache_usage_perc"][0].value)
    bucket = [s for s in samples if s.name.endswith("_bucket")][0]
    assert dict(bucket.labels)["le"] == "+Inf" and bucket.value == 3


@pytest.mark.parametrize("line", ['vllm:x{engine="0" 1', "vllm:x one", 'vllm:x{engine=0} 1',
                                  "{engine=\"0\"} 1", "vllm:x", "vllm:x 1 2 3",
                                  'vllm:x{engine="0\\q"} 1'])
def test_parse_metrics_refuses_a_broken_line_naming_it(line):
    with pytest.raises(MetricsFormatError, match="line 2"):
        parse_metrics("# HELP vllm:x x\n" + line + "\n")


def test_the_real_client_library_output_parses():
    import prometheus_client as prom

    registry = prom.CollectorRegistry()
    c = prom.Counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.",
                     labelnames=["model_name", "engine"], registry=registry)
    c.labels('odd "name"\n', "0").inc(5)
    c.labels("m", "1").inc(2)
    samples = parse_metrics(prom.generate_latest(registry).decode())
    assert counter_total(samples, DRAFT_TOKENS) == 7


def test_degenerate_leaves_real_answers_alone():
    for text in (ANSWER, "Paris.", "The capital of France is Paris, on the Seine.",
                 "Paris\n\nIt is the capital.", "1, 2, 3, 4, 5, 6, 7, 8"):
        assert degenerate(text) is None, text
    for text in ("!!!!!!!!", "<unk><unk><unk><unk>", "a\x00b", "is is is is is is"):
        assert degenerate(text), text


# ------------------------------------------------------------------------ the CLI

def test_cli_good_server_exit_0_one_line_per_check(capsys):
    with serve() as s:
        code, lines, err = main(capsys, s.url, "--min-acceptance", "0.6")
    assert code == 0, err
    assert [line.split()[:2] for line in lines[:4]] == [
        ["ok", "health"], ["ok", "models"], ["ok", "chat"], ["ok", "acceptance"]]
    # a server whose build patchkit is not told: judged, nothing recorded, and said
    assert lines[4] == ("evidence: the build is unknown (no --container or --build): nothing "
                        "recorded")
    assert lines[5].startswith("ok: 4/4 checks passed on http://127.0.0.1:")
    assert len(lines) == 6 and err == ""


def test_cli_json_report(capsys):
    with serve(Behaviour(draft_tokens=10, accepted_tokens=2)) as s:
        code, lines, _ = main(capsys, s.url, "--min-acceptance", "0.5", "--format", "json",
                              "--model", MODEL)
        url = s.url
    doc = json.loads("\n".join(lines))
    assert code == 1
    assert set(doc) == {"ok", "url", "model", "checks", "acceptance", "spec_decode", "garble",
                        "speed", "build", "evidence", "gate", "notes"}
    assert doc["build"] is None and doc["evidence"] is None and doc["gate"] is None
    assert doc["notes"] == ["evidence: the build is unknown (no --container or --build): "
                            "nothing recorded"]
    assert doc["ok"] is False and doc["url"] == url and doc["model"] == MODEL
    assert doc["acceptance"] == 0.2 and doc["garble"] is None
    assert doc["spec_decode"]["draft_tokens"] == 10 and doc["spec_decode"]["accepted"] == 2
    counts = {k: doc["spec_decode"][k] for k in ("drafts", "draft_tokens", "drafted", "accepted")}
    assert all(type(v) is int for v in counts.values()), counts   # counts, not 10.0
    assert [(c["name"], c["ok"], c["status"]) for c in doc["checks"]] == [
        ("health", True, "ok"), ("models", True, "ok"), ("chat", True, "ok"),
        ("acceptance", False, "failed")]
    assert all(set(c) == {"name", "ok", "status", "message"} for c in doc["checks"])


@pytest.mark.parametrize("fault, args, failing, words", [
    (Behaviour(health_status=500), [], "health", "HTTP 500"),
    (Behaviour(models=["x"]), ["--model", MODEL], "models", "does not list"),
    (Behaviour(models=["x", "y"]), [], "models", "2 models ('x', 'y')"),
    (Behaviour(content=""), [], "chat", "empty content"),
    (Behaviour(garbled={CHAT}), [], "chat", "not JSON"),
    (Behaviour(accepted_tokens=1), ["--min-acceptance", "0.5"], "acceptance", "below 0.5"),
    (Behaviour(draft_tokens=0, accepted_tokens=0), ["--min-acceptance", "0.5"], "acceptance",
     "spec decode did not run"),
    (Behaviour(hang={"/v1/models"}), ["--timeout", "0.3"], "models", "no answer within 0.3s"),
], ids=["health-500", "model-missing", "two-models", "empty-content", "garbled",
        "low-acceptance", "no-drafts", "hang"])
def test_cli_each_failure_exit_1_names_the_check(capsys, fault, args, failing, words):
    with serve(fault) as s:
        code, lines, err = main(capsys, s.url, *args)
    assert code == 1 and err == ""
    [line] = [x for x in lines if x.split()[0] in ("FAILED", "INCONCLUSIVE")]
    assert line.split()[1] == failing and words in line
    assert lines[-1].startswith("FAILED: ")
    # every check that could not run after it says so
    assert all("not run: " in x for x in lines[:-1] if x.startswith("- "))


def test_cli_nothing_listening_is_one_line_exit_1(capsys):
    with refusing_port() as port:
        code, lines, err = main(capsys, f"http://127.0.0.1:{port}", "--min-acceptance", "0.5")
    assert code == 1 and err == ""
    assert len(lines) == 1
    assert lines[0].startswith("FAILED: ") and "connection refused" in lines[0]
    assert f"127.0.0.1:{port}" in lines[0]


@pytest.mark.parametrize("args", [["localhost:8000"], ["ftp://h"], ["http://x", "--min-acceptance",
                                  "1.5"], ["http://x", "--min-acceptance", "-0.2"],
                                  ["http://x", "--min-acceptance", "nan"],
                                  ["http://x", "--timeout", "0"]])
def test_cli_bad_input_is_exit_2_one_line(capsys, args):
    code, lines, err = main(capsys, *args)
    assert code == 2 and lines == []
    assert len(err.splitlines()) == 1 and err.startswith("patchkit")


def test_cli_console_script_runs(tmp_path):
    with serve() as s:
        p = patchkit("smoke", s.url, "--format", "json", cwd=tmp_path, timeout=60)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["ok"] is True


def test_smoke_core_stays_apart_from_the_cli():
    text = Path(smoke.__file__).read_text()
    assert "import click" not in text and "print(" not in text


# ------------------------------------------------------------------------ acceptance that cannot lie

def test_mean_length_and_per_position_rates_come_from_the_drafts_counter():
    # 24 draft tokens, 18 accepted over two engines; 3 draft positions: 4 drafts an engine
    with serve(Behaviour(draft_tokens=24, accepted_tokens=18)) as s:
        report = run(s.url, min_acceptance=0.7, min_acceptance_length=3.25)
    got = report.spec_decode
    assert report.ok
    assert (got.drafts, got.draft_tokens, got.accepted) == (8, 24, 18)
    assert got.mean_length == 1 + 18 / 8
    assert got.per_position == (0.75, 0.75, 0.75)   # 6 accepted at each position over 8 drafts
    message = by_name(report)["acceptance"].message
    assert "mean length 3.25" in message and "per position 0.750, 0.750, 0.750" in message


def test_a_mean_length_below_the_floor_fails_saying_so():
    with serve(Behaviour(draft_tokens=24, accepted_tokens=18)) as s:
        report = run(s.url, min_acceptance_length=3.5)
    check = by_name(report)["acceptance"]
    assert not report.ok and check.status == "failed"
    assert "mean length below 3.5" in check.message and report.spec_decode.mean_length == 3.25


def test_created_twins_are_served_and_never_read():
    with serve(Behaviour(draft_tokens=30, accepted_tokens=7, engines=1)) as s:
        text = http.get_text(s.url + "/metrics", timeout=5)
        report = run(s.url, min_acceptance=0.1, min_acceptance_length=1.1)
    samples = parse_metrics(text)
    twins = [x for x in samples if x.name.endswith("_created") and "spec_decode" in x.name]
    # the twins hold Unix times: read as counts they would give a rate and a length far off
    assert {x.name for x in twins} >= {DRAFT_TOKENS.replace("_total", "_created"),
                                       metrics.DRAFTS.replace("_total", "_created"),
                                       metrics.PER_POSITION.replace("_total", "_created")}
    assert all(x.value > 1e9 for x in twins)
    got = report.spec_decode
    assert (got.rate, got.drafts, got.mean_length) == (7 / 30, 10, 1.7)
    assert got.per_position == (0.3, 0.2, 0.2)   # 3, 2 and 2 accepted over 10 drafts


def test_zero_drafts_are_inconclusive_never_a_pass():
    with serve(Behaviour(draft_tokens=0, accepted_tokens=0)) as s:
        report = run(s.url, min_acceptance=0.0)   # even a floor of 0 is not met by nothing
    check = by_name(report)["acceptance"]
    assert not report.ok and check.inconclusive and check.status == "inconclusive"
    assert check.message.startswith("inconclusive: ") and report.spec_decode is None


def test_cli_zero_drafts_print_inconclusive_exit_1(capsys):
    with serve(Behaviour(draft_tokens=0, accepted_tokens=0)) as s:
        code, lines, _ = main(capsys, s.url, "--min-acceptance-length", "1.5")
    assert code == 1
    assert lines[3].split()[:2] == ["INCONCLUSIVE", "acceptance"]
    assert lines[-1].startswith("FAILED: 1 of 4 checks")


# ------------------------------------------------------------------------ --long

def test_a_long_answer_that_counts_right_passes():
    with serve() as s:
        report = run(s.url, long=Long(3000))
        [*_, (_, _, body)] = s.requests(CHAT)
    long = by_name(report)["long"]
    assert report.ok and long.ok and report.garble is None
    assert "counted from 1 to 3000" in long.message and "3000 of 3000 tokens" in long.message
    assert body["max_tokens"] == 3000 and body["temperature"] == 0 and body["logprobs"] is True


@pytest.mark.parametrize("kind, words", [("fffd", "U+FFFD"), ("repeat", "a run of repeats"),
                                         ("skip", "the sequence breaks"),
                                         ("bytes", "U+FFFD")])
def test_a_long_answer_that_garbles_late_is_caught_at_its_token(kind, words):
    with serve(Behaviour(long_garble_after=2345, long_garble=kind)) as s:
        report = run(s.url, long=Long(4000), min_acceptance=0.5)
    long = by_name(report)["long"]
    assert not report.ok and not long.ok
    assert report.garble.token == 2345
    assert words in long.message and "token 2345" in long.message
    # the text around it shows the last good numbers
    assert "2344" in report.garble.context
    assert by_name(report)["chat"].ok and by_name(report)["acceptance"].ok   # ran all the same


def test_a_long_answer_repeating_a_text_garbles_at_its_token():
    with serve(Behaviour(long_garble_after=301, long_garble="repeat")) as s:
        ok = run(s.url, long=Long(300, "the quick brown fox"))
        bad = run(s.url, long=Long(500, "the quick brown fox"))
    assert ok.ok and "repeated 'the quick brown fox'" in by_name(ok)["long"].message
    assert not bad.ok and bad.garble.token == 301


def test_a_long_answer_that_stops_early_is_no_garble():
    with serve(Behaviour(long_stop_after=700)) as s:
        report = run(s.url, long=Long(1000))
    assert report.ok and "700 of 1000 tokens, finish_reason stop" in by_name(report)["long"].message


def test_a_hung_long_answer_is_bounded_by_the_timeout():
    with serve(Behaviour(hang={CHAT})) as s:
        report = run(s.url, long=Long(8192), timeout=0.3)
    assert not by_name(report)["long"].ok
    assert "no answer within 0.3s" in by_name(report)["long"].message


def test_cli_long_garble_exit_1_names_offset_and_text(capsys):
    with serve(Behaviour(long_garble_after=1200)) as s:
        code, lines, _ = main(capsys, s.url, "--long", "2000")
    assert code == 1
    [line] = [x for x in lines if x.startswith("FAILED  long")]
    assert "garbled at token 1200 (character " in line and "1199" in line


@pytest.mark.parametrize("args", [["--long", "0"], ["--long", "-5"], ["--text", "abc"],
                                  ["--long", "10", "--text", " "],
                                  ["--min-acceptance", "2"],
                                  ["--min-acceptance-length", "0.5"],
                                  ["--min-acceptance-length", "nan"]])
def test_cli_bad_long_and_floors_are_exit_2_one_line(capsys, args):
    with serve() as s:
        code, lines, err = main(capsys, s.url, *args)
        asked = s.requests()
    assert code == 2 and lines == [] and asked == []
    assert len(err.splitlines()) == 1 and args[-2] in err   # the flag at fault


def test_a_long_answer_spent_on_reasoning_is_walked_there():
    with serve(Behaviour(long_garble_after=800, reasoning_long=True)) as s:
        report = run(s.url, long=Long(1000))
    assert not report.ok and report.garble.token == 800
