"""The core against real vLLM releases from PyPI (v0.27.1 and v0.33.0), laid out as a cached
local git upstream.  The diffs are cut from the real v0.27.1 files here, so each one meets a
known fate at v0.33.0: upstream, applied at an offset, conflict, anchor missing."""

from __future__ import annotations

import json

import pytest
from testing import REPO_ROOT
from testing.realdiffs import CHAT_UTILS, TORCH_UTILS, real_diffs
from testing.upstream import sh

from patchkit import manifest
from patchkit.series import applier
from patchkit.run import run_spec
from patchkit.source import pypi

pytestmark = pytest.mark.real_vllm

@pytest.fixture
def project(real_vllm, tmp_path):
    repo, tag = pypi.ensure_release(real_vllm, "v0.27.1")
    pypi.ensure_release(real_vllm, "v0.33.0")
    diffs = real_diffs(repo, tag)
    proj = tmp_path / "proj"
    (proj / "patches").mkdir(parents=True)
    entries = []
    verify = {
        "dtype-map": f"file: {TORCH_UTILS}\n        in: STR_DTYPE_TO_TORCH_DTYPE\n        has_key: nvfp4_ds_mla",
        "dtype-size": f"file: {TORCH_UTILS}\n        in: get_dtype_size\n        calls: torch.tensor",
        "dtype-tail": f"file: {TORCH_UTILS}\n        in: STR_DTYPE_TO_TORCH_DTYPE\n        has_key: nvfp4_tail",
        "chat-utils": f"file: {CHAT_UTILS}\n        defines: _detect_field",
    }
    for pid, text in diffs.items():
        (proj / "patches" / f"{pid}.diff").write_text(text)
        entries.append(f"  - id: {pid}\n    summary: real edit {pid}\n    diff: patches/{pid}.diff\n"
                       f"    verify:\n      - {verify[pid]}\n")
    (proj / "patchset.yaml").write_text(
        "name: real\nvllm:\n  repo: pypi\n  ref: v0.27.1\npatches:\n" + "".join(entries))
    return proj


def test_series_applies_at_v0_27_1_one_commit_each(project, tmp_path):
    wd = tmp_path / "wd"
    report = applier.apply_series(manifest.load(project / "patchset.yaml"),
                                  run=run_spec(manifest.load(project / "patchset.yaml")),
                                  workdir=wd)
    assert report.ok, report.to_json()
    assert [p.status for p in report.patches] == ["applied"] * 4
    assert report.vllm.version == "0.27.1"
    log = sh("git", "log", "--format=%s", "patchkit/base..HEAD", cwd=wd).splitlines()
    assert log == [f"patchkit: {pid}: real edit {pid}" for pid in
                   ("chat-utils", "dtype-tail", "dtype-size", "dtype-map")]
    assert all(a.ok for a in report.verify) and len(report.verify) == 4
    for rel in (TORCH_UTILS, CHAT_UTILS):
        compile((wd / rel).read_text(), rel, "exec")
    assert len(sh("git", "ls-files", cwd=wd).splitlines()) > 4000


def test_series_at_v0_33_0_reports_each_true_fate_and_leaves_workdir(project, tmp_path):
    wd = tmp_path / "wd"
    m = manifest.load(project / "patchset.yaml")
    assert applier.apply_series(m, run=run_spec(m), workdir=wd).ok
    good_head = sh("git", "rev-parse", "HEAD", cwd=wd)
    report = applier.apply_series(m, run=run_spec(m, ref="v0.33.0"), workdir=wd)
    assert not report.ok
    fates = {p.id: (p.status, p.reason) for p in report.patches}
    assert fates == {"dtype-map": ("upstream", None), "dtype-size": ("applied", None),
                     "dtype-tail": ("failed", "conflict"), "chat-utils": ("failed", "anchor-missing")}
    size = report.patches[1]
    assert size.offsets and "offset +" in str(size.offsets[0])
    assert report.patches[2].message.startswith(f"hunk 1 of {TORCH_UTILS}: expected at line")
    assert report.vllm.version == "0.33.0"
    # the earlier good checkout is untouched
    assert sh("git", "rev-parse", "HEAD", cwd=wd) == good_head
    saved = json.loads((wd / ".git/patchkit-report.json").read_text())
    assert saved["vllm"]["version"] == "0.27.1"


def test_fuzz_is_refused_on_a_real_file(project, real_vllm, tmp_path):
    # rewrite an outer context line of the dtype-map hunk: only a fuzzy tool would take it
    text = (project / "patches/dtype-map.diff").read_text()
    text = text.replace(' "fp8_per_token_head": torch.uint8,\n', ' "fp8_per_token_head": torch.uint16,\n', 1)
    (project / "patches/dtype-map.diff").write_text(text)
    report = applier.apply_series(manifest.load(project / "patchset.yaml"),
                                  run=run_spec(manifest.load(project / "patchset.yaml")),
                                  workdir=tmp_path / "wd")
    assert (report.patches[0].status, report.patches[0].reason) == ("failed", "fuzz")
    assert not (tmp_path / "wd").exists()


def test_docs_transform_example_works_on_the_real_file(real_vllm, tmp_path):
    import re

    from patchkit.transform import run_transform_file

    readme = (REPO_ROOT / "docs" / "manifest.md").read_text()
    code = re.search(r"```python\n(import libcst as cst\n.*?)```", readme, re.S).group(1)
    (tmp_path / "t.py").write_text(code)
    repo, tag = pypi.ensure_release(real_vllm, "v0.27.1")
    rel = "vllm/v1/worker/gpu/spec_decode/dspark/utils.py"
    (tmp_path / "tree" / rel).parent.mkdir(parents=True)
    (tmp_path / "tree" / rel).write_text(sh("git", "show", f"{tag}:{rel}", cwd=repo) + "\n")
    first = run_transform_file(tmp_path / "t.py", tmp_path / "tree", None)
    assert (first.status, first.reason) == ("applied", None), first.message
    assert "moe_backend=speculative_config.moe_backend" in (tmp_path / "tree" / rel).read_text()
    assert run_transform_file(tmp_path / "t.py", tmp_path / "tree", None).status == "upstream"
