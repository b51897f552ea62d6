from __future__ import annotations


import pytest
import yaml
from testing import patchkit
from testing.project import make_fates, snapshot
from testing.upstream import commit, sh

from patchkit import manifest
from patchkit.series import applier, checkout
from patchkit.run import run_spec
from patchkit.errors import UsageError
from patchkit.commands.export import export, slug

@pytest.fixture
def applied(tmp_path):
    proj = make_fates(tmp_path)
    wd = proj / ".patchkit/vllm"
    report = applier.apply_series(manifest.load(proj / "patchset.yaml"),
                                  run=run_spec(manifest.load(proj / "patchset.yaml")), workdir=wd)
    assert report.ok
    return proj, wd


def test_commits_become_patches_and_round_trip(applied, tmp_path):
    proj, wd = applied
    commit(wd, "Speed up helper", {"pkg/mod.py": (wd / "pkg/mod.py").read_text().replace(
        "return x + 1", "return x + 2")})
    commit(wd, "Add a new module\n\nWhy it is needed.\n\n"
               "Upstream: https://github.com/vllm-project/vllm/pull/777\n",
           {"pkg/new.py": "NEW = 1\n", "pkg/util.py": None})
    head_tree = sh("git", "rev-parse", "HEAD^{tree}", cwd=wd)

    result = export(proj / "patchset.yaml", wd)
    assert [(e.id, e.action, e.path) for e in result.exported] == [
        ("speed-up-helper", "added", "patches/speed-up-helper.diff"),
        ("add-a-new-module", "added", "patches/add-a-new-module.diff")]
    data = yaml.safe_load((proj / "patchset.yaml").read_text())
    assert data["patches"][-2:] == [
        {"id": "speed-up-helper", "summary": "Speed up helper",
         "diff": "patches/speed-up-helper.diff"},
        {"id": "add-a-new-module", "summary": "Add a new module",
         "upstream": "https://github.com/vllm-project/vllm/pull/777",
         "diff": "patches/add-a-new-module.diff"}]
    # only lines were added to the manifest: comments and everything else stay
    changed = [ln for ln in sh("git", "diff", "-U0", "--", "patchset.yaml", cwd=proj).splitlines()
               if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]
    assert all(ln.startswith("+") for ln in changed) and len(changed) == 7

    # a fresh apply of the exported series gives the tree the developer committed
    report = applier.apply_series(manifest.load(proj / "patchset.yaml"),
                                  run=run_spec(manifest.load(proj / "patchset.yaml")),
                                  workdir=tmp_path / "again")
    assert report.ok, report.to_json()
    assert [p.status for p in report.patches][-2:] == ["applied", "applied"]
    assert sh("git", "rev-parse", "HEAD^{tree}", cwd=tmp_path / "again") == head_tree


def test_re_export_changes_no_byte(applied):
    proj, wd = applied
    commit(wd, "Speed up helper", {"pkg/mod.py": (wd / "pkg/mod.py").read_text().replace(
        "return x + 1", "return x + 2")})
    commit(wd, "Speed up helper", {"pkg/other.py": "X = 1\n"})  # the same subject twice
    first = export(proj / "patchset.yaml", wd)
    assert [e.id for e in first.exported] == ["speed-up-helper", "speed-up-helper-2"]
    files = snapshot(proj)
    stats = {p: (proj / p).stat().st_mtime_ns for p in files}
    second = export(proj / "patchset.yaml", wd)
    assert [(e.id, e.action) for e in second.exported] == [
        ("speed-up-helper", "unchanged"), ("speed-up-helper-2", "unchanged")]
    assert snapshot(proj) == files
    assert {p: (proj / p).stat().st_mtime_ns for p in files} == stats  # not even rewritten


def test_amended_commit_updates_its_patch_in_place(applied):
    proj, wd = applied
    commit(wd, "Tweak", {"pkg/other.py": "X = 1\n"})
    export(proj / "patchset.yaml", wd)
    sh("git", "commit", "-q", "--amend", "-m", "Tweak the other module", cwd=wd)
    (wd / "pkg/other.py").write_text("X = 2\n")
    sh("git", "commit", "-q", "-a", "--amend", "-m", "Tweak\n\nPatchkit-Id: tweak\n", cwd=wd)
    result = export(proj / "patchset.yaml", wd)
    assert [(e.id, e.action) for e in result.exported] == [("tweak", "updated")]
    assert "+X = 2" in (proj / "patches/tweak.diff").read_text()
    assert [p["id"] for p in yaml.safe_load((proj / "patchset.yaml").read_text())["patches"]
            ].count("tweak") == 1


def test_a_series_patch_id_is_never_overwritten(applied):
    proj, wd = applied
    before = (proj / "patches/other.diff").read_bytes()
    commit(wd, "x\n\nPatchkit-Id: other-fix\n", {"pkg/other.py": "Y = 1\n"})
    result = export(proj / "patchset.yaml", wd)
    assert [e.id for e in result.exported] == ["other-fix-2"]
    assert (proj / "patches/other.diff").read_bytes() == before


def test_exported_diff_is_independent_of_git_config(applied, tmp_path, monkeypatch):
    proj, wd = applied
    commit(wd, "Change", {"pkg/mod.py": (wd / "pkg/mod.py").read_text().replace(
        "import os", "import os\nimport sys")})
    export(proj / "patchset.yaml", wd)
    first = (proj / "patches/change.diff").read_bytes()
    cfg = tmp_path / "odd.gitconfig"
    cfg.write_text("[diff]\n\tnoprefix = true\n\talgorithm = histogram\n\tcontext = 7\n"
                   "\tmnemonicPrefix = true\n[core]\n\tabbrev = 8\n[color]\n\tdiff = always\n")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(cfg))
    (proj / "patches/change.diff").unlink()
    sh("git", "checkout", "--", "patchset.yaml", cwd=proj)
    export(proj / "patchset.yaml", wd)
    assert (proj / "patches/change.diff").read_bytes() == first
    assert first.startswith(b"diff --git a/pkg/mod.py b/pkg/mod.py\nindex ")


def test_nothing_to_export_and_not_a_checkout(applied, tmp_path):
    proj, wd = applied
    before = snapshot(proj)
    assert export(proj / "patchset.yaml", wd).exported == []
    assert snapshot(proj) == before
    with pytest.raises(UsageError, match="not a checkout"):
        export(proj / "patchset.yaml", tmp_path / "nowhere")
    sh("git", "tag", "-d", checkout.APPLIED_TAG, cwd=wd)
    with pytest.raises(UsageError, match="no tag patchkit/applied"):
        export(proj / "patchset.yaml", wd)


def test_merge_commits_are_refused(applied):
    proj, wd = applied
    sh("git", "checkout", "-q", "-b", "side", cwd=wd)
    commit(wd, "side", {"pkg/a.py": "A = 1\n"})
    sh("git", "checkout", "-q", "patchkit", cwd=wd)
    commit(wd, "main", {"pkg/b.py": "B = 1\n"})
    sh("git", "merge", "-q", "--no-edit", "side", cwd=wd)
    with pytest.raises(UsageError, match="merge commit"):
        export(proj / "patchset.yaml", wd)


def test_slug():
    assert slug("Fix: the DSpark loader (fail closed)!") == "fix-the-dspark-loader-fail-closed"
    assert len(slug("word " * 40)) <= 48 and not slug("word " * 40).endswith("-")
    assert slug("!!!") == ""


def test_cli_export(applied):
    proj, wd = applied
    commit(wd, "Speed up helper", {"pkg/mod.py": (wd / "pkg/mod.py").read_text().replace(
        "return x + 1", "return x + 2")})
    def run():
        return patchkit("export", cwd=proj)
    p = run()
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("added     speed-up-helper: patches/speed-up-helper.diff from ")
    p = run()
    assert p.returncode == 0 and p.stdout.startswith("unchanged speed-up-helper")


def test_an_id_a_commit_asks_for_is_capped_at_100_characters(applied):
    proj, wd = applied
    long_id = "x" * 99 + "-" + "y" * 200  # cut at 100 it would end in '-'
    commit(wd, f"Long one\n\nPatchkit-Id: {long_id}\n", {"pkg/a.py": "A = 1\n"})
    commit(wd, f"patchkit: {long_id}: long two", {"pkg/b.py": "B = 1\n"})
    p = patchkit("export", cwd=proj)
    assert p.returncode == 0, p.stderr
    ids = [e["id"] for e in yaml.safe_load((proj / "patchset.yaml").read_text())["patches"][-2:]]
    assert ids == ["x" * 99, "x" * 98 + "-2"]
    assert all(len(i) <= 100 and (proj / f"patches/{i}.diff").is_file() for i in ids)
    before = snapshot(proj)
    assert patchkit("export", cwd=proj).returncode == 0  # the same ids again: no churn
    assert snapshot(proj) == before


@pytest.mark.real_vllm
def test_each_packages_commits_become_that_packages_patches(tmp_path, real_vllm):
    """Commits on FlashInfer's checkout beside vLLM's become flashinfer patches under
    patches/flashinfer/, and a fresh apply gives both trees as committed."""
    from testing.flashinfer import FI_FILE, ensure_releases, make_stack

    ensure_releases(real_vllm)
    proj = make_stack(tmp_path / "stack")
    wd = proj / ".patchkit/vllm"
    report = applier.apply_series(manifest.load(proj / "patchset.yaml"),
                                  run=run_spec(manifest.load(proj / "patchset.yaml")), workdir=wd)
    assert report.ok, report.to_json()
    fi = proj / ".patchkit/flashinfer"
    kernel = (fi / FI_FILE).read_text()
    commit(fi, "Clamp the gate limit", {FI_FILE: kernel.replace(
        "_COMPACT_STATIC_TILE_M = 128", "_COMPACT_STATIC_TILE_M = 64")})
    commit(wd, "Speed up helper", {"pkg/mod.py": (wd / "pkg/mod.py").read_text().replace(
        "return x + 1", "return x + 2")})
    trees = {name: sh("git", "rev-parse", "HEAD^{tree}", cwd=place)
             for name, place in (("vllm", wd), ("flashinfer", fi))}

    result = export(proj / "patchset.yaml", wd)
    assert [(e.id, e.action, e.path) for e in result.exported] == [
        ("speed-up-helper", "added", "patches/speed-up-helper.diff"),
        ("clamp-the-gate-limit", "added", "patches/flashinfer/clamp-the-gate-limit.diff")]
    entries = yaml.safe_load((proj / "patchset.yaml").read_text())["patches"][-2:]
    assert entries[1] == {"id": "clamp-the-gate-limit", "summary": "Clamp the gate limit",
                          "package": "flashinfer",
                          "diff": "patches/flashinfer/clamp-the-gate-limit.diff"}
    again = tmp_path / "again" / "vllm"
    report = applier.apply_series(manifest.load(proj / "patchset.yaml"),
                                  run=run_spec(manifest.load(proj / "patchset.yaml")),
                                  workdir=again)
    assert report.ok, report.to_json()
    assert report.status_of("clamp-the-gate-limit") == "applied"
    assert {name: sh("git", "rev-parse", "HEAD^{tree}", cwd=place) for name, place in
            (("vllm", again), ("flashinfer", again.parent / "flashinfer"))} == trees
    again_result = export(proj / "patchset.yaml", wd)   # the same commits: nothing changes
    assert [e.action for e in again_result.exported] == ["unchanged", "unchanged"]
