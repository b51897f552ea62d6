"""`patchkit apply` of the repository's own patchset on its pinned vLLM, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO_ROOT, real_cache


@pytest.mark.real_vllm
def test_apply_the_whole_patchset_on_the_pin(tmp_path):
    env = dict(os.environ, PATCHKIT_CACHE_DIR=str(real_cache()),
               PYTHONPATH=str(REPO_ROOT / "src"))
    workdir = tmp_path / "vllm"
    out = subprocess.run([sys.executable, "-m", "patchkit", "apply", "--vllm-repo", "pypi",
                          "--workdir", str(workdir), "--format", "json"],
                         cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["ok"] and report["vllm"]["version"] == "0.27.1"
    statuses = {p["id"]: p["status"] for p in report["patches"]}
    assert statuses == {
        "draft-quant-normalization": "applied",
        "dspark-draft-quant-scope": "applied",
        "nvfp4-ds-mla-stage-a": "applied",
        "nvfp4-ds-mla-stage-b": "applied",
        "nvfp4-ds-mla-stage-b-v031": "skipped",
        "nvfp4-ds-mla-stage-c": "applied",
        "nvfp4-ds-mla-stage-c-v031": "skipped",
        "dspark-loader-guards": "applied",
        "dspark-draft-moe-backend": "applied",
    }
    assert report["verify"] and all(a["ok"] for a in report["verify"])
    assert (workdir / "vllm" / "config" / "speculative.py").is_file()
