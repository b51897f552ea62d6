"""A patchset pinned at v1.0.0 of a fixture upstream whose later releases give every fate.

On v1.1.0, v1.2.0, v1.3.0:

    table-nvfp4   applied (offset)  upstream        upstream       (upstream since v1.2.0, a PR)
    fast-mode     applied           applied         anchor-missing
    other-fix     applied           conflict        conflict
    conf-overlay  applied           applied         overlay-drift
    legacy        skipped           skipped         skipped
    already-in    upstream          upstream        upstream       (upstream everywhere: drop)

Tags v0.9.0 (older than the pin), v1.4.0rc1 (a pre-release) and nightly (no release) test the
release listing.
"""

from __future__ import annotations

from pathlib import Path

from testing.upstream import dedent, make_diff, make_upstream, sh
from testing.project import MOD_V1, MOD_V2, MOD_V3, MOD_V4, TRANSFORM

# the fixture module's releases are the engine tests' own
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

MANIFEST = """\
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
    proj = tmp / "proj"
    (proj / "patches").mkdir(parents=True)
    (proj / "overlays/conf/pkg").mkdir(parents=True)
    (proj / "patches/table.diff").write_text(make_diff(
        MOD, MOD.replace('    "fp8": 1,\n', '    "fp8": 1,\n    "nvfp4": 2,\n'), "pkg/mod.py"))
    (proj / "patches/fast.py").write_text(TRANSFORM)
    (proj / "patches/other.diff").write_text(make_diff(OTHER, OTHER_FIXED, "pkg/other.py"))
    (proj / "patches/legacy.diff").write_text(make_diff(UTIL, "# legacy\n" + UTIL, "pkg/util.py"))
    (proj / "patches/util2.diff").write_text(make_diff(UTIL, UTIL2, "pkg/util.py"))
    (proj / "overlays/conf/pkg/conf.py").write_text(CONF_OURS)
    conf_blob = sh("git", "rev-parse", "v1.0.0:pkg/conf.py", cwd=up)
    (proj / "patchset.yaml").write_text(dedent(MANIFEST).format(repo=up, pull=PULL,
                                                                conf_blob=conf_blob))
    (proj / ".gitignore").write_text("/.patchkit/\n__pycache__/\n")
    sh("git", "init", "-q", "-b", "main", str(proj))
    sh("git", "add", "-A", cwd=proj)
    sh("git", "commit", "-qm", "the series", cwd=proj)
    return proj


def snapshot(proj: Path) -> dict[str, bytes]:
    """Every file of the project but git's and patchkit's own, by path."""
    return {p.relative_to(proj).as_posix(): p.read_bytes() for p in proj.rglob("*")
            if p.is_file() and ".git" not in p.parts and ".patchkit" not in p.parts
            and "__pycache__" not in p.parts}


SLOW_TRANSFORM = '''\
import os
import time

import libcst as cst
from patchkit.transform import Transform


class Slow(Transform):
    path = "pkg/util.py"

    def postcondition(self, module):
        return "# slow" in module.code

    def transform(self, module):
        time.sleep(float(os.environ.get("SLOW", "0")))
        return cst.parse_module(module.code + "# slow\\n")
'''


def add_slow(proj: Path) -> None:
    """A last patch that sleeps $SLOW seconds: time to send a signal mid-run."""
    (proj / "patches/slow.py").write_text(SLOW_TRANSFORM)
    with open(proj / "patchset.yaml", "a") as fh:
        fh.write("  - id: slow\n    summary: takes a while\n    transform: patches/slow.py\n")
    sh("git", "add", "-A", cwd=proj)
    sh("git", "commit", "-qm", "slow", cwd=proj)
