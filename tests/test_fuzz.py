"""Malformed manifests, patches and transforms thrown at ``patchkit validate`` and ``apply``, in
this process, from a fixed seed: whatever the input, the answer is an exit code of the contract
(0, 1 or 2; never 3, "unexpected error"), no traceback, an error in one short line, and JSON
that stays JSON.  Bounded in count and in time; the inputs that once failed are in the lists
below by name, and the mutations around them are drawn at random.
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path

import pytest

from patchkit import cli
from testing.project import MANIFEST, TRANSFORM, make_project, table_diff

SEED = 41
MANIFESTS = 160     # drawn manifests for validate
PATCHES = 12        # drawn patch files for apply, besides the listed ones
BUDGET = 12.0       # seconds of each test: the draws stop there, whatever is left

LONG_NAME = "a" * 300
HUGE = "h" * 100_000

# values that once ended in exit 3 or in a line of 100 KB, and their neighbours
VALUES = [
    HUGE, f"patches/{LONG_NAME}.diff", f"{LONG_NAME}/x", "x\0y", "\x85", "\ufeff", "\x1b[31m",
    "../../etc/passwd", "/etc/passwd", ".git/config", "~", "-rf", "", " ", "null", "~/x",
    "0x10", "1e309", "-.inf", ".nan", "2001-01-01", "yes", "on", "!!binary AAAA",
    "!!python/object:os.system ls", "*undefined", "&a x", "[", "{", "'", '"', "|", ">",
    "%YAML 9.9", "---", "...", "@x", "`x`", "v1" * 600, "é" * 5000, "\t", "a: b",
]
# whole documents that once failed, or that hit YAML's odd corners
DOCUMENTS = [
    "a: &a [*a]\n",
    "x: " + "[" * 5000 + "]" * 5000 + "\n",
    "- " * 2000 + "x\n",
    "name: demo\nvllm: &v {repo: x, ref: v1}\n" + "".join(f"k{i}: &k{i} [*v, *v]\n"
                                                     for i in range(30)),
    "\0",
    "name: demo\n" + "#" * (2 << 20),
    ":" * 1000,
    "\ufeffname: demo\n",
    "name: demo\nvllm:\n  repo: x\n  ref: v1\npatches:\n" + "  - id: p\n" * 3000,
]


def _mutated(rng: random.Random, text: str) -> str:
    """``text`` changed in one to three ways drawn at random."""
    lines = text.splitlines(keepends=True)
    for _ in range(rng.randint(1, 3)):
        how = rng.randrange(9)
        at = rng.randrange(len(lines)) if lines else 0
        if not lines:
            lines = [rng.choice(VALUES) + "\n"]
        elif how == 0:      # a value replaced
            line = lines[at]
            if ": " in line:
                key = line.split(": ", 1)[0]
                lines[at] = f"{key}: {rng.choice(VALUES)}\n"
        elif how == 1:      # a line dropped
            del lines[at]
        elif how == 2:      # a line twice
            lines.insert(at, lines[at])
        elif how == 3:      # a line moved
            lines.insert(rng.randrange(len(lines)), lines.pop(at))
        elif how == 4:      # indentation changed
            lines[at] = " " * rng.choice([0, 1, 3, 8]) + lines[at].lstrip(" ")
        elif how == 5:      # bytes flipped
            line = list(lines[at])
            for _ in range(rng.randint(1, 4)):
                if line:
                    line[rng.randrange(len(line))] = chr(rng.choice([0, 9, 10, 34, 39, 58, 91,
                                                                      123, 0x85, 0xfeff,
                                                                      rng.randrange(32, 127)]))
            lines[at] = "".join(line)
        elif how == 6:      # cut short
            return "".join(lines)[:rng.randrange(len("".join(lines)) + 1)]
        elif how == 7:      # a value made another type
            line = lines[at]
            if ": " in line:
                key = line.split(": ", 1)[0]
                lines[at] = f"{key}: {rng.choice(['[]', '{}', '[a, b]', '{a: 1}', '1', '1.5', 'true', '~', '2020-01-01'])}\n"
        else:               # a key nobody knows, or one of the kinds twice
            lines.insert(at, rng.choice(["  - id: x\n", "    diff: patches/table.diff\n",
                                         "    transform: patches/fast.py\n", "unknown: 1\n",
                                         "    verify: []\n", "  <<: *nothing\n"]))
    return "".join(lines)


def _run(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def _holds(code: int, out: str, err: str, fmt: str, what: str) -> None:
    assert code in (0, 1, 2), f"{what}: exit {code}\n{err[-2000:]}"
    assert "Traceback" not in err, f"{what}\n{err[-2000:]}"
    if code == 2:
        last = err.strip().splitlines()[-1]
        assert last.startswith("patchkit "), f"{what}: {last[:300]}"
        assert len(last) < 1000, f"{what}: a line of {len(last)} characters"
    if fmt == "json":
        json.loads(out)   # JSON stays JSON, whatever happened


@pytest.fixture
def project(tmp_path, monkeypatch):
    proj = make_project(tmp_path)
    monkeypatch.chdir(proj)
    return proj


def test_malformed_manifests(project, capsys):
    rng = random.Random(SEED)
    good = (project / "patchset.yaml").read_text()
    (project / "patches/zero.diff").symlink_to("/dev/zero")
    (project / "patches/folder.diff").mkdir()
    drawn = [*DOCUMENTS, *(good.replace("repo: ", f"repo: {v}#", 1) for v in VALUES[:4]),
             *(good.replace("ref: v1", f"ref: {v}") for v in VALUES[:6])]
    drawn += [_mutated(rng, good) for _ in range(MANIFESTS)]
    deadline = time.monotonic() + BUDGET
    tried = 0
    for n, text in enumerate(drawn):
        if time.monotonic() > deadline:
            break
        (project / "patchset.yaml").write_bytes(text.encode("utf-8", "surrogatepass"))
        fmt = "json" if n % 2 else "text"
        _holds(*_run(capsys, "validate", "--format", fmt), fmt, f"manifest #{n}: {text[:300]!r}")
        tried += 1
    print(f"{tried} of {len(drawn)} manifests tried")
    assert tried >= len(DOCUMENTS) + 10


def test_a_manifest_that_is_no_regular_file(project, capsys):
    for target in ("/dev/zero", "/dev/null", str(project / "patches")):
        (project / "patchset.yaml").unlink()
        os.symlink(target, project / "patchset.yaml")
        code, out, err = _run(capsys, "validate", "--format", "json")
        _holds(code, out, err, "json", target)
        assert code == 2


PATCH_TEXTS = [
    "", "\0" * 10, "not a diff\n", "--- a/x\n", "diff --git a/x b/x\n", "@@ -1 +1 @@\n",
    f"--- a/pkg/{LONG_NAME}.py\n+++ b/pkg/{LONG_NAME}.py\n@@ -1 +1 @@\n-x\n+y\n",
    "--- a/../../x\n+++ b/../../x\n@@ -1 +1 @@\n-x\n+y\n",
    "--- /dev/null\n+++ b/.git/hooks/pre-commit\n@@ -0,0 +1 @@\n+x\n",
    "--- a/pkg/mod.py\n+++ b/pkg/mod.py\n@@ -99999999999999999999 +1 @@\n-x\n+y\n",
    "--- a/pkg/mod.py\n+++ b/pkg/mod.py\n@@ -1,3 +1,3 @@\n" + "-x\n" * 50,
    "GIT binary patch\nliteral 5\nMcmZ?\n",
]
TRANSFORM_TEXTS = [
    "raise GeneratorExit\n", "raise SystemExit(3)\n", "raise KeyboardInterrupt\n",
    "import os\nos._exit(9)\n", "x = (\n", "\0", "class T: pass\n",
    TRANSFORM.replace("return module.deep_replace", "raise GeneratorExit\n        return 1 #"),
    TRANSFORM.replace("return module.deep_replace", "raise ValueError('v' * 100000)\n        #"),
    TRANSFORM.replace("return module.deep_replace", "return 5  #"),
    TRANSFORM.replace("def postcondition(self, module):",
                      "def postcondition(self, module):\n        raise MemoryError"),
    TRANSFORM.replace('path = "pkg/mod.py"', f'path = "pkg/{LONG_NAME}.py"'),
    TRANSFORM.replace('path = "pkg/mod.py"', 'path = "/etc/passwd"'),
    TRANSFORM.replace('path = "pkg/mod.py"', 'path = None'),
]


def test_malformed_patches_and_transforms(project, capsys):
    """Each drawn patch file in place of the series' diff or transform: validate and apply
    hold, and a failed apply leaves no workdir behind."""
    rng = random.Random(SEED)
    diff, transform = table_diff(), TRANSFORM
    listed = [("patches/fast.py", t) for t in TRANSFORM_TEXTS] + \
        [("patches/table.diff", t) for t in PATCH_TEXTS]
    mutated = [("patches/table.diff", _mutated(rng, diff)) for _ in range(PATCHES // 2)] + \
        [("patches/fast.py", _mutated(rng, transform)) for _ in range(PATCHES // 2)]
    rng.shuffle(listed)   # the same order every run; each kind early
    drawn = listed + mutated
    deadline = time.monotonic() + BUDGET
    tried = 0
    for n, (rel, text) in enumerate(drawn):
        if time.monotonic() > deadline:
            break
        tried += 1
        (project / "patches/table.diff").write_text(diff)
        (project / "patches/fast.py").write_text(transform)
        (project / rel).write_bytes(text.encode("utf-8", "surrogatepass"))
        what = f"{rel} #{n}: {text[:300]!r}"
        _holds(*_run(capsys, "validate"), "text", what)
        code, out, err = _run(capsys, "apply", "--timeout", "10", "--workdir", f"wd{n}",
                              "--format", "json")
        _holds(code, out, err, "json", what)
        if code != 0:
            assert not (project / f"wd{n}").exists(), what
    print(f"{tried} of {len(drawn)} patch files tried")
    assert tried >= 5


def test_the_manifest_once_failing_is_in_the_draws():
    """The fuzzing's finds stay in the lists above (a guard against trimming them away)."""
    assert any(len(v) == 100_000 for v in VALUES) and "x\0y" in VALUES
    assert any("GeneratorExit" in t for t in TRANSFORM_TEXTS)
    assert MANIFEST  # the engine project's manifest is the one mutated
