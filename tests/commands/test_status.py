"""``patchkit status`` and the manifest found from any folder below the project: what a
newcomer sees from inside ``.patchkit/vllm``, and export-then-apply without --discard."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from testing import one_error, patchkit
from testing.project import make_project
from testing.upstream import sh


@pytest.fixture
def applied(tmp_path):
    proj = make_project(tmp_path)
    p = patchkit("apply", cwd=proj)
    assert p.returncode == 0, p.stderr
    return proj, proj / ".patchkit/vllm"


def status(cwd: Path, *args: str) -> dict:
    p = patchkit("status", "--format", "json", *args, cwd=cwd)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)["packages"][0]


def my_commit(wd: Path, text: str = "MINE = 1\n", message: str = "Add mine") -> None:
    (wd / "pkg/mine.py").write_text(text)
    sh("git", "add", "pkg/mine.py", cwd=wd)
    sh("git", "commit", "-qm", message, cwd=wd)


def test_status_outside_a_project_is_one_line_exit_2(tmp_path):
    p = patchkit("status", cwd=tmp_path)
    assert p.returncode == 2
    assert "not inside a patchset project" in one_error(p)
    assert p.stdout == ""


def test_status_before_any_apply_says_to_apply(tmp_path):
    proj = make_project(tmp_path)
    p = patchkit("status", cwd=proj)
    assert p.returncode == 0, p.stderr
    assert "is not there; run 'patchkit apply'" in p.stdout
    assert status(proj)["applied"] is False


def test_status_from_inside_the_checkout_names_pin_variant_and_patches(applied):
    proj, wd = applied
    p = patchkit("status", cwd=wd / "pkg")   # two folders below the project's .patchkit
    assert p.returncode == 0, p.stderr
    assert "holds v1 = " in p.stdout and "variant (default)" in p.stdout
    assert "3 applied" in p.stdout and "table-nvfp4 fast-mode extra-file" in p.stdout
    assert "clean:" in p.stdout
    st = status(wd)
    pin = sh("git", "rev-parse", "patchkit/base", cwd=wd)
    assert (st["ref"], st["commit"], st["version"]) == ("v1", pin, "1")
    assert st["patches"]["applied"] == ["table-nvfp4", "fast-mode", "extra-file"]
    assert st["work"] == {"commits": 0, "changed": 0, "untracked": 0, "moved_to": None,
                          "unreadable": None}
    assert Path(st["workdir"]) == wd


def test_status_says_commits_edits_and_files_apart(applied):
    proj, wd = applied
    my_commit(wd)
    my_commit(wd, "MINE = 2\n", "Mine again")
    (wd / "pkg/mod.py").write_text((wd / "pkg/mod.py").read_text() + "# edit\n")
    (wd / "notes.txt").write_text("x\n")
    p = patchkit("status", cwd=wd)
    assert "2 commits not yet exported: run 'patchkit export'" in p.stdout
    assert "1 changed file not committed: commit" in p.stdout
    assert "1 untracked file: commit" in p.stdout
    st = status(wd)
    assert (st["work"]["commits"], st["work"]["changed"], st["work"]["untracked"]) == (2, 1, 1)


def test_status_says_what_changed_in_the_manifest_since_the_apply(applied):
    proj, wd = applied
    text = (proj / "patchset.yaml").read_text()
    # edit the diff's file, drop the overlay, add a patch, move the pin
    (proj / "patches/table.diff").write_text((proj / "patches/table.diff").read_text() + "\n")
    start = text.index("  - id: extra-file")
    end = text.find("  - id:", start + 1)
    text = text[:start] + (text[end:] if end != -1 else "")
    (proj / "patches/new.diff").write_text((proj / "patches/table.diff").read_text())
    text += "  - id: newer\n    summary: a new one\n    diff: patches/new.diff\n"
    text = text.replace("ref: v1", "ref: v2")
    (proj / "patchset.yaml").write_text(text)
    st = status(wd)
    assert st["manifest_changes"] == {"added": ["newer"], "removed": ["extra-file"],
                                      "edited": ["table-nvfp4"], "pin": ["v1", "v2"]}
    p = patchkit("status", cwd=proj)
    assert ("manifest changed since the apply: added newer; edited table-nvfp4; removed "
            "extra-file; the pin moved from v1 to v2") in p.stdout
    assert "run 'patchkit apply'" in p.stdout


def test_status_compares_patches_on_what_they_are_and_says_settings_apart(applied):
    proj, wd = applied
    text = (proj / "patchset.yaml").read_text()
    # lines added above every entry move each one's line numbers, and edit nothing of them
    text = text.replace("name: demo\n", "name: demo-renamed\n# a note\nbump:\n  probes:\n"
                        "    - 'true'\n")
    (proj / "patchset.yaml").write_text(text)
    st = status(wd)
    assert st["manifest_changes"]["edited"] == []
    p = patchkit("status", "--format", "json", cwd=proj)
    assert json.loads(p.stdout)["settings_changed"] == ["bump.probes", "name"]
    p = patchkit("status", cwd=proj)
    assert ("settings changed since the apply (outside patches:): bump.probes, name"
            in p.stdout.splitlines())
    assert "edited" not in p.stdout
    # one probe line fewer is a change of bump.probes alone
    (proj / "patchset.yaml").write_text(text.replace("    - 'true'\n", "    - 'false'\n"))
    assert status(wd)["manifest_changes"]["edited"] == []


def test_export_then_apply_needs_no_discard(applied):
    proj, wd = applied
    my_commit(wd)
    p = patchkit("export", cwd=wd)         # from inside the checkout, as the README says
    assert p.returncode == 0, p.stderr
    assert "added" in p.stdout and (proj / "patches/add-mine.diff").is_file()
    assert status(wd)["work"]["commits"] == 0
    p = patchkit("apply", cwd=wd / "pkg")
    assert p.returncode == 0, p.stderr
    assert "discard" not in p.stderr
    assert not list(wd.parent.glob("*.bundle"))
    # the rebuilt checkout holds the exported commit as a patch of the series
    assert sh("git", "log", "-1", "--format=%s", "patchkit/applied", cwd=wd).startswith(
        "patchkit: add-mine")
    assert (wd / "pkg/mine.py").read_text() == "MINE = 1\n"
    st = status(wd)
    assert st["patches"]["applied"][-1] == "add-mine" and not st["manifest_changes"]["added"]


def test_a_commit_after_an_export_is_work_again(applied):
    proj, wd = applied
    my_commit(wd)
    assert patchkit("export", cwd=proj).returncode == 0
    my_commit(wd, "MINE = 2\n", "Another")
    p = patchkit("apply", cwd=proj)
    assert p.returncode == 2
    assert "1 commit not yet exported" in one_error(p)


def test_discarding_the_same_work_twice_keeps_one_bundle(applied):
    proj, wd = applied
    for _ in range(2):
        (wd / "notes.txt").write_text("the same\n")
        p = patchkit("apply", "--discard", cwd=proj)
        assert p.returncode == 0, p.stderr
    assert len(list(wd.parent.glob("*.bundle"))) == 1
    (wd / "notes.txt").write_text("other\n")
    assert patchkit("apply", "--discard", cwd=proj).returncode == 0
    assert len(list(wd.parent.glob("*.bundle"))) == 2


def test_every_verb_finds_the_manifest_from_a_folder_below(applied):
    proj, wd = applied
    p = patchkit("validate", cwd=wd / "pkg")
    assert p.returncode == 0, p.stderr
    assert "ok (3 patches" in p.stdout
    p = patchkit("verify", cwd=wd / "pkg")
    assert p.returncode == 0, p.stderr
