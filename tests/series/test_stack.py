"""apply across the stack: vLLM (the fixture upstream) and real FlashInfer releases from PyPI,
each package in its own checkout, moved into place together or not at all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testing import release_cache
from testing.flashinfer import FI_FILE, ensure_releases, make_stack, patched
from testing.upstream import sh

from patchkit import manifest
from patchkit.errors import UsageError
from patchkit.run import run_spec
from patchkit.report import ApplyReport
from patchkit.series import applier, checkout, releases

pytestmark = pytest.mark.real_vllm


@pytest.fixture(scope="session")
def fi_cache() -> Path:
    return ensure_releases(release_cache())


def apply(proj: Path, cache: Path, **kw) -> ApplyReport:
    m = manifest.load(proj / "patchset.yaml")
    run = run_spec(m, refs=kw.pop("refs", ()), only=kw.pop("only", ()), cache=cache)
    return applier.apply_series(m, run=run, workdir=proj / ".patchkit" / "vllm", **kw)


def state(wd: Path) -> tuple[str, str]:
    return sh("git", "rev-parse", "HEAD", cwd=wd), sh("git", "status", "--porcelain", cwd=wd)


def test_both_packages_are_checked_out_patched_and_reported(tmp_path, fi_cache):
    proj = make_stack(tmp_path)
    report = apply(proj, fi_cache)
    assert report.ok, report.to_json()
    vllm, fi = proj / ".patchkit" / "vllm", proj / ".patchkit" / "flashinfer"
    got = {p.id: (p.package, p.status) for p in report.patches}
    assert got == {"table-nvfp4": ("vllm", "applied"), "fast-mode": ("vllm", "applied"),
                   "extra-file": ("vllm", "applied"),
                   "fi-moe-activations": ("flashinfer", "applied")}
    pristine = sh("git", "show", f"patchkit/base:{FI_FILE}", cwd=fi) + "\n"
    assert (fi / FI_FILE).read_bytes() == patched(pristine).encode()
    assert not (vllm / "flashinfer").exists() and not (fi / "pkg").exists()
    # FlashInfer's tree is the wheel's import folder alone, found from its top_level.txt
    assert sorted(p.name for p in fi.iterdir()) == [".git", "flashinfer"]
    data = report.to_dict()
    assert data["vllm"]["ref"] == "v1" and data["workdir"] == str(vllm)
    assert data["packages"]["flashinfer"] == {
        "ref": "v0.6.15", "commit": sh("git", "rev-parse", "patchkit/base", cwd=fi),
        "version": "0.6.15", "source": "pypi", "workdir": str(fi)}
    assert data["packages"]["vllm"]["workdir"] == str(vllm)
    assert {a["patch"] for a in data["verify"]} == {"table-nvfp4", "fast-mode", "extra-file",
                                                     "fi-moe-activations"}
    assert all(a["ok"] for a in data["verify"])
    for tree in (vllm, fi):
        stored = checkout.read_report(tree)
        assert stored is not None and stored.to_dict() == ApplyReport.from_dict(
            json.loads(checkout.report_path(tree).read_text())).to_dict()
        assert stored.packages["flashinfer"].version == "0.6.15"
        assert applier.check_workdir(tree) == checkout.UserWork()   # as patchkit left it
    subject = sh("git", "log", "-1", "--format=%s", cwd=fi)
    assert subject.startswith("patchkit: fi-moe-activations: ")



def test_each_package_lock_entry_and_label_name_where_its_pristine_tree_came_from(tmp_path,
                                                                                  fi_cache):
    """vLLM from its git upstream, FlashInfer from PyPI: each says so, as a kind of source
    (git, pypi, image), with a checkout and, before any, from its pin."""
    from patchkit.image import build, lockfile

    proj = make_stack(tmp_path)
    m = manifest.load(proj / "patchset.yaml")
    workdir = proj / ".patchkit" / "vllm"
    before = lockfile.patched_packages(m, workdir)
    assert {n: (p.source, p.commit) for n, p in before.items()} == {
        "vllm": ("git", ""), "flashinfer": ("pypi", "")}
    assert apply(proj, fi_cache).ok
    after = lockfile.patched_packages(m, workdir)
    fi_commit = sh("git", "rev-parse", "patchkit/base", cwd=proj / ".patchkit" / "flashinfer")
    assert after["flashinfer"] == lockfile.Pinned("0.6.15", fi_commit, "pypi",
                                                  after["flashinfer"].jit_modules)
    assert after["vllm"].source == "git"
    text = lockfile.Lock("b", "sha256:" + "0" * 64, after).render().decode()
    assert (f'[packages.flashinfer]\nversion = "0.6.15"\ncommit = "{fi_commit}"\n'
            'source = "pypi"') in text
    labels = build.packages_of(m, checkout.AppliedCheckout.open(workdir))
    assert {n: p["source"] for n, p in labels.items()} == {"vllm": "git", "flashinfer": "pypi"}

def test_ref_moves_a_pin_and_a_range_on_it_skips_a_vllm_patch(tmp_path, fi_cache):
    proj = make_stack(tmp_path)
    report = apply(proj, fi_cache, refs=["flashinfer=v0.6.16"])
    assert report.ok, report.to_json()
    assert report.packages["flashinfer"].version == "0.6.16"
    fast = next(p for p in report.patches if p.id == "fast-mode")
    assert fast.status == "skipped" and "flashinfer" in fast.message and "0.6.16" in fast.message
    assert "fast-mode" not in {a.patch for a in report.verify}
    fi = proj / ".patchkit" / "flashinfer"
    assert "v0.6.16" in sh("git", "tag", "--points-at", "patchkit/base", cwd=fi).splitlines()


BROKEN = """\
  - id: fi-broken
    summary: a hunk whose context is not in the file
    package: flashinfer
    diff: patches/flashinfer/fi-broken.diff
"""
BROKEN_DIFF = f"""\
--- a/{FI_FILE}
+++ b/{FI_FILE}
@@ -1,2 +1,2 @@
-this line is not there
+nor is this one
 at all
"""


def test_a_failing_flashinfer_patch_leaves_both_workdirs_as_they_were(tmp_path, fi_cache):
    proj = make_stack(tmp_path)
    assert apply(proj, fi_cache).ok
    vllm, fi = proj / ".patchkit" / "vllm", proj / ".patchkit" / "flashinfer"
    before = state(vllm), state(fi)
    (proj / "patches" / "flashinfer" / "fi-broken.diff").write_text(BROKEN_DIFF)
    with (proj / "patchset.yaml").open("a") as fh:
        fh.write(BROKEN)
    report = apply(proj, fi_cache, refs=["vllm=v2"])  # vLLM's own series is fine on v2
    assert not report.ok
    broken = next(p for p in report.patches if p.id == "fi-broken")
    assert (broken.package, broken.status, broken.reason) == ("flashinfer", "failed", "conflict")
    assert (state(vllm), state(fi)) == before
    assert sorted(p.name for p in (proj / ".patchkit").iterdir()) == ["flashinfer", "vllm"]


def test_package_limits_the_run_to_its_checkouts(tmp_path, fi_cache):
    proj = make_stack(tmp_path)
    report = apply(proj, fi_cache, only=["flashinfer"])
    assert report.ok, report.to_json()
    assert not (proj / ".patchkit" / "vllm").exists()
    assert (proj / ".patchkit" / "flashinfer" / FI_FILE).is_file()
    assert list(report.packages) == ["flashinfer"] and report.workdir is None
    got = {p.id: (p.status, p.message) for p in report.patches}
    assert got["fi-moe-activations"][0] == "applied"
    assert got["table-nvfp4"] == ("skipped", "it patches vllm, which has no checkout in this run")
    assert report.vllm.ref == "v1"   # vLLM's pin is still what ranges are judged on


ESCAPE = """\
  - id: fi-escape
    summary: a flashinfer patch that writes into vLLM's files
    package: flashinfer
    diff: patches/flashinfer/fi-escape.diff
"""
ESCAPE_DIFF = """\
--- /dev/null
+++ b/vllm/sneaky.py
@@ -0,0 +1 @@
+x = 1
"""


def test_a_diff_outside_its_package_fails_as_unsafe_path(tmp_path, fi_cache):
    proj = make_stack(tmp_path, ESCAPE)
    (proj / "patches" / "flashinfer" / "fi-escape.diff").write_text(ESCAPE_DIFF)
    report = apply(proj, fi_cache)
    assert not report.ok
    r = next(p for p in report.patches if p.id == "fi-escape")
    assert (r.status, r.reason) == ("failed", "unsafe-path")
    assert r.message == ("vllm/sneaky.py is outside flashinfer's files (flashinfer/); a "
                         "flashinfer patch names paths from that package's root")
    assert not (proj / ".patchkit").exists() or not list((proj / ".patchkit").iterdir())


def test_a_workdir_beside_vllm_holding_work_is_refused(tmp_path, fi_cache):
    proj = make_stack(tmp_path)
    assert apply(proj, fi_cache).ok
    fi = proj / ".patchkit" / "flashinfer"
    (fi / "notes.txt").write_text("mine\n")
    with pytest.raises(UsageError, match=r"flashinfer holds work: 1 untracked file"):
        apply(proj, fi_cache)
    report = apply(proj, fi_cache, discard=True)
    assert report.ok and report.discarded["package"] == "flashinfer"
    assert not (fi / "notes.txt").exists()


def test_flashinfers_releases_after_its_pin_come_from_pypi(tmp_path):
    proj = make_stack(tmp_path)
    m = manifest.load(proj / "patchset.yaml")
    found = releases.release_targets(m, run_spec(m, cache=tmp_path / "cache"),
                                     package="flashinfer")
    # PyPI's history of flashinfer-python: what came right after 0.6.15 never changes
    assert found[:4] == ["v0.6.15.post1", "v0.6.16", "v0.6.16.post1", "v0.6.16.post2"]
    assert "v0.6.15" not in found and "v0.6.14" not in found


def test_a_swap_that_fails_midway_puts_back_the_checkouts_already_moved(tmp_path, fi_cache,
                                                                         monkeypatch):
    proj = make_stack(tmp_path)
    assert apply(proj, fi_cache).ok
    vllm, fi = proj / ".patchkit" / "vllm", proj / ".patchkit" / "flashinfer"
    before = state(vllm), state(fi)
    real, failed = applier.os.rename, []

    def rename(src, dst):
        # vLLM's new checkout is in place by now; FlashInfer's fails, once
        if Path(dst) == fi and Path(src).name == "t" and not failed:
            failed.append(src)
            raise OSError(28, "No space left on device")
        return real(src, dst)

    monkeypatch.setattr(applier.os, "rename", rename)
    with pytest.raises(OSError):
        apply(proj, fi_cache, refs=["vllm=v2"])
    monkeypatch.undo()
    assert failed and (state(vllm), state(fi)) == before
    assert sorted(p.name for p in (proj / ".patchkit").iterdir()) == ["flashinfer", "vllm"]


def test_a_pin_read_from_a_base_image_is_vllms_alone(tmp_path, fi_cache):
    proj = make_stack(tmp_path)
    text = (proj / "patchset.yaml").read_text().replace("    repo: [pypi]\n", "    repo: [image]\n")
    (proj / "patchset.yaml").write_text(text)
    with pytest.raises(UsageError, match=r"^flashinfer: a pin read from a base image"):
        apply(proj, fi_cache)
    assert not (proj / ".patchkit" / "vllm").exists()
