"""patchkit bisect on a fixture upstream of 300 first-parent commits
(testing/bisect_history.py): the commit that broke a patch, the one from which another is
upstream, a patch whose fate does not change, a merge on the first-parent line; rebase-check
--bisect; the bad inputs."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from datetime import datetime
from pathlib import Path

import pytest
from testing import bisect_history as bh
from testing import isolate, patchkit
from testing.upstream import sh

from patchkit import manifest, source
from patchkit.commands import bisect as bisect_command
from patchkit.series import bisect_upstream as bisect
from patchkit.commands import rebase_check as rebasecheck
from patchkit.run import Asked
from patchkit.errors import SourceError, UsageError
from patchkit.render import matrix as render
from patchkit.render.bisect import render_text

N = 300
LIMIT = 11  # ceil(log2 300) + 2


@pytest.fixture(scope="module")
def hist(tmp_path_factory):
    """The upstream, the project pinned at v1.0.0 and one cache, shared by the module; each
    bisect is run once and its result kept."""
    tmp = tmp_path_factory.mktemp("history")
    with pytest.MonkeyPatch.context() as mp:  # the autouse isolation is per test, so again here
        isolate(mp, tmp / "home")
        up = bh.build(tmp / "upstream.git", n=N)
        proj = bh.make_project(tmp, up)
        yield History(up, proj, manifest.load(proj / "patchset.yaml"), tmp / "cache")


class History:
    def __init__(self, up: bh.Upstream, proj: Path, m, cache: Path) -> None:
        self.up, self.proj, self.m, self.cache = up, proj, m, cache
        self.sha = up.sha
        self._runs: dict = {}

    def run(self, patch_id: str, **kw) -> bisect.BisectResult:
        key = (patch_id, tuple(sorted(kw.items())))
        if key not in self._runs:
            ends = (kw.pop("good", None), kw.pop("bad", None))
            self._runs[key] = bisect_command.run(self.m, patch_id, ends=ends, cache=self.cache,
                                                 **kw)
        return self._runs[key]

    def cli(self, *args: str, tmpdir: Path | None = None) -> subprocess.CompletedProcess:
        env = dict(os.environ, PATCHKIT_CACHE_DIR=str(self.cache))
        if tmpdir is not None:
            env["TMPDIR"] = str(tmpdir)
        return patchkit(*args, cwd=self.proj, env=env)


def test_limits_and_pull_numbers():
    assert [bisect.limit_for(n) for n in (1, 2, 3, 4, 5, 300, 2000)] == [2, 3, 4, 4, 5, 11, 13]
    assert bisect.pull_of("[Core] fix (#12) and more (#34567)") == 34567
    assert bisect.pull_of("Merge pull request #77 from dev/side") == 77
    assert bisect.pull_of("no pull request here #12") is None


def test_the_commit_that_broke_it(hist):
    r = hist.run("table-entry")
    assert (r.good.ref, r.good.commit, str(r.good.fate)) == ("v1.0.0", hist.sha["v1.0.0"],
                                                             "applied")
    # --bad is the newest release tag: not the pre-release, not `nightly`
    assert (r.bad.ref, r.bad.commit, str(r.bad.fate)) == ("v2.0.0", hist.sha["v2.0.0"],
                                                          "failed/conflict")
    fb = r.first_bad
    assert fb is not None and fb.commit == hist.sha["break"]
    assert fb.subject == "[Kernel] add int4 to the table (#10180)" and fb.pull == 10180
    assert datetime.fromisoformat(fb.date).year == 2020
    assert str(fb.fate) == "failed/conflict"
    assert r.ok and r.changed and r.commits == N
    assert 2 < r.tested <= LIMIT == r.limit
    # the upstream change of the patch's own file at that commit, and only that
    assert r.files == ("pkg/table.py",)
    assert r.diff.startswith("diff --git a/pkg/table.py b/pkg/table.py\n")
    assert '+    "int4": 3,\n' in r.diff and "noise/" not in r.diff
    assert r.diff == sh("git", "diff", "--full-index", f"{fb.commit}^", fb.commit, "--",
                        "pkg/table.py",
                        cwd=hist.up.repo) + "\n"


def test_the_patches_before_it_are_applied_where_they_apply(hist):
    # table-more's context is table-entry's line: it applies at the pin only on top of it, and
    # fails at the commit where table-entry stops applying
    r = hist.run("table-more")
    assert str(r.good.fate) == "applied" and str(r.bad.fate) == "failed/conflict"
    assert r.first_bad is not None and r.first_bad.commit == hist.sha["break"]
    assert r.tested <= LIMIT


def test_the_commit_from_which_it_is_upstream(hist):
    r = hist.run("fast-mode")
    # its `vllm: "<2"` would skip it at v2.0.0; under test the range is ignored
    assert str(r.good.fate) == "applied" and str(r.bad.fate) == "upstream"
    assert r.first_bad is not None and r.first_bad.commit == hist.sha["upstream"]
    assert r.first_bad.subject == "[Perf] the fast mode by default (#10240)"
    assert r.first_bad.pull == 10240
    # the header commit before it moved the hunk (an offset): the same fate, not the answer
    assert hist.sha["header"] != r.first_bad.commit
    assert '-MODE = "plain"\n+MODE = "fast"\n' in r.diff
    assert r.tested <= LIMIT
    text = render_text(r)
    assert f"upstream from {hist.sha['upstream'][:10]}  #10240  [Perf] the fast mode" in text


def test_the_same_fate_at_both_ends_says_so(hist):
    r = hist.run("stable")
    assert not r.changed and r.first_bad is None and r.ok
    assert str(r.good.fate) == str(r.bad.fate) == "applied"
    assert r.tested == 2 and r.diff == ""
    text = render_text(r)
    assert "the same fate at both ends: nothing changes between v1.0.0 and v2.0.0" in text


def test_a_merge_on_the_first_parent_line_is_one_step(hist):
    r = hist.run("side-fix")
    fb = r.first_bad
    assert fb is not None and fb.commit == hist.sha["merge"] != hist.sha["side-break"]
    assert fb.subject == "Merge pull request #10100 from dev/side" and fb.pull == 10100
    parents = sh("git", "rev-list", "--parents", "-n1", fb.commit, cwd=hist.up.repo).split()
    assert len(parents) == 3  # a merge
    # what the merge brought in, against its first parent
    assert "-    return 1\n+    return 10\n" in r.diff
    assert r.tested <= LIMIT


def test_explicit_ends(hist):
    # from the commit before the break up to the break: one candidate, nothing to search
    before = sh("git", "rev-parse", f"{hist.sha['break']}^", cwd=hist.up.repo)
    r = hist.run("table-entry", good=before, bad=hist.sha["break"])
    assert r.commits == 1 and r.tested == 2 == r.limit
    assert r.first_bad is not None and r.first_bad.commit == hist.sha["break"]
    # and a stretch in which it does not change
    r = hist.run("table-entry", good="v1.0.0", bad=before)
    assert not r.changed and r.first_bad is None


def test_from_a_release_branch_to_another_the_search_starts_at_their_merge_base(hist):
    # v1.0.1 and v1.9.0 each sit on a release branch of their own, as vLLM tags releases
    r = hist.run("table-entry", good="v1.0.1", bad="v1.9.0")
    assert r.base is not None and r.base.commit == hist.sha["v1.0.0"]
    assert str(r.good.fate) == str(r.base.fate) == "applied"
    assert r.first_bad is not None and r.first_bad.commit == hist.sha["break"]
    fork = sh("git", "rev-list", "--first-parent", "--count", f"v1.0.0..{hist.sha['v1.9-fork']}",
              cwd=hist.up.repo)
    assert r.commits == int(fork) + 1  # main up to the fork, then the release commit
    assert r.tested <= r.limit == bisect.limit_for(r.commits) + 1
    text = render_text(r)
    assert (f"  v1.0.1 is not an ancestor of v1.9.0 (a release branch?): searched from their "
            f"merge base {hist.sha['v1.0.0'][:10]} (applied)") in text
    assert r.to_dict()["base"] == {"ref": "merge base", "commit": hist.sha["v1.0.0"],
                                   "fate": "applied", "message": ""}
    assert hist.run("table-entry").base is None


def test_the_earlier_patches_are_those_of_the_build(hist, tmp_path):
    fast = hist.m.patch("fast-mode")
    assert bisect.Oracle(hist.m, fast, tmp_path).before == ()
    diag = bisect.Oracle(hist.m, fast, tmp_path, variant="diag")
    assert [p.id for p in diag.before] == ["diag-mode"]
    r = hist.run("fast-mode", variant="diag")
    assert r.variant == "diag" and r.to_dict()["variant"] == "diag"
    assert r.first_bad is not None and r.first_bad.commit == hist.sha["upstream"]
    assert hist.run("fast-mode").variant is None
    # a patch that names a variant is tested whatever the build
    assert str(hist.run("diag-mode", bad=hist.sha["break"]).good.fate) == "applied"


def test_scratch_is_removed_and_the_workdir_untouched(hist, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    r = bisect_command.run(hist.m, "fast-mode", ends=(hist.sha["header"], hist.sha["upstream"]),
                           cache=hist.cache)
    assert r.first_bad is not None and r.first_bad.commit == hist.sha["upstream"]
    assert list(tmp_path.iterdir()) == []
    assert not (hist.proj / ".patchkit").exists()


def test_the_predicate_applies_what_can_reach_the_patch_and_checks_out_only_that(hist, tmp_path):
    more = bisect.Oracle(hist.m, hist.m.patch("table-more"), tmp_path)
    assert [p.id for p in more.before] == ["table-entry"] and more.paths == ["pkg/table.py"]
    side = bisect.Oracle(hist.m, hist.m.patch("side-fix"), tmp_path)
    assert side.before == () and side.paths == ["pkg/side.py"]
    # the same fate as with every patch before it, in a full checkout
    res = source.resolve([str(hist.up.repo)], "v1.0.0", hist.cache)
    for commit in (hist.sha["v1.0.0"], hist.sha["break"], hist.sha["merge"]):
        at = source.Resolved(res.source, res.repo, commit, commit, None)
        for oracle in (more, side):
            full = bisect.fate_at(hist.m, oracle.patch, at, tmp_path)
            assert oracle(at) == full
            assert oracle(at).message == full.message
    assert list(tmp_path.iterdir()) == []


def test_cli_text(hist, tmp_path):
    p = hist.cli("bisect", "table-entry", tmpdir=tmp_path)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    short = hist.sha["break"][:10]
    assert lines[0] == (f"table-entry: applied at v1.0.0 ({hist.sha['v1.0.0'][:10]}), "
                        f"failed/conflict at v2.0.0 ({hist.sha['v2.0.0'][:10]})")
    assert lines[1] == f"broken by {short}  #10180  [Kernel] add int4 to the table (#10180)"
    assert f"  commit {hist.sha['break']}" in lines
    assert any(ln.startswith("tested ") and ln.endswith(f"of {N + 1} first-parent commits, "
                                                         f"both ends included (at most {LIMIT})") for ln in lines)
    assert f"upstream diff of pkg/table.py at {short}:" in lines
    assert "table-entry at v1.0.0" in p.stderr  # progress goes to stderr
    assert list(tmp_path.iterdir()) == []


def test_cli_json_shape(hist):
    p = hist.cli("bisect", "side-fix", "--format", "json")
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert {"ok", "patch", "good", "bad", "first_bad", "tested", "diff"} <= set(data)
    assert data["ok"] is True and data["patch"] == "side-fix"
    for end in ("good", "bad"):
        assert {"ref", "commit", "fate"} <= set(data[end])
    assert data["good"]["fate"] == "applied" and data["bad"]["fate"] == "failed/conflict"
    assert {"commit", "subject", "pull", "date"} <= set(data["first_bad"])
    assert data["first_bad"]["commit"] == hist.sha["merge"] and data["first_bad"]["pull"] == 10100
    assert isinstance(data["tested"], int) and data["tested"] <= LIMIT
    assert data["diff"].startswith("diff --git a/pkg/side.py")
    same = json.loads(hist.cli("bisect", "stable", "--format", "json").stdout)
    assert same["ok"] is True and same["first_bad"] is None and same["changed"] is False


@pytest.mark.parametrize("args, code, words", [
    (["table-entyr"], 2, "no patch 'table-entyr' in patchset.yaml; did you mean 'table-entry'?"),
    (["table-entry", "--bad", "v9.9.9"], 2, "unknown vLLM ref 'v9.9.9'"),
    (["table-entry", "--good", "island"], 2,
     "--good island is not an ancestor of the newest release v2.0.0: their histories never "
     "meet"),
    (["stable", "--good", "v1.0.1"], 2,
     "--good v1.0.1 is not an ancestor of the newest release v2.0.0, and at their merge base "),
    # the end not given is named by the default that was taken, not by a flag
    (["table-entry", "--bad", "v1.0.0"], 2, "the pin v1.0.0 and --bad v1.0.0 are the same commit"),
    (["table-entry", "--good", "v2.0.0", "--bad", "v1.0.0"], 2,
     "--good v2.0.0 is not an ancestor of --bad v1.0.0: it comes after it (swap them?)"),
    (["table-entry", "--good", "v1.0.0", "--bad", "v1.0.0"], 2,
     "--good v1.0.0 and --bad v1.0.0 are the same commit"),
    (["table-entry", "--good", "HEAD~3"], 2, "is a revision expression"),
    (["table-entry", "--variant", "dag"], 2,
     "--variant 'dag': unknown variant; did you mean 'diag'?"),
    (["table-entry", "--good", "v1.0.0", "--ref", "vllm=v1.0.1"], 2,
     "--good v1.0.0 and --ref vllm= both say where the bisect starts; give one"),
    (["--series", "--run", "true", "--ref", "vllm=v1.0.0"], 2,
     "--ref moves a pin under one patch's bisect; --series bisects the series at the "
     "manifest's pins: drop it"),
])
def test_bad_inputs_are_one_line(hist, tmp_path, args, code, words):
    p = hist.cli("bisect", *args, tmpdir=tmp_path)
    assert p.returncode == code, (p.stdout, p.stderr)
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("patchkit")]
    assert len(errors) == 1 and words in errors[0], p.stderr
    assert "Traceback" not in p.stderr and p.stdout == ""
    assert list(tmp_path.iterdir()) == []  # nothing was checked out
    as_json = hist.cli("bisect", *args, "--format", "json")
    assert json.loads(as_json.stdout) == {"ok": False, "error": errors[0].split("error: ", 1)[1],
                                          "exit_code": code}


def test_bad_inputs_in_the_core(hist):
    with pytest.raises(UsageError, match="did you mean 'stable'"):
        bisect_command.run(hist.m, "stabel", cache=hist.cache)
    with pytest.raises(SourceError, match="did you mean v1.0.0"):
        bisect_command.run(hist.m, "stable", ends=(None, "v1.0.00"), cache=hist.cache)


def test_rebase_check_bisect_notes(hist):
    matrix = rebasecheck.run(hist.m, Asked(), refs=["v2.0.0"], jobs=1, bisect=True)
    rows = {r.patch.id: r for r in matrix.rows()}
    brk, merge = hist.sha["break"][:10], hist.sha["merge"][:10]
    assert render.notes(rows["table-entry"]) == ["vllm#777", f"broken by {brk} (#10180)"]
    assert render.notes(rows["table-more"]) == [f"broken by {brk} (#10180)"]
    assert render.notes(rows["side-fix"]) == [f"broken by {merge} (#10100)"]
    assert render.notes(rows["stable"]) == []  # no failure, no bisect
    text = render.render_text(matrix)
    assert any(ln.startswith("side-fix") and ln.endswith(f"broken by {merge} (#10100)")
               for ln in text.splitlines())
    assert f"broken by {brk} (#10180)" in render.render_markdown(matrix)
    data = matrix.to_dict()
    entries = {p["id"]: p for p in data["targets"][0]["patches"]}
    assert entries["side-fix"]["bisect"]["first_bad"]["commit"] == hist.sha["merge"]
    assert entries["table-entry"]["bisect"]["first_bad"]["pull"] == 10180
    assert "bisect" not in entries["stable"]
    # each failure was bisected within the limit, the pin's fate computed once per patch
    assert all(entries[p]["bisect"]["tested"] <= LIMIT for p in ("table-entry", "side-fix"))


def test_rebase_check_bisect_cli(hist):
    # at the merge only side-fix fails
    p = hist.cli("rebase-check", "--to", hist.sha["merge"], "--bisect", "--format", "json")
    assert p.returncode == 1, p.stderr
    data = json.loads(p.stdout)
    failed = [x for x in data["targets"][0]["patches"] if x["status"] == "failed"]
    assert [x["id"] for x in failed] == ["side-fix"]
    assert failed[0]["bisect"]["first_bad"]["commit"] == hist.sha["merge"]
    plain = hist.cli("rebase-check", "--to", hist.sha["merge"])
    assert "broken by" not in plain.stdout and "side-fix" in plain.stdout
