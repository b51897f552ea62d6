"""patchkit bisect --series --run CMD on the fixture upstream of testing/bisect_history.py (its
five-patch default build at v1.0.0): the patch whose addition makes CMD fail, CMD's exit 125
and a tree that cannot be made skipped, the ends checked first, a CMD that hangs, one ended by
a signal, its output bounded; the scratch trees removed, also on SIGINT; the bad inputs.

The search itself is also run over series of 1 to 40 patches with every culprit position,
against the ceil(log2 n) + 2 bound."""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from testing import bisect_history as bh
from testing import isolate, patchkit, spawn

from patchkit import manifest
from patchkit.commands import bisect_series as bs
from patchkit.run import Asked
from patchkit.series.bisect_upstream import limit_for
from patchkit.errors import UsageError
from patchkit.render.bisect import render_series

SERIES = ["table-entry", "table-more", "fast-mode", "stable", "side-fix"]
# what each patch of the series writes, for a CMD that looks for it in the tree
CHANGE = {"table-entry": ("pkg/table.py", '"nvfp4": 2'),
          "table-more": ("pkg/table.py", "nvfp4_tail"),
          "fast-mode": ("pkg/mode.py", '"fast"'),
          "stable": ("pkg/stable.py", "return 2"),
          "side-fix": ("pkg/side.py", "return 2")}


@pytest.fixture(scope="module")
def hist(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("series")
    with pytest.MonkeyPatch.context() as mp:
        isolate(mp, tmp / "home")
        up = bh.build(tmp / "upstream.git", n=20, noise_files=2)
        proj = bh.make_project(tmp, up)
        yield Project(proj, tmp / "cache", tmp)


class Project:
    def __init__(self, proj: Path, cache: Path, tmp: Path) -> None:
        self.proj, self.cache, self.tmp = proj, cache, tmp

    @property
    def m(self):
        return manifest.load(self.proj / "patchset.yaml")

    def script(self, name: str, body: str) -> Path:
        path = self.tmp / name
        path.write_text("#!/bin/sh\n" + body)
        path.chmod(0o755)
        return path

    def fails_with(self, patch_id: str, name: str | None = None) -> Path:
        """A CMD that fails (exit 1) exactly when ``patch_id``'s change is in the tree."""
        rel, text = CHANGE[patch_id]
        return self.script(name or f"fails-with-{patch_id}.sh",
                           f"grep -qF '{text}' \"$PATCHKIT_TREE/{rel}\" && "
                           f"{{ echo '{patch_id} is in'; exit 1; }}\necho clean\n")

    def run(self, command, **kw) -> bs.SeriesBisect:
        return bs.run(self.m, str(command), Asked(cache=self.cache, **kw))

    def cli(self, *args: str, tmpdir: Path | None = None):
        env = dict(os.environ, PATCHKIT_CACHE_DIR=str(self.cache))
        if tmpdir is not None:
            env["TMPDIR"] = str(tmpdir)
        return patchkit("bisect", *args, cwd=self.proj, env=env)


def _runs(r: bs.SeriesBisect) -> list[tuple[int, str]]:
    return [(run.patches, run.outcome) for run in r.runs]


# ------------------------------------------------------------------------------ the search

def _fake(n: int, culprit: int, skips=frozenset()):
    """A predicate over prefixes 0..n: bad from ``culprit`` on, 125 on ``skips``."""
    asked: list[int] = []

    def test(k: int) -> bs.Run:
        asked.append(k)
        outcome = bs.SKIP if k in skips else bs.BAD if k >= culprit else bs.GOOD
        return bs.Run(k, None, outcome, "", 0.0)
    return test, asked


@pytest.mark.parametrize("n", range(1, 41))
def test_one_culprit_anywhere_is_found_within_the_bound(n):
    for culprit in range(1, n + 1):
        test, asked = _fake(n, culprit)
        r = bs.search([None] * n, test)  # type: ignore[list-item]
        assert (r.verdict, r.first_bad) == (bs.Verdict.FOUND, culprit)
        assert asked[:2] == [0, n] and len(set(asked)) == len(asked)
        assert len(asked) == len(r.runs) <= limit_for(n), (n, culprit, asked)


def test_a_skipped_prefix_is_replaced_by_its_neighbour():
    test, asked = _fake(16, culprit=12, skips={8})
    r = bs.search([None] * 16, test)  # type: ignore[list-item]
    assert (r.verdict, r.first_bad) == (bs.Verdict.FOUND, 12)
    assert asked[:4] == [0, 16, 8, 7]          # the skipped middle, then its neighbour
    assert len(asked) <= limit_for(16) + 1     # one run more for the one skip


def test_a_skipped_prefix_next_to_the_culprit_leaves_two_candidates():
    test, asked = _fake(16, culprit=9, skips={8})
    r = bs.search([SimpleNamespace(id=f"p{i}") for i in range(1, 17)], test)
    assert r.verdict is bs.Verdict.ONLY_SKIPPED and r.first_bad is None
    assert r.candidates == ("p8", "p9")   # 7 passes, 9 fails, 8 cannot be judged


# ------------------------------------------------------------------------------ on trees

def test_the_patch_that_makes_cmd_fail(hist, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    r = hist.run(hist.fails_with("fast-mode"))
    assert [p.id for p in r.series] == SERIES
    assert r.left_out == (("diag-mode", "only in variant diag"),)
    assert r.verdict is bs.Verdict.FOUND and r.ok and r.culprit.id == "fast-mode" and r.first_bad == 3
    # the ends first, then the search; every run a fresh tree of that prefix
    assert _runs(r)[:2] == [(0, "good"), (5, "bad")]
    assert len(r.runs) <= r.limit == 5
    assert r.run_of(2).outcome == "good" and r.run_of(3).outcome == "bad"
    bad = r.run_of(3)
    assert (bad.exit_code, bad.why, bad.last) == (1, "exit 1", "fast-mode")
    assert "fast-mode is in" in bad.output and not bad.truncated
    assert all(run.seconds > 0 for run in r.runs)
    assert list(tmp_path.iterdir()) == []  # scratch trees removed
    text = render_series(r)
    assert "first bad patch: fast-mode (3 of 5): the fast mode" in text
    assert "CMD passes with 2 patches and fails once fast-mode is added" in text
    assert f"runs: {len(r.runs)} (at most 5" in text and "fast-mode is in" in text


@pytest.mark.parametrize("culprit", SERIES)
def test_every_position_within_the_bound(hist, culprit):
    r = hist.run(hist.fails_with(culprit))
    assert r.culprit.id == culprit and len(r.runs) <= limit_for(5)
    k = SERIES.index(culprit) + 1
    assert r.run_of(k).outcome == "bad"
    assert k == 1 or r.run_of(k - 1).outcome == "good"


def test_exit_125_skips_that_prefix_and_a_neighbour_is_tried(hist):
    # 125 exactly on the prefix of two patches (table-more in, fast-mode not)
    cmd = hist.script("skip-two.sh", """\
t="$PATCHKIT_TREE"
if grep -qF nvfp4_tail "$t/pkg/table.py" && ! grep -qF '"fast"' "$t/pkg/mode.py"; then
  echo "cannot judge this one"; exit 125
fi
grep -qF 'return 2' "$t/pkg/stable.py" && exit 1
exit 0
""")
    r = hist.run(cmd)
    assert r.culprit.id == "stable"
    two = r.run_of(2)
    assert (two.outcome, two.why, two.exit_code) == ("skip", "exit 125", 125)
    assert r.run_of(3).outcome == "good"   # the neighbour, found good
    assert len(r.runs) <= r.limit


def test_a_prefix_whose_tree_cannot_be_made_is_skipped(hist, tmp_path):
    # table-entry now also asserts fast-mode's change: every prefix without fast-mode fails it
    proj = tmp_path / "proj"
    shutil.copytree(hist.proj, proj)
    text = (proj / "patchset.yaml").read_text()
    (proj / "patchset.yaml").write_text(text.replace(
        "        has_key: nvfp4\n",
        "        has_key: nvfp4\n      - file: pkg/mode.py\n        in: MODE\n"
        "        contains: fast\n"))
    m = manifest.load(proj / "patchset.yaml")
    r = bs.run(m, str(hist.fails_with("stable")), Asked(cache=hist.cache))
    assert r.culprit.id == "stable"
    two = r.run_of(2)
    assert two.outcome == "skip" and two.exit_code is None
    assert two.why == "tree not made: table-entry failed (assertion)"
    assert len(r.runs) <= r.limit


def test_what_fails_in_the_whole_series_is_left_out(hist, tmp_path):
    # a patch that conflicts at the pin, in the middle of the series: bisect the rest
    proj = tmp_path / "proj"
    shutil.copytree(hist.proj, proj)
    (proj / "patches" / "broken.diff").write_text(
        bh.make_diff("def nothing():\n    pass\n", "def nothing():\n    return 0\n",
                     "pkg/stable.py"))
    text = (proj / "patchset.yaml").read_text()
    (proj / "patchset.yaml").write_text(text.replace(
        "  - id: stable\n", "  - id: broken\n    summary: written for another tree\n"
        "    diff: patches/broken.diff\n  - id: stable\n"))
    m = manifest.load(proj / "patchset.yaml")
    r = bs.run(m, str(hist.fails_with("side-fix")), Asked(cache=hist.cache))
    assert [p.id for p in r.series] == SERIES and r.culprit.id == "side-fix"
    assert ("broken", "it fails in the whole series at the pin (conflict); bisected without "
            "it") in r.left_out
    assert _runs(r)[:2] == [(0, "good"), (5, "bad")] and len(r.runs) <= r.limit


def test_only_skipped_prefixes_left_names_the_candidates(hist):
    cmd = hist.script("skip-all.sh", """\
t="$PATCHKIT_TREE"
grep -qF 'return 2' "$t/pkg/side.py" && exit 1
grep -qF '"nvfp4"' "$t/pkg/table.py" && exit 125
exit 0
""")
    r = hist.run(cmd)
    assert r.verdict is bs.Verdict.ONLY_SKIPPED and not r.ok and r.first_bad is None
    assert list(r.candidates) == SERIES
    assert {k for k, o in _runs(r) if o == "skip"} == {1, 2, 3, 4}
    assert "the first bad patch is one of table-entry, table-more, fast-mode, stable, " \
           "side-fix" in render_series(r)


def test_whole_series_passes_and_pin_fails_say_so(hist):
    passes = hist.run(hist.script("pass.sh", "exit 0\n"))
    assert passes.verdict is bs.Verdict.PASSES and _runs(passes) == [(0, "good"), (5, "good")]
    assert "CMD passes with the whole series (5 patches): no patch of it makes CMD fail" in \
        render_series(passes)
    fails = hist.run(hist.script("fail.sh", "echo broken anyway; exit 3\n"))
    assert fails.verdict is bs.Verdict.FAILS_WITHOUT and _runs(fails) == [(0, "bad")]
    assert "CMD fails on the pin alone (no patch applied): the cause is not in the series" in \
        render_series(fails)


def test_a_hang_is_bad_and_killed_at_the_deadline(hist):
    # hangs once stable is in; the deadline kills it (and the child it started)
    cmd = hist.script("hang.sh", "grep -qF 'return 2' \"$PATCHKIT_TREE/pkg/stable.py\" && "
                                 "{ sleep 300 & wait; }\nexit 0\n")
    started = time.monotonic()
    r = hist.run(cmd, timeout=1.0)
    assert r.culprit.id == "stable"
    hung = r.run_of(4)
    assert (hung.outcome, hung.exit_code) == ("bad", None)
    assert hung.why == "killed after 1 s (--timeout)" and hung.seconds < 30
    assert time.monotonic() - started < 120


def test_an_exit_above_127_or_a_signal_stops_the_bisect(hist):
    r = hist.run(hist.script("kill.sh", "kill -TERM $$\n"))
    assert r.verdict is bs.Verdict.STOPPED and not r.ok and _runs(r) == [(0, "error")]
    assert r.runs[0].why == "ended by SIGTERM"
    assert "stops the bisect" in r.error
    r = hist.run(hist.script("x129.sh", "exit 129\n"))
    assert r.verdict is bs.Verdict.STOPPED and r.runs[0].why == "exit 129"


def test_output_is_bounded(hist):
    r = hist.run(hist.script("loud.sh", "yes 0123456789abcdef | head -c 200000; echo; "
                                        "echo the end; exit 1\n"))
    out = r.runs[0].output
    assert r.runs[0].truncated and len(out.encode()) <= bs.KEEP and out.endswith("the end\n")


def test_cli_json_and_exit_codes(hist, tmp_path):
    cp = hist.cli("--series", "--run", str(hist.fails_with("table-more")), "--format", "json",
                  tmpdir=tmp_path)
    assert cp.returncode == 0, cp.stderr
    data = json.loads(cp.stdout)
    assert data["ok"] and data["verdict"] == "found"
    assert data["first_bad"] == {"id": "table-more", "summary": "add the nvfp4 tail after nvfp4",
                                 "position": 2}
    assert data["series"] == SERIES and data["limit"] == 5 and data["tested"] <= 5
    assert data["tested"] == len(data["runs"])
    assert set(data["runs"][0]) == {"patches", "last", "outcome", "why", "seconds", "exit_code",
                                    "image", "output", "truncated", "failed"}
    assert [(x["patches"], x["outcome"]) for x in data["runs"][:2]] == [(0, "good"), (5, "bad")]
    assert data["vllm"]["ref"] == "v1.0.0" and data["image"] is False
    assert "up to table-more" in cp.stderr   # progress, one line a run
    assert list(tmp_path.iterdir()) == []
    cp = hist.cli("--series", "--run", "true")
    assert cp.returncode == 1 and "CMD passes with the whole series" in cp.stdout


def test_the_variant_build_is_bisected(hist):
    rel, text = "pkg/mode.py", "DIAG = True"
    cmd = hist.script("diag.sh", f"grep -qF '{text}' \"$PATCHKIT_TREE/{rel}\" && exit 1\n"
                                 "exit 0\n")
    r = hist.run(cmd, variant="diag")
    assert r.series[0].id == "diag-mode" and r.left_out == () and r.culprit.id == "diag-mode"


def test_scratch_removed_on_sigint_and_workdir_untouched(hist, tmp_path):
    workdir = hist.proj / ".patchkit" / "vllm"
    assert not workdir.exists()
    started = hist.tmp / "started"
    cmd = hist.script("slow.sh", f"touch {started}; sleep 120\n")
    env = dict(os.environ, PATCHKIT_CACHE_DIR=str(hist.cache), TMPDIR=str(tmp_path))
    proc = spawn("bisect", "--series", "--run", str(cmd), "--timeout", "300", cwd=hist.proj,
                 env=env)
    deadline = time.monotonic() + 60
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert started.exists(), proc.communicate(timeout=10)
    assert len(list(tmp_path.iterdir())) == 1
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == 130, err
    assert "interrupted by SIGINT" in err
    assert list(tmp_path.iterdir()) == [] and not workdir.exists()


@pytest.mark.parametrize("args, words", [
    (["--series"], "--series needs --run CMD"),
    (["--series", "--run", "no-such-command-here"], "no-such-command-here: command not found"),
    (["--series", "--run", "./missing.sh"], "./missing.sh: no such file"),
    (["--series", "--run", "patchset.yaml"], "(the file here is ./patchset.yaml)"),
    (["--series", "--run", "true", "--good", "v1.0.0"], "--good moves the upstream commit"),
    (["--series", "--run", "true", "--bad", "v2.0.0"], "--bad moves the upstream commit"),
    (["--series", "--run", "true", "stable"], "drop the PATCH_ID 'stable'"),
    (["stable", "--image"], "--image goes with --series"),
    (["--series", "--run", "true", "--no-daemon"], "--no-daemon goes with --image"),
    (["--run", "true"], "--run goes with --series"),
    ([], "give a PATCH_ID"),
    (["--series", "--run", "true", "--variant", "nope"], "unknown variant"),
])
def test_bad_inputs_are_one_line_before_any_tree(hist, tmp_path, args, words):
    cache = tmp_path / "fresh-cache"
    env = dict(os.environ, PATCHKIT_CACHE_DIR=str(cache), TMPDIR=str(tmp_path))
    cp = patchkit("bisect", *args, cwd=hist.proj, env=env)
    assert cp.returncode == 2, (cp.stdout, cp.stderr)
    lines = cp.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in cp.stderr
    # nothing was fetched or made
    assert not (cache / "repos").exists() and list(tmp_path.iterdir()) in ([], [cache])


def test_bad_command_in_the_core(hist, tmp_path):
    plain = tmp_path / "plain.sh"
    plain.write_text("exit 0\n")
    with pytest.raises(UsageError, match="is not executable"):
        hist.run(plain)
    with pytest.raises(UsageError, match="is a folder"):
        hist.run(tmp_path)
    with pytest.raises(UsageError, match="the command is empty"):
        hist.run("  ")
