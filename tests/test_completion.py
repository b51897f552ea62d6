"""Shell completion through click's own protocol (what the scripts ``patchkit`` prints for
bash, zsh and fish ask for): verbs, flags, patch ids, variants, and the release tags the cache
holds; from a folder below the project too."""

from __future__ import annotations

import subprocess
import sys

import pytest
from testing import cli_env, patchkit
from testing.project import make_project


def complete(cwd, words: str, shell: str = "bash") -> list[str]:
    parts = words.split(" ")
    env = cli_env(COMP_WORDS=words, COMP_CWORD=str(len(parts) - 1),
                  _PATCHKIT_COMPLETE=f"{shell}_complete")
    p = subprocess.run([sys.executable, "-m", "patchkit"], cwd=cwd, env=env, text=True,
                       capture_output=True, check=False)
    assert p.returncode == 0, p.stderr
    return [line.split(",", 1)[1] for line in p.stdout.splitlines() if "," in line]


@pytest.fixture
def proj(tmp_path):
    proj = make_project(tmp_path)
    text = (proj / "patchset.yaml").read_text()
    text = text.replace("patches:\n", "variants:\n  diag: diagnostics\n  trace: tracing\n"
                                      "patches:\n", 1)
    (proj / "patchset.yaml").write_text(text)
    assert patchkit("apply", cwd=proj).returncode == 0   # the mirror, with its tags, cached
    return proj


def test_verbs_flags_ids_variants_and_tags(proj):
    assert "status" in complete(proj, "patchkit st")
    assert {"--discard", "--dry-run"} & set(complete(proj, "patchkit apply --d")) == {"--discard"}
    assert complete(proj, "patchkit bisect ") == ["table-nvfp4", "fast-mode", "extra-file"]
    assert complete(proj, "patchkit apply --variant ") == ["diag", "trace"]
    assert complete(proj, "patchkit rebase-check --to ") == ["v4", "v3", "v2", "v1"]
    assert complete(proj / ".patchkit/vllm/pkg", "patchkit apply --vllm-ref v") == \
        ["v4", "v3", "v2", "v1"]


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_each_shell_gets_a_script(proj, shell):
    p = subprocess.run([sys.executable, "-m", "patchkit"], cwd=proj, text=True,
                       env=cli_env(_PATCHKIT_COMPLETE=f"{shell}_source"), capture_output=True,
                       check=False)
    assert p.returncode == 0 and "_PATCHKIT_COMPLETE" in p.stdout, p.stderr


def test_completion_outside_a_project_offers_verbs_and_nothing_else(tmp_path):
    assert "apply" in complete(tmp_path, "patchkit a")
    assert complete(tmp_path, "patchkit bisect ") == []
