"""import: a fork branch's commits and an overlay tree become diff patches, proven at the pin."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from testing import one_error, patchkit, snapshot
from testing.upstream import commit, dedent, make_upstream, sh
from testing.project import MOD_V1, make_project

from patchkit import manifest
from patchkit.commands import import_
from patchkit.errors import PatchkitError, UsageError
from patchkit.series import applier
from patchkit.run import run_spec

BRANCH = "dspark-nvfp4-a4w4"


@pytest.fixture
def proj(tmp_path) -> Path:
    return make_project(tmp_path)


@pytest.fixture
def fork(tmp_path, proj) -> Path:
    """A fork of the upstream with a branch made at the pin (v1): the bundle's commits."""
    fork = tmp_path / "fork"
    sh("git", "clone", "-q", str(tmp_path / "upstream"), str(fork))
    sh("git", "checkout", "-q", "-b", BRANCH, "v1", cwd=fork)
    mod = MOD_V1.replace("return x + 1", "return x + 2")
    commit(fork, "Speed up helper", {"pkg/mod.py": mod})
    commit(fork, "Add the guard module\n\nWhy it is needed.\n\nPatchkit-Id: dspark-guard\n"
                 "Upstream: https://github.com/vllm-project/vllm/pull/777\n",
           {"pkg/guard.py": "GUARD = True\n"})
    commit(fork, "A commit that changes nothing")
    commit(fork, "Speed up helper", {"pkg/other.py": "OTHER = 1\n"})  # the same subject again
    return fork


# ------------------------------------------------------------------------------ a fork branch

def test_a_fork_branch_becomes_patches_oldest_first(proj, fork):
    before = (proj / "patchset.yaml").read_text()
    p = patchkit("import", BRANCH, "--from", str(fork), cwd=proj)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert [ln.split(" from ")[0] for ln in lines[:3]] == [
        "added     speed-up-helper: patches/speed-up-helper.diff",
        "added     dspark-guard: patches/dspark-guard.diff",
        "added     speed-up-helper-2: patches/speed-up-helper-2.diff"]
    assert lines[3].startswith("note: ") and "'A commit that changes nothing' changes nothing" in lines[3]
    assert lines[-1].startswith("ok: the series applies at vLLM v1 with 3 new patches (base ")
    after = (proj / "patchset.yaml").read_text()
    assert after.startswith(before)  # only lines added; the comments stay
    entries = yaml.safe_load(after)["patches"][3:]
    assert entries == [
        {"id": "speed-up-helper", "summary": "Speed up helper", "diff": "patches/speed-up-helper.diff"},
        {"id": "dspark-guard", "summary": "Add the guard module",
         "upstream": "https://github.com/vllm-project/vllm/pull/777",
         "diff": "patches/dspark-guard.diff"},
        {"id": "speed-up-helper-2", "summary": "Speed up helper",
         "diff": "patches/speed-up-helper-2.diff"}]
    wd = proj / ".patchkit/vllm"
    report = applier.apply_series(manifest.load(proj / "patchset.yaml"),
                                  run=run_spec(manifest.load(proj / "patchset.yaml")), workdir=wd)
    assert report.ok and [p.status for p in report.patches][3:] == ["applied"] * 3
    for rel in ("pkg/guard.py", "pkg/other.py"):
        assert (wd / rel).read_text() == (fork / rel).read_text()
    assert "return x + 2" in (wd / "pkg/mod.py").read_text()

    # again: every commit is in the series already; nothing changes
    files = snapshot(proj)
    p = patchkit("import", BRANCH, "--from", str(fork), "--format", "json", cwd=proj)
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert data["patches"] == [] and len(data["notes"]) == 4
    assert "is in the series already as dspark-guard" in data["notes"][1]
    assert snapshot(proj) == files


def test_a_branch_of_the_manifest_source_needs_no_from(proj, tmp_path):
    up = tmp_path / "upstream"
    sh("git", "checkout", "-q", "-b", "fix-branch", "v1", cwd=up)
    commit(up, "Tweak other\n\nPatchkit-Id: other-tweak\n", {"pkg/other.py": "X = 2\n"})
    sh("git", "checkout", "-q", "main", cwd=up)
    result = import_.run(proj / "patchset.yaml", "fix-branch")
    assert [(p.id, p.summary) for p in result.patches] == [("other-tweak", "Tweak other")]
    assert result.statuses() == {"other-tweak": "applied"}


def test_a_branch_older_than_the_pin_applies_at_an_offset(proj, fork):
    path = proj / "patchset.yaml"
    path.write_text(path.read_text().replace("ref: v1", "ref: v2"))
    result = import_.run(path, BRANCH, from_repo=str(fork))
    assert result.base == sh("git", "rev-parse", "v1", cwd=fork)
    assert [p.id for p in result.patches] == ["speed-up-helper", "dspark-guard",
                                             "speed-up-helper-2"]
    fates = {r.id: r for r in result.reports[0].patches}
    assert [str(o) for o in fates["speed-up-helper"].offsets] == [
        "hunk 1 of pkg/mod.py at line 17 (offset +3)"]  # v2 header, the table line


def test_a_conflicting_commit_writes_nothing(proj, fork):
    # the series' fast-mode transform rewrites the line this commit's hunk needs
    commit(fork, "Slow mode", {"pkg/mod.py": (fork / "pkg/mod.py").read_text().replace(
        '"plain"', '"slow"')})
    before = snapshot(proj)
    p = patchkit("import", BRANCH, "--from", str(fork), cwd=proj)
    assert p.returncode == 1
    message = one_error(p)
    assert message.startswith("patchkit import: error: slow-mode does not apply at vLLM v1 (")
    assert ": conflict: hunk 1 of pkg/mod.py" in message and message.endswith("nothing was written")
    assert snapshot(proj) == before


def test_merges_unknown_refs_and_unrelated_history_are_one_line(proj, fork, tmp_path):
    before = snapshot(proj)
    p = patchkit("import", "no-such-branch", "--from", str(fork), cwd=proj)
    assert p.returncode == 2 and one_error(p) == (f"patchkit import: error: unknown vLLM ref "
                                              f"'no-such-branch' in {fork}")
    p = patchkit("import", BRANCH, "--from", str(tmp_path / "nowhere"), cwd=proj)
    assert (p.returncode, one_error(p)) == (
        2, f"patchkit import: error: no such repository: {tmp_path / 'nowhere'}")
    other = make_upstream(tmp_path / "other", {"x1": {"a.py": "A = 1\n"}})
    p = patchkit("import", "x1", "--from", str(other), cwd=proj)
    assert p.returncode == 2 and "shares no history with the pin v1" in one_error(p)
    p = patchkit("import", "HEAD~1", cwd=proj)
    assert p.returncode == 2 and "revision expression" in one_error(p)
    sh("git", "checkout", "-q", "-b", "side", "v1", cwd=fork)
    commit(fork, "side", {"pkg/side.py": "S = 1\n"})
    sh("git", "checkout", "-q", BRANCH, cwd=fork)
    sh("git", "merge", "-q", "--no-edit", "side", cwd=fork)
    p = patchkit("import", BRANCH, "--from", str(fork), cwd=proj)
    assert p.returncode == 2 and "merge commit" in one_error(p) and "straight line" in p.stderr
    for args, message in [((), "give REF (a fork branch) or --overlay DIR"),
                          (("x", "--overlay", "d"), "give REF (a fork branch) or --overlay DIR"),
                          (("x", "--onto", "v1"),
                           "--onto, --id, --summary, --split and --package go with --overlay"),
                          (("--overlay", "d", "--from", "r"),
                           "--from r: with --overlay, give the fork as REPO@REF")]:
        p = patchkit("import", *args, cwd=proj)
        assert p.returncode == 2 and message in one_error(p)
    assert snapshot(proj) == before


# ------------------------------------------------------------------------------ an overlay tree

PKG_V1 = {"vllm/__init__.py": "", "vllm/mod.py": MOD_V1,
          "vllm/config.py": "LIMIT = 1\n\n\ndef limit():\n    return LIMIT\n"}
PKG_V2 = {"vllm/config.py": "# config, reworded upstream\nLIMIT = 1\n\n\ndef limit():\n    return LIMIT\n"}

OVERLAY_MANIFEST = """\
name: demo
vllm:
  repo: {repo}   # comments survive
  ref: v2
patches:
  - id: table-nvfp4
    summary: add nvfp4 to the table
    diff: patches/table.diff
"""


@pytest.fixture
def vproj(tmp_path) -> Path:
    from testing.upstream import make_diff

    up = make_upstream(tmp_path / "vllm-up", {"v1": PKG_V1, "v2": PKG_V2})
    proj = tmp_path / "vproj"
    (proj / "patches").mkdir(parents=True)
    (proj / "patches/table.diff").write_text(make_diff(
        MOD_V1, MOD_V1.replace('    "fp8": 1,\n', '    "fp8": 1,\n    "nvfp4": 2,\n'),
        "vllm/mod.py"))
    (proj / "patchset.yaml").write_text(dedent(OVERLAY_MANIFEST).format(repo=up))
    return proj


def _package_copy(root: Path, files: dict[str, str], lock: str | None = None) -> Path:
    """A copy of dist-packages/vllm: the package's own files at the top, with the byte-code,
    compiled objects and generated version file an installed package has."""
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "__pycache__").mkdir(exist_ok=True)
    (root / "__pycache__/mod.cpython-312.pyc").write_bytes(b"\x00\x01stale")
    (root / "_C.abi3.so").write_bytes(b"\x7fELF\x00\x00")
    (root / "_version.py").write_text("__version__ = version = '0.0.1'\n")
    if lock is not None:
        (root / "upstream.lock").write_text(lock)
    return root


def test_a_package_copy_becomes_one_diff_against_its_lock(vproj, tmp_path):
    v1 = sh("git", "rev-parse", "v1", cwd=tmp_path / "vllm-up")
    mod = MOD_V1.replace("return x + 1", "return x + 3")
    overlay = _package_copy(tmp_path / "dist-vllm", {
        "__init__.py": "", "mod.py": mod, "guard.py": "GUARD = 1\n",
        "config.py": PKG_V1["vllm/config.py"]},  # as v1 had it: v2's change must stay
        lock=f"# copied by hand\nvllm commit: {v1}\n")
    before = (vproj / "patchset.yaml").read_text()
    p = patchkit("import", "--overlay", str(overlay), cwd=vproj)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == (f"added     dist-vllm: patches/dist-vllm.diff from {overlay} the files of "
                        f"dist-vllm, against vLLM {v1[:12]}")
    assert lines[1:4] == [
        "note: left out, byte-code: vllm/__pycache__/",
        "note: left out, not text: vllm/_C.abi3.so",
        "note: vllm/_version.py: written by vLLM's build, not in the source; left out"]
    assert (vproj / "patchset.yaml").read_text().startswith(before)
    saved = (vproj / "patches/dist-vllm.diff").read_text()
    assert "vllm/config.py" not in saved and "_version" not in saved and "pyc" not in saved
    wd = vproj / ".patchkit/vllm"
    report = applier.apply_series(manifest.load(vproj / "patchset.yaml"),
                                  run=run_spec(manifest.load(vproj / "patchset.yaml")), workdir=wd)
    assert report.ok, report.to_json()
    assert (wd / "vllm/guard.py").read_text() == "GUARD = 1\n"
    assert "return x + 3" in (wd / "vllm/mod.py").read_text()
    assert (wd / "vllm/config.py").read_text() == PKG_V2["vllm/config.py"]  # upstream's kept


def test_an_overlay_that_conflicts_with_the_series_writes_nothing(vproj, tmp_path):
    root = tmp_path / "tree"
    (root / "vllm").mkdir(parents=True)
    (root / "vllm/__init__.py").write_text("")
    # the series' table patch adds a line right below the one this changes
    (root / "vllm/mod.py").write_text(MOD_V1.replace('"fp8": 1', '"fp8": 9'))
    before = snapshot(vproj)
    with pytest.raises(PatchkitError, match=r"^tree does not apply at vLLM v2 \(.*\): conflict: "
                                            r"hunk 1 of vllm/mod.py: .*; nothing was written$"):
        import_.run_overlay(vproj / "patchset.yaml", root)
    assert snapshot(vproj) == before


def test_applying_an_overlay_diff_reproduces_its_files(vproj, tmp_path):
    path = vproj / "patchset.yaml"
    path.write_text(path.read_text().split("patches:")[0] + "patches:\n")
    root = tmp_path / "tree"
    files = {"vllm/__init__.py": "", "vllm/mod.py": MOD_V1.replace("import os", "import os\nimport re"),
             "vllm/new/probe.py": "PROBE = 1\n", "csrc/probe.cu": "// a kernel\n"}
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    result = import_.run_overlay(path, root, import_.Overlay(patch_id="probe", summary="a probe"))
    assert [(p.id, p.summary) for p in result.patches] == [("probe", "a probe")]
    assert result.base == sh("git", "rev-parse", "v2", cwd=tmp_path / "vllm-up")
    wd = vproj / ".patchkit/vllm"
    assert applier.apply_series(manifest.load(path), run=run_spec(manifest.load(path)),
                                workdir=wd).ok
    for rel, text in files.items():
        assert (wd / rel).read_text() == text


def test_onto_names_the_base_and_wins_over_the_lock(vproj, tmp_path):
    overlay = _package_copy(tmp_path / "pkg", {"__init__.py": "", "mod.py": MOD_V1,
                                               "config.py": PKG_V2["vllm/config.py"] + "X = 1\n"},
                            lock="v1\n")
    result = import_.run_overlay(vproj / "patchset.yaml", overlay, import_.Overlay(onto="v2"))
    assert result.base == sh("git", "rev-parse", "v2", cwd=tmp_path / "vllm-up")
    assert "upstream.lock names v1; --onto v2 is used instead" in result.notes
    saved = (vproj / "patches/pkg.diff").read_text()
    changed = [ln for ln in saved.splitlines()
               if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]
    assert changed == ["+X = 1"]  # against v2 (v1 would also undo v2's reworded comment)


@pytest.mark.parametrize("setup,code,message", [
    (lambda d: None, 2, "--overlay {d}: no such directory"),
    (lambda d: (d.mkdir(), (d / "x.py").write_text("X = 1\n")), 2,
     "--overlay {d}: holds no vllm/ folder (at its top or one level down) and is no copy of the "
     "vllm package (no __init__.py at its top)"),
    (lambda d: _package_copy(d, {"__init__.py": "", "mod.py": MOD_V1}, lock="0" * 40 + "\n"), 2,
     "{d}/upstream.lock names vLLM " + "0" * 40 + ", which no source of patchset.yaml has: "),
    (lambda d: _package_copy(d, {"__init__.py": "", "mod.py": MOD_V1}, lock="a b c\n"), 2,
     "{d}/upstream.lock: names no commit (expected a 40-digit sha, or `commit: REF`)"),
])
def test_bad_overlays_are_one_line(vproj, tmp_path, setup, code, message):
    d = tmp_path / "ov"
    setup(d)
    before = snapshot(vproj)
    p = patchkit("import", "--overlay", str(d), cwd=vproj)
    assert p.returncode == code, p.stderr
    assert one_error(p).startswith("patchkit import: error: " + message.format(d=d)), p.stderr
    assert snapshot(vproj) == before


def test_every_file_left_out_of_an_overlay_is_named(vproj, tmp_path):
    root = tmp_path / "tree"
    files = {"vllm/__init__.py": "", "vllm/mod.py": MOD_V1.replace("return x + 1", "return x + 5"),
             "vllm/sub/__pycache__/mod.cpython-312.pyc": "stale",
             "vllm/stray.pyc": "stale", "vllm/.git/HEAD": "ref: refs/heads/main\n",
             "elsewhere/real.py": "REAL = 1\n"}
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "vllm/huge.json").write_bytes(b"{}" + b" " * import_.MAX_FILE)
    (root / "vllm/blob.bin").write_bytes(b"\x00\x01")
    p = patchkit("import", "--overlay", str(root), "--format", "json", cwd=vproj)
    assert p.returncode == 0, p.stderr
    notes = json.loads(p.stdout)["notes"]
    assert sorted(notes) == sorted([
        "left out, version control data: vllm/.git/",
        "left out, byte-code: vllm/stray.pyc, vllm/sub/__pycache__/",
        "left out, not text: vllm/blob.bin",
        "left out, larger than 16 MiB (no source file is): vllm/huge.json"])
    saved = (vproj / "patches/tree.diff").read_text()
    assert "return x + 5" in saved and "elsewhere/real.py" in saved
    assert not any(word in saved for word in ("pyc", "HEAD", "huge", "blob"))


def test_a_link_to_a_folder_in_an_overlay_is_refused(vproj, tmp_path):
    root = tmp_path / "tree"
    (root / "vllm/sub").mkdir(parents=True)
    (root / "vllm/mod.py").write_text(MOD_V1.replace("return x + 1", "return x + 5"))
    (root / "vllm/linked").symlink_to(root / "vllm/sub", target_is_directory=True)
    before = snapshot(vproj)
    p = patchkit("import", "--overlay", str(root), cwd=vproj)
    assert (p.returncode, p.stderr.strip()) == (
        2, f"patchkit import: error: --overlay {root}: vllm/linked is a link to a folder; an overlay "
           "holds regular files only")
    assert snapshot(vproj) == before


@pytest.mark.parametrize("how", ["overlay", "branch"])
def test_nothing_to_import_is_exit_0_and_one_line_for_both(vproj, tmp_path, how):
    if how == "overlay":
        args = ("--overlay", str(_package_copy(tmp_path / "ov", {"__init__.py": "",
                                                                 "mod.py": MOD_V1})))
        said = f"note: every file of {tmp_path / 'ov'} is as vLLM v2 ("
    else:
        args = ("v2", "--from", str(tmp_path / "vllm-up"))
        said = "note: v2 ("
    before = snapshot(vproj)
    p = patchkit("import", *args, cwd=vproj)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[-1] == "nothing to import"
    assert any(line.startswith(said) for line in lines[:-1]), p.stdout
    assert snapshot(vproj) == before


def test_an_overlay_id_that_exists_is_refused(vproj, tmp_path):
    overlay = _package_copy(tmp_path / "table-nvfp4", {"__init__.py": "", "mod.py": "X = 1\n"})
    with pytest.raises(UsageError, match=r"^--id table-nvfp4: the series has that id already"):
        import_.run_overlay(vproj / "patchset.yaml", overlay)


@pytest.mark.parametrize("summary, problem", [("two\nlines", "must be one line"),
                                              ("   ", "must not be empty")])
def test_a_bad_summary_names_the_option_not_a_line_of_the_manifest(vproj, tmp_path, summary,
                                                                    problem):
    root = tmp_path / "tree"
    (root / "vllm").mkdir(parents=True)
    (root / "vllm/__init__.py").write_text("")
    (root / "vllm/probe.py").write_text("PROBE = 1\n")
    before = snapshot(vproj)
    p = patchkit("import", "--overlay", str(root), "--summary", summary, cwd=vproj)
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().splitlines() == [f"patchkit import: error: --summary: {problem}"]
    assert snapshot(vproj) == before


def test_an_id_longer_than_100_characters_is_refused_before_any_work(vproj, tmp_path):
    before = snapshot(vproj)
    p = patchkit("import", "--overlay", str(tmp_path / "nowhere"), "--id", "a" * 101, cwd=vproj)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        f"patchkit import: error: --id '{'a' * 37}...': 101 characters long; an id has at most 100"]
    assert snapshot(vproj) == before
