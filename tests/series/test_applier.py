from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from testing.project import MOD_V1, make_project, write_project
from testing.said import said
from testing.upstream import make_upstream, sh, unified

from patchkit import git as g
from patchkit import manifest
from patchkit.series import applier, checkout
from patchkit.errors import Origin, SourceError, UsageError
from patchkit.run import run_spec


def load(proj: Path):
    return manifest.load(proj / "patchset.yaml")


def apply(proj: Path, workdir: Path, **kw):
    m = load(proj)
    run = run_spec(m, **{k: kw.pop(k) for k in ("ref", "repos", "variant", "cache") if k in kw})
    return applier.apply_series(m, run=run, workdir=workdir, **kw)


def statuses(report):
    return [(p.id, p.status, p.reason) for p in report.patches]


def test_applies_one_commit_per_patch(tmp_path):
    proj = make_project(tmp_path)
    wd = tmp_path / "wd"
    report = apply(proj, wd)
    assert report.ok, report.to_json()
    assert statuses(report) == [("table-nvfp4", "applied", None), ("fast-mode", "applied", None),
                                ("extra-file", "applied", None)]
    log = sh("git", "log", "--format=%s", "patchkit/base..HEAD", cwd=wd).splitlines()
    assert log == ["patchkit: extra-file: add a new module", "patchkit: fast-mode: make the mode fast",
                   "patchkit: table-nvfp4: add nvfp4 to the table"]
    assert [p.commit for p in report.patches] == sh(
        "git", "rev-list", "--reverse", "patchkit/base..HEAD", cwd=wd).splitlines()
    assert sh("git", "rev-parse", "patchkit/applied", cwd=wd) == sh("git", "rev-parse", "HEAD", cwd=wd)
    text = (wd / "pkg/mod.py").read_text()
    assert '"nvfp4": 2' in text and '"fast"' in text
    assert (wd / "pkg/extra.py").read_text() == "EXTRA = 1\n"
    saved = json.loads((wd / ".git" / checkout.REPORT_FILE).read_text())
    assert saved["ok"] is True and saved["vllm"]["ref"] == "v1"
    assert all(a.ok for a in report.verify) and len(report.verify) == 3
    assert sh("git", "status", "--porcelain", cwd=wd) == ""


def test_same_inputs_give_same_commits(tmp_path):
    proj = make_project(tmp_path)
    a, b = apply(proj, tmp_path / "a"), apply(proj, tmp_path / "b")
    assert [p.commit for p in a.patches] == [p.commit for p in b.patches]


def test_reapply_with_discard_replaces_a_scribbled_checkout(tmp_path):
    proj = make_project(tmp_path)
    wd = tmp_path / "wd"
    apply(proj, wd)
    (wd / "scribble.txt").write_text("x")
    with pytest.raises(UsageError, match="1 untracked file"):
        apply(proj, wd)
    report = apply(proj, wd, discard=True)
    assert report.ok and not (wd / "scribble.txt").exists()
    assert Path(report.discarded["bundle"]).is_file()
    assert not [p for p in tmp_path.iterdir() if "patchkit-" in p.name]


def test_failure_leaves_absent_workdir_absent_and_reports_every_patch(tmp_path):
    proj = make_project(tmp_path)
    wd = tmp_path / "wd"
    report = apply(proj, wd, ref="v4")  # table is upstream, setup() rewritten: fast-mode fails
    assert not report.ok
    assert statuses(report) == [("table-nvfp4", "upstream", None),
                                ("fast-mode", "failed", "anchor-missing"),
                                ("extra-file", "applied", None)]
    assert 'the "plain" mode' in report.patches[1].message
    assert not wd.exists()
    assert not [p for p in tmp_path.iterdir() if "patchkit-" in p.name]


def test_failure_leaves_previous_good_state_byte_for_byte(tmp_path):
    proj = make_project(tmp_path)
    wd = tmp_path / "wd"
    apply(proj, wd)
    head = sh("git", "rev-parse", "HEAD", cwd=wd)
    snapshot = {p: p.read_bytes() for p in wd.rglob("*") if p.is_file()}
    report = apply(proj, wd, ref="v4")
    assert not report.ok
    assert sh("git", "rev-parse", "HEAD", cwd=wd) == head
    assert {p: p.read_bytes() for p in wd.rglob("*") if p.is_file()} == snapshot


def test_keep_failed_keeps_scratch(tmp_path):
    proj = make_project(tmp_path)
    report = apply(proj, tmp_path / "wd", ref="v4", keep_failed=True)
    kept = Path(report.keep_failed)
    assert kept.is_dir() and (kept / "pkg/extra.py").exists()
    assert not (tmp_path / "wd").exists()
    # after the failed patch: one commit for the patch that applied, the index at it
    log = sh("git", "log", "--format=%H %s", "patchkit/base..patchkit/applied", cwd=kept)
    assert [line.split(" ", 2)[1:2] for line in log.splitlines()] == [["patchkit:"]]
    assert log.split()[0] == report.patches[2].commit == sh("git", "rev-parse", "HEAD", cwd=kept)
    assert "extra-file" in log
    assert sh("git", "status", "--porcelain", "--untracked-files=all", cwd=kept) == ""


def test_offset_is_reported(tmp_path):
    proj = make_project(tmp_path)
    report = apply(proj, tmp_path / "wd", ref="v2")
    assert report.ok
    assert [str(o) for o in report.patches[0].offsets] == ["hunk 1 of pkg/mod.py at line 6 (offset +2)"]


def test_out_of_range_patch_is_skipped_and_not_verified(tmp_path):
    proj = make_project(tmp_path)
    text = (proj / "patchset.yaml").read_text().replace(
        "    transform: patches/fast.py\n", "    transform: patches/fast.py\n    vllm: '<1'\n")
    (proj / "patchset.yaml").write_text(text)
    report = apply(proj, tmp_path / "wd", ref="v2")
    assert report.ok
    assert report.patches[1].status == "skipped"
    assert "vLLM 2 is outside <1" in report.patches[1].message
    assert {a.patch for a in report.verify} == {"table-nvfp4", "extra-file"}


def test_failed_assertion_fails_the_patch_and_the_run(tmp_path):
    proj = make_project(tmp_path)
    text = (proj / "patchset.yaml").read_text().replace("has_key: nvfp4", "has_key: mxfp4")
    (proj / "patchset.yaml").write_text(text)
    report = apply(proj, tmp_path / "wd")
    assert not report.ok
    assert statuses(report)[0] == ("table-nvfp4", "failed", "assertion")
    assert report.patches[0].message.startswith("pkg/mod.py:")
    assert not (tmp_path / "wd").exists()


def test_an_assertion_on_a_missing_file_names_the_file_alone(tmp_path):
    proj = make_project(tmp_path)
    text = (proj / "patchset.yaml").read_text().replace("file: pkg/extra.py", "file: pkg/gone.py")
    (proj / "patchset.yaml").write_text(text)
    report = apply(proj, tmp_path / "wd")
    assert statuses(report)[2] == ("extra-file", "failed", "assertion")
    assert report.patches[2].message.startswith("pkg/gone.py: ")


def test_overlay_replacing_upstream_file_needs_recorded_blob(tmp_path):
    proj = make_project(tmp_path)
    (proj / "overlays/extra/pkg/mod.py").write_text(MOD_V1 + "# ours\n")
    report = apply(proj, tmp_path / "wd")
    r = report.patches[2]
    assert (r.status, r.reason) == ("failed", "overlay-drift")
    assert "records no `replaces:" in r.message


def test_overlay_drift_when_upstream_moved(tmp_path):
    proj = make_project(tmp_path)
    (proj / "overlays/extra/pkg/mod.py").write_text(MOD_V1 + "# ours\n")
    v1_blob = sh("git", "rev-parse", "v1:pkg/mod.py", cwd=tmp_path / "upstream")
    text = (proj / "patchset.yaml").read_text().replace(
        "    overlay: overlays/extra\n",
        f"    overlay: overlays/extra\n    replaces:\n      pkg/mod.py: {v1_blob}\n")
    (proj / "patchset.yaml").write_text(text)
    # drop the other patches' edits to pkg/mod.py so the overlay is the only writer
    text = text.replace("    verify:\n      - file: pkg/mod.py\n        in: TABLE\n        has_key: nvfp4\n", "")
    (proj / "patchset.yaml").write_text(text)
    ok = apply(proj, tmp_path / "a", ref="v1")
    assert ok.patches[2].status == "applied"
    moved = apply(proj, tmp_path / "b", ref="v2")
    r = moved.patches[2]
    assert (r.status, r.reason) == ("failed", "overlay-drift")
    assert "changed upstream" in r.message and "diff" in r.message


def test_overlay_symlink_is_refused(tmp_path):
    proj = make_project(tmp_path)
    (proj / "overlays/extra/pkg/evil.py").symlink_to("/etc/passwd")
    report = apply(proj, tmp_path / "wd")
    assert (report.patches[2].status, report.patches[2].reason) == ("failed", "unsafe-path")


def test_ambiguous_anchor(tmp_path):
    proj = make_project(tmp_path)
    (proj / "patches/fast.py").write_text((proj / "patches/fast.py").read_text().replace(
        "m.SimpleString('\"plain\"')", "m.Name()").replace(
        "cst.SimpleString('\"fast\"')", "cst.Name('x')"))
    report = apply(proj, tmp_path / "wd")
    assert (report.patches[1].status, report.patches[1].reason) == ("failed", "ambiguous-anchor")


def test_unknown_ref_is_a_source_error(tmp_path):
    proj = make_project(tmp_path)
    with pytest.raises(SourceError, match=r"^unknown vLLM ref 'v9' in .*upstream$"):
        apply(proj, tmp_path / "wd", ref="v9")
    assert not (tmp_path / "wd").exists()


def test_refuses_to_replace_a_foreign_directory(tmp_path):
    proj = make_project(tmp_path)
    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / "precious.txt").write_text("keep me")
    with pytest.raises(UsageError, match="not a patchkit checkout"):
        apply(proj, wd)
    assert (wd / "precious.txt").read_text() == "keep me"


def test_branch_ref_is_refetched(tmp_path):
    proj = make_project(tmp_path)
    up = tmp_path / "upstream"
    first = apply(proj, tmp_path / "a", ref="main")
    (up / "pkg/more.py").write_text("MORE = 1\n")
    sh("git", "add", "-A", cwd=up)
    sh("git", "commit", "-qm", "more", cwd=up)
    second = apply(proj, tmp_path / "b", ref="main")
    assert first.vllm.commit != second.vllm.commit == sh("git", "rev-parse", "main", cwd=up)


def test_diff_that_deletes_a_file(tmp_path):
    proj = make_project(tmp_path)
    scratch = tmp_path / "scratch"
    sh("git", "clone", "-q", "--branch", "v1", str(tmp_path / "upstream"), str(scratch))
    sh("git", "rm", "-q", "pkg/mod.py", cwd=scratch)
    (proj / "patches/drop.diff").write_text(sh("git", "diff", "--cached", cwd=scratch) + "\n")
    (proj / "patchset.yaml").write_text(
        f"name: demo\nvllm:\n  repo: {tmp_path / 'upstream'}\n  ref: v1\npatches:\n"
        "  - id: drop\n    summary: remove the module\n    diff: patches/drop.diff\n")
    report = apply(proj, tmp_path / "wd")
    assert statuses(report) == [("drop", "applied", None)], report.patches[0].message
    assert not (tmp_path / "wd/pkg/mod.py").exists()
    assert sh("git", "show", "--name-status", "--format=", "HEAD", cwd=tmp_path / "wd") == "D\tpkg/mod.py"


def test_a_workdir_under_a_file_is_refused_before_any_source_is_read(tmp_path):
    proj = make_project(tmp_path)
    (tmp_path / "afile").write_text("x")
    cache = tmp_path / "cache"
    with pytest.raises(UsageError) as info:
        apply(proj, tmp_path / "afile" / "wd", cache=cache)
    assert said(info.value) == (f"--workdir {tmp_path / 'afile' / 'wd'}: {tmp_path / 'afile'} "
                                "is a file, not a folder")
    assert info.value.origin == Origin("workdir")
    assert not cache.exists()


def test_a_workdir_whose_folder_cannot_be_written_is_a_usage_error(tmp_path):
    proj = make_project(tmp_path)
    # /proc refuses new entries even to root, where file modes would not
    with pytest.raises(UsageError) as info:
        apply(proj, Path("/proc/wd"), cache=tmp_path / "cache")
    assert said(info.value).startswith("--workdir /proc/wd: cannot write in /proc: ")
    assert not (tmp_path / "cache").exists()


def test_an_empty_ref_is_an_error_not_the_manifest_default(tmp_path):
    proj = make_project(tmp_path)
    with pytest.raises(SourceError, match="bad vLLM ref: the ref is empty"):
        apply(proj, tmp_path / "wd", ref="")
    assert not (tmp_path / "wd").exists()


STRAY_TRANSFORM = '''\
import pathlib

import libcst as cst
import libcst.matchers as m
from patchkit.transform import Transform

ROOT = None


class Fast(Transform):
    path = "pkg/mod.py"

    def postcondition(self, module):
        return self.has(module, m.SimpleString('"fast"'))

    def transform(self, module):
        # the author's code reaches past its path into the checkout
        for tree in pathlib.Path(__file__).parents[2].glob(".wd.patchkit-*/t"):
            (tree / "pkg" / "stray.py").write_text("STRAY = 1\\n")
        old = self.anchor(module, m.SimpleString('"plain"'), 'the "plain" mode')
        return module.deep_replace(old, cst.SimpleString('"fast"'))
'''


def test_a_transform_that_writes_files_it_does_not_name_fails_and_leaves_nothing(tmp_path):
    proj = make_project(tmp_path)
    (proj / "patches/fast.py").write_text(STRAY_TRANSFORM)
    wd = tmp_path / "wd"
    report = apply(proj, wd, keep_failed=True)
    assert statuses(report)[1] == ("fast-mode", "failed", "unsafe-path")
    assert report.patches[1].message == "it changed files it does not name: pkg/stray.py"
    assert report.patches[1].commit is None
    kept = Path(report.keep_failed)
    assert not (kept / "pkg/stray.py").exists()
    assert sh("git", "status", "--porcelain", cwd=kept) == ""
    assert not wd.exists()


def test_a_cache_deleted_during_the_run_is_one_line_and_changes_nothing(tmp_path, monkeypatch):
    import shutil

    from patchkit.kinds import diff as diffapply

    proj = make_project(tmp_path)
    wd, cache = tmp_path / "wd", tmp_path / "cache"
    real_apply = diffapply.apply_file

    def cache_deleted_meanwhile(diff_file, root):
        shutil.rmtree(cache)
        return real_apply(diff_file, root)

    monkeypatch.setattr(diffapply, "apply_file", cache_deleted_meanwhile)
    with pytest.raises(SourceError) as info:
        apply(proj, wd, cache=cache)
    message = str(info.value)
    assert message.startswith(f"the cached vLLM repository {cache / 'repos'}")
    assert message.endswith("went away during the run (was the cache deleted?); nothing was "
                            "changed, run again")
    assert not wd.exists()
    assert not [p for p in tmp_path.iterdir() if "patchkit-" in p.name]


LINES = "".join(f"line {n}\n" for n in range(1, 21))


def _distinct_files_project(tmp_path: Path) -> Path:
    """Six diffs, each on its own file: two edits (the second at an offset in v2), a new file,
    a deletion, a diff that changes nothing, and one with an upstream link; in v2 a.txt and c.txt
    moved on, so the first diff and the deletion no longer apply."""
    up = make_upstream(tmp_path / "upstream", {
        "v1": {f"pkg/{n}.txt": LINES for n in "abcde"},
        "v2": {"pkg/a.txt": LINES.replace("line 5\n", "line five\n"),
               "pkg/b.txt": "top\n" * 3 + LINES,
               "pkg/c.txt": LINES.replace("line 3\n", "line three\n")}})
    diffs = {"patches/a.diff": unified("pkg/a.txt", LINES, LINES.replace("line 6\n", "A\n")),
             "patches/b.diff": unified("pkg/b.txt", LINES, LINES.replace("line 9\n", "B\n")),
             "patches/n.diff": unified("pkg/n.txt", None, "new\n"),
             "patches/c.diff": unified("pkg/c.txt", LINES, None),
             "patches/d.diff": ("diff --git a/pkg/d.txt b/pkg/d.txt\n--- a/pkg/d.txt\n"
                                "+++ b/pkg/d.txt\n@@ -1,4 +1,4 @@\n line 1\n-line 2\n+line 2\n line 3\n"
                                " line 4\n"),
             "patches/e.diff": unified("pkg/e.txt", LINES, LINES + "E\n")}
    entries = "".join(f"  - id: {n}\n    summary: {n} it\n"
                      f"    diff: patches/{n}.diff\n" for n in "abncde")
    entries = entries.replace("    diff: patches/e.diff\n", "    upstream: https://github."
                              "com/vllm-project/vllm/pull/1\n    diff: patches/e.diff\n")
    return write_project(tmp_path / "proj", diffs, f"name: t\nvllm:\n  repo: {up}\n  ref: v1\n"
                                                   f"patches:\n{entries}")


def _one_by_one(proj: Path, ref: str, into: Path) -> list[str | None]:
    """Each diff by plain git, `git apply --index` and `git commit` one after the other."""
    sh("git", "clone", "-q", "--branch", ref, str(proj.parent / "upstream"), str(into))
    made: list[str | None] = []
    for p in load(proj).patches:
        try:
            sh("git", "apply", "--index", str(proj / p.path), cwd=into)
        except subprocess.CalledProcessError:
            made.append(None)
            continue
        if subprocess.run(["git", "diff", "--cached", "--quiet"], cwd=into).returncode == 0:
            made.append(None)
            continue
        message = f"patchkit: {p.id}: {p.summary}" + (f"\n\nUpstream: {p.upstream}"
                                                      if p.upstream else "")
        subprocess.run(["git", "commit", "-q", "-m", message], cwd=into, check=True,
                       env=dict(os.environ, **g.IDENTITY))
        made.append(sh("git", "rev-parse", "HEAD", cwd=into))
    return made


def test_diffs_on_distinct_files_make_the_commits_git_makes_one_by_one(tmp_path):
    """However the engine applies a run of diffs on distinct files, each patch gets the very
    commit plain git makes of it alone, its own offsets, and the fate it has alone."""
    proj = _distinct_files_project(tmp_path)
    report = apply(proj, tmp_path / "wd")
    assert statuses(report) == [("a", "applied", None), ("b", "applied", None),
                                ("n", "applied", None), ("c", "applied", None),
                                ("d", "upstream", None), ("e", "applied", None)]
    assert [p.commit for p in report.patches] == _one_by_one(proj, "v1", tmp_path / "git1")
    assert report.patches[3].files == ["pkg/c.txt"] and not (tmp_path / "wd/pkg/c.txt").exists()
    assert sh("git", "status", "--porcelain", cwd=tmp_path / "wd") == ""

    report = apply(proj, tmp_path / "wd2", ref="v2")
    assert statuses(report) == [("a", "failed", "conflict"), ("b", "applied", None),
                                ("n", "applied", None), ("c", "failed", "conflict"),
                                ("d", "upstream", None), ("e", "applied", None)]
    assert "pkg/a.txt" in report.patches[0].message
    assert "pkg/c.txt" in report.patches[3].message
    assert [str(o) for o in report.patches[1].offsets] == [
        "hunk 1 of pkg/b.txt at line 9 (offset +3)"]
    assert [p.commit for p in report.patches] == _one_by_one(proj, "v2", tmp_path / "git2")


def test_a_patch_out_of_range_between_diffs_keeps_its_place(tmp_path):
    """Diffs around a patch that is passed over (out of range) still go in as one run: the
    skipped patch keeps its place in the report, and each diff its own commit in order."""
    proj = _distinct_files_project(tmp_path)
    manifest = proj / "patchset.yaml"
    manifest.write_text(manifest.read_text().replace(
        "    diff: patches/n.diff\n", "    diff: patches/n.diff\n    vllm: \">=9\"\n"))
    report = apply(proj, tmp_path / "wd")
    assert statuses(report) == [("a", "applied", None), ("b", "applied", None),
                                ("n", "skipped", None), ("c", "applied", None),
                                ("d", "upstream", None), ("e", "applied", None)]
    log = sh("git", "log", "--reverse", "--format=%H %s", "patchkit/base..HEAD",
             cwd=tmp_path / "wd").splitlines()
    assert [line.split()[0] for line in log] == [p.commit for p in report.patches if p.commit]
    assert [line.split()[2] for line in log] == ["a:", "b:", "c:", "e:"]
    assert not (tmp_path / "wd/pkg/n.txt").exists()
    assert sh("git", "status", "--porcelain", cwd=tmp_path / "wd") == ""


def test_a_transforms_result_is_kept_in_the_runs_cache(tmp_path):
    """The run names the cache: what a pure transform made is kept there, nowhere else."""
    proj = make_project(tmp_path)
    cache = tmp_path / "run-cache"
    report = apply(proj, tmp_path / "wd", cache=cache)
    assert report.ok, report.to_json()
    assert [p.status for p in report.patches if p.kind == "transform"] == ["applied"]
    assert len(list((cache / "transforms").glob("*.json"))) == 1
