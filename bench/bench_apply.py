"""patchkit apply vs the plain git it stands on, side by side, warm cache.

A three-diff series on the real vLLM v0.27.1 tree: `patchkit apply` (checkout, preflight, apply,
commit per patch, assertions, atomic move) against `git clone --shared` + checkout + `git apply`
+ `git commit` per diff, run alternately in this process tree.  Prints medians and the ratio.
Target: ratio <= 1.25.

    python bench/bench_apply.py [--runs 5] [--ref v0.27.1]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from common import end_diff, plain_git, tree_files
from patchkit import manifest, source
from patchkit.series import applier
from patchkit.cache import cache_dir

FILES = ["vllm/utils/torch_utils.py", "vllm/config/speculative.py", "vllm/v1/kv_cache_interface.py"]


def make_series(resolved: source.Resolved, proj: Path) -> list[Path]:
    (proj / "patches").mkdir(parents=True)
    entries, diffs = [], []
    for i, rel in enumerate(FILES):
        diff = proj / "patches" / f"edit{i}.diff"
        diff.write_text(end_diff(resolved, rel, f"BENCH_EDIT_{i} = {i}\n"))
        diffs.append(diff)
        entries.append(f"  - id: edit{i}\n    summary: bench edit {i}\n    diff: patches/edit{i}.diff\n"
                       f"    verify:\n      - file: {rel}\n        defines: BENCH_EDIT_{i}\n"
                       f"      - file: {rel}\n        not: {{defines: no_such_name_{i}}}\n")
    (proj / "patchset.yaml").write_text(
        f"name: bench\nvllm:\n  repo: pypi\n  ref: {resolved.ref}\npatches:\n" + "".join(entries))
    return diffs


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--ref", default="v0.27.1")
    args = ap.parse_args()
    resolved = source.resolve(["pypi"], args.ref, cache_dir())
    work = Path(tempfile.mkdtemp(prefix="pk-bench-"))
    try:
        proj = work / "proj"
        diffs = make_series(resolved, proj)
        m = manifest.load(proj / "patchset.yaml")
        base, pk = [], []
        for i in range(args.runs):
            t = time.perf_counter()
            plain_git(resolved, diffs, work / f"plain{i}")
            base.append(time.perf_counter() - t)
            t = time.perf_counter()
            report = applier.apply_series(m, workdir=work / f"pk{i}")
            pk.append(time.perf_counter() - t)
            assert report.ok, report.to_json()
            shutil.rmtree(work / f"plain{i}")
            shutil.rmtree(work / f"pk{i}")
        b, p = statistics.median(base), statistics.median(pk)
        files = tree_files(resolved)
        print(f"tree: vLLM {args.ref}, {files} files; series: 3 diffs; runs: {args.runs}")
        print(f"plain git (clone --shared, checkout, apply+commit x3): median {b:.3f} s")
        print(f"patchkit apply:                                      median {p:.3f} s")
        print(f"ratio patchkit/plain: {p / b:.2f} (target <= 1.25)")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
