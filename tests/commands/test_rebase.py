from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
import yaml
from testing import patchkit, spawn
from testing.project import (
    CONF_OURS_V13,
    OTHER_RESOLVED,
    TRANSFORM_V13,
    Hold,
    add_slow,
    make_fates,
    snapshot,
)
from testing.upstream import sh

from patchkit import manifest
from patchkit.series import rebase
from patchkit.commands import rebase as rebase_cmd
from patchkit.series import applier
from patchkit.run import run_spec
from patchkit.errors import UsageError

def manifest_diff(proj: Path) -> list[str]:
    """The changed lines of patchset.yaml against the last commit."""
    out = sh("git", "diff", "-U0", "--", "patchset.yaml", cwd=proj)
    return [ln for ln in out.splitlines() if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]


def applies_cleanly(proj: Path, tmp: Path, name: str = "wd"):
    report = applier.apply_series(manifest.load(proj / "patchset.yaml"),
                                  run=run_spec(manifest.load(proj / "patchset.yaml")),
                                  workdir=tmp / name)
    assert report.ok, report.to_json()
    assert all(not p.offsets for p in report.patches)
    return report


def test_offset_is_refreshed_upstream_marked_and_only_needed_lines_change(tmp_path):
    proj = make_fates(tmp_path)
    old_table = (proj / "patches/table.diff").read_text()
    result = rebase_cmd.start_at(proj / "patchset.yaml", "v1.1.0")
    assert result.done and result.stop is None
    assert [(s.id, s.action) for s in result.steps] == [
        ("table-nvfp4", "refreshed"), ("fast-mode", "applied"), ("other-fix", "applied"),
        ("conf-overlay", "applied"), ("legacy", "skipped"), ("already-in", "upstream")]
    assert manifest_diff(proj) == [
        "-  ref: v1.0.0    # the pin", "+  ref: v1.1.0    # the pin",
        "-  base: example/vllm:v1.0.0", "+  base: example/vllm:v1.1.0",
        '+    vllm: "<1.1.0"']
    # the refreshed diff differs from the old one only in its hunk header
    new_table = (proj / "patches/table.diff").read_text()
    assert [a for a, b in zip(old_table.splitlines(), new_table.splitlines()) if a != b] == [
        "@@ -4,6 +4,7 @@"]
    assert "@@ -6,6 +6,7 @@" in new_table
    assert sh("git", "status", "--porcelain", cwd=proj).splitlines() == [
        "M patches/table.diff", " M patchset.yaml"]  # (the first line's blank is stripped)
    text = (proj / "patchset.yaml").read_text()
    assert "# The fixture series.  This comment" in text and "# --- a diff that drifts" in text
    # the new pin applies exactly
    report = applies_cleanly(proj, tmp_path)
    assert report.vllm.ref == "v1.1.0"
    assert [p.status for p in report.patches] == ["applied"] * 4 + ["skipped"] * 2
    assert not rebase.in_progress(proj)


def test_drop_upstream_removes_entry_and_file(tmp_path):
    proj = make_fates(tmp_path)
    result = rebase_cmd.start_at(proj / "patchset.yaml", "v1.1.0", drop_upstream=True)
    assert result.done
    assert ("already-in", "dropped") in [(s.id, s.action) for s in result.steps]
    assert not (proj / "patches/util2.diff").exists()
    ids = [p["id"] for p in yaml.safe_load((proj / "patchset.yaml").read_text())["patches"]]
    assert ids == ["table-nvfp4", "fast-mode", "other-fix", "conf-overlay", "legacy"]
    changed = [ln for ln in manifest_diff(proj) if ln[:1] in "-+" and "ref:" not in ln
               and "base:" not in ln]
    # the entry's place says what went and which release has it
    assert changed == ["-  - id: already-in", "-    summary: add util2",
                       "-    diff: patches/util2.diff",
                       "+  # already-in: dropped, upstream in vLLM v1.1.0 (it reported `upstream` "
                       "there)"]
    applies_cleanly(proj, tmp_path)


def test_conflict_stop_continue_to_the_end(tmp_path):
    """v1.3.0 meets a transform anchor, a diff conflict and an overlay drift in turn."""
    proj = make_fates(tmp_path)
    tree = proj / ".patchkit/rebase/tree"

    first = rebase_cmd.start_at(proj / "patchset.yaml", "v1.3.0")
    assert not first.done and first.stop.patch == "fast-mode"
    assert first.stop.reason == "anchor-missing" and first.stop.edit == ["patches/fast.py"]
    assert any("Change patches/fast.py: its anchor is not in the file any more" in ln
               for ln in first.stop.instructions)
    assert (tree / "pkg/mod.py").read_text().count("compute()") == 1

    # a transform is fixed in its own file; retrying unchanged stops again the same way
    again = rebase.resume(proj / "patchset.yaml")
    assert again.stop.patch == "fast-mode"
    (proj / "patches/fast.py").write_text(TRANSFORM_V13)
    second = rebase.resume(proj / "patchset.yaml")
    assert second.stop.patch == "other-fix" and second.stop.reason == "conflict"
    merged = (tree / "pkg/other.py").read_text()
    assert merged == ("def compute(a, b):\n<<<<<<< vLLM v1.3.0\n    total = a * b\n=======\n"
                      "    total = a + b + 1\n>>>>>>> other-fix\n    return total\n")
    assert "  pkg/other.py: 1 conflict between <<<<<<< and >>>>>>>" in second.stop.instructions

    # markers left: refused, nothing lost
    with pytest.raises(UsageError, match=r"conflict markers left in .*pkg/other.py:2"):
        rebase.resume(proj / "patchset.yaml")
    assert (tree / "pkg/other.py").read_text() == merged

    (tree / "pkg/other.py").write_text(OTHER_RESOLVED)
    third = rebase.resume(proj / "patchset.yaml")
    assert third.stop.patch == "conf-overlay" and third.stop.reason == "overlay-drift"
    blob = sh("git", "rev-parse", "v1.3.0:pkg/conf.py", cwd=tmp_path / "upstream")
    assert third.stop.drift == {"pkg/conf.py": blob}
    assert any("git -C .patchkit/rebase/tree diff " in ln or "diff" in ln
               for ln in third.stop.instructions)
    assert third.stop.edit == ["overlays/conf/pkg/conf.py"]

    (proj / "overlays/conf/pkg/conf.py").write_text(CONF_OURS_V13)
    done = rebase.resume(proj / "patchset.yaml")
    assert done.done, done.stop
    assert [(s.id, s.action) for s in done.steps] == [
        ("table-nvfp4", "upstream"), ("fast-mode", "applied"), ("other-fix", "resolved"),
        ("conf-overlay", "applied"), ("legacy", "skipped"), ("already-in", "upstream")]
    other = (proj / "patches/other.diff").read_text()
    assert "-    total = a * b\n+    total = a * b + 1\n" in other
    data = yaml.safe_load((proj / "patchset.yaml").read_text())
    assert data["vllm"]["ref"] == "v1.3.0"
    assert data["patches"][3]["replaces"] == {"pkg/conf.py": blob}
    assert data["patches"][0]["vllm"] == "<1.3.0"
    assert not (proj / ".patchkit/rebase").exists()
    report = applies_cleanly(proj, tmp_path)
    assert (tmp_path / "wd/pkg/other.py").read_text() == OTHER_RESOLVED
    assert (tmp_path / "wd/pkg/conf.py").read_text() == CONF_OURS_V13
    assert [p.status for p in report.patches] == ["skipped", "applied", "applied", "applied",
                                                  "skipped", "skipped"]


def test_abort_restores_every_byte(tmp_path):
    proj = make_fates(tmp_path)
    before = snapshot(proj)
    first = rebase_cmd.start_at(proj / "patchset.yaml", "v1.2.0")  # table marked, other-fix conflicts
    assert first.stop.patch == "other-fix"
    assert snapshot(proj) != before  # the manifest already carries the upstream mark
    (proj / "patches/other.diff").write_text("half-edited\n")
    (proj / "overlays/conf/pkg/conf.py").write_text("scribbled\n")
    aborted = rebase.abort(proj / "patchset.yaml")
    assert aborted.aborted and aborted.ok and (aborted.from_ref, aborted.to_ref) == ("v1.0.0",
                                                                                    "v1.2.0")
    assert set(aborted.restored) == {"patchset.yaml", "patches/other.diff",
                                     "overlays/conf/pkg/conf.py"}
    assert snapshot(proj) == before
    assert not (proj / ".patchkit/rebase").exists()
    with pytest.raises(UsageError, match="no rebase in progress"):
        rebase.abort(proj / "patchset.yaml")


def test_abort_after_a_refresh_and_a_resolution(tmp_path):
    proj = make_fates(tmp_path)
    before = snapshot(proj)
    rebase_cmd.start_at(proj / "patchset.yaml", "v1.3.0", drop_upstream=True)
    (proj / "patches/fast.py").write_text(TRANSFORM_V13)
    rebase.resume(proj / "patchset.yaml")
    (proj / ".patchkit/rebase/tree/pkg/other.py").write_text(OTHER_RESOLVED)
    third = rebase.resume(proj / "patchset.yaml")
    assert third.stop.patch == "conf-overlay"
    assert not (proj / "patches/table.diff").exists()  # dropped: upstream
    rebase.abort(proj / "patchset.yaml")
    assert snapshot(proj) == before


def test_empty_resolution_is_dropped_by_hand_never_upstream(tmp_path):
    proj = make_fates(tmp_path)
    first = rebase_cmd.start_at(proj / "patchset.yaml", "v1.2.0")
    assert first.stop.patch == "other-fix"
    sh("git", "checkout", "--", ".", cwd=proj / ".patchkit/rebase/tree")  # take upstream's side
    done = rebase.resume(proj / "patchset.yaml")
    assert done.done
    step = next(s for s in done.steps if s.id == "other-fix")
    assert step.action == "dropped-by-hand" and "resolved to no change" in step.detail
    assert "upstream" not in step.detail
    assert yaml.safe_load((proj / "patchset.yaml").read_text())["patches"][2]["vllm"] == "<1.2.0"


def test_empty_resolution_dropped_writes_no_false_comment(tmp_path):
    """With --drop-upstream the entry goes, and the comment left in its place says what a
    person did at that release: the release does not have the change."""
    proj = make_fates(tmp_path)
    first = rebase_cmd.start_at(proj / "patchset.yaml", "v1.2.0", drop_upstream=True)
    assert first.stop.patch == "other-fix"
    # the line it changes is gone from v1.2.0: the stop says how to retire it
    assert ('if vLLM v1.2.0 no longer has the code other-fix changes, retire it: `retired: '
            '{from: v1.2.0, why: "..."}` on its entry (patchkit proves the code is gone), then '
            '`patchkit rebase --continue`.') in first.stop.instructions
    sh("git", "checkout", "--", ".", cwd=proj / ".patchkit/rebase/tree")
    done = rebase.resume(proj / "patchset.yaml")
    assert done.done
    text = (proj / "patchset.yaml").read_text()
    assert "# other-fix: dropped by hand at vLLM v1.2.0 (resolved to no change)" in text
    assert "other-fix: dropped, upstream" not in text


def test_one_rebase_at_a_time_and_continue_needs_one(tmp_path):
    proj = make_fates(tmp_path)
    with pytest.raises(UsageError, match="no rebase in progress"):
        rebase.resume(proj / "patchset.yaml")
    rebase_cmd.start_at(proj / "patchset.yaml", "v1.2.0")
    with pytest.raises(UsageError, match="already in progress"):
        rebase_cmd.start_at(proj / "patchset.yaml", "v1.3.0")


def test_transform_stop_refuses_edits_in_the_checkout(tmp_path):
    proj = make_fates(tmp_path)
    rebase_cmd.start_at(proj / "patchset.yaml", "v1.3.0")
    (proj / ".patchkit/rebase/tree/pkg/mod.py").write_text("edited = 1\n")
    with pytest.raises(UsageError, match="fast-mode is a transform: change patches/fast.py"):
        rebase.resume(proj / "patchset.yaml")


def test_hunk_from_a_diff_without_index_lines_uses_the_old_pin(tmp_path):
    """The fixture diffs carry no blob ids, so `git apply --3way` could not merge them; the
    merge base comes from the old pin with the earlier patches applied."""
    proj = make_fates(tmp_path)
    assert "index " not in (proj / "patches/other.diff").read_text()
    stop = rebase_cmd.start_at(proj / "patchset.yaml", "v1.2.0").stop
    assert len(stop.edit) == 1 and stop.edit[0].endswith(".patchkit/rebase/tree/pkg/other.py")
    assert "<<<<<<< vLLM v1.2.0" in (proj / ".patchkit/rebase/tree/pkg/other.py").read_text()
    assert not (proj / ".patchkit/rebase/old").exists()  # the old pin's checkout is gone


def test_cli_rebase_conflict_continue_abort(tmp_path):
    proj = make_fates(tmp_path)
    p = patchkit("rebase", "--to", "v1.2.0", cwd=proj)
    assert p.returncode == 1, p.stderr
    assert p.stdout.splitlines()[:2] == [
        "vLLM v1.0.0 -> v1.2.0, patch by patch:",
        'upstream  table-nvfp4: already in the tree; marked vllm: "<1.2.0"']
    # the list is said once, on stdout: no patch line on stderr as well
    assert "table-nvfp4" not in p.stderr
    assert "`patchkit rebase --continue` writes that change to patches/other.diff" in p.stdout
    p = patchkit("rebase", "--continue", cwd=proj)
    assert p.returncode == 2 and "conflict markers left" in p.stderr
    (proj / ".patchkit/rebase/tree/pkg/other.py").write_text(OTHER_RESOLVED)
    p = patchkit("rebase", "--continue", cwd=proj)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.splitlines()[-1] == "ok: rebased from vLLM v1.0.0 to v1.2.0; review with `git diff`"
    assert "resolved  other-fix: patches/other.diff rewritten from the checkout" in p.stdout
    for args in (["rebase"], ["rebase", "--to", "v1.3.0", "--abort"],
                 ["rebase", "--continue", "--drop-upstream"]):
        p = patchkit(*args, cwd=proj)
        assert p.returncode == 2 and len(p.stderr.splitlines()) == 1, p.stderr
    p = patchkit("rebase", "--to", "v1.3.0", cwd=proj)
    assert p.returncode == 1
    p = patchkit("rebase", "--abort", cwd=proj)
    assert p.returncode == 0 and p.stdout.startswith("rebase aborted; restored")
    assert yaml.safe_load((proj / "patchset.yaml").read_text())["vllm"]["ref"] == "v1.2.0"


@pytest.mark.parametrize("then", ["continue", "abort"])
def test_interrupted_rebase_goes_on_or_goes_back(tmp_path, then):
    proj = make_fates(tmp_path)
    add_slow(proj)
    before = snapshot(proj)
    hold = Hold(tmp_path / "hold")
    proc = spawn("rebase", "--to", "v1.1.0", cwd=proj, env=hold.env,
                 stdout=subprocess.DEVNULL, start_new_session=True)
    hold.wait(proc)  # inside the slow patch, the last one
    os.killpg(proc.pid, signal.SIGINT)
    hold.release()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert err.splitlines()[-1].startswith("patchkit: interrupted by SIGINT")
    assert rebase.in_progress(proj)
    if then == "abort":
        assert patchkit("rebase", "--abort", cwd=proj).returncode == 0
        assert snapshot(proj) == before
        return
    p = patchkit("rebase", "--continue", cwd=proj)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.splitlines()[0] == "vLLM v1.0.0 -> v1.1.0, patch by patch:"
    assert [ln.split()[:2] for ln in p.stdout.splitlines()[1:8]] == [
        ["refreshed", "table-nvfp4:"], ["applied", "fast-mode"], ["applied", "other-fix"],
        ["applied", "conf-overlay"], ["skipped", "legacy:"], ["upstream", "already-in:"],
        ["applied", "slow"]]
    report = applies_cleanly(proj, tmp_path)
    assert (tmp_path / "wd/pkg/util.py").read_text().endswith("# slow\n")
    assert report.patches[-1].status == "applied"


def test_moving_the_pin_backwards_is_said_in_one_line(tmp_path):
    proj = make_fates(tmp_path)
    p = patchkit("rebase", "--to", "v0.9.0", cwd=proj)
    warnings = [line for line in p.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == ["warning: vLLM v0.9.0 (0.9.0) is older than the pin v1.0.0: the pin "
                        "moves backwards"], p.stderr
    forward = patchkit("rebase", "--abort", cwd=proj) if p.returncode else None
    assert forward is None or forward.returncode == 0
    p = patchkit("rebase", "--to", "v1.1.0", cwd=proj)
    assert "warning:" not in p.stderr


def test_a_stop_on_gone_code_is_retired_and_proven(tmp_path):
    """The stop says how to retire a patch whose code is gone; retired at the stop,
    --continue proves it and passes it over; a retirement whose code is still there is
    refused before anything is written."""
    proj = make_fates(tmp_path)
    first = rebase_cmd.start_at(proj / "patchset.yaml", "v1.2.0")
    assert first.stop.patch == "other-fix"
    text = (proj / "patchset.yaml").read_text()
    (proj / "patchset.yaml").write_text(text.replace(
        "    diff: patches/other.diff\n",
        "    diff: patches/other.diff\n    retired: {from: v1.2.0, why: compute() multiplies}\n"))
    done = rebase.resume(proj / "patchset.yaml")
    assert done.done, done.stop
    step = next(s for s in done.steps if s.id == "other-fix")
    assert (step.action, step.detail) == ("skipped", "retired from v1.2.0: compute() multiplies")
    assert yaml.safe_load((proj / "patchset.yaml").read_text())["vllm"]["ref"] == "v1.2.0"


def test_a_retirement_whose_code_is_there_is_refused_before_anything(tmp_path):
    proj = make_fates(tmp_path)
    text = (proj / "patchset.yaml").read_text().replace(
        "    diff: patches/other.diff\n",
        "    diff: patches/other.diff\n    retired: {from: v1.1.0, why: not really}\n")
    (proj / "patchset.yaml").write_text(text)
    before = snapshot(proj)
    with pytest.raises(UsageError) as err:
        rebase_cmd.start_at(proj / "patchset.yaml", "v1.1.0")
    assert str(err.value) == ("other-fix is retired from v1.1.0, but v1.1.0 still has its code: "
                              "pkg/other.py still has `total = a + b` (hunk 1)")
    assert snapshot(proj) == before and not (proj / ".patchkit/rebase").exists()


def test_a_retired_release_the_sources_lack_is_one_line(tmp_path):
    proj = make_fates(tmp_path)
    text = (proj / "patchset.yaml").read_text().replace(
        "    diff: patches/other.diff\n",
        "    diff: patches/other.diff\n    retired: {from: v1.9.0, why: gone}\n")
    (proj / "patchset.yaml").write_text(text)
    before = snapshot(proj)
    with pytest.raises(UsageError) as err:
        rebase_cmd.start_at(proj / "patchset.yaml", "v1.2.0")
    assert str(err.value) == ("patchset.yaml:30: patches[2] (id=other-fix): retired.from: vLLM "
                              "has no release v1.9.0 (its sources list none such)")
    assert snapshot(proj) == before


def test_a_change_an_earlier_patch_made_is_dropped_naming_it(tmp_path):
    """table-again makes table-nvfp4's change: at v1.1.0 the tree has it only because of
    table-nvfp4, and the comment says so, never "upstream in vLLM v1.1.0"."""
    proj = make_fates(tmp_path)
    (proj / "patches/table-again.diff").write_text((proj / "patches/table.diff").read_text())
    text = (proj / "patchset.yaml").read_text().replace(
        "  - id: fast-mode\n", "  - id: table-again\n    summary: nvfp4 again\n"
                              "    diff: patches/table-again.diff\n\n  - id: fast-mode\n")
    (proj / "patchset.yaml").write_text(text)
    done = rebase_cmd.start_at(proj / "patchset.yaml", "v1.1.0", drop_upstream=True)
    assert done.done, done.stop
    step = next(s for s in done.steps if s.id == "table-again")
    assert step.action == "made-by-earlier"
    text = (proj / "patchset.yaml").read_text()
    assert ("# table-again: dropped at vLLM v1.1.0: its change is made by table-nvfp4, earlier "
            "in the series (not by vLLM v1.1.0)") in text
    assert "table-again: dropped, upstream" not in text
