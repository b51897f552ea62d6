"""rebase-check and rebase against the real vLLM releases from PyPI.

A small series cut from the real v0.27.1 files here, pinned at v0.27.1, checked against
v0.31.0, v0.32.0 and v0.33.0 through `--vllm-repo pypi`, as CI does with `--releases`."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest
import yaml
from testing import patchkit
from testing.realdiffs import TORCH_UTILS, real_diffs

from patchkit import manifest
from patchkit.series import rebase
from patchkit.commands import rebase as rebase_cmd
from patchkit.series import applier
from patchkit.run import run_spec
from patchkit.source import pypi

pytestmark = pytest.mark.real_vllm

TARGETS = ["v0.31.0", "v0.32.0", "v0.33.0"]
SPECULATIVE = "vllm/config/speculative.py"

MARKER = '''\
import libcst as cst
import libcst.matchers as m
from patchkit.transform import Transform


class Marker(Transform):
    path = "vllm/config/speculative.py"

    def postcondition(self, module):
        return self.has(module, m.Name("_PATCHKIT_MARKER"))

    def transform(self, module):
        return module.with_changes(
            body=[*module.body, cst.parse_statement("_PATCHKIT_MARKER = True\\n")])
'''


@pytest.fixture
def project(real_vllm, tmp_path):
    repo, tag = pypi.ensure_release(real_vllm, "v0.27.1")
    for t in TARGETS:
        pypi.ensure_release(real_vllm, t)
    diffs = real_diffs(repo, tag)
    proj = tmp_path / "proj"
    (proj / "patches").mkdir(parents=True)
    entries = []
    for pid, text in diffs.items():
        (proj / "patches" / f"{pid}.diff").write_text(text)
        entries.append(f"  - id: {pid}\n    summary: {pid}\n    diff: patches/{pid}.diff\n")
    (proj / "patches/marker.py").write_text(MARKER)
    entries.append(f"  - id: marker\n    summary: a marker\n    transform: patches/marker.py\n"
                   f"    verify:\n      - file: {SPECULATIVE}\n        defines: _PATCHKIT_MARKER\n")
    (proj / "patchset.yaml").write_text(
        "name: real\nvllm:\n  repo: pypi   # the wheels\n  ref: v0.27.1\npatches:\n"
        + "".join(entries))
    return proj


def test_rebase_check_real_releases(project):
    p = patchkit("rebase-check", *[a for t in TARGETS for a in ("--to", t)], "--vllm-repo",
                 "pypi", "--format", "json", "--output", "junit:junit.xml", cwd=project)
    assert p.returncode == 1, p.stderr
    data = json.loads(p.stdout)
    got = {t["vllm"]["ref"]: {x["id"]: x["status"] if x["status"] != "failed" else x["reason"]
                              for x in t["patches"]} for t in data["targets"]}
    # upstream took the dtype-map line in v0.31.0; chat_utils.py is gone from v0.32.0 on;
    # the tail of the dtype map changed under dtype-tail in v0.31.0
    fates = {"dtype-map": "upstream", "dtype-size": "applied", "dtype-tail": "conflict",
             "chat-utils": "anchor-missing", "marker": "applied"}
    assert got == {"v0.31.0": {**fates, "chat-utils": "applied"}, "v0.32.0": fates,
                   "v0.33.0": fates}
    assert data["patches"][0]["upstream_since"] == "v0.31.0" and data["patches"][0]["drop"]
    size = next(x for x in data["targets"][2]["patches"] if x["id"] == "dtype-size")
    assert size["offsets"] and "offset +" in size["offsets"][0]
    suites = ET.parse(project / "junit.xml").getroot().findall("testsuite")
    assert sum(len(s.findall("testcase")) for s in suites) == 15
    tail = next(c for c in suites[2].findall("testcase") if c.get("name") == "dtype-tail")
    failure = tail.find("failure").text
    assert f"hunk 1 of {TORCH_UTILS}" in failure and '+    "nvfp4_tail": torch.uint8,' in failure
    assert not (project / ".patchkit").exists()


def test_rebase_real_refresh_and_conflict_then_abort(project, tmp_path):
    before = {p.name: p.read_bytes() for p in (project / "patches").iterdir()}
    before["patchset.yaml"] = (project / "patchset.yaml").read_bytes()
    first = rebase_cmd.start_at(project / "patchset.yaml", "v0.33.0")
    assert first.stop and first.stop.patch == "dtype-tail" and first.stop.reason == "conflict"
    steps = {s.id: s.action for s in first.steps}
    assert steps == {"dtype-map": "upstream", "dtype-size": "refreshed"}
    merged = (project / ".patchkit/rebase/tree" / TORCH_UTILS).read_text()
    assert "<<<<<<< vLLM v0.33.0" in merged and '    "nvfp4_tail": torch.uint8,' in merged
    rebase.abort(project / "patchset.yaml")
    after = {p.name: p.read_bytes() for p in (project / "patches").iterdir()
             if p.name != "__pycache__"}
    after["patchset.yaml"] = (project / "patchset.yaml").read_bytes()
    assert after == before


def test_rebase_real_to_the_end(project, tmp_path):
    text = (project / "patchset.yaml").read_text()
    # keep what moves cleanly: the upstream mark and the offset refresh, on real files
    keep = [e for e in text.split("  - id: ")[1:] if e.split("\n")[0] in ("dtype-map", "dtype-size", "marker")]
    (project / "patchset.yaml").write_text(text.split("  - id: ")[0] + "".join(
        "  - id: " + e for e in keep))
    result = rebase_cmd.start_at(project / "patchset.yaml", "v0.33.0")
    assert result.done, result.stop
    data = yaml.safe_load((project / "patchset.yaml").read_text())
    assert data["vllm"]["ref"] == "v0.33.0"
    assert data["patches"][0]["vllm"] == "<0.33.0"
    assert "# the wheels" in (project / "patchset.yaml").read_text()
    report = applier.apply_series(manifest.load(project / "patchset.yaml"),
                                  run=run_spec(manifest.load(project / "patchset.yaml")),
                                  workdir=tmp_path / "wd")
    assert report.ok and all(not r.offsets for r in report.patches)
    assert [r.status for r in report.patches] == ["skipped", "applied", "applied"]
