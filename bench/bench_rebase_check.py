"""rebase-check of three releases against one release, side by side, warm cache.

Two series pinned at v0.27.1: a small one on real vLLM files (three diffs made against the pin,
one libcst transform, AST assertions) and the repository's own patchset.yaml (five transforms,
four diffs).  For each, `rebase-check --to v0.31.0` and `rebase-check --to v0.31.0 --to v0.32.0
--to v0.33.0 --vllm-repo pypi`, each as its own `patchkit` process (start-up, manifest, resolve,
checkouts, series, assertions, rendering), run alternately.  Prints medians and the ratios.
Target: ratio <= 2.0.

    python bench/bench_rebase_check.py [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
from pathlib import Path

from common import end_diff, one_and_many, shown, tree_files
from patchkit import source
from patchkit.cache import cache_dir

PIN = "v0.27.1"
TARGETS = ["v0.31.0", "v0.32.0", "v0.33.0"]
FILES = ["vllm/utils/torch_utils.py", "vllm/config/speculative.py", "vllm/v1/kv_cache_interface.py"]

TRANSFORM = '''\
import libcst as cst
import libcst.matchers as m
from patchkit.transform import Transform


class Marker(Transform):
    path = "vllm/config/speculative.py"

    def postcondition(self, module):
        return self.has(module, m.Name("_PATCHKIT_BENCH"))

    def transform(self, module):
        stmt = cst.parse_statement("_PATCHKIT_BENCH = True\\n")
        return module.with_changes(body=[*module.body, stmt])
'''


def make_project(resolved: source.Resolved, proj: Path) -> None:
    (proj / "patches").mkdir(parents=True)
    entries = []
    for i, rel in enumerate(FILES):
        (proj / "patches" / f"edit{i}.diff").write_text(end_diff(resolved, rel,
                                                                 f"# bench edit {i}\n"))
        entries.append(f"  - id: edit{i}\n    summary: bench edit {i}\n    diff: patches/edit{i}.diff\n"
                       f"    verify:\n      - file: {rel}\n        not: {{defines: no_such_{i}}}\n")
    (proj / "patches/marker.py").write_text(TRANSFORM)
    entries.append("  - id: marker\n    summary: a marker\n    transform: patches/marker.py\n"
                   "    verify:\n      - file: vllm/config/speculative.py\n"
                   "        defines: _PATCHKIT_BENCH\n")
    (proj / "patchset.yaml").write_text(
        f"name: bench\nvllm:\n  repo: pypi\n  ref: {PIN}\npatches:\n" + "".join(entries))


def measure(label: str, proj: Path, runs: int) -> float:
    one, three = one_and_many(proj, TARGETS, ["--vllm-repo", "pypi"], runs)
    a, b = statistics.median(one), statistics.median(three)
    print(f"{label}:")
    print(f"  --to {TARGETS[0]}:                          {shown(one)}")
    print(f"  --to {' --to '.join(TARGETS)}: {shown(three)}")
    print(f"  ratio three/one: {b / a:.2f} (target <= 2.00)")
    return b / a


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    cache = cache_dir()
    for ref in [PIN, *TARGETS]:  # warm: wheels laid out once, outside the timing
        resolved = source.resolve(["pypi"], ref, cache)
    pin = source.resolve(["pypi"], PIN, cache)
    files = tree_files(resolved)
    print(f"vLLM trees of ~{files} files; cores: {os.cpu_count()}; runs: {args.runs}")
    work = Path(tempfile.mkdtemp(prefix="pk-bench-rc-"))
    try:
        proj = work / "proj"
        make_project(pin, proj)
        measure("small series (3 diffs + 1 transform)", proj, args.runs)
        repo = Path(__file__).resolve().parents[1]
        if (repo / "patchset.yaml").exists():
            measure("the repository's patchset.yaml", repo, args.runs)
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
