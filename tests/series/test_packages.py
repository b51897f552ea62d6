"""Packages beside vLLM in the manifest: declared, named by patches, ranges on them read.
Applying them is test_stack.py's."""

from __future__ import annotations

from testing import patchkit
from testing.flashinfer import PACKAGES
from testing.project import make_project

FI_DIFF = """\
--- a/flashinfer/x.py
+++ b/flashinfer/x.py
@@ -1,1 +1,1 @@
-a = 1
+a = 2
"""

FI_ENTRY = """\
  - id: fi-prefetch
    summary: prefetch the weights
    package: flashinfer
    diff: patches/fi.diff
    flashinfer: ">=0.6.15"
"""


def project(tmp_path, fast_range: str = '"<0.6.16"'):
    proj = make_project(tmp_path)
    (proj / "patches" / "fi.diff").write_text(FI_DIFF)
    text = (proj / "patchset.yaml").read_text().replace("patches:\n", PACKAGES)
    text = text.replace("    transform: patches/fast.py\n",
                        f"    transform: patches/fast.py\n    flashinfer: {fast_range}\n")
    (proj / "patchset.yaml").write_text(text + FI_ENTRY)
    return proj


def test_validate_reads_packages_and_ranges(tmp_path):
    proj = project(tmp_path)
    p = patchkit("validate", cwd=proj)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == ("patchset.yaml: ok (4 patches, 2 diffs parsed, 1 transform imported, "
                                "1 overlay listed, 3 assertions, vLLM v1, flashinfer v0.6.15)")


def test_validate_refuses_a_range_on_an_undeclared_package(tmp_path):
    proj = project(tmp_path)
    text = (proj / "patchset.yaml").read_text().replace("flashinfer: \"<0.6.16\"", 'triton: "<3"')
    (proj / "patchset.yaml").write_text(text)
    p = patchkit("validate", cwd=proj)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        "patchkit validate: error: patchset.yaml:21: patches[1] (id=fast-mode): triton: a range on "
        "package 'triton', which the manifest does not have (packages: vllm, flashinfer; "
        "declare it under packages:)"]


def test_validate_refuses_an_unknown_package(tmp_path):
    proj = project(tmp_path)
    text = (proj / "patchset.yaml").read_text().replace("package: flashinfer", "package: flash")
    (proj / "patchset.yaml").write_text(text)
    p = patchkit("validate", cwd=proj)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "patches[3] (id=fi-prefetch): package: unknown package 'flash'" in p.stderr


def test_a_package_read_from_the_base_is_pinned_base_unless_a_ref_is_given(tmp_path):
    from patchkit import manifest
    from patchkit.run import run_spec

    proj = project(tmp_path)
    path = proj / "patchset.yaml"
    text = path.read_text().replace("    repo: [pypi]\n    ref: v0.6.15\n", "    repo: image\n")
    path.write_text(text.replace("patches:\n", "image:\n  base: b:1\npatches:\n", 1))
    m = manifest.load(path)
    assert m.package("flashinfer").ref == "base"
    assert run_spec(m).pin("flashinfer").ref == "base"
    assert run_spec(m, refs=["flashinfer=v0.6.15"]).pin("flashinfer").ref == "v0.6.15"
    path.write_text(path.read_text().replace("    repo: image\n", "    repo: pypi\n"))
    p = patchkit("validate", cwd=proj)
    assert p.returncode == 2
    assert p.stderr.strip().endswith("packages.flashinfer: missing required key 'ref'"), p.stderr
