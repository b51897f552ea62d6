"""The repository's whole support matrix against plain git doing the same work, side by side,
warm cache.

patchkit: one `patchkit rebase-check --vllm-repo pypi --to R ...` process over every release in
docs/support.md (v0.27.1 to v0.34.0): resolve, a sparse checkout per release borrowing the
cached objects, every patch of the series (diffs, libcst transforms) applied or judged with one
commit each where it applied, every assertion, the report, the scratch checkouts removed.

The baseline, what a shell script checking the same releases does with git alone: per release a
`git clone --shared --no-checkout` of the same cached upstream, a sparse checkout of the same
files, then one `git apply --check` per patch in the release's range, each patch as the diff of
its effect (a transform's too: the diff its commit made where it applied), and the clone
removed.  Same releases, same files; no transform is run, no commit made, no assertion checked,
no report made.

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
from patchkit.run import run_spec
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


def in_range(series, cache: Path) -> dict[str, list]:
    """Each release's patches in its range, in series order (untimed)."""
    found = {}
    for release in RELEASES:
        version = source.resolve(["pypi"], release, cache).version
        found[release] = [p for p in series.patches if applier.in_range(p, version)[0]]
    return found


def plain(series, diffs: dict[str, Path], cache: Path, work: Path, cells: dict[str, list]
          ) -> float:
    """Seconds of the baseline: per release, a shared sparse checkout, one `git apply
    --check` per patch in range, and the checkout removed."""
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
        for p in cells[release]:
            git("apply", "--check", str(diffs[p.id]), cwd=dest, check=False)
        shutil.rmtree(dest)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    cache = cache_dir()
    series = manifest.load(REPO / "patchset.yaml")
    work = Path(tempfile.mkdtemp(prefix="pk-bench-matrix-"))
    try:
        diffs = effects(series, cache, work)
        cells = in_range(series, cache)
        checks = sum(len(c) for c in cells.values())
        extra = ["--vllm-repo", "pypi"]
        print(f"{len(series.patches)} patches x {len(RELEASES)} releases ({RELEASES[0]} to "
              f"{RELEASES[-1]}), {checks} in range; cores: {os.cpu_count()}; runs: {args.runs}; "
              f"load {os.getloadavg()[0]:.1f}")
        rebase_check(REPO, list(RELEASES), extra)   # untimed: page cache and byte code warm
        plain(series, diffs, cache, work, cells)
        ours, base = [], []
        for _ in range(args.runs):
            ours.append(rebase_check(REPO, list(RELEASES), extra))
            base.append(plain(series, diffs, cache, work, cells))
        a, b = statistics.median(ours), statistics.median(base)
        print(f"  patchkit rebase-check:         {shown(ours)}")
        print(f"  {len(RELEASES)} sparse clones + {checks} x git apply --check: {shown(base)}")
        print(f"  ratio: {a / b:.2f} (target <= 1.50); load {os.getloadavg()[0]:.1f}")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
