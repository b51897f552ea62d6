"""A patch to compiled code that the package's source does not hold (vLLM's csrc against a
source laid out from a wheel) is one line at validate and at apply: it needs a source build."""

from __future__ import annotations

from pathlib import Path

from testing import one_error, patchkit, snapshot
from testing.project import make_project

CSRC_DIFF = """\
--- a/csrc/moe/topk_softmax_kernels.cu
+++ b/csrc/moe/topk_softmax_kernels.cu
@@ -1,3 +1,3 @@
 #include <cuda.h>
-constexpr int kMaxExperts = 256;
+constexpr int kMaxExperts = 512;
 // end
"""

ENTRY = """\
  - id: moe-more-experts
    summary: let the top-k softmax kernel take 512 experts
    diff: patches/csrc.diff
"""


def _project(tmp_path: Path, repo: str | None) -> Path:
    proj = make_project(tmp_path)
    (proj / "patches" / "csrc.diff").write_text(CSRC_DIFF)
    text = (proj / "patchset.yaml").read_text() + ENTRY
    if repo is not None:
        lines = [f"  repo: {repo}" if ln.startswith("  repo: ") else ln
                 for ln in text.splitlines()]
        text = "\n".join(lines) + "\n"
    (proj / "patchset.yaml").write_text(text)
    return proj


def _line_of(proj: Path, needle: str) -> int:
    return next(n for n, ln in enumerate((proj / "patchset.yaml").read_text().splitlines(), 1)
                if needle in ln)


WHY = ("csrc/moe/topk_softmax_kernels.cu is compiled code not in vLLM's source ({src}: it "
       "holds vllm/ as the package installs it, no build tree); a change to it needs a source "
       "build of vLLM from a git repository")


def test_validate_refuses_csrc_against_a_wheel_source(tmp_path):
    proj = _project(tmp_path, "[pypi, image]")
    p = patchkit("validate", cwd=proj)
    assert p.returncode == 2, p.stderr
    line = _line_of(proj, "- id: moe-more-experts")
    index = (proj / "patchset.yaml").read_text().count("  - id: ") - 1
    assert one_error(p) == (f"patchkit validate: error: patchset.yaml:{line}: patches[{index}] "
                            f"(id=moe-more-experts): " + WHY.format(src="pypi or image"))


def test_apply_refuses_it_before_anything_is_fetched_or_made(tmp_path):
    proj = _project(tmp_path, "pypi")
    before = snapshot(proj)
    p = patchkit("apply", cwd=proj)
    assert p.returncode == 2, p.stderr
    assert one_error(p) == "patchkit apply: error: patch moe-more-experts: " + WHY.format(src="pypi")
    assert snapshot(proj) == before and not (proj / ".patchkit" / "vllm").exists()
    assert "downloading" not in p.stderr


def test_a_wheel_source_named_on_the_command_line_is_refused_too(tmp_path):
    proj = _project(tmp_path, None)          # the manifest's own source is a git repository
    assert patchkit("validate", cwd=proj).returncode == 0
    p = patchkit("apply", "--vllm-repo", "pypi", "--vllm-ref", "v0.27.1", cwd=proj)
    assert p.returncode == 2, p.stderr
    assert one_error(p) == "patchkit apply: error: patch moe-more-experts: " + WHY.format(src="pypi")


def test_a_git_source_takes_the_patch_to_its_kind(tmp_path):
    # with a build tree the patch is the diff kind's to judge: the fixture has no csrc, so it
    # fails as a patch (exit 1), not as a usage error
    proj = _project(tmp_path, None)
    p = patchkit("apply", cwd=proj)
    assert p.returncode == 1, p.stderr
    assert "moe-more-experts" in p.stdout
