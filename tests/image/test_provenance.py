"""Where an image came from: the patchset's commit (dirty-marked), its repository without
credentials, and a reproducible time that is no date.  Real git repositories; the labels are
built as build-image builds them (tests/image/test_build_image_docker.py builds the image)."""

from __future__ import annotations

import pytest
from testing.upstream import sh

from patchkit import __version__
from patchkit import git as g
from patchkit.image import labels
from patchkit.formats import layer
from patchkit.render.images import NO_TIME, commit
from patchkit.render.text import holds


@pytest.fixture
def project(tmp_path):
    root = tmp_path / "patchset"
    root.mkdir()
    (root / "patchset.yaml").write_text("name: mine\n")
    (root / ".gitignore").write_text("/.patchkit/\n")
    sh("git", "init", "-q", "-b", "main", cwd=root)
    sh("git", "add", "-A", cwd=root)
    sh("git", "commit", "-q", "-m", "first", cwd=root)
    return root


def test_a_clean_project_names_its_commit(project):
    head = sh("git", "rev-parse", "HEAD", cwd=project).strip()
    got = g.provenance(project)
    assert got == g.Provenance(head, False, None) and got.revision == head
    # patchkit's own folder is not a change of the project
    (project / ".patchkit" / "vllm").mkdir(parents=True)
    (project / ".patchkit" / "vllm" / "x.py").write_text("x\n")
    assert g.provenance(project).revision == head


@pytest.mark.parametrize("change", ["modified", "untracked", "staged"])
def test_changes_not_committed_mark_it_dirty(project, change):
    head = sh("git", "rev-parse", "HEAD", cwd=project).strip()
    if change == "modified":
        (project / "patchset.yaml").write_text("name: mine2\n")
    else:
        (project / "patches").mkdir()
        (project / "patches" / "new.diff").write_text("--- a\n")
        if change == "staged":
            sh("git", "add", "patches", cwd=project)
    assert g.provenance(project).revision == f"{head}-dirty"


def test_outside_a_repository_there_is_no_commit(tmp_path):
    assert g.provenance(tmp_path) == g.Provenance()
    assert g.Provenance().revision is None


def test_the_origin_is_named_without_credentials(project):
    sh("git", "remote", "add", "origin", "https://me:ghp_secret@github.com/me/patchset.git",
       cwd=project)
    assert g.provenance(project).origin == "https://github.com/me/patchset.git"


@pytest.mark.parametrize("url, shown", [
    ("https://oauth2:tok@gitlab.example/me/p.git", "https://gitlab.example/me/p.git"),
    ("https://tok@github.com/me/p.git", "https://github.com/me/p.git"),
    ("https://github.com/me/p.git?token=abc#x", "https://github.com/me/p.git"),
    ("ssh://git@github.com/me/p.git", "ssh://git@github.com/me/p.git"),
    ("ssh://git:pw@github.com/me/p.git", "ssh://github.com/me/p.git"),
    ("git@github.com:me/p.git", "git@github.com:me/p.git"),
    ("/srv/git/p.git", "/srv/git/p.git"),
])
def test_credentials_are_stripped(url, shown):
    assert g.without_credentials(url) == shown


@pytest.mark.parametrize("text, real", [
    ("2000-01-01T00:00:00Z", False), ("1970-01-01T00:00:00Z", False),
    ("0001-01-01T00:00:00Z", False), ("", False), ("garbage", False),
    ("2026-11-30T12:00:00Z", True), ("2026-11-30T12:00:00.123456789Z", True),
])
def test_a_time_that_is_not_real_is_no_date(text, real):
    assert (labels.real_time(text) == text) is real
    if not real:
        assert labels.real_time(text) is None


def test_facts_read_back_the_commit_and_show_no_fake_date():
    facts = labels.ImageFacts.from_labels({
        labels.PATCHSET_COMMIT_LABEL: "a" * 40 + "-dirty",
        labels.CREATED_LABEL: layer.iso_time(labels.NO_TIME),
        labels.PATCHKIT_VERSION_LABEL: __version__})
    assert facts.commit == "a" * 40 + "-dirty" and facts.created is None
    assert facts.patchkit == __version__
    assert commit(facts.commit) == "aaaaaaaaaaaa-dirty"
    line = holds({"installed": "0.27.1", "source": "pypi", "fingerprint": "sha256:f",
                  "patchset_commit": facts.commit, "created": facts.created}, created=True)
    assert line.endswith(f"patchset commit aaaaaaaaaaaa-dirty, created {NO_TIME}")
    assert "2000" not in line


def test_the_annotations_are_the_oci_labels():
    got = labels.annotations({labels.REVISION_LABEL: "abc", labels.SOURCE_URL_LABEL: "u",
                              labels.PATCHSET_LABEL: "mine"})
    assert got == {labels.REVISION_LABEL: "abc", labels.SOURCE_URL_LABEL: "u"}
