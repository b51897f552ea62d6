from __future__ import annotations

import json
import os
import signal
import subprocess
import xml.etree.ElementTree as ET

import pytest
from testing import isolate, patchkit, spawn
from testing.project import MOD, PULL, add_nvfp4, Hold, add_slow, make_fates, snapshot
from testing.upstream import make_diff

from patchkit import manifest, source
from patchkit import versions
from patchkit.commands import rebase_check as rebasecheck
from patchkit.run import run_spec
from patchkit.render import matrix as render
from patchkit.series import applier, releases
from patchkit.errors import SourceError

TARGETS = ["v1.1.0", "v1.2.0", "v1.3.0"]
FATES = {
    "table-nvfp4": ["applied (offset)", "upstream", "upstream"],
    "fast-mode": ["applied", "applied", "anchor-missing"],
    "other-fix": ["applied", "conflict", "conflict"],
    "conf-overlay": ["applied", "applied", "overlay-drift"],
    "legacy": ["skipped", "skipped", "skipped"],
    "already-in": ["upstream", "upstream", "upstream"],
}


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    """One matrix over the three releases (given newest first), shared by the rendering tests."""
    tmp = tmp_path_factory.mktemp("fates")
    with pytest.MonkeyPatch.context() as mp:  # the autouse isolation is per test, so again here
        isolate(mp, tmp / "home")
        proj = make_fates(tmp)
        m = manifest.load(proj / "patchset.yaml")
        return rebasecheck.check(m, list(reversed(TARGETS)), run_spec(m, cache=tmp / "cache"),
                                 jobs=2)


def test_every_fate_in_the_matrix(checked):
    assert checked.refs == TARGETS  # given newest first, ordered by version
    assert not checked.ok
    got = {r.patch.id: [render.cell_word(c) for c in r.cells] for r in checked.rows()}
    assert got == FATES
    table = checked.targets[0].patches[0]
    assert [str(o) for o in table.offsets] == ["hunk 1 of pkg/mod.py at line 6 (offset +2)"]
    fast = checked.targets[2].patches[1]
    assert 'anchor not found: the "plain" mode' in fast.message
    drift = checked.targets[2].patches[3]
    assert "pkg/conf.py changed upstream" in drift.message


def test_upstream_since_drop_and_pull(checked):
    rows = {r.patch.id: r for r in checked.rows()}
    assert (rows["table-nvfp4"].upstream_since, rows["table-nvfp4"].drop) == ("v1.2.0", False)
    assert rows["table-nvfp4"].pull == 4242
    assert (rows["already-in"].upstream_since, rows["already-in"].drop) == ("v1.1.0", True)
    assert rows["fast-mode"].upstream_since is None and rows["fast-mode"].pull is None


def test_text_matrix(checked):
    text = render.render_text(checked)
    lines = text.splitlines()
    assert lines[0] == "fates: 6 patches x 3 vLLM targets (pinned at v1.0.0)"
    # the pin is the first column: every fate is judged from it
    assert lines[2].split() == ["patch", "v1.0.0", "(pin)", *TARGETS, "notes"]
    row = {ln.split()[0]: ln for ln in lines[3:9]}
    assert row["table-nvfp4"].endswith("upstream since v1.2.0; vllm#4242")
    assert row["already-in"].endswith("upstream in every target: drop it")
    # the cells line up under their release
    col = lines[2].index("v1.3.0")
    assert row["fast-mode"][col:].startswith("anchor-missing")
    assert row["conf-overlay"][col:].startswith("overlay-drift")
    assert "  other-fix @ v1.2.0: conflict: hunk 1 of pkg/other.py" in text
    assert "  table-nvfp4 @ v1.1.0: hunk 1 of pkg/mod.py at line 6 (offset +2)" in text
    assert "to drop: already-in (patchkit rebase --to v1.3.0 --drop-upstream)" in text
    # fates that change without a loss are listed under the matrix, each where it first shows
    assert "fates that change without loss:\n  already-in @ v1.1.0: now upstream\n" \
        "  table-nvfp4 @ v1.2.0: now upstream\n" in text
    assert row["already-in"].split()[1] == "applied"   # at the pin
    assert lines[-1] == "FAILED: 4 patch failures on 2 of 3 targets (v1.2.0, v1.3.0)"
    assert "\033[" not in text
    colored = render.render_text(checked, color=True)
    assert "\033[1;31manchor-missing\033[0m" in colored and "\033[36mupstream\033[0m" in colored
    # colour codes do not shift the columns
    strip = colored.replace("\033[0m", "")
    for code in ("1;31", "32", "36", "2", "33"):
        strip = strip.replace(f"\033[{code}m", "")
    assert strip == text


def test_json_has_one_apply_report_per_target(checked):
    data = json.loads(render.render_json(checked))
    assert data["ok"] is False and data["pin"] == "v1.0.0"
    assert [t["vllm"]["ref"] for t in data["targets"]] == TARGETS
    for t in data["targets"]:
        assert {"ok", "vllm", "workdir", "patches", "verify"} <= set(t)
        assert [p["id"] for p in t["patches"]] == list(FATES)
    assert data["targets"][1]["patches"][2]["reason"] == "conflict"
    table = data["patches"][0]
    assert table == {"id": "table-nvfp4", "kind": "diff", "upstream": PULL, "pull": 4242,
                     "upstream_since": "v1.2.0", "drop": False, "pin_status": "applied",
                     "status": {"v1.1.0": "applied", "v1.2.0": "upstream", "v1.3.0": "upstream"},
                     "fate": {"v1.1.0": "unchanged", "v1.2.0": "now upstream",
                              "v1.3.0": "now upstream"},
                     "lost": []}
    assert data["lost"] == [] and data["at_pin"]["vllm"]["ref"] == "v1.0.0"
    assert data["targets"][1]["patches"][0]["fate"]["change"] == "now upstream"


def test_markdown_for_a_job_summary(checked):
    md = render.render_markdown(checked)
    lines = md.splitlines()
    assert lines[0] == "## vLLM rebase-check: fates"
    header = lines.index("| patch | `v1.0.0` (pin) | `v1.1.0` | `v1.2.0` | `v1.3.0` | notes |")
    assert lines[header + 1] == "|---|---|---|---|---|---|"
    assert lines[header + 2] == (f"| `table-nvfp4` | ✅ applied | ✅ applied (offset) | ⬆️ upstream | "
                                 f"⬆️ upstream | upstream since `v1.2.0` · [vllm#4242]({PULL}) |")
    assert "| `other-fix` | ✅ applied | ✅ applied | ❌ conflict | ❌ conflict |  |" in lines
    assert "- `table-nvfp4` on `v1.2.0`: now upstream" in lines
    assert any(ln.startswith("| `already-in` |") and
               ln.endswith("| **upstream in every target: drop it** |") for ln in lines)
    assert "<details><summary><code>fast-mode</code> on <code>v1.3.0</code>: anchor-missing</summary>" in lines
    assert "❌ 4 patch failures" in md
    assert "Upstream in every target: `already-in`" in md


def test_junit_one_testcase_per_patch_and_release(checked):
    root = ET.fromstring(render.render_junit(checked))
    assert root.tag == "testsuites"
    assert (root.get("tests"), root.get("failures"), root.get("skipped")) == ("18", "4", "3")
    suites = root.findall("testsuite")
    assert [s.get("name") for s in suites] == [f"vLLM {t}" for t in TARGETS]
    cases = {(s.get("name"), c.get("name")): c for s in suites for c in s.findall("testcase")}
    assert len(cases) == 18
    conflict = cases[("vLLM v1.2.0", "other-fix")].find("failure")
    assert conflict.get("type") == "conflict"
    # the failure carries the hunk that did not apply
    assert "the hunk:\n@@ -1,3 +1,3 @@\n def compute(a, b):\n-    total = a + b\n+    total = a + b + 1" in conflict.text
    anchor = cases[("vLLM v1.3.0", "fast-mode")].find("failure")
    assert anchor.get("type") == "anchor-missing" and 'the "plain" mode' in anchor.text
    assert "assertions that do not hold:\n  pkg/mod.py:" in anchor.text
    assert cases[("vLLM v1.1.0", "legacy")].find("skipped") is not None
    assert cases[("vLLM v1.1.0", "already-in")].find("failure") is None
    assert "offset +2" in cases[("vLLM v1.1.0", "table-nvfp4")].find("system-out").text


def test_releases_after_the_pin(tmp_path):
    proj = make_fates(tmp_path)
    m = manifest.load(proj / "patchset.yaml")
    cache = tmp_path / "cache"
    assert releases.release_targets(m, run_spec(m, cache=cache)) == TARGETS
    assert releases.release_targets(m, run_spec(m, cache=cache), pre=True) == [*TARGETS,
                                                                              "v1.4.0rc1"]
    # a new upstream release shows up: the mirror is fetched again
    from testing.upstream import sh
    sh("git", "tag", "v1.5.0", "v1.3.0", cwd=tmp_path / "upstream")
    assert releases.release_targets(m, run_spec(m, cache=cache))[-1] == "v1.5.0"


def test_release_version():
    assert versions.release_tag("v0.8.5.post1") is not None
    assert versions.release_tag("v1.4.0rc1").is_prerelease
    for tag in ("nightly", "1.0.0", "v01.0", "v1.0+local", "vX"):
        assert versions.release_tag(tag) is None


def test_resolves_each_target_once_and_leaves_nothing_behind(tmp_path, monkeypatch):
    proj = make_fates(tmp_path)
    scratch_root = tmp_path / "tmp"
    scratch_root.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch_root))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)
    calls = []
    real = source.resolve

    def counting(repos, ref, cache, log=lambda m: None, **kw):
        calls.append(ref)
        return real(repos, ref, cache, log, **kw)

    monkeypatch.setattr(source, "resolve", counting)
    m = manifest.load(proj / "patchset.yaml")
    before = snapshot(proj)
    matrix = rebasecheck.check(m, TARGETS + ["v1.2.0"], run_spec(m, cache=tmp_path / "cache"),
                               jobs=2)
    assert sorted(calls) == ["v1.0.0", *TARGETS]   # the pin, then each target, once
    assert len(matrix.targets) == 3
    assert list(scratch_root.iterdir()) == []
    assert snapshot(proj) == before and not (proj / ".patchkit").exists()


def test_sparse_checkout_gives_the_same_reports_as_a_full_one(tmp_path):
    proj = make_fates(tmp_path)
    m = manifest.load(proj / "patchset.yaml")
    assert applier.needed_paths(m) == ["pkg/conf.py", "pkg/mod.py", "pkg/other.py",
                                           "pkg/util.py"]
    run = run_spec(m, cache=tmp_path / "cache")
    sparse = rebasecheck.check(m, TARGETS, run, jobs=1)
    full = rebasecheck.check(m, TARGETS, run, jobs=1, sparse=False)
    assert render.render_json(sparse) == render.render_json(full)


def test_unknown_target_is_a_source_error(tmp_path):
    proj = make_fates(tmp_path)
    m = manifest.load(proj / "patchset.yaml")
    with pytest.raises(SourceError, match="unknown vLLM ref 'v9.9.9'"):
        rebasecheck.check(m, ["v1.1.0", "v9.9.9"], run_spec(m, cache=tmp_path / "cache"))


def test_cli_exit_codes_formats_and_outputs(tmp_path):
    proj = make_fates(tmp_path)
    p = patchkit("rebase-check", "--to", "v1.1.0", cwd=proj)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[-1] == "ok: the series applies to 1 of 1 targets"
    p = patchkit("rebase-check", "--releases", "--format", "junit", "--output",
                 "markdown:summary.md", "--output", "json:report.json", cwd=proj)
    assert p.returncode == 1
    assert ET.fromstring(p.stdout).get("tests") == "18"
    assert (proj / "summary.md").read_text().startswith("## vLLM rebase-check: fates\n")
    assert len(json.loads((proj / "report.json").read_text())["targets"]) == 3
    assert "releases after v1.0.0: v1.1.0, v1.2.0, v1.3.0" in p.stderr
    assert not (proj / ".patchkit").exists()


def test_cli_usage_errors(tmp_path):
    proj = make_fates(tmp_path)
    for args, msg in ((["rebase-check"], "give --to REF"),
                      (["rebase-check", "--to", "v1.1.0", "--pre"], "--pre goes with --releases"),
                      (["rebase-check", "--to", "v1.1.0", "--output", "xml:x"], "FORMAT:FILE"),
                      (["rebase-check", "--to", "v1.1.0", "--output", "json:nowhere/r.json"],
                       "no folder nowhere")):
        p = patchkit(*args, cwd=proj)
        assert p.returncode == 2 and msg in p.stderr and len(p.stderr.splitlines()) == 1, p.stderr
    p = patchkit("rebase-check", "--to", "v7", cwd=proj)
    assert p.returncode == 2 and "unknown vLLM ref 'v7'" in p.stderr


def test_no_release_after_the_pin(tmp_path):
    proj = make_fates(tmp_path)
    text = (proj / "patchset.yaml").read_text().replace("ref: v1.0.0", "ref: v1.3.0")
    (proj / "patchset.yaml").write_text(text)
    p = patchkit("rebase-check", "--releases", "--format", "json", cwd=proj)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["targets"] == []


def test_interrupt_stops_every_worker_and_cleans_up(tmp_path):
    """^C at a terminal reaches the whole process group: the parent and each worker."""
    proj = make_fates(tmp_path)
    add_slow(proj)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    hold = Hold(tmp_path / "hold")
    env = dict(hold.env, TMPDIR=str(scratch))
    err = tmp_path / "stderr"
    with open(err, "w") as fh:
        proc = spawn("rebase-check", "--releases", cwd=proj, env=env, stdout=subprocess.DEVNULL,
                     stderr=fh, start_new_session=True)
    hold.wait(proc)  # a worker is inside the slow patch now
    os.killpg(proc.pid, signal.SIGINT)
    hold.release()
    assert proc.wait(timeout=60) == 130
    text = err.read_text()
    assert "Traceback" not in text
    assert text.splitlines()[-1] == "patchkit: interrupted by SIGINT; nothing was changed"
    assert list(scratch.iterdir()) == []


# ------------------------------------------------------------------------------ lost fixes

def _edit(proj, old: str, new: str) -> None:
    text = (proj / "patchset.yaml").read_text()
    assert old in text
    (proj / "patchset.yaml").write_text(text.replace(old, new, 1))


def _helper_fix(proj, name: str) -> None:
    """A diff on the module's helper(), which every release keeps (as legacy's)."""
    mod = add_nvfp4(MOD)   # as table-nvfp4 leaves it
    (proj / "patches" / name).write_text(make_diff(mod, mod.replace("return x + 1",
                                                                    "return x + 2"), "pkg/mod.py"))


LEGACY = '  - id: legacy\n    summary: only for old releases\n    diff: patches/legacy.diff\n    vllm: "<1.0"\n'


def test_a_fix_ranged_out_with_nothing_in_its_place_is_lost(tmp_path):
    """A patch that takes effect at the pin and not at a release, with nothing that says where
    its fix went, fails that release: exit 1, the cell marked, the patch named, in every
    format; --releases too.  rebase-check and bump judge it alike (test_bump)."""
    proj = make_fates(tmp_path)
    _helper_fix(proj, "legacy.diff")
    _edit(proj, 'vllm: "<1.0"', 'vllm: "<1.1"')
    p = patchkit("rebase-check", "--to", "v1.1.0", "--output", "json:r.json", "--output",
                 "junit:r.xml", "--output", "markdown:r.md", cwd=proj)
    assert p.returncode == 1, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    assert lines[2].split()[:4] == ["patch", "v1.0.0", "(pin)", "v1.1.0"]
    row = next(ln for ln in lines if ln.startswith("legacy"))
    assert row.split()[1:4] == ["applied", "LOST", "(skipped)"]
    assert ("  legacy @ v1.1.0: legacy took effect at v1.0.0 and not at v1.1.0 (skipped): it is "
            "not upstream there, no patch that takes effect there supersedes it, and it is not "
            "retired") in lines
    assert lines[-1] == "FAILED: 1 lost fix on 1 of 1 targets (v1.1.0)"
    data = json.loads((proj / "r.json").read_text())
    assert data["ok"] is False and data["targets"][0]["ok"] is False
    assert data["lost"][0]["id"] == "legacy" and data["lost"][0]["target"] == "v1.1.0"
    legacy = next(x for x in data["patches"] if x["id"] == "legacy")
    assert (legacy["pin_status"], legacy["fate"], legacy["lost"]) == (
        "applied", {"v1.1.0": "lost"}, ["v1.1.0"])
    case = next(c for c in ET.parse(proj / "r.xml").iter("testcase") if c.get("name") == "legacy")
    assert case.find("failure").get("type") == "lost"
    md = (proj / "r.md").read_text()
    assert "| `legacy` | ✅ applied | ❌ LOST (skipped) |" in md and "### Lost fixes" in md
    p = patchkit("rebase-check", "--releases", cwd=proj)
    assert p.returncode == 1 and "legacy @ v1.1.0: legacy took effect" in p.stdout
    assert "lost fix" in p.stdout.splitlines()[-1]


def test_a_successor_that_takes_effect_carries_the_fix(tmp_path):
    proj = make_fates(tmp_path)
    _helper_fix(proj, "legacy.diff")
    _helper_fix(proj, "legacy11.diff")
    _edit(proj, LEGACY, LEGACY.replace('"<1.0"', '"<1.1"')
          + "  - id: legacy-v11\n    summary: the legacy fix from 1.1 on\n"
            "    diff: patches/legacy11.diff\n    vllm: \">=1.1\"\n    supersedes: [legacy]\n")
    p = patchkit("rebase-check", "--to", "v1.1.0", cwd=proj)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "  legacy @ v1.1.0: superseded: superseded by legacy-v11" in p.stdout
    assert "  legacy-v11 @ v1.1.0: newly applied: takes effect at v1.1.0" in p.stdout
    assert p.stdout.splitlines()[-1] == "ok: the series applies to 1 of 1 targets"


def test_a_retirement_is_proven_where_the_code_is_gone(tmp_path):
    """v1.2.0 changed the line other-fix changes: retired from there, the proof holds; a
    retirement from v1.1.0, where the line is still there, is refused in one line."""
    proj = make_fates(tmp_path)
    _edit(proj, "    diff: patches/other.diff\n",
          "    diff: patches/other.diff\n"
          "    retired: {from: v1.2.0, why: upstream rewrote compute()}\n")
    p = patchkit("rebase-check", "--to", "v1.2.0", "--format", "json", cwd=proj)
    data = json.loads(p.stdout)
    other = next(x for x in data["patches"] if x["id"] == "other-fix")
    assert (other["status"], other["fate"]) == ({"v1.2.0": "skipped"}, {"v1.2.0": "retired"})
    assert data["ok"] is True and p.returncode == 0, p.stderr
    p = patchkit("rebase-check", "--to", "v1.2.0", cwd=proj)
    assert ("  other-fix @ v1.2.0: retired: retired from v1.2.0 (upstream rewrote compute()); "
            "proven at v1.2.0: pkg/other.py: the line hunk 1 changes is gone "
            "(`total = a + b`)") in p.stdout.splitlines()
    assert next(ln for ln in p.stdout.splitlines() if ln.startswith("other-fix")).split()[1:3] \
        == ["applied", "retired"]
    # the release before: the line is still there
    _edit(proj, "from: v1.2.0", "from: v1.1.0")
    p = patchkit("rebase-check", "--to", "v1.1.0", cwd=proj)
    assert p.returncode == 1
    assert ("  other-fix @ v1.1.0: other-fix is retired from v1.1.0, but v1.1.0 still has its "
            "code: pkg/other.py still has `total = a + b` (hunk 1)") in p.stdout.splitlines()
    assert p.stdout.splitlines()[-1] == "FAILED: 1 lost fix on 1 of 1 targets (v1.1.0)"


def test_a_retired_transform_is_proven_by_its_anchor(tmp_path):
    """v1.3.0 computes the mode: fast-mode's anchor (the "plain" mode) is gone there."""
    proj = make_fates(tmp_path)
    _edit(proj, "    transform: patches/fast.py   # libcst\n",
          "    transform: patches/fast.py   # libcst\n"
          "    retired: {from: v1.3.0, why: the mode is computed}\n")
    p = patchkit("rebase-check", "--to", "v1.3.0", cwd=proj)
    assert ('  fast-mode @ v1.3.0: retired: retired from v1.3.0 (the mode is computed); proven '
            'at v1.3.0: pkg/mod.py: anchor not found: the "plain" mode') in p.stdout.splitlines()
    _edit(proj, "from: v1.3.0", "from: v1.2.0")
    p = patchkit("rebase-check", "--to", "v1.2.0", cwd=proj)
    assert p.returncode == 1
    assert ("fast-mode is retired from v1.2.0, but v1.2.0 still has its code: pkg/mod.py still "
            "has Fast's anchor (it applies there)") in p.stdout


def test_a_retired_release_the_source_lacks_is_one_line(tmp_path):
    proj = make_fates(tmp_path)
    _edit(proj, "    diff: patches/other.diff\n",
          "    diff: patches/other.diff\n    retired: {from: v1.9.0, why: gone}\n")
    p = patchkit("rebase-check", "--to", "v1.2.0", cwd=proj)
    assert p.returncode == 2
    assert p.stderr.splitlines()[-1] == (
        "patchkit rebase-check: error: patchset.yaml:30: patches[2] (id=other-fix): "
        "retired.from: vLLM has no release v1.9.0 (its sources list none such)")


def test_a_change_an_earlier_patch_made_is_never_upstream(tmp_path):
    """table-again makes table-nvfp4's change: the tree has it only because table-nvfp4 made
    it, and the matrix says so, naming it; where the release has it (v1.2.0), it is upstream."""
    proj = make_fates(tmp_path)
    (proj / "patches/table-again.diff").write_text((proj / "patches/table.diff").read_text())
    _edit(proj, "  - id: fast-mode\n", "  - id: table-again\n    summary: nvfp4 again\n"
                                      "    diff: patches/table-again.diff\n\n  - id: fast-mode\n")
    p = patchkit("rebase-check", "--to", "v1.1.0", "--to", "v1.2.0", "--format", "json",
                 cwd=proj)
    data = json.loads(p.stdout)
    again = next(x for x in data["patches"] if x["id"] == "table-again")
    assert again["status"] == {"v1.1.0": "upstream", "v1.2.0": "upstream"}
    at11 = next(x for x in data["targets"][0]["patches"] if x["id"] == "table-again")
    assert at11["made_by"] == "table-nvfp4"
    assert at11["message"] == ("the tree has this change only because table-nvfp4, earlier in "
                               "the series, made it; the release does not have it")
    at12 = next(x for x in data["targets"][1]["patches"] if x["id"] == "table-again")
    assert "made_by" not in at12
    text = patchkit("rebase-check", "--to", "v1.1.0", "--to", "v1.2.0", cwd=proj).stdout
    row = next(ln for ln in text.splitlines() if ln.startswith("table-again"))
    assert row.split()[1:8] == ["made", "by", "table-nvfp4", "made", "by", "table-nvfp4",
                                "upstream"]
