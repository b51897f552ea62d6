"""`patchkit bump` of this repository's own series from a v0.33.0 pin to v0.34.0, probes
included, as a user runs it: warm (the releases already in the cache) and, with --cold, from
an empty cache (both wheels downloaded and laid out, and every release the support-table probe
reads).

A clone of this checkout's HEAD is pinned at v0.33.0 (vllm.ref and the image base's tag) and
committed; each round is one `patchkit bump --package vllm --to v0.34.0 --vllm-repo pypi
--dry-run` process (a dry run does the whole port, both trials and the probes, and writes
nothing, so rounds repeat).  Prints each round's seconds and the ratio to the targets: 60 s
warm, 300 s cold, on a 2-core machine.

    python bench/bench_bump.py [--runs 2] [--cold]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import PYCACHE, SRC

ROOT = SRC.parent
WARM_TARGET, COLD_TARGET = 60.0, 300.0


def pinned_copy(dest: Path) -> Path:
    subprocess.run(["git", "clone", "-q", str(ROOT), str(dest)], check=True)
    text = (dest / "patchset.yaml").read_text()
    text = text.replace("  ref: v0.34.0\n", "  ref: v0.33.0\n", 1)
    text = text.replace("base: vllm/vllm-openai:v0.34.0", "base: vllm/vllm-openai:v0.33.0", 1)
    (dest / "patchset.yaml").write_text(text)
    env = dict(os.environ, GIT_AUTHOR_NAME="bench", GIT_AUTHOR_EMAIL="bench@localhost",
               GIT_COMMITTER_NAME="bench", GIT_COMMITTER_EMAIL="bench@localhost")
    subprocess.run(["git", "commit", "-qam", "pin v0.33.0"], cwd=dest, check=True, env=env)
    return dest


def bump(proj: Path, cache: Path | None) -> float:
    env = dict(os.environ, PYTHONPATH=str(SRC), PYTHONPYCACHEPREFIX=str(PYCACHE))
    if cache is not None:
        env["PATCHKIT_CACHE_DIR"] = str(cache)
    args = [sys.executable, "-m", "patchkit", "bump", "--package", "vllm", "--to", "v0.34.0",
            "--vllm-repo", "pypi", "--dry-run"]
    t0 = time.perf_counter()
    proc = subprocess.run(args, cwd=proj, env=env, capture_output=True, text=True, check=False)
    took = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"bump failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--cold", action="store_true", help="also once from an empty cache")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="patchkit-bench-bump-") as tmp:
        proj = pinned_copy(Path(tmp) / "proj")
        bump(proj, None)   # untimed: the cache and the byte code warm
        warm = [bump(proj, None) for _ in range(args.runs)]
        print(f"warm: {', '.join(f'{t:.1f}' for t in warm)} s; median "
              f"{statistics.median(warm):.1f} s = {statistics.median(warm) / WARM_TARGET:.2f}x "
              f"the {WARM_TARGET:g} s target")
        if args.cold:
            cold = bump(proj, Path(tmp) / "empty-cache")
            print(f"cold: {cold:.1f} s = {cold / COLD_TARGET:.2f}x the {COLD_TARGET:g} s target")


if __name__ == "__main__":
    main()
