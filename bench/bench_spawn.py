"""What the death signal costs each child: a git command run through patchkit's git border
with ``PR_SET_PDEATHSIG`` armed (as clones and fetches are) and without it (every local
command), interleaved rounds, median per call.  Arming it needs a ``preexec_fn``, which makes
``subprocess`` fork the whole interpreter instead of using vfork.

    python bench/bench_spawn.py [--calls 200] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import common  # noqa: F401  # puts this checkout's src/ first on the path
from patchkit import git as g
from patchkit import process


def per_call(calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        g._run(*g.NETWORK, "--version", network=True)   # armed like a clone, when dies_with_us arms
    return (time.perf_counter() - start) / calls


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    armed, bare = process.dies_with_us, (lambda: None)
    per_call(20)   # warm: imports, page cache
    times: dict[str, list[float]] = {"with": [], "without": []}
    for _ in range(args.rounds):
        for name, fn in (("with", armed), ("without", bare)):
            process.dies_with_us = fn
            times[name].append(per_call(args.calls))
    process.dies_with_us = armed
    w, wo = statistics.median(times["with"]), statistics.median(times["without"])
    print(f"git --version x{args.calls}, {args.rounds} rounds: with the death signal "
          f"{w * 1e3:.2f} ms/call, without {wo * 1e3:.2f} ms/call, ratio {w / wo:.2f}")


if __name__ == "__main__":
    main()
