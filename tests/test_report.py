"""The apply report stored in a checkout keeps offsets as values, beside the sentences people
read; one written before the values were stored still reads."""

from __future__ import annotations

import json

import pytest
from testing.project import make_project

from patchkit import manifest
from patchkit.report import ApplyReport, Offset
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
    assert [(p.id, p.status, p.offsets) for p in report.patches] == [("p", "applied", [])]


def test_a_broken_offset_value_is_not_a_report():
    data = {"vllm": {"ref": "v1"}, "patches": [
        {"id": "p", "status": "applied", "offset_values": [{"hunk": 1, "path": "m.py"}]}]}
    with pytest.raises(ValueError, match="not an apply report"):
        ApplyReport.from_dict(data)


def test_what_is_in_the_way_reads_back_and_an_older_report_has_none():
    from patchkit.report import InTheWay, PatchResult, PackageInfo

    ways = [InTheWay("vllm/a.py", 2, "conflict", 40), InTheWay("vllm/c.py", None, "gone")]
    report = ApplyReport(PackageInfo("v1", "c" * 40, "1.0"), None,
                         [PatchResult("p", "diff", "failed", "conflict", in_the_way=ways)])
    data = json.loads(report.to_json())
    assert data["patches"][0]["in_the_way"] == [
        {"file": "vllm/a.py", "hunk": 2, "reason": "conflict", "line": 40},
        {"file": "vllm/c.py", "hunk": None, "reason": "gone", "line": None}]
    assert ApplyReport.from_dict(data).patches[0].in_the_way == ways
    del data["patches"][0]["in_the_way"]
    assert ApplyReport.from_dict(data).patches[0].in_the_way == []
