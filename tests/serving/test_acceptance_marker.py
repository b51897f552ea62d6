"""The ``acceptance:`` runtime marker: vLLM's periodic spec-decode metrics lines, in every
wording vLLM has logged them, held to a floor; and the bad floors the manifest refuses.

The current wording is rendered here with the format string of the real
``vllm/v1/spec_decode/metrics.py`` of each release from 0.27.1 to 0.33.0, read from the
releases' sources; the older wordings are vLLM's V0 ``Speculative metrics`` line and
the first V1 ``SpecDecoding metrics`` line, whose rate was a percentage placed first.
"""

from __future__ import annotations

import ast
import textwrap

import pytest
from testing import patchkit
from testing.project import make_project

from patchkit import git, manifest
from patchkit.errors import ManifestError
from patchkit.manifest import Marker
from patchkit.serving import acceptance, runtime
from patchkit.source import pypi
from testing.releases import RELEASES
from testing.releases import RELEASES

V0 = ("INFO 06-01 10:00:05 metrics.py:455] Speculative metrics: Draft acceptance rate: {rate:.3f}, "
      "System efficiency: 0.412, Number of speculative tokens: 5, Number of accepted tokens: "
      "{accepted}, Number of draft tokens: {drafted}, Number of emitted tokens: 1700.")
EARLY_V1 = ("INFO 04-10 10:00:05 [metrics.py:84] SpecDecoding metrics: Draft acceptance rate: "
            "{pct:.1f}%, Mean acceptance length: {length:.2f}, Accepted: {accepted} tokens, "
            "Drafted: {drafted} tokens, Per-position acceptance rate: 0.600, 0.400")
RATES_ONLY = "INFO SpecDecoding metrics: Draft acceptance rate: {pct:.1f}%"


def _format_of_release(cache, tag: str) -> str:
    """The format string of SpecDecodingLogging.log's metrics line in the real release."""
    repo, tag = pypi.ensure_release(cache, tag)
    tree = ast.parse(git.show(repo, f"{tag}:vllm/v1/spec_decode/metrics.py"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "log_fn":
            first = node.args[0]
            if isinstance(first, ast.Constant) and "SpecDecoding metrics" in first.value:
                return first.value
    raise AssertionError(f"no SpecDecoding metrics line in {tag}")


def current(fmt: str, accepted: int, drafted: int, drafts: int, per: str) -> str:
    rate = accepted / drafted * 100 if drafted else float("nan")
    length = 1 + accepted / drafts if drafts else float("nan")
    return "(APIServer pid=1) INFO 12-01 10:00:10 [loggers.py:257] " + fmt % (
        length, accepted / 10, drafted / 10, accepted, drafted, per, rate)


def judge(floor: acceptance.Floor, *logs: str, unless: str | None = None):
    marker = Marker(acceptance.LINE, acceptance=floor, unless=unless)
    [result] = runtime.judge([runtime.ScopedMarker(None, marker)],
                             [runtime.Log(f"r{i}.log", text.splitlines())
                              for i, text in enumerate(logs)])
    return result


@pytest.mark.real_vllm
@pytest.mark.parametrize("tag", RELEASES)   # every release the series supports
def test_the_line_of_each_real_release_is_judged_on_its_counts(real_vllm, tag):
    fmt = _format_of_release(real_vllm, tag)
    # 347 of 1000 accepted (DSpark's good 34.7%), then a stretch at 4.4%: 391 of 2000 in all
    log = "\n".join([current(fmt, 347, 1000, 200, "0.800, 0.500, 0.250, 0.120, 0.065"),
                     "INFO 12-01 10:00:20 [loggers.py:250] Engine 000: Avg prompt throughput",
                     current(fmt, 44, 1000, 200, "0.150, 0.050, 0.010, 0.010, 0.000")])
    result = judge(acceptance.Floor(0.19), log)
    assert result.ok and result.found == 2
    assert "rate 0.196 (391 of 2000 draft tokens)" in result.message
    assert "mean length 1.98" in result.message   # (2.735 + 1.22) / 2, weighed by drafted
    assert "per position 0.475, 0.275" in result.message
    failed = judge(acceptance.Floor(0.2, 2.0), log)
    assert not failed.ok
    assert "rate below 0.2" in failed.message and "mean length below 2" in failed.message


def test_the_v0_wording_a_fraction_with_counts():
    line = V0.format(rate=0.044, accepted=44, drafted=1000)
    assert judge(acceptance.Floor(0.04), line).ok
    result = judge(acceptance.Floor(0.25, 1.5), line)
    assert not result.ok and "rate 0.044 (44 of 1000 draft tokens)" in result.message
    assert "mean length 1.22" in result.message   # 1 + 44 accepted over 200 drafts of 5


def test_the_early_v1_wording_a_percentage_first():
    line = EARLY_V1.format(pct=34.7, length=2.74, accepted=347, drafted=1000)
    result = judge(acceptance.Floor(0.3, 2.5), line)
    assert result.ok and "rate 0.347" in result.message and "mean length 2.74" in result.message


def test_lines_without_counts_are_judged_on_their_rates():
    log = RATES_ONLY.format(pct=30.0) + "\n" + RATES_ONLY.format(pct=10.0)
    assert judge(acceptance.Floor(0.2), log).ok          # the mean of 30% and 10%
    assert not judge(acceptance.Floor(0.21), log).ok


def test_counts_outweigh_the_rounded_rates():
    # 1 of 3 accepted logs "33.3%"; summed counts say 2 of 6 exactly
    lines = "\n".join(EARLY_V1.format(pct=33.3, length=1.33, accepted=1, drafted=3)
                      for _ in range(2))
    assert judge(acceptance.Floor(1 / 3), lines).ok


def test_no_metrics_lines_are_not_yet_judged():
    result = judge(acceptance.Floor(0.1), "INFO Application startup complete.\n")
    assert not result.ok and result.pending and result.found == 0
    assert result.message == ("acceptance rate at least 0.1 in r0.log: not yet judged (no "
                              "spec-decode metrics lines: the server has served no drafts)")
    assert result.acceptance is None


def test_zero_drafts_are_an_inconclusive_failure():
    fmt = ("SpecDecoding metrics: Mean acceptance length: %.2f, Accepted throughput: %.2f "
           "tokens/s, Drafted throughput: %.2f tokens/s, Accepted: %d tokens, Drafted: %d "
           "tokens, Per-position acceptance rate: %s, Avg Draft acceptance rate: %.1f%%")
    line = current(fmt, 0, 0, 0, "nan, nan, nan")
    assert "nan" in line
    result = judge(acceptance.Floor(0.0), line)
    assert not result.ok and result.message.startswith("inconclusive: nothing was drafted")
    rates = judge(acceptance.Floor(0.0), "SpecDecoding metrics: Draft acceptance rate: nan%")
    assert not rates.ok and "inconclusive" in rates.message


def test_lines_of_several_logs_are_summed_and_unless_leaves_a_log_out():
    good = EARLY_V1.format(pct=34.7, length=2.74, accepted=347, drafted=1000)
    bad = EARLY_V1.format(pct=4.4, length=1.22, accepted=44, drafted=1000) + "\nDEBUG x"
    assert not judge(acceptance.Floor(0.25), good, bad).ok
    result = judge(acceptance.Floor(0.25), good, bad, unless="^DEBUG ")
    assert result.ok and "r1.log left out" in result.message


# ------------------------------------------------------------------------------ the manifest

HEAD = "name: demo\nvllm:\n  repo: pypi\n  ref: v0.33.0\n"
BAD = [
    ("runtime:\n  - acceptance: {min: 2}\n",
     "patchset.yaml:6: runtime[0].acceptance.min: 2 is outside 0 to 1 (a rate: 0.25 means a "
     "quarter of the draft tokens accepted)"),
    ("runtime:\n  - acceptance:\n      min: -0.1\n",
     "patchset.yaml:7: runtime[0].acceptance.min: -0.1 is outside 0 to 1 (a rate: 0.25 means a "
     "quarter of the draft tokens accepted)"),
    ("runtime:\n  - acceptance: {min: 27%}\n",
     "patchset.yaml:6: runtime[0].acceptance.min: expected a rate from 0 to 1, got the string "
     "'27%'"),
    ("runtime:\n  - acceptance: {min_length: 0.5}\n",
     "patchset.yaml:6: runtime[0].acceptance.min_length: 0.5 is below 1 (the mean acceptance "
     "length counts the bonus token: 1 means no draft token accepted)"),
    ("runtime:\n  - acceptance: {}\n",
     "patchset.yaml:6: runtime[0].acceptance: give min (a rate from 0 to 1), min_length (1 or "
     "more) or both"),
    ("runtime:\n  - acceptance: {minimum: 0.2}\n",
     "patchset.yaml:6: runtime[0].acceptance: unknown key 'minimum'; did you mean 'min'?"),
    ("runtime:\n  - acceptance: 0.2\n",
     "patchset.yaml:6: runtime[0].acceptance: expected a floor ({min: RATE, min_length: L}), got "
     "the number 0.2"),
    ("runtime:\n  - acceptance: {min: 0.2}\n    log: x\n",
     "patchset.yaml:7: runtime[0]: 'log' with acceptance; an acceptance marker takes only "
     "unless (it is judged on vLLM's spec-decode metrics lines)"),
]


@pytest.mark.parametrize("body, message", BAD, ids=[m.split(": ", 1)[1][:50] for _, m in BAD])
def test_a_bad_floor_is_one_line_with_its_line(tmp_path, monkeypatch, body, message):
    (tmp_path / "patchset.yaml").write_text(HEAD + body)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ManifestError) as info:
        manifest.load("patchset.yaml")
    assert str(info.value) == message


def test_a_bad_floor_exits_2_from_validate(tmp_path):
    (tmp_path / "patchset.yaml").write_text(HEAD + "runtime:\n  - acceptance: {min: 2}\n")
    out = patchkit("validate", cwd=tmp_path)
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1
    assert out.stderr.startswith("patchkit validate: error: patchset.yaml:6: runtime[0].acceptance.min: 2")


def test_a_floor_loads_into_a_frozen_value(tmp_path, monkeypatch):
    (tmp_path / "patchset.yaml").write_text(
        HEAD + "runtime:\n  - acceptance: {min: 0.25, min_length: 2}\n    unless: DEBUG\n")
    monkeypatch.chdir(tmp_path)
    [marker] = manifest.load("patchset.yaml").runtime
    assert marker == Marker(acceptance.LINE, unless="DEBUG", line=6,
                            acceptance=acceptance.Floor(0.25, 2.0))


def test_verify_log_judges_the_acceptance_marker(tmp_path):
    proj = make_project(tmp_path / "proj")
    text = (proj / "patchset.yaml").read_text() + textwrap.dedent("""\
        runtime:
          - acceptance: {min: 0.25, min_length: 2}
        """)
    (proj / "patchset.yaml").write_text(text)
    assert patchkit("apply", cwd=proj).returncode == 0
    good = proj / "good.log"
    good.write_text(EARLY_V1.format(pct=34.7, length=2.74, accepted=347, drafted=1000) + "\n")
    bad = proj / "bad.log"
    bad.write_text(EARLY_V1.format(pct=4.4, length=1.31, accepted=44, drafted=1000) + "\n")
    assert patchkit("verify", "--log", str(good), cwd=proj).returncode == 0
    out = patchkit("verify", "--log", str(bad), cwd=proj)
    assert out.returncode == 1
    assert "[series] acceptance rate 0.044 (44 of 1000 draft tokens)" in out.stdout
    assert "rate below 0.25" in out.stdout and "mean length below 2" in out.stdout
