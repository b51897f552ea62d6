"""The pin from a base (``--vllm-ref base``) and the base as the source (``--vllm-repo image``),
on fixture upstreams, with the base image given as a plain object: the image layer's reading of
a real image is the concern of tests/image/test_base_source_docker.py."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from testing.upstream import dedent, make_diff, make_upstream

from patchkit import git as g
from patchkit import manifest, source, versions
from patchkit.errors import ManifestError, SourceError, UsageError
from patchkit.image import build
from patchkit.engines import facts
from patchkit.formats import layer
from patchkit.engines.facts import Inspected
from patchkit.imageref import Platform
from patchkit.report import ApplyReport, PackageInfo
from patchkit.series.checkout import AppliedCheckout
from patchkit.series.applier import apply_series
from patchkit.run import run_spec
from patchkit.source import image as image_source

ATTN = dedent("""
    class Attention:
        def forward(self, x):
            return x


    def helper():
        return 1
""")
CUDA = dedent("""
    import os

    logger = None


    def capability():
        return (9, 0)
""")
VENDOR_CUDA = CUDA.replace("logger = None\n", "logger = None\nNV_VALIDATED = ((12, 1),)\n")
VENDOR_ATTN = ATTN + "\n\nNV_TUNED = True  # vendor\n"


@dataclass
class FakeBase:
    """A base image as the image source sees one."""

    version: str | None
    files: dict[str, bytes | tuple[int, bytes]] = field(default_factory=dict)
    name: str = "registry.example/vllm:nv"
    key: str = "sha256:" + "ab" * 32
    platform: str = "linux/arm64"
    package_dir: str = "/usr/lib/python3/dist-packages/vllm"
    reads: int = 0

    def package_files(self):
        self.reads += 1
        for path, data in self.files.items():
            mode = 0o100644
            if isinstance(data, tuple):
                mode, data = data
            yield g.TreeFile(path, mode, data)


@pytest.fixture
def upstream(tmp_path):
    return make_upstream(tmp_path / "up", {
        "v0.31.0": {"vllm/__init__.py": "", "vllm/attention.py": ATTN,
                    "vllm/platforms/cuda.py": CUDA},
        "v0.32.0": {"vllm/attention.py": ATTN + "\n\ndef added():\n    return 2\n"},
    })


def commit_of(repo: Path, rev: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "rev-parse", f"{rev}^{{commit}}"], check=True,
                          capture_output=True, text=True).stdout.strip()


# ------------------------------------------------------------------------------ versions

@pytest.mark.parametrize("version,commit,pin", [
    ("0.26.1rc1.dev1257+g94d96e244", "94d96e244", "94d96e244"),
    ("0.25.2.dev0+g752a3a504.d20260714", "752a3a504", "752a3a504"),
    ("0.10.1rc2.dev397+g0b1bdac6a.cu128", "0b1bdac6a", "0b1bdac6a"),
    ("0.33.0", None, "v0.33.0"),
    ("0.33.0rc1", None, "v0.33.0rc1"),
    ("0.33.0+cu130", None, "v0.33.0"),
    ("0.31.0+nv25.11", None, None),
    ("0.31.1.dev7", None, None),
    ("0.31.1.dev7+gnothex", None, None),
    ("not a version", None, None),
    (None, None, None),
])
def test_what_an_installed_version_names(version, commit, pin):
    assert versions.named_commit(version) == commit
    got = versions.base_pin(version)
    assert (got.ref if got else None) == pin
    assert (got.commit if got else None) == (None if pin is None else commit is not None)


def test_a_dev_build_is_judged_on_its_own_version():
    from packaging.specifiers import SpecifierSet

    assert versions.in_range(SpecifierSet(">=0.31"), "0.31.1.dev7+g94d96e244")[0]
    assert versions.in_range(SpecifierSet(">0.31.0"), "0.31.1.dev7+g94d96e244")[0]
    assert not versions.in_range(SpecifierSet(">0.31.0"), "0.31.0")[0]


# ------------------------------------------------------------------------------ git

def test_commit_files_is_an_orphan_of_exactly_the_files_and_the_same_everywhere(tmp_path):
    repo = tmp_path / "r.git"
    g.init_bare(repo)
    files = [g.TreeFile("vllm/a.py", 0o100644, b"A = 1\n"),
             g.TreeFile("vllm/bin/run", 0o100755, b"#!/bin/sh\n"),
             g.TreeFile("vllm/link.py", 0o120000, b"a.py"),
             g.TreeFile("vllm/hard.py", 0o100644, same_as="vllm/a.py"),
             g.TreeFile('vllm/odd "name"\\.py', 0o100644, b"")]
    commit, count = g.commit_files(repo, "refs/patchkit/one", files, "msg")
    assert count == 5
    again, _ = g.commit_files(repo, "refs/patchkit/two", iter(files), "msg")
    assert again == commit
    listing = subprocess.run(["git", "-C", str(repo), "ls-tree", "-r", "-z", commit],
                             capture_output=True, text=True, check=True).stdout
    entries = {line.split("\t", 1)[1]: line.split()[0] for line in listing.split("\0") if line}
    assert entries == {"vllm/a.py": "100644", "vllm/bin/run": "100755", "vllm/link.py": "120000",
                       "vllm/hard.py": "100644", 'vllm/odd "name"\\.py': "100644"}
    assert g.show(repo, f"{commit}:vllm/hard.py") == "A = 1\n"
    assert g.show(repo, f"{commit}:vllm/link.py") == "a.py"
    parents = subprocess.run(["git", "-C", str(repo), "log", "-1", "--format=%P", commit],
                             capture_output=True, text=True, check=True).stdout.strip()
    assert parents == ""
    # a ref moves to a new orphan, not to a child of the old commit
    other, _ = g.commit_files(repo, "refs/patchkit/one", files[:1], "msg")
    assert other != commit and g.resolve_commit(repo, "refs/patchkit/one") == other


@pytest.mark.parametrize("bad", [g.TreeFile("../x", 0o100644, b""),
                                 g.TreeFile("/etc/x", 0o100644, b""),
                                 g.TreeFile("vllm/x", 0o040000, b""),
                                 g.TreeFile("vllm/y", 0o100644, same_as="vllm/nothing")])
def test_commit_files_refuses_what_git_cannot_hold(tmp_path, bad):
    repo = tmp_path / "r.git"
    g.init_bare(repo)
    with pytest.raises(ValueError):
        g.commit_files(repo, "refs/patchkit/x", [bad], "msg")
    assert g.resolve_commit(repo, "refs/patchkit/x") is None


# ------------------------------------------------------------------------------ --vllm-ref base

def test_a_version_naming_a_commit_pins_that_commit(tmp_path, upstream):
    full = commit_of(upstream, "v0.31.0")
    base = FakeBase(f"0.31.1.dev7+g{full[:9]}")
    got = source.resolve([str(upstream)], "base", tmp_path / "cache", base=base)
    assert got.commit == full
    assert got.ref == full[:9]
    assert got.version == base.version  # ranges are judged on what the base holds
    assert base.reads == 0  # the pin needs the version only


def test_a_dev_build_whose_commit_the_source_lacks_is_missing_never_unreachable(tmp_path,
                                                                                upstream):
    """The repository answers without the base's commit: named as missing, with the source
    and the base, and nothing remembered; the next run asks the source again."""
    cache = tmp_path / "cache"
    source.resolve([str(upstream)], "v0.31.0", cache)   # the mirror is there: a fetch follows
    base = FakeBase("0.31.1.dev7+gc5de82f35")
    with pytest.raises(SourceError) as info:
        source.resolve([str(upstream)], "base", cache, base=base)
    assert str(info.value).startswith(
        f"vLLM commit c5de82f35 is missing from {upstream} (it answered: fetched just now, the "
        f"commit is not there); base {base.name} holds vLLM 0.31.1.dev7+gc5de82f35, built from "
        "it: name a source that has it with --vllm-repo URL, or patch the base as it is with "
        "--vllm-repo image")
    assert "unreachable" not in str(info.value)
    assert not list((cache / "repos").glob("*.unreachable"))


def test_a_dated_dev_version_pins_its_commit_too(tmp_path, upstream):
    full = commit_of(upstream, "v0.32.0")
    base = FakeBase(f"0.32.1.dev0+g{full[:9]}.d20260714")
    assert source.resolve([str(upstream)], "base", tmp_path / "cache", base=base).commit == full


def test_a_plain_release_pins_its_tag(tmp_path, upstream):
    got = source.resolve([str(upstream)], "base", tmp_path / "cache", base=FakeBase("0.32.0"))
    assert got.commit == commit_of(upstream, "v0.32.0")
    assert (got.ref, got.version) == ("v0.32.0", "0.32.0")


@pytest.mark.parametrize("version", ["0.31.0+nv25.11", "0.31.1.dev7"])
def test_a_version_naming_no_commit_is_one_line_suggesting_the_image_source(tmp_path, upstream,
                                                                           version):
    cache = tmp_path / "cache"
    with pytest.raises(SourceError) as info:
        source.resolve([str(upstream), "pypi"], "base", cache, base=FakeBase(version))
    message = str(info.value)
    assert f"holds vLLM {version}, which names no commit" in message
    assert "--vllm-repo image" in message and "\n" not in message
    assert info.value.exit_code == 2
    assert not cache.exists()  # said before any source was asked


def test_a_packages_base_pin_messages_name_that_package(tmp_path):
    """Another package's ref ``base`` is read from its dist-info in the base: what it cannot
    pin names that package and its manifest key, never vLLM's flags."""
    fi = manifest.identity("flashinfer", "flashinfer-python")
    cache = tmp_path / "cache"
    with pytest.raises(UsageError) as info:
        source.resolve(["pypi"], "base", cache, package=fi)
    assert str(info.value) == ("packages.flashinfer.ref: base reads the pin from a base image: "
                               "give --base IMAGE or set image.base in patchset.yaml")
    with pytest.raises(SourceError) as info:
        source.resolve(["pypi"], "base", cache, base=FakeBase("0.6.15+cu130.local"),
                       package=fi)
    assert str(info.value) == ("base registry.example/vllm:nv holds flashinfer "
                               "0.6.15+cu130.local, which names no "
                               "commit (+g<sha>) and no release; patch it as it is with "
                               "packages.flashinfer.repo: image")
    with pytest.raises(UsageError, match=r"^the flashinfer source pypi takes a release tag"):
        source.resolve(["pypi"], "main", cache, package=fi)
    assert not cache.exists()  # said before any source was asked


def test_a_commit_pin_skips_pypi_which_holds_releases_only(tmp_path, upstream):
    full = commit_of(upstream, "v0.31.0")
    base = FakeBase(f"0.31.1.dev7+g{full[:9]}")
    with pytest.raises(SourceError, match=r"holds releases only; name a git source"):
        source.resolve(["pypi"], "base", tmp_path / "cache", base=base)
    # in a list, the git source that holds it answers
    assert source.resolve(["pypi", str(upstream)], "base", tmp_path / "cache",
                          base=base).commit == full


def test_the_ref_base_without_a_base_is_a_usage_error(tmp_path, upstream):
    with pytest.raises(UsageError, match=r"--vllm-ref base reads the pin from a base image: "
                                         r"give --base IMAGE"):
        source.resolve([str(upstream)], "base", tmp_path / "cache")


def test_ranges_are_judged_on_the_installed_dev_version(tmp_path, upstream):
    full = commit_of(upstream, "v0.31.0")
    diff = make_diff(ATTN, ATTN.replace("return x", "return x * 2"), "vllm/attention.py")
    proj = tmp_path / "proj"
    (proj / "patches").mkdir(parents=True)
    (proj / "patches" / "p.diff").write_text(diff)
    (proj / "patchset.yaml").write_text(dedent(f"""
        name: t
        vllm: {{repo: {upstream}, ref: base}}
        image: {{base: registry.example/vllm:dev}}
        patches:
          - id: past-the-release
            summary: only for what came after 0.31.0
            diff: patches/p.diff
            vllm: ">0.31.0"
    """))
    m = manifest.load(proj / "patchset.yaml")
    report = apply_series(m, run=run_spec(m, cache=tmp_path / "cache"), workdir=proj / "w",
                          base=FakeBase(f"0.31.1.dev7+g{full[:9]}"))
    assert report.ok, report.to_json()
    assert [p.status for p in report.patches] == ["applied"]
    assert (report.vllm.commit, report.vllm.version) == (full, f"0.31.1.dev7+g{full[:9]}")


# ------------------------------------------------------------------------------ the manifest

def test_manifest_ref_base_needs_image_base(tmp_path):
    path = tmp_path / "patchset.yaml"
    path.write_text("name: t\nvllm:\n  repo: pypi\n  ref: base\n")
    with pytest.raises(ManifestError) as info:
        manifest.load(path)
    assert str(info.value) == (f"{path}:4: vllm.ref: 'base' pins what the base image holds, and "
                               "image.base is not set")
    path.write_text("name: t\nvllm:\n  repo: pypi\n  ref: base\nimage:\n  base: reg/vllm:1\n")
    assert manifest.load(path).vllm.ref == "base"


# ------------------------------------------------------------------------------ --vllm-repo image

def vendor_base(**kw) -> FakeBase:
    files = {"vllm/__init__.py": b"", "vllm/attention.py": VENDOR_ATTN.encode(),
             "vllm/platforms/cuda.py": VENDOR_CUDA.encode(),
             "vllm/__pycache__/attention.cpython-312.pyc": b"\x00pyc",
             "vllm/_C.abi3.so": b"\x7fELF...",
             "vllm/kernels/fused": b"\x7fELFnative",
             "vllm/configs/tuned.json": b'{"a": 1}\n',
             "vllm/scripts/run.sh": (0o100755, b"#!/bin/sh\n")}
    return FakeBase("0.31.0+nv25.11", files, **kw)


def test_the_image_source_is_the_base_package_committed_once(tmp_path):
    base = vendor_base()
    cache = tmp_path / "cache"
    got = source.resolve(["image"], "base", cache, base=base)
    assert (got.source, got.ref, got.version) == ("image", "base", "0.31.0+nv25.11")
    listing = subprocess.run(["git", "-C", str(got.repo), "ls-tree", "-r", "--name-only",
                              got.commit], capture_output=True, text=True, check=True).stdout
    assert listing.split() == ["vllm/__init__.py", "vllm/attention.py", "vllm/configs/tuned.json",
                               "vllm/platforms/cuda.py", "vllm/scripts/run.sh"]
    assert g.show(got.repo, f"{got.commit}:vllm/attention.py") == VENDOR_ATTN
    assert g.resolve_commit(got.repo, image_source.ref_of(base)) == got.commit
    assert base.reads == 1
    again = source.resolve(["image"], "base", cache, base=base)
    assert again.commit == got.commit and base.reads == 1  # made once, then reused
    # another base (another digest) is another tree
    other = vendor_base(key="sha256:" + "cd" * 32)
    other.files["vllm/extra.py"] = b"X = 1\n"
    assert source.resolve(["image"], "base", cache, base=other).commit != got.commit


def test_the_image_source_takes_a_ref_naming_what_the_base_holds_and_nothing_else(tmp_path):
    cache = tmp_path / "cache"
    assert source.resolve(["image"], "v0.31.0", cache, base=vendor_base()).ref == "v0.31.0"
    with pytest.raises(SourceError) as info:
        source.resolve(["image"], "v0.33.0", cache, base=vendor_base())
    assert ("is what base registry.example/vllm:nv holds (vLLM 0.31.0+nv25.11), and the pin "
            "v0.33.0 names something else; give --vllm-ref base") in str(info.value)
    dev = FakeBase("0.31.1.dev7+g94d96e244", {"vllm/__init__.py": b""})
    assert source.resolve(["image"], "94d96e244", cache, base=dev).version == dev.version


def test_the_image_source_without_a_base_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError) as info:
        source.resolve(["image"], "base", tmp_path / "cache")
    assert str(info.value) == image_source.NO_BASE and info.value.exit_code == 2


def test_a_package_with_no_source_file_is_one_line(tmp_path):
    base = FakeBase("0.31.0", {"vllm/_C.so": b"\x7fELF"})
    with pytest.raises(SourceError, match=r"holds no source files"):
        source.resolve(["image"], "base", tmp_path / "cache", base=base)
    assert g.resolve_commit(image_source.repo_path(tmp_path / "cache"),
                            image_source.ref_of(base)) is None


def test_the_image_source_lists_no_releases(tmp_path):
    with pytest.raises(SourceError, match="name the targets with --to"):
        source.list_tags(["image"], tmp_path / "cache")


def _project(tmp_path: Path, diffs: dict[str, str]) -> manifest.Manifest:
    proj = tmp_path / "proj"
    (proj / "patches").mkdir(parents=True)
    entries = []
    for pid, text in diffs.items():
        (proj / "patches" / f"{pid}.diff").write_text(text)
        entries.append(f"  - id: {pid}\n    summary: {pid}\n    diff: patches/{pid}.diff\n")
    (proj / "patchset.yaml").write_text("name: t\nvllm:\n  repo: image\n  ref: base\nimage:\n"
                                        "  base: registry.example/vllm:nv\npatches:\n"
                                        + "".join(entries))
    return manifest.load(proj / "patchset.yaml")


def test_patches_land_on_the_vendor_files_and_keep_their_changes(tmp_path):
    # written against upstream's attention.py; the vendor's addition lies out of its reach
    diff = make_diff(ATTN, ATTN.replace("return x", "return x * 2"), "vllm/attention.py")
    m = _project(tmp_path, {"double": diff})
    workdir = tmp_path / "w"
    report = apply_series(m, run=run_spec(m, cache=tmp_path / "cache"), workdir=workdir,
                          base=vendor_base())
    assert report.ok, report.to_json()
    text = (workdir / "vllm/attention.py").read_text()
    assert "return x * 2" in text and "NV_TUNED = True  # vendor" in text
    assert report.vllm.source == "image" and report.vllm.version == "0.31.0+nv25.11"



def test_the_lock_entry_and_labels_say_the_pristine_tree_came_from_the_image(tmp_path):
    from patchkit.image import lockfile

    diff = make_diff(ATTN, ATTN.replace("return x", "return x * 2"), "vllm/attention.py")
    m = _project(tmp_path, {"double": diff})
    workdir = tmp_path / "w"
    assert apply_series(m, run=run_spec(m, cache=tmp_path / "cache"), workdir=workdir, base=vendor_base()).ok
    pinned = lockfile.patched_packages(m, workdir)["vllm"]
    assert (pinned.version, pinned.source) == ("0.31.0+nv25.11", "image")
    assert 'source = "image"' in lockfile.Lock("b", "sha256:" + "0" * 64,
                                               {"vllm": pinned}).render().decode()
    labels = build.packages_of(m, AppliedCheckout.open(workdir))
    assert labels["vllm"]["source"] == "image"

def test_a_patch_whose_context_the_vendor_changed_fails_with_its_true_reason(tmp_path):
    diff = make_diff(CUDA, CUDA.replace("logger = None\n", "logger = None\nNEW = 1\n"),
                     "vllm/platforms/cuda.py")
    m = _project(tmp_path, {"cuda-new": diff})
    workdir = tmp_path / "w"
    report = apply_series(m, run=run_spec(m, cache=tmp_path / "cache"), workdir=workdir,
                          base=vendor_base())
    assert not report.ok
    (result,) = report.patches
    assert (result.status, result.reason) == ("failed", "conflict")
    assert "vllm/platforms/cuda.py" in result.message
    assert not workdir.exists()


# ------------------------------------------------------------------------------ the overlay check

def _tree(version: str | None, commit: str, repo: str = "https://github.com/vllm-project/vllm",
          ref: str = "v0.31.0") -> AppliedCheckout:
    report = ApplyReport(PackageInfo(ref, commit, version, repo), workdir=None)
    return AppliedCheckout(Path("/nonexistent"), report, commit, commit)


SHA = "e07dd6f9b" + "0" * 31


def test_a_base_built_from_the_pinned_commit_fits_whatever_its_version_says():
    assert build.installed_problem("b", "0.31.1.dev7+ge07dd6f9b", _tree("0.31.0", SHA),
                                   "/v") is None
    assert build.installed_problem("b", "0.31.1.dev7+ge07dd6f9b.d20260101",
                                   _tree("0.31.1.dev7+ge07dd6f9b", SHA, ref="e07dd6f9b"),
                                   "/v") is None


def test_a_base_built_from_another_commit_is_refused_naming_both():
    problem = build.installed_problem("b", "0.31.1.dev7+g1234567ab", _tree("0.31.0", SHA), "/v")
    assert problem == ("base b holds vLLM 0.31.1.dev7+g1234567ab, built from commit 1234567ab, "
                       "not from the pinned commit e07dd6f9b000 (vLLM v0.31.0); use a base built "
                       "from it, or pin it with --vllm-ref base")


def test_release_strings_still_decide_without_a_commit():
    assert build.installed_problem("b", "0.31.0+cu130", _tree("0.31.0", SHA), "/v") is None
    assert "holds vLLM 0.33.0, not 0.31.0" in build.installed_problem(
        "b", "0.33.0", _tree("0.31.0", SHA), "/v")


def test_a_tree_read_from_a_base_fits_a_base_holding_that_very_version():
    tree = _tree("0.31.0+nv25.11", SHA, repo="image", ref="base")
    assert build.installed_problem("b", "0.31.0+nv25.11", tree, "/v") is None
    assert "the tree was read from a base holding vLLM 0.31.0+nv25.11" in \
        build.installed_problem("b", "0.31.0+nv25.12", tree, "/v")


# ------------------------------------------------------------------------------ fingerprints

def test_the_fingerprint_is_config_and_layers_not_the_image_id():
    layers = ["sha256:" + "a" * 64]
    one = facts.fingerprint(Inspected("sha256:" + "9" * 64, tuple(layers),
                                      Platform("linux", "arm64"),
                                      config_digest="sha256:" + "1" * 64))
    # the engine's image id plays no part: only the config digest and the layers
    assert one == facts.fingerprint(Inspected("sha256:" + "8" * 64, tuple(layers),
                                              Platform("linux", "arm64"),
                                              config_digest="sha256:" + "1" * 64))
    assert one == layer.fingerprint_of("sha256:" + "1" * 64, layers)
    assert one.startswith("sha256:") and len(one) == 71
    assert one != layer.fingerprint_of("sha256:" + "1" * 64, ["sha256:" + "b" * 64])
    base = layer.BaseImage("b", "sha256:" + "9" * 64, None, None, {}, tuple(layers), ())
    assert base.fingerprint is None  # a store whose ids are not config digests
    assert layer.BaseImage("b", "sha256:" + "1" * 64, None, None, {}, tuple(layers), (),
                           config_digest="sha256:" + "1" * 64).fingerprint == one


def test_holds_names_the_commit_of_a_dev_build():
    holds = build.Holds.of("0.31.1.dev7+ge07dd6f9b", "git", "sha256:f")
    assert holds.to_dict() == {"installed": "0.31.1.dev7+ge07dd6f9b", "commit": "e07dd6f9b",
                               "source": "git", "fingerprint": "sha256:f",
                               "patchset_commit": None, "created": None}
    assert build.Holds.of("0.31.0+nv25.11", "image", None).commit is None


def test_rebase_refuses_a_pin_that_follows_the_base(tmp_path, monkeypatch):
    from patchkit.commands import rebase as rebase_cmd

    monkeypatch.setenv("PATCHKIT_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "patchset.yaml"
    path.write_text("name: t\nvllm:\n  repo: pypi\n  ref: base\nimage:\n  base: reg/vllm:1\n")
    with pytest.raises(UsageError, match="follows the base image instead"):
        rebase_cmd.start_at(path, "v0.33.0")
    path.write_text("name: t\nvllm:\n  repo: image\n  ref: v0.31.0\n")
    with pytest.raises(UsageError, match="follows the base image instead"):
        rebase_cmd.start_at(path, "v0.33.0")
    assert not (tmp_path / "cache").exists()


def test_build_image_text_says_what_the_image_holds():
    from patchkit.commands.build_image import BuildReport
    from patchkit.render import text

    report = BuildReport(mode="overlay", tag="reg/pk:e07dd6f9b",
                         image_id="sha256:" + "1" * 64, platform="linux/arm64",
                         base={"name": "reg/vllm:dev", "digest": "sha256:" + "2" * 64},
                         layer=build.LayerInfo(3, 10240, 2),
                         holds=build.Holds.of("0.31.1.dev7+ge07dd6f9b", "git",
                                              "sha256:" + "f" * 64))
    lines = text.build_image(report).splitlines()
    assert ("  holds: vLLM 0.31.1.dev7+ge07dd6f9b (commit e07dd6f9b), source git, fingerprint "
            "sha256:" + "f" * 64) in lines
    assert report.to_dict()["holds"]["commit"] == "e07dd6f9b"


def test_a_build_whose_copy_failed_is_not_ok_in_every_reading():
    """One ``ok``: the report's, its JSON's and the exit code's agree when a copy failed."""
    from patchkit.commands.build_image import BuildReport
    from patchkit.nodes.transfer import CopyReport, CopyStatus, TargetResult
    from patchkit.render import text

    copied = CopyReport("reg/pk:1", "sha256:" + "3" * 64,
                        [TargetResult("ssh://node2", CopyStatus.COPIED),
                         TargetResult("ssh://node3", CopyStatus.FAILED, error="no route")])
    report = BuildReport(mode="overlay", tag="reg/pk:1", image_id="sha256:" + "1" * 64,
                         platform="linux/arm64", copy=copied)
    assert report.built and not report.ok and report.to_dict()["ok"] is False
    assert text.build_image(report).splitlines()[-1] == (
        "FAILED: reg/pk:1 was built, but 1 of 2 copies failed")
    landed = CopyReport("reg/pk:1", "x", copied.targets[:1])
    whole = BuildReport(mode="overlay", tag="reg/pk:1", image_id="sha256:" + "1" * 64,
                        platform="linux/arm64", copy=landed)
    assert whole.ok and whole.to_dict()["ok"] is True
    unmade = BuildReport("the series did not apply (p failed)")
    assert not unmade.built and not unmade.ok and unmade.to_dict()["ok"] is False
