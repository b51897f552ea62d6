"""A patchset project on disk, against a fixture upstream, for engine and CLI tests."""

from __future__ import annotations

from pathlib import Path

from testing.upstream import dedent, make_diff, make_upstream

MOD_V1 = """\
\"\"\"A module of the fixture upstream.\"\"\"

import os

TABLE = {
    "fp8": 1,
}


class Config:
    def setup(self):
        self.mode = "plain"
        return self.mode


def helper(x):
    return x + 1
"""
# v2 moves helper down (offset for diff 1's hunk after it), v3 takes diff 1 upstream,
# v4 rewrites setup() so diff 2 conflicts
MOD_V2 = "# header added upstream\n# another\n" + MOD_V1
MOD_V3 = MOD_V2.replace('    "fp8": 1,\n', '    "fp8": 1,\n    "nvfp4": 2,\n')
MOD_V4 = MOD_V3.replace('        self.mode = "plain"\n', '        self.mode = compute()\n')

TRANSFORM = '''\
import libcst as cst
import libcst.matchers as m
from patchkit.transform import Transform


class Fast(Transform):
    path = "pkg/mod.py"

    def postcondition(self, module):
        return self.has(module, m.SimpleString('"fast"'))

    def transform(self, module):
        old = self.anchor(module, m.SimpleString('"plain"'), 'the "plain" mode')
        return module.deep_replace(old, cst.SimpleString('"fast"'))
'''

MANIFEST = """\
name: demo
vllm:
  repo: {repo}   # the fixture upstream
  ref: v1
patches:
  - id: table-nvfp4
    summary: add nvfp4 to the table
    diff: patches/table.diff
    verify:
      - file: pkg/mod.py
        in: TABLE
        has_key: nvfp4
  - id: fast-mode
    summary: make the mode fast
    transform: patches/fast.py
    verify:
      - file: pkg/mod.py
        in: Config.setup
        contains: fast
  - id: extra-file
    summary: add a new module
    overlay: overlays/extra
    verify:
      - file: pkg/extra.py
        defines: EXTRA
"""


def make_project(tmp: Path, manifest: str = MANIFEST, **fmt) -> Path:
    up = make_upstream(tmp / "upstream", {"v1": {"pkg/mod.py": MOD_V1},
                                          "v2": {"pkg/mod.py": MOD_V2},
                                          "v3": {"pkg/mod.py": MOD_V3},
                                          "v4": {"pkg/mod.py": MOD_V4}})
    proj = tmp / "proj"
    (proj / "patches").mkdir(parents=True)
    (proj / "overlays/extra/pkg").mkdir(parents=True)
    (proj / "patches/table.diff").write_text(
        make_diff(MOD_V1, MOD_V1.replace('    "fp8": 1,\n', '    "fp8": 1,\n    "nvfp4": 2,\n'),
                  "pkg/mod.py"))
    (proj / "patches/fast.py").write_text(TRANSFORM)
    (proj / "overlays/extra/pkg/extra.py").write_text("EXTRA = 1\n")
    (proj / "patchset.yaml").write_text(dedent(manifest).format(repo=up, **fmt))
    return proj
