"""Finding the JIT modules a patched file feeds, over the whole FlashInfer 0.6.15 source tree
(its wheel's flashinfer/: the module definitions, csrc, include, cutlass, cccl, spdlog), warm.

Each run reads the definitions, builds the include graph from every module's sources and
names the modules of three patched files, as ``apply`` does once per run.  Prints the median.
Target: <= 2 s.

    python bench/bench_jit_modules.py [--runs 5]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
import zipfile
from pathlib import Path

from patchkit.cache import cache_dir
from patchkit.series import jit
from patchkit.source import package_id, pypi

FILES = ["flashinfer/data/csrc/fused_moe/cutlass_backend/cutlass_fused_moe_kernels.cuh",
         "flashinfer/data/include/flashinfer/norm.cuh",
         "flashinfer/data/cutlass/include/cute/tensor.hpp"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    wheel = pypi._wheel(cache_dir(), "0.6.15", print,
                        package_id("flashinfer", "flashinfer-python"))
    root = Path(tempfile.mkdtemp(prefix="pk-bench-jit-"))
    try:
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(root, [n for n in zf.namelist() if n.startswith("flashinfer/")])
        count = sum(1 for p in (root / "flashinfer").rglob("*") if p.is_file())
        found = jit.modules_for(root, "flashinfer-python", FILES)  # warms the page cache
        times = []
        for _ in range(args.runs):
            start = time.perf_counter()
            jit.modules_for(root, "flashinfer-python", FILES)
            times.append(time.perf_counter() - start)
        for path, modules in found.items():
            print(f"{path}: {len(modules)} modules ({', '.join(modules[:5])}"
                  f"{', ...' if len(modules) > 5 else ''})")
        print(f"{count} files in the tree; median {statistics.median(times):.2f} s over "
              f"{args.runs} runs (target <= 2 s)")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
