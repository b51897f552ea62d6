"""`patchkit apply` of the repository's own patchset on its pinned vLLM, as a user runs it."""

from __future__ import annotations

import json
import os

import pytest

from patchkit import manifest
from testing import REPO_ROOT, patchkit, release_cache

from testing.releases import STATUSES

PIN = manifest.load(REPO_ROOT / "patchset.yaml").vllm.ref


@pytest.mark.real_vllm
@pytest.mark.parametrize("ref,version,release", [(None, PIN.removeprefix("v"), PIN),
                                                 ("v0.27.1", "0.27.1", "v0.27.1")])
def test_apply_the_whole_patchset(tmp_path, ref, version, release):
    env = dict(os.environ, PATCHKIT_CACHE_DIR=str(release_cache()))
    workdir = tmp_path / "vllm"
    args = ["--vllm-ref", ref] if ref else []
    out = patchkit("apply", "--vllm-repo", "pypi", *args, "--workdir", str(workdir),
                   "--format", "json", cwd=REPO_ROOT, env=env, timeout=900)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["ok"] and report["vllm"]["version"] == version
    statuses = {p["id"]: p["status"] for p in report["patches"]}
    assert statuses == STATUSES[release]
    assert report["verify"] and all(a["ok"] for a in report["verify"])
    assert (workdir / "vllm" / "config" / "speculative.py").is_file()
