"""The kinds of source: which text names which kind, and what each kind says it can do."""

from __future__ import annotations

from pathlib import Path

import pytest

from patchkit import source
from patchkit.errors import SourceError
from patchkit.source import image, mirror, pypi
from patchkit.packageid import PackageId


@pytest.mark.parametrize("text", ["https://github.com/vllm-project/vllm.git", "/srv/vllm",
                                  "./vllm", "../up", "file:///srv/vllm.git", "~/vllm",
                                  "git@github.com:vllm-project/vllm.git", "pypi2", "images"])
def test_every_text_but_the_words_is_a_git_source(text):
    kind = source.kind_of(text)
    assert kind is mirror.SOURCE
    assert (kind.name, kind.holds_commits, kind.reads_base, kind.has_history) == (
        "git", True, False, True)
    assert kind.no_history_why is None
    assert kind.label(text, "0.33.0") == text


def test_the_word_pypi_is_releases_without_history():
    kind = source.kind_of("pypi")
    assert kind is pypi.SOURCE
    assert (kind.name, kind.holds_commits, kind.reads_base, kind.has_history) == (
        "pypi", False, False, False)
    assert kind.no_history_why
    assert kind.label("pypi", "0.33.0") == "pypi:vllm==0.33.0"
    assert kind.label("pypi", "0.6.1", PackageId("flashinfer", "flashinfer-python",
                                                 "flashinfer", "FlashInfer")) == (
        "pypi:flashinfer-python==0.6.1")


def test_the_word_image_reads_the_base():
    kind = source.kind_of("image")
    assert kind is image.SOURCE
    assert (kind.name, kind.holds_commits, kind.reads_base, kind.has_history) == (
        "image", False, True, False)
    assert kind.label("image", "0.33.0") == "image"


def test_vllm_caches_keep_their_paths_and_another_package_gets_its_own(tmp_path):
    assert pypi.repo_path(tmp_path) == tmp_path / "pypi" / "vllm.git"
    assert image.repo_path(tmp_path) == tmp_path / "image" / "vllm.git"
    other = PackageId("flashinfer", "flashinfer-python", "flashinfer", "FlashInfer")
    assert pypi.repo_path(tmp_path, other) == tmp_path / "pypi" / "flashinfer-python.git"
    assert image.repo_path(tmp_path, other) == tmp_path / "image" / "flashinfer-python.git"


def test_a_ref_refused_for_another_package_names_that_package(tmp_path):
    other = PackageId("flashinfer", "flashinfer-python", "flashinfer", "FlashInfer")
    with pytest.raises(SourceError, match="^bad FlashInfer ref: '-x' starts with '-'$"):
        source.resolve(["pypi"], "-x", Path(tmp_path), package=other)
