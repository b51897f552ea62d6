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
import difflib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
sys.path.insert(0, str(SRC))

from patchkit import git as g  # noqa: E402
from patchkit import source  # noqa: E402
from patchkit.cache import cache_dir  # noqa: E402

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
        lines = g.show(resolved.repo, f"{resolved.commit}:{rel}").splitlines(keepends=True)
        after = lines + [f"# bench edit {i}\n"]
        body = "".join(difflib.unified_diff(lines, after, f"a/{rel}", f"b/{rel}"))
        (proj / "patches" / f"edit{i}.diff").write_text(f"diff --git a/{rel} b/{rel}\n{body}")
        entries.append(f"  - id: edit{i}\n    summary: bench edit {i}\n    diff: patches/edit{i}.diff\n"
                       f"    verify:\n      - file: {rel}\n        not: {{defines: no_such_{i}}}\n")
    (proj / "patches/marker.py").write_text(TRANSFORM)
    entries.append("  - id: marker\n    summary: a marker\n    transform: patches/marker.py\n"
                   "    verify:\n      - file: vllm/config/speculative.py\n"
                   "        defines: _PATCHKIT_BENCH\n")
    (proj / "patchset.yaml").write_text(
        f"name: bench\nvllm:\n  repo: pypi\n  ref: {PIN}\npatches:\n" + "".join(entries))


def rebase_check(proj: Path, targets: list[str]) -> float:
    args = [sys.executable, "-m", "patchkit", "rebase-check", "--format", "json",
            "--vllm-repo", "pypi"]
    for t in targets:
        args += ["--to", t]
    env = dict(os.environ, PYTHONPATH=str(SRC))
    t0 = time.perf_counter()
    proc = subprocess.run(args, cwd=proj, env=env, capture_output=True, text=True, check=False)
    took = time.perf_counter() - t0
    if proc.returncode not in (0, 1) or '"targets"' not in proc.stdout:
        raise SystemExit(f"rebase-check failed ({proc.returncode}):\n{proc.stderr}")
    return took


def measure(label: str, proj: Path, runs: int) -> float:
    rebase_check(proj, TARGETS)  # one untimed round: page cache and byte code warm
    one, three = [], []
    for _ in range(runs):
        one.append(rebase_check(proj, TARGETS[:1]))
        three.append(rebase_check(proj, TARGETS))
    a, b = statistics.median(one), statistics.median(three)
    print(f"{label}:")
    print(f"  --to {TARGETS[0]}:                          median {a:.3f} s  "
          f"({', '.join(f'{x:.2f}' for x in one)})")
    print(f"  --to {' --to '.join(TARGETS)}: median {b:.3f} s  "
          f"({', '.join(f'{x:.2f}' for x in three)})")
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
    files = g.out("ls-tree", "-r", "--name-only", resolved.commit, cwd=resolved.repo).count("\n") + 1
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
