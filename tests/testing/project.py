"""Patchset projects on disk against fixture upstreams, for the engine, CLI, rebase and export
tests, and the held patch that keeps a run inside the series while a test interrupts it.

``make_project`` is the engine's project: a diff, a transform and an overlay on a one-module
upstream with releases v1 to v4.  ``make_fates`` is the rebase tests' project, whose later
releases give every fate (below).  Both write their files through ``write_project``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from testing.upstream import commit, dedent, make_diff, make_upstream, sh, write_files


def add_nvfp4(text: str) -> str:
    """The fixture module with nvfp4 in its table: what the table diff does."""
    return text.replace('    "fp8": 1,\n', '    "fp8": 1,\n    "nvfp4": 2,\n')


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
MOD_V3 = add_nvfp4(MOD_V2)
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
# the same with GitHub's vLLM behind the fixture upstream: a source add-pr can fetch a PR from
GH_MANIFEST = MANIFEST.replace("  repo: {repo}   # the fixture upstream\n",
                               "  repo: [{repo}, https://github.com/vllm-project/vllm.git]  # mirror first\n")


def write_project(proj: Path, files: Mapping[str, str], manifest: str) -> Path:
    """The project folder ``proj``: its patch files and its patchset.yaml."""
    write_files(proj, {**files, "patchset.yaml": manifest})
    return proj


def table_diff() -> str:
    return make_diff(MOD_V1, add_nvfp4(MOD_V1), "pkg/mod.py")


def make_project(tmp: Path, manifest: str = MANIFEST, **fmt) -> Path:
    up = make_upstream(tmp / "upstream", {"v1": {"pkg/mod.py": MOD_V1},
                                          "v2": {"pkg/mod.py": MOD_V2},
                                          "v3": {"pkg/mod.py": MOD_V3},
                                          "v4": {"pkg/mod.py": MOD_V4}})
    return write_project(tmp / "proj", {"patches/table.diff": table_diff(),
                                        "patches/fast.py": TRANSFORM,
                                        "overlays/extra/pkg/extra.py": "EXTRA = 1\n"},
                         dedent(manifest).format(repo=up, **fmt))


# ------------------------------------------------------------------------------ the fates
#
# make_fates: a patchset pinned at v1.0.0 of a fixture upstream whose later releases give
# every fate.
#
# On v1.1.0, v1.2.0, v1.3.0:
#
#     table-nvfp4   applied (offset)  upstream        upstream       (upstream since v1.2.0, a PR)
#     fast-mode     applied           applied         anchor-missing
#     other-fix     applied           conflict        conflict
#     conf-overlay  applied           applied         overlay-drift
#     legacy        skipped           skipped         skipped
#     already-in    upstream          upstream        upstream       (upstream everywhere: drop)
#
# Tags v0.9.0 (older than the pin), v1.4.0rc1 (a pre-release) and nightly (no release) test the
# release listing.

# the fixture module's releases are the engine project's own
MOD, MOD_HEADER, MOD_NVFP4, MOD_COMPUTE = MOD_V1, MOD_V2, MOD_V3, MOD_V4

UTIL = "def util():\n    return 0\n"
UTIL2 = UTIL + "\n\ndef util2():\n    return 2\n"

OTHER = "def compute(a, b):\n    total = a + b\n    return total\n"
OTHER_FIXED = OTHER.replace("a + b", "a + b + 1")
OTHER_V12 = OTHER.replace("a + b", "a * b")
OTHER_RESOLVED = OTHER.replace("a + b", "a * b + 1")

CONF = "SETTING = 1\n"
CONF_V13 = "SETTING = 1\nOTHER = 3\n"
CONF_OURS = "SETTING = 2\n"
CONF_OURS_V13 = "SETTING = 2\nOTHER = 3\n"

# what a person writes once v1.3.0 computes the mode
TRANSFORM_V13 = TRANSFORM.replace("""m.SimpleString('"plain"'), 'the "plain" mode'""",
                                  """m.Call(func=m.Name("compute")), 'the compute() call'""")

PULL = "https://github.com/vllm-project/vllm/pull/4242"

FATES_MANIFEST = """\
# The fixture series.  This comment, and the ones below, must survive every rewrite.
name: fates
vllm:
  repo: {repo}   # the fixture upstream
  ref: v1.0.0    # the pin
image:
  base: example/vllm:v1.0.0
patches:
  # --- a diff that drifts, then lands upstream
  - id: table-nvfp4
    summary: add nvfp4 to the table
    upstream: {pull}
    diff: patches/table.diff
    verify:
      - file: pkg/mod.py
        in: TABLE
        has_key: nvfp4

  - id: fast-mode
    summary: make the mode fast
    transform: patches/fast.py   # libcst
    verify:
      - file: pkg/mod.py
        in: Config.setup
        contains: fast

  - id: other-fix
    summary: add one
    diff: patches/other.diff

  - id: conf-overlay
    summary: our settings
    overlay: overlays/conf
    replaces:
      pkg/conf.py: {conf_blob}
    verify:
      - file: pkg/conf.py
        defines: SETTING

  - id: legacy
    summary: only for old releases
    diff: patches/legacy.diff
    vllm: "<1.0"

  - id: already-in
    summary: add util2
    diff: patches/util2.diff
"""



def make_fates(tmp: Path) -> Path:
    """The upstream at tmp/upstream and the project at tmp/proj (a git repo, committed)."""
    up = make_upstream(tmp / "upstream", {
        "v1.0.0": {"pkg/mod.py": MOD, "pkg/util.py": UTIL, "pkg/other.py": OTHER,
                   "pkg/conf.py": CONF},
        "v0.9.0": {},
        "v1.1.0": {"pkg/mod.py": MOD_HEADER, "pkg/util.py": UTIL2},
        "v1.2.0": {"pkg/mod.py": MOD_NVFP4, "pkg/other.py": OTHER_V12},
        "nightly": {},
        "v1.3.0": {"pkg/mod.py": MOD_COMPUTE, "pkg/conf.py": CONF_V13},
        "v1.4.0rc1": {"pkg/new.py": "NEW = 1\n"},
    })
    conf_blob = sh("git", "rev-parse", "v1.0.0:pkg/conf.py", cwd=up)
    proj = write_project(tmp / "proj", {
        "patches/table.diff": table_diff(),
        "patches/fast.py": TRANSFORM,
        "patches/other.diff": make_diff(OTHER, OTHER_FIXED, "pkg/other.py"),
        "patches/legacy.diff": make_diff(UTIL, "# legacy\n" + UTIL, "pkg/util.py"),
        "patches/util2.diff": make_diff(UTIL, UTIL2, "pkg/util.py"),
        "overlays/conf/pkg/conf.py": CONF_OURS,
        ".gitignore": "/.patchkit/\n__pycache__/\n",
    }, dedent(FATES_MANIFEST).format(repo=up, pull=PULL, conf_blob=conf_blob))
    sh("git", "init", "-q", "-b", "main", str(proj))
    commit(proj, "the series")
    return proj


def snapshot(proj: Path) -> dict[str, bytes]:
    """Every file of the project but git's and patchkit's own, by path."""
    return {p.relative_to(proj).as_posix(): p.read_bytes() for p in proj.rglob("*")
            if p.is_file() and ".git" not in p.parts and ".patchkit" not in p.parts
            and "__pycache__" not in p.parts}


# ------------------------------------------------------------------------------ the held patch

SLOW_TRANSFORM = '''\
import os
import time
from pathlib import Path

import libcst as cst
from patchkit.transform import Transform


class Slow(Transform):
    path = "{path}"
    pure = False   # it waits on the test's word: run it every time

    def postcondition(self, module):
        return "# slow" in module.code

    def transform(self, module):
        hold = os.environ.get("PK_TEST_HOLD")
        if hold:  # say so, then wait for the test's word to go on
            Path(hold, f"running.{{os.getpid()}}").touch()
            deadline = time.monotonic() + 120
            while not Path(hold, "go").exists() and time.monotonic() < deadline:
                time.sleep(0.01)
        return cst.parse_module(module.code + "# slow\\n")
'''
SLOW_ENTRY = "  - id: slow\n    summary: takes a while\n    transform: patches/slow.py\n"


def add_slow(proj: Path, path: str = "pkg/util.py", before: str | None = None) -> None:
    """A patch ``slow`` on ``path``, last in the series or before the patch ``before``, that
    waits inside the run while a ``Hold`` holds it (and else does its edit at once).  Committed
    when the project is a git repo."""
    (proj / "patches/slow.py").write_text(SLOW_TRANSFORM.format(path=path))
    text = (proj / "patchset.yaml").read_text()
    if before is None:
        text += SLOW_ENTRY
    else:
        anchor = f"  - id: {before}\n"
        assert text.count(anchor) == 1, before
        text = text.replace(anchor, SLOW_ENTRY + anchor)
    (proj / "patchset.yaml").write_text(text)
    if (proj / ".git").exists():
        commit(proj, "slow")


class Hold:
    """Keeps patchkit runs inside their ``slow`` patch until the test lets them go on: each run
    that reaches the patch says so with a file under ``folder`` and waits for ``release()``.  A
    signal sent between ``wait()`` and ``release()`` lands mid-run, without a guess at timing."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    @property
    def env(self) -> dict[str, str]:
        return dict(os.environ, PK_TEST_HOLD=str(self.folder))

    def wait(self, proc, count: int = 1) -> None:
        """Until ``count`` processes of the run ``proc`` are inside the patch."""
        deadline = time.monotonic() + 120
        while len(list(self.folder.glob("running.*"))) < count:
            if proc.poll() is not None:
                _, err = proc.communicate()
                pytest.fail(f"patchkit ended ({proc.returncode}) before the held patch: {err}")
            if time.monotonic() > deadline:
                pytest.fail("patchkit did not reach the held patch")
            time.sleep(0.01)

    def release(self) -> None:
        (self.folder / "go").touch()
