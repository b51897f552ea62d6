"""``patchkit smoke --requests N``: decode speed as the client timed it.

vLLM cannot serve here (no GPU): these tests run against ``testing.standin_vllm``, a stand-in
on 127.0.0.1 that streams ``/v1/completions`` as vLLM does, at a token rate the test sets.
smoke's figures must come out within TOLERANCE of that rate.
"""

from __future__ import annotations

import json

import pytest
from testing.standin_vllm import MODEL, Behaviour, serve

from patchkit import cli
from patchkit.commands.smoke import Measure, run
from patchkit.errors import UsageError
from patchkit.serving import speed

TOLERANCE = 0.15   # the stand-in's rate is exact to its sleeps; the machine is shared


def completions(s) -> list[dict]:
    return [body for _, _, body in s.requests("/v1/completions")]


@pytest.mark.parametrize("rate", [30.0, 120.0])
def test_decode_rate_is_the_stand_ins_within_tolerance(rate):
    with serve(Behaviour(token_rate=rate, ttft=0.15)) as s:
        report = run(s.url, measure=Measure(3, 48))
        bodies = completions(s)
    assert report.ok, report.checks
    m = report.speed
    assert m.figures.decode_tok_s == pytest.approx(rate, rel=TOLERANCE)
    assert m.figures.decode_min <= m.figures.decode_tok_s <= m.figures.decode_max
    assert m.figures.ttft_s == pytest.approx(0.15, abs=0.1)
    assert len(m.figures.samples) == 3 and all(x.tokens == 48 for x in m.figures.samples)
    assert m.figures.tokens_from == "usage"
    assert (m.settings.model, m.settings.requests, m.settings.output_tokens) == (MODEL, 3, 48)
    assert m.server_version == "0.33.0" and m.spec_decode is True
    assert m.figures.acceptance == pytest.approx(0.75)
    assert len(bodies) == 3
    for body in bodies:   # the fixed, deterministic request
        assert body["stream"] is True and body["temperature"] == 0
        assert body["max_tokens"] == 48 and body["ignore_eos"] is True
        assert body["prompt"] == speed.PROMPT
        assert body["stream_options"] == {"include_usage": True}


def test_tokens_come_from_usage_when_events_carry_several():
    # a speculative step sends several tokens in one event: counting events would undercount
    with serve(Behaviour(token_rate=60.0, tokens_per_event=3)) as s:
        report = run(s.url, measure=Measure(2, 48))
    assert report.speed.figures.decode_tok_s == pytest.approx(60.0, rel=TOLERANCE)
    assert [x.tokens for x in report.speed.figures.samples] == [48, 48]


def test_without_usage_the_stream_is_counted_and_said():
    with serve(Behaviour(token_rate=60.0, send_usage=False, spec_decode=False,
                         version=None)) as s:
        report = run(s.url, measure=Measure(2, 40))
    m = report.speed
    assert m.figures.tokens_from == "stream"
    assert m.figures.decode_tok_s == pytest.approx(60.0, rel=TOLERANCE)
    assert m.spec_decode is False and m.server_version is None
    text = next(c.message for c in report.checks if c.name == "speed")
    assert "counted from the stream" in text and "spec decode off" in text


def test_aggregate_at_a_concurrency():
    with serve(Behaviour(token_rate=50.0, ttft=0.01)) as s:
        report = run(s.url, measure=Measure(1, 40, 4))
        n = len(completions(s))
    assert n == 5
    # four streams at 50 tok/s each, at once
    assert report.speed.figures.aggregate_tok_s == pytest.approx(200.0, rel=TOLERANCE)


def test_a_stream_that_misses_its_deadline_fails_the_check():
    with serve(Behaviour(token_rate=5.0)) as s:
        report = run(s.url, measure=Measure(1, 100), timeout=1.0)
    check = next(c for c in report.checks if c.name == "speed")
    assert not report.ok and not check.ok
    assert "no answer within 1s" in check.message


@pytest.mark.parametrize("measure, said", [
    (Measure(0), "--requests 0"), (Measure(2, concurrency=0), "--concurrency 0"),
    (Measure(2, output_tokens=1), "--output-tokens 1"),
    (Measure(None, concurrency=2), "go with --requests")])
def test_bad_settings_are_usage_errors(measure, said):
    with pytest.raises(UsageError, match=said):
        run("http://127.0.0.1:9", measure=measure)


def test_cli_json_says_how_it_was_measured(capsys):
    with serve(Behaviour(token_rate=100.0)) as s:
        code = cli.main(["smoke", s.url, "--requests", "2", "--output-tokens", "32",
                         "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0
    assert doc["speed"]["settings"] == {"model": MODEL, "output_tokens": 32, "requests": 2,
                                        "concurrency": None, "prompt": speed.PROMPT,
                                        "endpoint": "/v1/completions"}
    assert doc["speed"]["server_version"] == "0.33.0" and doc["speed"]["spec_decode"] is True
    assert doc["speed"]["figures"]["decode_tok_s"] == pytest.approx(100.0, rel=TOLERANCE)
