"""patchkit bisect over 2,000 first-parent commits against one apply, warm cache.

The fixture upstream of the tests (tests/bisect_history.py) made long: 2,000 first-parent
commits from v1.0.0 to v2.0.0 (a side branch merged on the way), a tree of 4,000 files, the
five-patch series pinned at v1.0.0.  `bisect table-entry` (broken 60% of the way) and `bisect
side-fix` (broken by the merge) each test at most ceil(log2 n) + 2 commits, each in a sparse
checkout.  Beside them: one `patchkit apply` of the series (full checkout, every patch,
assertions, atomic move) and one sparse test of one commit.  Prints medians and ratios.
Targets: tested <= ceil(log2 n) + 2; bisect <= that many sparse tests.

    python bench/bench_bisect.py [--runs 3] [--commits 2000] [--files 4000]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

import bisect_history as history  # noqa: E402

from patchkit import manifest, source  # noqa: E402
from patchkit.commands import bisect  # noqa: E402
from patchkit.series import engine  # noqa: E402


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--commits", type=int, default=2000)
    ap.add_argument("--files", type=int, default=4000)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="pk-bench-bisect-"))
    try:
        made, up = timed(lambda: history.build(work / "upstream.git", n=args.commits,
                                               noise_files=args.files))
        proj = history.make_project(work, up)
        m = manifest.load(proj / "patchset.yaml")
        cache = work / "cache"
        pin = source.resolve([str(up.repo)], "v1.0.0", cache)  # the mirror, once
        expected = {"table-entry": up.sha["break"], "side-fix": up.sha["merge"]}
        limit = bisect.limit_for(args.commits)
        times: dict[str, list[float]] = {pid: [] for pid in expected}
        tested: dict[str, int] = {}
        apply_t, sparse_t = [], []
        for i in range(args.runs):
            for pid, sha in expected.items():
                t, r = timed(lambda: bisect.run(m, pid, cache=cache))
                assert r.first_bad is not None and r.first_bad.commit == sha, r.to_dict()
                assert r.commits == args.commits
                times[pid].append(t)
                tested[pid] = r.tested
            t, report = timed(lambda: engine.apply_series(m, workdir=work / f"wd{i}", cache=cache))
            assert report.ok, report.to_json()
            apply_t.append(t)
            shutil.rmtree(work / f"wd{i}")
            scratch = Path(tempfile.mkdtemp(dir=work))
            oracle = bisect.Oracle(m, m.patch("table-entry"), scratch)
            for sha in (pin.commit, up.sha["header"], up.sha["v2.0.0"]):
                # as the search does it: the commit's release, then the sparse test
                t, _ = timed(lambda: oracle(bisect._at_commit(pin, sha)))
                sparse_t.append(t)
            shutil.rmtree(scratch)
        one, sparse = statistics.median(apply_t), statistics.median(sparse_t)
        print(f"fixture: {args.commits} first-parent commits, {args.files + 4} files, "
              f"5 patches; written in {made:.2f} s; runs: {args.runs}")
        print(f"one apply (full checkout, series, assertions): median {one:.3f} s")
        print(f"one sparse test of one commit:                 median {sparse:.3f} s")
        for pid, ts in times.items():
            b = statistics.median(ts)
            print(f"bisect {pid:<11} tested {tested[pid]:>2} of {args.commits} commits "
                  f"(limit ceil(log2 n)+2 = {limit}): median {b:.3f} s; "
                  f"ratio to one apply {b / one:.2f}; "
                  f"in sparse tests {b / sparse:.1f} (target <= {limit})")
        return 0 if all(n <= limit for n in tested.values()) else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
