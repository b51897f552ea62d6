"""bisect --series on a real release: the image tests' three-patch series
(testing/imageproject.py) on vLLM 0.27.1 from PyPI, each prefix a full checkout of the real
tree; a CMD that looks in PATCHKIT_TREE for one patch's change, and one that skips a prefix."""

from __future__ import annotations

import json

import pytest
from testing import imageproject as ip
from testing import patchkit

from patchkit import manifest
from patchkit.commands import bisect_series as bs
from patchkit.run import Asked

pytestmark = pytest.mark.real_vllm

SERIES = ["draft-quant-config", "nvfp4-ds-mla-dtype", "draft-guard"]


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("real-series")
    ip.make_project(root, base="bisect-test/base:none", tag="bisect-test/series:{ref}")
    return root


def _script(path, body: str):
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def test_the_real_patch_that_makes_cmd_fail(project, real_vllm, tmp_path):
    cmd = _script(tmp_path / "dtype.sh",
                  f'grep -q nvfp4_ds_mla "$PATCHKIT_TREE/{ip.DTYPES}" && '
                  '{ echo "nvfp4_ds_mla is mapped"; exit 1; }\n'
                  f'test -f "$PATCHKIT_TREE/vllm/__init__.py" || exit 2\n')
    cp = patchkit("bisect", "--series", "--run", str(cmd), "--format", "json", cwd=project,
                  env=None)
    assert cp.returncode == 0, cp.stderr
    data = json.loads(cp.stdout)
    assert data["series"] == SERIES and data["vllm"]["version"] == ip.RELEASE
    assert data["first_bad"]["id"] == "nvfp4-ds-mla-dtype" and data["first_bad"]["position"] == 2
    runs = {r["patches"]: r for r in data["runs"]}
    assert runs[0]["outcome"] == "good" and runs[3]["outcome"] == "bad"
    assert runs[1]["outcome"] == "good" and runs[2]["outcome"] == "bad"
    assert "nvfp4_ds_mla is mapped" in runs[2]["output"]
    assert data["tested"] == len(data["runs"]) <= data["limit"] == 4
    assert not (project / ".patchkit").exists()


def test_a_real_prefix_skipped_by_exit_125(project, real_vllm, tmp_path):
    # 125 on the prefix of one patch (the spec marker in, the dtype not); draft-guard is bad
    cmd = _script(tmp_path / "guard.sh", f"""\
t="$PATCHKIT_TREE"
if grep -q {ip.MARK_SPEC} "$t/{ip.SPEC}" && ! grep -q nvfp4_ds_mla "$t/{ip.DTYPES}"; then
  exit 125
fi
test -f "$t/{ip.NEW}" && exit 1
exit 0
""")
    m = manifest.load(project / "patchset.yaml")
    r = bs.run(m, str(cmd), Asked())
    assert r.culprit.id == "draft-guard"
    assert [(x.patches, x.outcome) for x in r.runs] == [(0, "good"), (3, "bad"), (1, "skip"),
                                                         (2, "good")]
    assert len(r.runs) <= r.limit
