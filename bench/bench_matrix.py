"""The repository's whole support matrix against the same number of plain `git apply --check`
runs, side by side, warm cache.

patchkit: one `patchkit rebase-check --vllm-repo pypi --to R ...` process over every release in
docs/support.md (v0.27.1 to the pin): resolve, a sparse shared checkout per release, every patch
of the series (diffs, libcst transforms) applied or judged, every assertion, the report.

The baseline, what a shell script checking the same cells does with git alone: per release a
`git clone --shared --no-checkout` of the same cached upstream, a sparse checkout of the same
files, then one `git apply --check` per cell (release x patch), each patch as the diff of its
effect (a transform's too: the diff its commit made where it applied).  Same cells, same files;
no transform is run, no assertion checked, no report made.

Prints both medians and the ratio.  Target: ratio <= 1.5.

    python bench/bench_matrix.py [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import rebase_check, shown
from patchkit import git as g
from patchkit import manifest, source
from patchkit.cache import cache_dir
from patchkit.manifest.runspec import run_spec
from patchkit.series import applier

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from testing.releases import RELEASES  # noqa: E402


def effects(series, cache: Path, work: Path) -> dict[str, Path]:
    """Each patch's effect as a diff file, taken where it applied (untimed)."""
    out: dict[str, Path] = {}
    for release in RELEASES:
        tree = work / f"apply-{release}"
        run = run_spec(series, ref=release, repos=("pypi",), cache=cache)
        applier.apply_series(series, run=run, workdir=tree)
        for line in g._lines(g._run("log", "--format=%H %s", "patchkit/base..HEAD", cwd=tree)):
            sha, subject = line.split(" ", 1)
            pid = subject.removeprefix("patchkit: ").split(":", 1)[0]
            if pid not in out:
                out[pid] = work / f"{pid}.diff"
                out[pid].write_text(g.diff(tree, f"{sha}~1", sha))
        shutil.rmtree(tree)
    missing = [p.id for p in series.patches if p.id not in out]
    if missing:
        raise SystemExit(f"never applied on any release: {missing}")
    return out


def plain(series, diffs: dict[str, Path], cache: Path, work: Path) -> float:
    """Seconds of the baseline: per release, a shared sparse checkout and one `git apply
    --check` per patch."""
    paths = applier.needed_paths(series) or []
    env = {**g.IDENTITY, "PATH": "/usr/bin:/bin", "HOME": str(work)}

    def git(*args, cwd=None, check=True):
        return subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True,
                              check=check)

    t0 = time.perf_counter()
    for release in RELEASES:
        resolved = source.resolve(["pypi"], release, cache)
        dest = work / f"plain-{release}"
        git("clone", "-q", "--shared", "--no-checkout", str(resolved.repo), str(dest))
        git("sparse-checkout", "set", "--no-cone", *paths, cwd=dest)
        git("checkout", "-q", resolved.commit, cwd=dest)
        for p in series.patches:
            git("apply", "--check", str(diffs[p.id]), cwd=dest, check=False)
    took = time.perf_counter() - t0
    for release in RELEASES:
        shutil.rmtree(work / f"plain-{release}", ignore_errors=True)
    return took


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    cache = cache_dir()
    series = manifest.load(REPO / "patchset.yaml")
    cells = len(RELEASES) * len(series.patches)
    work = Path(tempfile.mkdtemp(prefix="pk-bench-matrix-"))
    try:
        diffs = effects(series, cache, work)
        extra = ["--vllm-repo", "pypi"]
        print(f"{len(series.patches)} patches x {len(RELEASES)} releases ({RELEASES[0]} to "
              f"{RELEASES[-1]}) = {cells} cells; cores: {os.cpu_count()}; runs: {args.runs}; "
              f"load {os.getloadavg()[0]:.1f}")
        rebase_check(REPO, list(RELEASES), extra)   # untimed: page cache and byte code warm
        plain(series, diffs, cache, work)
        ours, base = [], []
        for _ in range(args.runs):
            ours.append(rebase_check(REPO, list(RELEASES), extra))
            base.append(plain(series, diffs, cache, work))
        a, b = statistics.median(ours), statistics.median(base)
        print(f"  patchkit rebase-check:         {shown(ours)}")
        print(f"  {cells} x git apply --check:   {shown(base)}")
        print(f"  ratio: {a / b:.2f} (target <= 1.50); load {os.getloadavg()[0]:.1f}")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
