"""What the benches share: patchkit from this checkout, diffs made at a pin, the plain git a
series stands on, and `rebase-check` timed as its own process.

Each bench imports it by its bare name (`python bench/bench_x.py` puts bench/ on the path).
"""

from __future__ import annotations

import difflib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
# The byte code of the timed `patchkit` processes, written by the untimed first round and read
# by every timed one, whatever PYTHONDONTWRITEBYTECODE says (else each process compiles
# patchkit anew, or only the first does); outside the checkout.
PYCACHE = Path(tempfile.gettempdir()) / "patchkit-bench-pycache"
sys.path.insert(0, str(SRC))

from patchkit import git as g  # noqa: E402
from patchkit import source  # noqa: E402


def end_diff(resolved: source.Resolved, rel: str, line: str) -> str:
    """A git-style diff adding ``line`` at the end of ``rel`` as the pin ``resolved`` has it."""
    lines = g.show(resolved.repo, f"{resolved.commit}:{rel}").splitlines(keepends=True)
    body = "".join(difflib.unified_diff(lines, lines + [line], f"a/{rel}", f"b/{rel}"))
    return f"diff --git a/{rel} b/{rel}\n{body}"


def tree_files(resolved: source.Resolved) -> int:
    """How many files the pin's tree holds."""
    return len(g.list_tree(resolved.repo, f"{resolved.commit}^{{tree}}"))


def plain_git(resolved: source.Resolved, diffs: list[Path], dest: Path) -> None:
    """What `patchkit apply` stands on, by hand: `git clone --shared`, checkout, then
    `git apply --index` + `git commit` per diff."""
    def run(*args, cwd=None):
        subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                       env={**g.IDENTITY, "PATH": "/usr/bin:/bin", "HOME": str(dest.parent)})

    run("clone", "-q", "--shared", "--no-checkout", str(resolved.repo), str(dest))
    run("checkout", "-q", resolved.commit, cwd=dest)
    for d in diffs:
        run("apply", "--index", str(d), cwd=dest)
        run("commit", "-q", "-m", d.name, cwd=dest)


def rebase_check(proj: Path, targets: list[str], extra: list[str]) -> float:
    """Seconds of one `patchkit rebase-check --to T...` process in ``proj`` (exit 0 or 1)."""
    args = [sys.executable, "-m", "patchkit", "rebase-check", "--format", "json", *extra]
    for t in targets:
        args += ["--to", t]
    env = dict(os.environ, PYTHONPATH=str(SRC), PYTHONPYCACHEPREFIX=str(PYCACHE))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    t0 = time.perf_counter()
    proc = subprocess.run(args, cwd=proj, env=env, capture_output=True, text=True, check=False)
    took = time.perf_counter() - t0
    if proc.returncode not in (0, 1) or '"targets"' not in proc.stdout:
        raise SystemExit(f"rebase-check failed ({proc.returncode}):\n{proc.stderr}")
    return took


def one_and_many(proj: Path, targets: list[str], extra: list[str], runs: int
                 ) -> tuple[list[float], list[float]]:
    """`rebase-check` of the first target and of all of them, run alternately after one
    untimed round (page cache and byte code warm)."""
    rebase_check(proj, targets, extra)
    one, many = [], []
    for _ in range(runs):
        one.append(rebase_check(proj, targets[:1], extra))
        many.append(rebase_check(proj, targets, extra))
    return one, many


def shown(times: list[float]) -> str:
    """``median 1.234 s  (1.20, 1.23, 1.30)``."""
    return f"median {statistics.median(times):.3f} s  ({', '.join(f'{x:.2f}' for x in times)})"
