"""The apply report stored in a checkout keeps offsets as values, beside the sentences people
read; one written before the values were stored still reads."""

from __future__ import annotations

import json

import pytest
from testing.project import make_project

from patchkit import manifest
from patchkit.report import (REASONS, STATUSES, ApplyReport, Offset, PatchResult, Reason,
                             Status)
from patchkit.series import applier, checkout
from patchkit.run import run_spec


def test_the_stored_report_gives_back_the_offsets_it_was_written_with(tmp_path):
    proj = make_project(tmp_path)
    wd = tmp_path / "wd"
    report = applier.apply_series(manifest.load(proj / "patchset.yaml"),
                                  run=run_spec(manifest.load(proj / "patchset.yaml"),
                                  ref="v2"), workdir=wd)
    assert report.patches[0].offsets == [Offset(1, "pkg/mod.py", 6, 2)]
    stored = json.loads(checkout.report_path(wd).read_text())["patches"][0]
    assert stored["offsets"] == ["hunk 1 of pkg/mod.py at line 6 (offset +2)"]
    assert stored["offset_values"] == [{"hunk": 1, "path": "pkg/mod.py", "line": 6, "offset": 2}]
    assert checkout.read_report(wd).patches[0].offsets == [Offset(1, "pkg/mod.py", 6, 2)]


def test_a_path_that_reads_like_the_sentence_survives():
    odd = Offset(2, "a at line 9 (offset +1) b.py", 40, -3)
    data = {"vllm": {"ref": "v1", "commit": "c"}, "workdir": None,
            "patches": [{"id": "p", "kind": "diff", "status": "applied",
                         "offsets": [str(odd)], "offset_values": [odd.to_dict()]}]}
    assert ApplyReport.from_dict(data).patches[0].offsets == [odd]


def test_a_report_of_an_older_version_reads_without_offsets():
    text = json.dumps({"ok": True, "vllm": {"ref": "v1", "commit": "c", "version": None},
                       "workdir": "wd", "patches": [
                           {"id": "p", "kind": "diff", "status": "applied", "reason": None,
                            "commit": "d", "files": ["m.py"], "message": "",
                            "offsets": ["hunk 1 of m.py at line 6 (offset +2)"]}],
                       "verify": [], "variant": None})
    report = ApplyReport.from_json(text)
    assert [(p.id, p.status, p.offsets) for p in report.patches] == [("p", Status.APPLIED, [])]


def test_a_broken_offset_value_is_not_a_report():
    data = {"vllm": {"ref": "v1"}, "patches": [
        {"id": "p", "status": "applied", "offset_values": [{"hunk": 1, "path": "m.py"}]}]}
    with pytest.raises(ValueError, match="not an apply report"):
        ApplyReport.from_dict(data)


def test_what_is_in_the_way_reads_back_and_an_older_report_has_none():
    from patchkit.report import InTheWay, PackageInfo

    ways = [InTheWay("vllm/a.py", 2, "conflict", 40), InTheWay("vllm/c.py", None, "gone")]
    report = ApplyReport(PackageInfo("v1", "c" * 40, "1.0"), None,
                         [PatchResult("p", "diff", Status.FAILED, Reason.CONFLICT,
                                      in_the_way=ways)])
    data = json.loads(report.to_json())
    assert data["patches"][0]["in_the_way"] == [
        {"file": "vllm/a.py", "hunk": 2, "reason": "conflict", "line": 40},
        {"file": "vllm/c.py", "hunk": None, "reason": "gone", "line": None}]
    assert ApplyReport.from_dict(data).patches[0].in_the_way == ways
    del data["patches"][0]["in_the_way"]
    assert ApplyReport.from_dict(data).patches[0].in_the_way == []


def test_statuses_and_reasons_are_members_written_as_the_contracts_words():
    assert STATUSES == ("applied", "upstream", "skipped", "failed")
    assert REASONS == ("conflict", "fuzz", "anchor-missing", "ambiguous-anchor", "unsafe-path",
                       "overlay-drift", "assertion", "error")
    failed = PatchResult("p", "diff", Status.FAILED, Reason.ANCHOR_MISSING, message="m")
    text = json.dumps(failed.to_dict())
    assert '"status": "failed"' in text and '"reason": "anchor-missing"' in text
    assert f"{failed.status} {failed.reason}" == "failed anchor-missing"
    back = PatchResult.from_dict(json.loads(text))
    assert back.status is Status.FAILED and back.reason is Reason.ANCHOR_MISSING


def test_a_status_given_as_text_is_refused():
    with pytest.raises(AssertionError):
        PatchResult("p", "diff", "applied")
    with pytest.raises(AssertionError):
        PatchResult("p", "diff", Status.FAILED, "conflict")


def test_an_unknown_status_or_reason_is_not_a_report():
    for patch in ({"id": "p", "status": "merged"},
                  {"id": "p", "status": "failed", "reason": "bad-luck"}):
        with pytest.raises(ValueError, match="not an apply report"):
            ApplyReport.from_dict({"vllm": {"ref": "v1"}, "patches": [patch]})


def test_the_summary_says_the_statuses_in_one_order_and_apply_names_the_jit_modules():
    """Whichever patch comes first in the series, the closing line counts applied before
    skipped; a patch whose file feeds a FlashInfer JIT module is named with it in the text."""
    from patchkit.report import PackageInfo, PatchResult
    from patchkit.render import text

    pin = PackageInfo("v1", "0" * 40, "1")
    header = "flashinfer/data/include/flashinfer/norm.cuh"
    first_skipped = ApplyReport(pin, "wd", [
        PatchResult("a", "diff", Status.SKIPPED), PatchResult("b", "diff", Status.APPLIED),
        PatchResult("fi-norm", "diff", Status.APPLIED, files=[header], package="flashinfer"),
        PatchResult("fi-other", "diff", Status.APPLIED, files=["flashinfer/x.py"],
                    package="flashinfer")],
        jit_modules={"flashinfer": {header: ["norm"]}})
    first_applied = ApplyReport(pin, "wd", [PatchResult("b", "diff", Status.APPLIED),
                                            PatchResult("a", "diff", Status.SKIPPED)])
    assert text.summary(first_skipped).startswith("3 applied, 1 skipped;")
    assert text.summary(first_applied).startswith("1 applied, 1 skipped;")
    out = text.apply(first_skipped).splitlines()
    assert f"fi-norm feeds flashinfer's JIT module norm (through {header})" in out
    assert not any(line.startswith("fi-other") for line in out)
