"""C++ assertions on the real 5,000-line CUTLASS MoE header vs Python assertions on a Python
file of the same size, side by side, warm.

The header is FlashInfer 0.6.15's ``cutlass_fused_moe_kernels.cuh`` (tree-sitter's CUDA
grammar); the Python file is FlashInfer 0.6.15's own Python sources joined to the same number
of lines (``ast``).  Each run judges four assertions scoped to one function (calls, contains,
not contains, defines) plus one on the whole file, parsing the file afresh, as ``apply`` does.
Prints medians and the ratio.  Target: ratio <= 1.5.

    python bench/bench_cxx_assertions.py [--runs 15]
"""

from __future__ import annotations

import argparse
import ast
import statistics
import time
import zipfile

from patchkit.cache import cache_dir
from patchkit.manifest import Assertion, Patch
from patchkit.series.assertions import run_assertions
from patchkit.source import package_id, pypi

HEADER = "flashinfer/data/csrc/fused_moe/cutlass_backend/cutlass_fused_moe_kernels.cuh"
RUNNER = "CutlassMoeFCRunner::computeStridesTmaWarpSpecializedLowLatency"


def sources() -> tuple[str, str]:
    wheel = pypi._wheel(cache_dir(), "0.6.15", print,
                        package_id("flashinfer", "flashinfer-python"))
    with zipfile.ZipFile(wheel) as zf:
        header = zf.read(HEADER).decode()
        want = header.count("\n")
        parts, lines = [], 0
        for name in sorted(n for n in zf.namelist() if n.endswith(".py")):
            text = zf.read(name).decode()
            parts.append(text if text.endswith("\n") else text + "\n")
            lines += text.count("\n")
            if lines >= want:
                break
    python = "".join(parts)
    # cut at the last top-level statement that ends within the header's line count
    end = max(n.end_lineno for n in ast.parse(python).body if n.end_lineno <= want)
    return header, "\n".join(python.splitlines()[:end]) + "\n"


def biggest_function(text: str) -> tuple[str, str]:
    """(name, a name it calls) of the largest top-level function that still parses cut."""
    tree = ast.parse(text)
    fns = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    names = [n.name for n in fns]
    fn = max((f for f in fns if names.count(f.name) == 1),
             key=lambda f: f.end_lineno - f.lineno)
    call = next(n for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name))
    return fn.name, call.func.id


def patch(file: str, scope: str, call: str, name: str) -> Patch:
    absent = Assertion(file, scope, "contains", "no_such_name_anywhere")
    return Patch(id="bench", summary="s", kind="diff", path="x.diff", verify=(
        Assertion(file, scope, "calls", call),
        Assertion(file, scope, "contains", name),
        Assertion(file, scope, "not", None, negated=absent),
        Assertion(file, scope, "defines", "no_such_local"),
        Assertion(file, None, "contains", "no_such_name_anywhere")))


def timed(p: Patch, text: str) -> float:
    start = time.perf_counter()
    run_assertions([p], {p.verify[0].file: text}.get)
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    header, python = sources()
    fn, call = biggest_function(python)
    cxx = patch(HEADER, RUNNER, "TLLM_THROW", "TLLM_THROW")
    py = patch("bench.py", fn, call, call)
    timed(cxx, header), timed(py, python)  # warm: grammar loaded, imports done
    cxx_times, py_times = [], []
    for _ in range(args.runs):
        cxx_times.append(timed(cxx, header))
        py_times.append(timed(py, python))
    c, p = statistics.median(cxx_times), statistics.median(py_times)
    print(f"C++ header:  {header.count(chr(10))} lines, 5 assertions, median {c * 1000:.1f} ms")
    print(f"Python file: {python.count(chr(10))} lines, 5 assertions, median {p * 1000:.1f} ms")
    print(f"ratio C++/Python: {c / p:.2f} (target <= 1.5)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
