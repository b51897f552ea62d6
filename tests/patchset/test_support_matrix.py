"""The support table users read (docs/support.md) against the real releases: every vLLM release
on PyPI from the table's first to the pin has a column, and `patchkit rebase-check` over all of
them, as a user runs it, gives exactly the table: applied, upstream or skipped, never failed.
The behaviour tests (the `patched` fixture) read the same table."""

from __future__ import annotations

import functools
import json
import os

import pytest

from patchkit import manifest, versions
from patchkit.source import pypi
from testing import REPO_ROOT, patchkit, release_cache
from testing.releases import RELEASES, STATUS_WORDS, STATUSES

PIN = manifest.load(REPO_ROOT / "patchset.yaml").vllm.ref


@functools.cache
def on_pypi() -> list[str]:
    """Every vLLM release on PyPI, pre-releases left out, oldest first."""
    return [v for v in pypi.release_versions() if not versions.parse(v).is_prerelease]


def test_every_release_from_the_first_to_the_pin_has_a_column():
    first, pin = versions.parse(RELEASES[0][1:]), versions.parse(PIN[1:])
    between = [f"v{v}" for v in on_pypi() if first <= versions.parse(v) <= pin]
    assert list(RELEASES) == between
    assert RELEASES[-1] == PIN


def test_every_patch_has_a_row_and_no_range_claims_an_older_release():
    series = manifest.load(REPO_ROOT / "patchset.yaml")
    first = versions.parse(RELEASES[0][1:])
    older = [v for v in on_pypi() if versions.parse(v) < first]
    assert older   # 0.27.0 and before: releases the series does not claim
    for release, row in STATUSES.items():
        assert list(row) == [p.id for p in series.patches], release
        assert set(row.values()) <= set(STATUS_WORDS)
    for p in series.patches:
        spec = p.ranges.get("vllm")
        assert spec is not None, f"{p.id}: no vllm: range claims every older release too"
        claimed = [v for v in older if spec.contains(v)]
        assert not claimed, f"{p.id}: {spec} claims {claimed}, older than the table proves"
        assert any(spec.contains(r[1:]) for r in RELEASES), f"{p.id}: {spec} holds no release"


@pytest.mark.real_vllm
def test_rebase_check_over_every_release_gives_the_table(tmp_path):
    env = dict(os.environ, PATCHKIT_CACHE_DIR=str(release_cache()))
    args = [a for release in RELEASES for a in ("--to", release)]
    out = patchkit("rebase-check", "--vllm-repo", "pypi", *args, "--format", "json",
                   cwd=REPO_ROOT, env=env, timeout=1800)
    report = json.loads(out.stdout)
    got = {t["vllm"]["ref"]: {p["id"]: p["status"] for p in t["patches"]}
           for t in report["targets"]}
    assert got == STATUSES
    assert out.returncode == 0 and report["ok"], out.stderr
