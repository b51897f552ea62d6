"""The stack side by side, warm cache: two packages applied, FlashInfer's matrix, a long series.

1. A two-package apply: three diffs on the real vLLM tree and two on the real FlashInfer tree
   (both from PyPI), `patchkit apply` of both (checkouts, series, assertions, atomic move of
   both) against plain git doing the same per package (`git clone --shared`, checkout,
   `git apply` + `git commit` per diff), run alternately.  Target: ratio <= 1.3.
2. `rebase-check --package flashinfer` of that project over four FlashInfer releases against
   one, each as its own `patchkit` process.  Target: ratio <= 1.5.
3. A 33-patch series (one patch per file, made with `import --overlay --split file` from 33
   real files of the pin) `rebase-check`ed over three vLLM releases against one.
   Target: ratio <= 1.5.

    python bench/bench_stack.py [--runs 5] [--part N ...]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from common import end_diff, one_and_many, plain_git, shown
from patchkit import git as g
from patchkit import manifest, source
from patchkit.cache import cache_dir
from patchkit.commands import import_
from patchkit.series import applier

VLLM_PIN = "v0.27.1"
VLLM_TARGETS = ["v0.31.0", "v0.32.0", "v0.33.0"]
FI_PIN = "v0.6.15"
FI_TARGETS = ["v0.6.16", "v0.6.17", "v0.6.18", "v0.7.0"]
FI = source.package_id("flashinfer", "flashinfer-python")
VLLM_FILES = ["vllm/utils/torch_utils.py", "vllm/config/speculative.py",
              "vllm/v1/kv_cache_interface.py"]
FI_FILES = ["flashinfer/fused_moe/cute_dsl/blackwell_sm12x/moe_micro_kernel.py",
            "flashinfer/fused_moe/cute_dsl/blackwell_sm12x/moe_activation.py"]


def _diffs(resolved: source.Resolved, files: list[str], dest: Path, package: str) -> list[str]:
    """One diff per file (a line added at its end) in ``dest``; their manifest entries."""
    dest.mkdir(parents=True, exist_ok=True)
    entries = []
    for i, rel in enumerate(files):
        (dest / f"{package}-edit{i}.diff").write_text(end_diff(resolved, rel,
                                                               f"BENCH_EDIT_{i} = {i}\n"))
        entries.append(f"  - id: {package}-edit{i}\n    summary: bench edit {i}\n"
                       + (f"    package: {package}\n" if package != "vllm" else "")
                       + f"    diff: patches/{package}-edit{i}.diff\n"
                       f"    verify:\n      - file: {rel}\n        defines: BENCH_EDIT_{i}\n")
    return entries


def stack_project(vllm: source.Resolved, fi: source.Resolved, proj: Path) -> None:
    entries = (_diffs(vllm, VLLM_FILES, proj / "patches", "vllm")
               + _diffs(fi, FI_FILES, proj / "patches", "flashinfer"))
    (proj / "patchset.yaml").write_text(
        f"name: bench\nvllm:\n  repo: pypi\n  ref: {vllm.ref}\npackages:\n  flashinfer:\n"
        f"    dist: flashinfer-python\n    repo: [pypi]\n    ref: {fi.ref}\npatches:\n"
        + "".join(entries))


def bench_apply(vllm: source.Resolved, fi: source.Resolved, work: Path, runs: int) -> None:
    proj = work / "apply"
    stack_project(vllm, fi, proj)
    m = manifest.load(proj / "patchset.yaml")
    diffs = {name: sorted((proj / "patches").glob(f"{name}-edit*.diff"))
             for name in ("vllm", "flashinfer")}
    base, pk = [], []
    for i in range(runs + 1):   # the first round untimed: page cache warm
        t = time.perf_counter()
        plain_git(vllm, diffs["vllm"], work / f"plain{i}" / "vllm")
        plain_git(fi, diffs["flashinfer"], work / f"plain{i}" / "flashinfer")
        took_base = time.perf_counter() - t
        t = time.perf_counter()
        report = applier.apply_series(m, workdir=work / f"pk{i}" / "vllm")
        took_pk = time.perf_counter() - t
        assert report.ok, report.to_json()
        if i:
            base.append(took_base)
            pk.append(took_pk)
        shutil.rmtree(work / f"plain{i}")
        shutil.rmtree(work / f"pk{i}")
    b, p = statistics.median(base), statistics.median(pk)
    print(f"1. two-package apply (vLLM {vllm.ref} 3 diffs + FlashInfer {fi.ref} 2 diffs)")
    print(f"  plain git per package: {shown(base)}")
    print(f"  patchkit apply:        {shown(pk)}")
    print(f"  ratio patchkit/plain: {p / b:.2f} (target <= 1.30)")


def bench_matrix(label: str, proj: Path, targets: list[str], extra: list[str],
                 runs: int) -> None:
    one, many = one_and_many(proj, targets, extra, runs)
    a, b = statistics.median(one), statistics.median(many)
    print(label)
    print(f"  --to {targets[0]}: {shown(one)}")
    print(f"  {len(targets)} releases: {shown(many)}")
    print(f"  ratio {len(targets)}/1: {b / a:.2f} (target <= 1.50)")


def split_project(pin: source.Resolved, proj: Path) -> int:
    """A project pinned at ``pin`` whose series is 33 real files, each edited, one patch each."""
    names = [n for _m, _k, n in g.list_tree(pin.repo, pin.commit, "vllm")
             if n.endswith(".py") and n != "vllm/__init__.py"]
    chosen = names[::max(1, len(names) // 33)][:33]
    blobs = g.read_blobs(pin.repo, [f"{pin.commit}:{n}" for n in chosen])
    overlay = proj.parent / "overlay"
    for rel in chosen:
        (overlay / rel).parent.mkdir(parents=True, exist_ok=True)
        (overlay / rel).write_bytes(blobs[f"{pin.commit}:{rel}"] + b"# dgx-spark: GB10\n")
    (overlay / "LICENSE").write_text("Apache License 2.0\n")
    proj.mkdir(parents=True)
    (proj / "patchset.yaml").write_text(
        f"name: split\nvllm:\n  repo: pypi\n  ref: {pin.ref}\npatches: []\n")
    t = time.perf_counter()
    result = import_.run_overlay(proj / "patchset.yaml", overlay, split="file")
    print(f"   (import --overlay --split file of {len(chosen)} files: "
          f"{time.perf_counter() - t:.2f} s, {len(result.patches)} patches)")
    return len(result.patches)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--part", type=int, action="append", choices=(1, 2, 3),
                    help="run only this part (repeatable; default: all three)")
    args = ap.parse_args()
    parts = set(args.part or (1, 2, 3))
    cache = cache_dir()
    # warm: every wheel laid out once, outside the timing
    vllm = {ref: source.resolve(["pypi"], ref, cache) for ref in [VLLM_PIN, *VLLM_TARGETS]}
    fi = {ref: source.resolve(["pypi"], ref, cache, package=FI) for ref in [FI_PIN, *FI_TARGETS]}
    print(f"cores: {os.cpu_count()}; runs: {args.runs}")
    work = Path(tempfile.mkdtemp(prefix="pk-bench-stack-"))
    try:
        if 1 in parts:
            bench_apply(vllm[VLLM_TARGETS[-1]], fi[FI_PIN], work, args.runs)
        if 2 in parts:
            stack_project(vllm[VLLM_TARGETS[-1]], fi[FI_PIN], work / "stack")
            bench_matrix(f"2. rebase-check --package flashinfer from {FI_PIN}", work / "stack",
                         FI_TARGETS, ["--package", "flashinfer"], args.runs)
        if 3 in parts:
            n = split_project(vllm[VLLM_PIN], work / "split" / "proj")
            bench_matrix(f"3. rebase-check of a {n}-patch split series from {VLLM_PIN}",
                         work / "split" / "proj", VLLM_TARGETS, ["--vllm-repo", "pypi"],
                         args.runs)
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
