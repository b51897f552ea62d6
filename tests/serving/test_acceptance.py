"""Acceptance as one value, from counters or log lines, and its verdict against a floor."""

from __future__ import annotations

import pytest

from patchkit.serving.acceptance import (FAIL, INCONCLUSIVE, PASS, Floor, from_counts, from_lines, judge,
                                 length_problem, parse_line, rate_problem)


def test_from_counts_gives_rate_mean_length_and_per_position_rates():
    got = from_counts(drafts=10, draft_tokens=50, accepted=20, per_position=[8, 6, 4, 2, 0])
    assert got.rate == 0.4 and got.mean_length == 3.0
    assert got.per_position == (0.8, 0.6, 0.4, 0.2, 0.0)


@pytest.mark.parametrize("floor, status", [(Floor(0.4), PASS), (Floor(0.41), FAIL),
                                           (Floor(None, 3.0), PASS), (Floor(0.1, 3.1), FAIL)])
def test_judge_holds_each_part_to_its_floor(floor, status):
    assert judge(from_counts(10, 50, 20), floor).status == status


def test_nothing_drafted_is_inconclusive_whatever_the_floor():
    for floor in (Floor(0.0), Floor(None, 1.0)):
        verdict = judge(from_counts(0, 0, 0), floor)
        assert verdict.status == INCONCLUSIVE and not verdict.ok


def test_a_floor_needs_the_part_it_asks_for():
    # a rate-only log line holds no mean length
    lines = [parse_line("SpecDecoding metrics: Draft acceptance rate: 40.0%")]
    verdict = judge(from_lines(lines), Floor(None, 2.0))
    assert verdict.status == FAIL and "no mean acceptance length" in verdict.message


def test_other_lines_are_no_metrics_lines():
    assert parse_line("INFO Engine 000: Avg prompt throughput: 0.0 tokens/s") is None
    assert parse_line("DiffusionDecoding metrics: Committed: 3 tokens") is None


@pytest.mark.parametrize("value, bad", [(0, False), (1, False), (0.5, False), (1.01, True),
                                        (-0.1, True), (float("nan"), True), (True, True),
                                        ("0.5", True)])
def test_rate_bounds(value, bad):
    assert bool(rate_problem(value)) is bad


@pytest.mark.parametrize("value, bad", [(1, False), (4.5, False), (0.99, True),
                                        (float("inf"), True), (None, True)])
def test_length_bounds(value, bad):
    assert bool(length_problem(value)) is bad
