"""A real retirement: vLLM 0.32.0 removed the setting VLLM_ENGINE_ITERATION_TIMEOUT_S from
vllm/envs.py (0.31.0 has it at lines 26 and 805-806).  A patch that raises its default,
retired from v0.32.0, is proven there; retired from v0.31.0, where the setting is still there,
it is refused in one line naming what still exists."""

from __future__ import annotations

import json

import pytest
from testing import patchkit
from testing.upstream import make_diff, sh

from patchkit.source import pypi

pytestmark = pytest.mark.real_vllm

ENVS = "vllm/envs.py"
SETTING = "VLLM_ENGINE_ITERATION_TIMEOUT_S"


@pytest.fixture
def project(real_vllm, tmp_path):
    repo, tag = pypi.ensure_release(real_vllm, "v0.31.0")
    pypi.ensure_release(real_vllm, "v0.32.0")
    envs = sh("git", "show", f"{tag}:{ENVS}", cwd=repo) + "\n"
    assert f"    {SETTING}: int = 60\n" in envs
    raised = envs.replace(f"    {SETTING}: int = 60\n", f"    {SETTING}: int = 1800\n").replace(
        f'os.environ.get("{SETTING}", "60")', f'os.environ.get("{SETTING}", "1800")')
    proj = tmp_path / "proj"
    (proj / "patches").mkdir(parents=True)
    (proj / "patches/timeout.diff").write_text(make_diff(envs, raised, ENVS))
    (proj / "patchset.yaml").write_text(
        "name: real\nvllm:\n  repo: pypi\n  ref: v0.31.0\npatches:\n"
        "  - id: engine-timeout\n    summary: a longer engine iteration timeout\n"
        "    diff: patches/timeout.diff\n"
        '    retired: {from: v0.32.0, why: "vLLM removed the setting"}\n')
    return proj


def test_the_removal_proves_the_retirement_and_the_release_before_refuses_it(project):
    p = patchkit("rebase-check", "--to", "v0.32.0", "--format", "json", cwd=project)
    assert p.returncode == 0, p.stdout + p.stderr
    data = json.loads(p.stdout)
    (row,) = data["patches"]
    assert (row["pin_status"], row["status"], row["fate"]) == (
        "applied", {"v0.32.0": "skipped"}, {"v0.32.0": "retired"})
    why = data["targets"][0]["patches"][0]["fate"]["why"]
    assert why == ("retired from v0.32.0 (vLLM removed the setting); proven at v0.32.0: "
                   f"vllm/envs.py: the line hunk 1 changes is gone (`{SETTING}: int = 60`); "
                   "vllm/envs.py: the line hunk 2 changes is gone "
                   f'(`os.environ.get("{SETTING}", "60")`)')   # as docs/porting.md shows it
    # the release before the removal still has it: the retirement is refused, naming it
    text = (project / "patchset.yaml").read_text()
    (project / "patchset.yaml").write_text(text.replace("from: v0.32.0", "from: v0.31.0"))
    p = patchkit("rebase-check", "--to", "v0.31.0", cwd=project)
    assert p.returncode == 1
    assert (f"  engine-timeout @ v0.31.0: engine-timeout is retired from v0.31.0, but v0.31.0 "
            f"still has its code: {ENVS} still has `{SETTING}: int = 60` (hunk 1)"
            ) in p.stdout.splitlines()
