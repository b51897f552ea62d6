"""`patchkit apply` of the repository's own patchset on its pinned vLLM, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO_ROOT, real_cache


V027 = {
    "draft-quant-normalization": "applied",
    "dspark-draft-quant-scope": "applied",
    "nvfp4-ds-mla-stage-a": "applied",
    "nvfp4-ds-mla-stage-b": "applied",
    "nvfp4-ds-mla-stage-b-v031": "skipped",
    "nvfp4-ds-mla-stage-c": "applied",
    "nvfp4-ds-mla-stage-c-v031": "skipped",
    "dspark-loader-guards": "applied",
    "dspark-draft-moe-backend": "applied",
    # DeepSeek-V4.1 (vllm/models/deepseek_v41) from 0.31.0
    "dspark-v41-draft-quant-scope": "skipped",
    "dspark-v41-loader-guards": "skipped",
}
# the pin: stage A is upstream from 0.31.0 and out of its range at 0.33.0; B and C use their
# >=0.31 variants
V033 = dict(V027, **{"nvfp4-ds-mla-stage-a": "skipped", "nvfp4-ds-mla-stage-b": "skipped",
                     "nvfp4-ds-mla-stage-b-v031": "applied", "nvfp4-ds-mla-stage-c": "skipped",
                     "nvfp4-ds-mla-stage-c-v031": "applied",
                     "dspark-v41-draft-quant-scope": "applied",
                     "dspark-v41-loader-guards": "applied"})


@pytest.mark.real_vllm
@pytest.mark.parametrize("ref,version,expected", [(None, "0.33.0", V033),
                                                  ("v0.27.1", "0.27.1", V027)])
def test_apply_the_whole_patchset(tmp_path, ref, version, expected):
    env = dict(os.environ, PATCHKIT_CACHE_DIR=str(real_cache()),
               PYTHONPATH=str(REPO_ROOT / "src"))
    workdir = tmp_path / "vllm"
    args = ["--vllm-ref", ref] if ref else []
    out = subprocess.run([sys.executable, "-m", "patchkit", "apply", "--vllm-repo", "pypi",
                          *args, "--workdir", str(workdir), "--format", "json"],
                         cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["ok"] and report["vllm"]["version"] == version
    statuses = {p["id"]: p["status"] for p in report["patches"]}
    assert statuses == expected
    assert report["verify"] and all(a["ok"] for a in report["verify"])
    assert (workdir / "vllm" / "config" / "speculative.py").is_file()
