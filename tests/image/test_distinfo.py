"""The dist-info reader and the stack checks, on a file tree held in memory."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

from patchkit.errors import ImageError, ManifestError, UsageError
from patchkit.image import distinfo, lockfile
from patchkit.manifest import loader
from testing.imagetree import FI, SITE, TreeFiles, dist, record_sha256


def base_files() -> TreeFiles:
    return TreeFiles({**dist("flashinfer-python", "0.6.15", FI),
                      **dist("torch", "2.11.0", {"torch/__init__.py": b""}),
                      **dist("Nvidia_Cutlass.DSL", "4.5.0", {}, record=False,
                             folder="nvidia_cutlass_dsl-4.5.0.dist-info"),
                      f"{SITE}/README.txt": b"not a dist"})


def test_reads_every_dist_info_with_names_normalized_and_records():
    got = distinfo.installed(base_files(), {"PATH": "/usr/local/bin:/usr/bin"})
    assert got.versions() == {"flashinfer-python": "0.6.15", "nvidia-cutlass-dsl": "4.5.0",
                              "torch": "2.11.0"}
    fi = got.get("Flashinfer_Python")
    assert fi.site == SITE and fi.info == f"{SITE}/flashinfer_python-0.6.15.dist-info"
    row = fi.record["flashinfer/fused_moe/core.py"]
    assert row.sha256 == record_sha256(FI["flashinfer/fused_moe/core.py"]) and row.size == 18
    assert fi.record["flashinfer_python-0.6.15.dist-info/RECORD"].sha256 is None
    assert got.get("nvidia-cutlass-dsl").record is None
    assert got.sites == (SITE,)


def test_the_first_site_wins_and_the_other_is_kept_as_shadowed():
    venv = "/opt/venv/lib/python3.12/site-packages"
    files = TreeFiles({**dist("torch", "2.10.0", {}, site=venv), **dist("torch", "2.11.0", {})})
    got = distinfo.installed(files, {"VIRTUAL_ENV": "/opt/venv"})
    assert got.get("torch").version == "2.10.0" and got.get("torch").site == venv
    assert [d.version for d in got.shadowed] == ["2.11.0"]


def test_a_metadata_without_a_version_is_one_line():
    files = TreeFiles({f"{SITE}/bad-1.dist-info/METADATA": b"Name: bad\n\n"})
    with pytest.raises(ImageError, match=r"bad-1.dist-info/METADATA: no Name and Version"):
        distinfo.installed(files, {})


def test_pristine_proved_by_record_without_reading_the_file():
    files = base_files()
    fi = distinfo.installed(files, {}).get("flashinfer-python")
    files.reads.clear()
    proof = distinfo.prove_pristine(files, fi, ["flashinfer/fused_moe/core.py"], dict(FI),
                                    image="b", what="FlashInfer v0.6.15")
    assert proof.by_record == ("flashinfer/fused_moe/core.py",) and proof.by_reading == ()
    assert files.reads == [] and proof.describe() == "1 proved by RECORD"


def test_a_record_hash_that_differs_is_refused_naming_the_file():
    files = base_files()
    fi = distinfo.installed(files, {}).get("flashinfer-python")
    with pytest.raises(ImageError, match=r"base b: flashinfer/__init__.py is not the pristine "
                                         r"file of FI 1 \(its RECORD hash differs\)"):
        distinfo.prove_pristine(files, fi, ["flashinfer/__init__.py"],
                                {"flashinfer/__init__.py": b"x = 2\n"}, image="b", what="FI 1")


def test_without_a_hash_the_file_is_read_and_compared():
    files = TreeFiles(dist("flashinfer-python", "0.6.15", FI, record=False))
    fi = distinfo.installed(files, {}).get("flashinfer-python")
    proof = distinfo.prove_pristine(files, fi, ["flashinfer/__init__.py"], dict(FI),
                                    image="b", what="FI")
    assert proof.by_reading == ("flashinfer/__init__.py",)
    files.files[f"{SITE}/flashinfer/__init__.py"] = b"edited\n"
    with pytest.raises(ImageError, match="is not the pristine file of FI; refusing"):
        distinfo.prove_pristine(files, fi, ["flashinfer/__init__.py"], dict(FI), image="b",
                                what="FI")
    with pytest.raises(ImageError, match="already has flashinfer/__init__.py, which FI does not"):
        distinfo.prove_pristine(files, fi, [], {}, image="b", what="FI",
                                added=["flashinfer/__init__.py"])


# ----------------------------------------------------------------- the manifest and the stack

MANIFEST = """\
name: t
vllm:
  repo: pypi
  ref: v0.27.1
packages:
  flashinfer:
    dist: flashinfer-python
    repo: pypi
    ref: {ref}
image:
  base: base:test
  requires:
{requires}
patches: []
"""


def manifest(tmp_path: Path, ref: str = "v0.6.15",
             requires: str = '    torch: "==2.11.*"\n    Nvidia_Cutlass_DSL: ">=4.5,<4.6"'):
    path = tmp_path / "patchset.yaml"
    path.write_text(MANIFEST.format(ref=ref, requires=requires))
    return loader.load(path)


def test_requires_are_read_by_normalized_name_with_their_lines(tmp_path):
    m = manifest(tmp_path)
    assert m.image.requires == {"torch": SpecifierSet("==2.11.*"),
                                "nvidia-cutlass-dsl": SpecifierSet(">=4.5,<4.6")}
    assert m.image.requires_lines == {"torch": 13, "nvidia-cutlass-dsl": 14}
    assert m.others[0].dist_line == 7


@pytest.mark.parametrize("requires, message", [
    ('    torch: "=>2"', r"patchset.yaml:13: .*image.requires.torch: invalid PEP 440"),
    ("    - torch", r"patchset.yaml:13: .*image.requires: expected a mapping of distribution"),
    ('    "torch!": "==2"', r"patchset.yaml:13: .*'torch!' is not a distribution name"),
    ('    torch: "==2"\n    Torch: "==2"', r"patchset.yaml:14: .*'Torch' is the distribution "
                                            r"of line 13 again"),
])
def test_a_bad_requires_is_a_manifest_error_at_its_line(tmp_path, requires, message):
    with pytest.raises(ManifestError, match=message):
        manifest(tmp_path, requires=requires)


def test_a_base_meeting_every_pin_and_require_passes(tmp_path):
    lockfile.check_base(manifest(tmp_path), distinfo.installed(base_files(), {}), "b")


def test_a_require_not_met_names_the_dist_its_version_and_the_specifier(tmp_path):
    m = manifest(tmp_path, requires='    torch: "==2.10.*"\n    cuda-python: ">=12"')
    with pytest.raises(ImageError) as err:
        lockfile.check_base(m, distinfo.installed(base_files(), {}), "b")
    assert str(err.value) == (
        f"base b has no cuda-python installed (no cuda_python-*.dist-info in {SITE}), "
        "image.requires wants >=12; base b has torch 2.11.0, image.requires wants ==2.10.*")


def test_a_base_without_the_dist_is_a_manifest_error_at_the_dist_line(tmp_path):
    files = base_files()
    files.files = {k: v for k, v in files.files.items() if "flashinfer" not in k}
    with pytest.raises(ManifestError) as err:
        lockfile.check_base(manifest(tmp_path), distinfo.installed(files, {}), "b")
    assert str(err.value) == (
        "patchset.yaml:7: packages.flashinfer.dist: base b has no flashinfer-python installed "
        f"(no flashinfer_python-*.dist-info in {SITE})")


def test_a_base_whose_version_is_not_the_pin_is_refused(tmp_path):
    with pytest.raises(ImageError, match=r"^base b holds flashinfer-python 0.6.15, the pin is "
                                         r"v0.6.16$"):
        lockfile.check_base(manifest(tmp_path, ref="v0.6.16"),
                         distinfo.installed(base_files(), {}), "b")


# ------------------------------------------------------------------------------- the lock

def lock() -> lockfile.Lock:
    return lockfile.Lock("base:test", "sha256:" + "a" * 64,
                         {"vllm": lockfile.Pinned("0.27.1", "c" * 40, "git"),
                          "flashinfer": lockfile.Pinned("0.6.15", "", "pypi")},
                         {"torch": "2.11.0", "flashinfer-python": "0.6.15"})


def test_the_lock_is_sorted_text_read_back_as_written(tmp_path):
    data = lock().render()
    text = data.decode()
    assert text.index("[packages.flashinfer]") < text.index("[packages.vllm]")
    assert text.index('flashinfer-python = "0.6.15"') < text.index('torch = "2.11.0"')
    path = tmp_path / "patchset.lock"
    path.write_bytes(data)
    assert lockfile.Lock.read(path) == lock()


@pytest.mark.parametrize("text, message", [
    (None, r"patchset.lock: no lock file; write it with `patchkit lock`"),
    ("[base\n", r"patchset.lock: not a lock file: "),
    ('[installed]\ntorch = "2"\n', r"patchset.lock: not a lock file: missing or malformed 'base'"),
    ('[base]\nname = 1\ndigest = "d"\n', r"not a lock file: missing or malformed value 1"),
])
def test_a_missing_or_malformed_lock_is_one_usage_line(tmp_path, text, message):
    path = tmp_path / "patchset.lock"
    if text is not None:
        path.write_text(text)
    with pytest.raises(UsageError, match=message) as err:
        lockfile.Lock.read(path)
    assert "\n" not in str(err.value)


def test_differences_name_each_one():
    got = lockfile.base_differences(lock(), "sha256:" + "b" * 64,
                                 {"torch": "2.10.0", "nvidia-cutlass-dsl": "4.5.0"})
    assert got == [f"base digest sha256:{'b' * 64}, the lock has sha256:{'a' * 64}",
                   "flashinfer-python is not installed, the lock has 0.6.15",
                   "nvidia-cutlass-dsl 4.5.0 is installed, the lock has none",
                   "torch 2.10.0, the lock has 2.11.0"]
    assert lockfile.base_differences(lock(), lock().base_digest, dict(lock().installed)) == []
    got = lockfile.package_differences(lock(), {"vllm": lockfile.Pinned("0.27.1", "d" * 40, "git")})
    assert got == ["package flashinfer is in the lock, not in the stack",
                   f"package vllm commit {'d' * 12}, the lock has {'c' * 12}"]


# ------------------------------------------------- the proof on a package's applied checkout

def test_an_applied_checkout_of_a_package_is_proven_on_the_base(tmp_path):
    from testing.upstream import make_upstream, unified

    from patchkit.run import run_spec
    from patchkit.series.applier import apply_series
    from patchkit.series.checkout import AppliedCheckout

    core = FI["flashinfer/fused_moe/core.py"].decode()
    up = make_upstream(tmp_path / "fi", {"v0.6.15": {k: v.decode() for k, v in FI.items()}})
    proj = tmp_path / "proj"
    (proj / "patches").mkdir(parents=True)
    (proj / "patches" / "p.diff").write_text(
        unified("flashinfer/fused_moe/core.py", core, core + "PREFETCH = True\n")
        + unified("flashinfer/extra.py", None, "X = 1\n"))
    (proj / "patchset.yaml").write_text(
        f"name: fi\nvllm:\n  repo: {up}\n  ref: v0.6.15\npatches:\n"
        "  - id: p\n    summary: prefetch\n    diff: patches/p.diff\n")
    workdir = proj / ".patchkit" / "flashinfer"
    m = loader.load(proj / "patchset.yaml")
    assert apply_series(m, run=run_spec(m, cache=tmp_path / "cache"), workdir=workdir).ok
    tree = AppliedCheckout.open(workdir)
    files = base_files()
    fi = distinfo.installed(files, {}).get("flashinfer-python")
    files.reads.clear()
    proof = distinfo.prove_checkout(files, fi, tree, package="flashinfer", image="b")
    assert proof.by_record == ("flashinfer/fused_moe/core.py",) and files.reads == []
    files.files[f"{SITE}/flashinfer/extra.py"] = b"X = 0\n"
    with pytest.raises(ImageError, match=r"base b already has flashinfer/extra.py, which "
                                         r"flashinfer-python v0.6.15 \(commit [0-9a-f]{12}\) "
                                         r"does not"):
        distinfo.prove_checkout(files, fi, tree, package="flashinfer", image="b")


def test_verify_locked_compares_the_labels_and_the_image_dist_info(tmp_path):
    import json

    from patchkit.commands.verify import _stack_checks
    from patchkit.image import labels

    m = manifest(tmp_path)
    the_lock = lockfile.Lock("base:test", "sha256:" + "a" * 64,
                             {"flashinfer": lockfile.Pinned("0.6.15", "", "pypi")},
                             {"flashinfer-python": "0.6.15", "nvidia-cutlass-dsl": "4.5.0",
                              "torch": "2.11.0"})
    recorded = {labels.BASE_DIGEST_LABEL: "sha256:" + "a" * 64, labels.PACKAGES_LABEL:
                json.dumps({"flashinfer": {"version": "0.6.15", "commit": "", "source": "pypi"}})}
    facts = labels.ImageFacts.from_labels(recorded)
    assert facts.packages == {"flashinfer": {"version": "0.6.15", "commit": "", "source": "pypi"}}
    assert _stack_checks(m, distinfo.installed(base_files(), {}), facts, the_lock, "img") == []
    recorded[labels.PACKAGES_LABEL] = json.dumps(
        {"flashinfer": {"version": "0.6.16", "commit": "", "source": "pypi"}})
    assert _stack_checks(m, distinfo.installed(base_files(), {}),
                         labels.ImageFacts.from_labels(recorded), the_lock, "img") == ["package flashinfer version 0.6.16, the lock has 0.6.15"]
    unlabelled = labels.ImageFacts.from_labels({})
    assert _stack_checks(m, distinfo.installed(base_files(), {}), unlabelled, the_lock, "img") == [
        f"base digest (not recorded), the lock has sha256:{'a' * 64}",
        "the labels of img do not record its packages' versions and commits (it was not built "
        "by this patchkit)"]
    with pytest.raises(ImageError, match=r"^image img has torch 2.11.0, image.requires wants "
                                         r"==2.10.\*$"):
        _stack_checks(manifest(tmp_path, requires='    torch: "==2.10.*"'),
                      distinfo.installed(base_files(), {}), facts, None, "img")
