"""patchkit bisect over 2,000 first-parent commits against one apply, warm cache.

The fixture upstream of the tests (tests/testing/bisect_history.py) made long: 2,000 first-parent
commits from v1.0.0 to v2.0.0 (a side branch merged on the way), a tree of 4,000 files, the
fixture's series pinned at v1.0.0.  `bisect table-entry` (broken 60% of the way) and `bisect
side-fix` (broken by the merge) each test at most ceil(log2 n) + 2 commits, each in a sparse
checkout.  Beside them: one `patchkit apply` of the series (full checkout, every patch,
assertions, atomic move), and as many sparse tests of single commits as the search may make,
one after the other, as the search makes them.  Prints medians and ratios.
Targets: tested <= ceil(log2 n) + 2; bisect <= that many sparse tests (ratio <= 1).

Then `bisect --series --run CMD` over a series of `--series` patches (15 by default: one bad
patch among fifteen), each editing a file of its own on a small fixture upstream, with every
patch in turn the culprit (CMD fails once that patch's edit is in the tree): the runs made per
culprit position against ceil(log2 n) + 2, and the time of one such bisect against one apply of
the whole series.  Target: runs <= ceil(log2 n) + 2 for every position.

    python bench/bench_bisect.py [--runs 3] [--commits 2000] [--files 4000] [--series 15]
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

from testing import bisect_history as history  # noqa: E402
from testing.project import write_project  # noqa: E402
from testing.upstream import make_diff  # noqa: E402

from patchkit import git as g  # noqa: E402
from patchkit import manifest, source  # noqa: E402
from patchkit.commands import bisect  # noqa: E402
from patchkit.commands import bisect_series  # noqa: E402
from patchkit.series import applier  # noqa: E402


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def sparse_tests(m, patch_id: str, pin, commits: list[str], work: Path) -> float:
    """The time of testing ``commits`` one by one as the search does (the commit's release,
    then the sparse checkout, the series and the assertions), in a fresh oracle."""
    scratch = Path(tempfile.mkdtemp(dir=work))
    try:
        oracle = bisect.Oracle(m, m.patch(patch_id), scratch)
        return sum(timed(lambda: oracle(bisect._at_commit(pin, c)))[0] for c in commits)
    finally:
        shutil.rmtree(scratch)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--commits", type=int, default=2000)
    ap.add_argument("--files", type=int, default=4000)
    ap.add_argument("--series", type=int, default=15)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="pk-bench-bisect-"))
    try:
        made, up = timed(lambda: history.build(work / "upstream.git", n=args.commits,
                                               noise_files=args.files))
        proj = history.make_project(work, up)
        m = manifest.load(proj / "patchset.yaml")
        cache = work / "cache"
        pin = source.resolve([str(up.repo)], "v1.0.0", cache)  # the mirror, once
        line = g.first_parent_commits(pin.repo, pin.commit, up.sha["v2.0.0"])
        limit = bisect.limit_for(len(line))
        # as many commits as the search may test, spread over the line
        spread = [pin.commit] + [line[(k * (len(line) - 1)) // (limit - 2)]
                                 for k in range(limit - 1)]
        expected = {"table-entry": up.sha["break"], "side-fix": up.sha["merge"]}
        took: dict[str, list[float]] = {pid: [] for pid in expected}
        budget: dict[str, list[float]] = {pid: [] for pid in expected}
        tested: dict[str, int] = {}
        apply_t = []
        for i in range(args.runs):
            for pid, sha in expected.items():
                t, r = timed(lambda: bisect.run(m, pid, cache=cache))
                assert r.first_bad is not None and r.first_bad.commit == sha, r.to_dict()
                assert r.commits == len(line) == args.commits
                took[pid].append(t)
                tested[pid] = r.tested
                budget[pid].append(sparse_tests(m, pid, pin, spread, work))
            t, report = timed(lambda: applier.apply_series(m, workdir=work / f"wd{i}", cache=cache))
            assert report.ok, report.to_json()
            apply_t.append(t)
            shutil.rmtree(work / f"wd{i}")
        one = statistics.median(apply_t)
        print(f"fixture: {args.commits} first-parent commits, {args.files + 4} files, "
              f"{len(m.patches)} patches; written in {made:.2f} s; runs: {args.runs}")
        print(f"one apply (full checkout, series, assertions): median {one:.3f} s")
        for pid in expected:
            b = statistics.median(took[pid])
            s = statistics.median(budget[pid])
            ratio = statistics.median(x / y for x, y in zip(took[pid], budget[pid]))
            print(f"bisect {pid:<11}: tested {tested[pid]} of {args.commits} commits "
                  f"(ceil(log2 n)+2 = {limit}); median {b:.3f} s, {b / one:.2f} x one apply; "
                  f"{limit} sparse tests {s:.3f} s: ratio {ratio:.2f} (target <= 1.0)")
        ok = all(n <= limit for n in tested.values())
        return 0 if series_bench(work, args.series) and ok else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


SERIES_MANIFEST = "name: series\nvllm:\n  repo: {repo}\n  ref: v1.0.0\npatches:\n"


def series_bench(work: Path, n: int) -> bool:
    """bisect --series over ``n`` patches, each position the culprit once."""
    up = history.build(work / "series.git", n=10, noise_files=n)
    files, entries = {}, []
    for j in range(n):
        rel = f"noise/n{j:04d}.txt"
        files[f"patches/p{j:02d}.diff"] = make_diff(f"{j}\n", f"{j} patched\n", rel)
        entries.append(f"  - id: p{j:02d}\n    summary: edit {rel}\n"
                       f"    diff: patches/p{j:02d}.diff\n")
    proj = write_project(work / "series-proj", files,
                         SERIES_MANIFEST.format(repo=up.repo) + "".join(entries))
    m = manifest.load(proj / "patchset.yaml")
    cache = work / "series-cache"
    limit = bisect.limit_for(n)
    t_apply, report = timed(lambda: applier.apply_series(m, workdir=work / "series-wd",
                                                         cache=cache))
    assert report.ok, report.to_json()
    runs, took = [], []
    for j in range(n):
        cmd = work / f"fails-with-{j}.sh"
        # the tree of a noise file at v1.0.0 differs from the fixture's later commits: look for
        # the patch's own words
        cmd.write_text(f"#!/bin/sh\n! grep -q patched \"$PATCHKIT_TREE/noise/n{j:04d}.txt\"\n")
        cmd.chmod(0o755)
        t, r = timed(lambda: bisect_series.run(m, str(cmd), cache=cache))
        assert r.culprit is not None and r.culprit.id == f"p{j:02d}", r.to_dict()
        runs.append(len(r.runs))
        took.append(t)
    med = statistics.median(took)
    print(f"bisect --series over {n} patches, each the culprit once: runs {runs}; most "
          f"{max(runs)} (ceil(log2 n)+2 = {limit}, target <= it); median {med:.3f} s, "
          f"{med / t_apply:.2f} x one apply of the series ({t_apply:.3f} s)")
    return max(runs) <= limit


if __name__ == "__main__":
    raise SystemExit(main())
