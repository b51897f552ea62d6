"""A patch's ranges judged in one place: every package by its name, vLLM's wording unchanged."""

from __future__ import annotations

import pytest
from packaging.specifiers import SpecifierSet

from patchkit import versions
from patchkit.errors import UsageError

FI = {"flashinfer": SpecifierSet("<0.6.16")}


def test_a_range_that_holds_is_in():
    assert versions.in_ranges(FI, {"vllm": "0.33.0", "flashinfer": "0.6.15"}) == (True, "")


def test_a_range_outside_names_the_package_and_its_version():
    assert versions.in_ranges(FI, {"flashinfer": "0.6.16"}) == (
        False, "flashinfer 0.6.16 is outside <0.6.16")


def test_the_first_range_outside_is_the_reason():
    ranges = {"vllm": SpecifierSet(">=0.27.1"), "flashinfer": SpecifierSet(">=0.6.15,<0.7"),
              "b12x": SpecifierSet("<1")}
    found = {"vllm": "0.33.0", "flashinfer": "0.7.1", "b12x": "2.0"}
    assert versions.in_ranges(ranges, found) == (False, "flashinfer 0.7.1 is outside <0.7,>=0.6.15")


def test_a_range_on_vllm_keeps_its_wording():
    ranges = {"vllm": SpecifierSet("<1")}
    assert versions.in_ranges(ranges, {"vllm": "2"}) == (False, "vLLM 2 is outside <1")
    assert versions.in_ranges(ranges, {"vllm": None}) == (
        False, "the vLLM version is unknown, so the range <1 cannot be checked")
    assert versions.in_ranges(ranges, {"vllm": "nope"}) == (
        False, "vLLM version 'nope' is not PEP 440")


def test_an_unknown_version_of_another_package_is_said_by_name():
    assert versions.in_ranges(FI, {"flashinfer": None}) == (
        False, "the flashinfer version is unknown, so the range <0.6.16 cannot be checked")
    assert versions.in_ranges(FI, {"flashinfer": "x.y"}) == (
        False, "flashinfer version 'x.y' is not PEP 440")


def test_a_package_the_caller_has_no_version_of_is_not_judged():
    # Until each package has its checkout, callers know vLLM's version alone.
    assert versions.in_ranges(FI, {"vllm": "0.33.0"}) == (True, "")
    assert versions.in_ranges({}, {"vllm": None}) == (True, "")


def test_prereleases_and_dev_builds_are_judged_like_releases():
    found = {"flashinfer": "0.6.16rc1"}
    assert versions.in_ranges({"flashinfer": SpecifierSet(">=0.6.16rc1")}, found)[0]
    assert not versions.in_ranges({"flashinfer": SpecifierSet(">0.6.16rc1")}, found)[0]


def test_a_commit_sha_is_no_pypi_release_even_of_digits_alone():
    """A sha of digits alone is a version to PEP 440; PyPI is never asked for it."""
    assert versions.pypi_release("v0.33.0") == "0.33.0"
    for sha in ("7" * 40, "0123456789abcdef0123456789abcdef01234567"):
        with pytest.raises(UsageError, match="takes a release tag"):
            versions.pypi_release(sha)
