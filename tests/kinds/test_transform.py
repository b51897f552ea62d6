from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from patchkit.kinds import transform as kind
from patchkit.transform import run_transform_file

HEADER = """\
import libcst as cst
import libcst.matchers as m
from patchkit.transform import Transform
"""

RENAME = HEADER + '''
class UseB12x(Transform):
    path = "pkg/spec.py"

    def postcondition(self, module):
        return self.has(module, m.SimpleString('"b12x"'))

    def transform(self, module):
        fn = self.scope(module, "Spec.backend")
        old = self.anchor(fn, m.SimpleString('"flashinfer_b12x"'), "the backend default")
        return module.deep_replace(old, old.with_changes(value='"b12x"'))
'''


def run(tmp_path: Path, code: str, files: dict[str, str]):
    root = tmp_path / "tree"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(text))
    t = tmp_path / "t.py"
    t.write_text(code)
    return run_transform_file(t, root, None, KEPT()), root


def KEPT():  # noqa: N802
    """Where the results are kept: the test's cache, as a run names it."""
    from patchkit.cache import cache_dir

    return cache_dir()


def assert_transform(tmp_path, code, before, after):
    """before -> after, and a second run on the output is `upstream` and changes nothing."""
    out, root = run(tmp_path, code, {"pkg/spec.py": before})
    assert (out.status, out.reason) == ("applied", None), out.message
    assert (root / "pkg/spec.py").read_text() == textwrap.dedent(after)
    again = run_transform_file(tmp_path / "t.py", root, None)
    assert again.status == "upstream"
    assert (root / "pkg/spec.py").read_text() == textwrap.dedent(after)


def test_keeps_comments_and_odd_formatting(tmp_path):
    assert_transform(tmp_path, RENAME, """\
        class Spec:
            def backend(self):   # odd spacing stays
                return (
                    "flashinfer_b12x"    # the default
                )  ;  x = 1
        """, """\
        class Spec:
            def backend(self):   # odd spacing stays
                return (
                    "b12x"    # the default
                )  ;  x = 1
        """)


def test_postcondition_before_means_upstream_and_nothing_written(tmp_path):
    src = 'class Spec:\n    def backend(self):\n        return "b12x"\n'
    out, root = run(tmp_path, RENAME, {"pkg/spec.py": src})
    assert out.status == "upstream"
    assert (root / "pkg/spec.py").read_text() == src


def test_anchor_missing(tmp_path):
    out, _ = run(tmp_path, RENAME, {"pkg/spec.py": 'class Spec:\n    def backend(self):\n        return "cutlass"\n'})
    assert (out.status, out.reason) == ("failed", "anchor-missing")
    assert "the backend default" in out.message


def test_scope_missing_is_anchor_missing(tmp_path):
    out, _ = run(tmp_path, RENAME, {"pkg/spec.py": 'class Other:\n    pass\n'})
    assert (out.status, out.reason) == ("failed", "anchor-missing")
    assert "Spec" in out.message


def test_ambiguous_anchor_writes_nothing(tmp_path):
    src = ('class Spec:\n    def backend(self, a):\n        if a:\n            return "flashinfer_b12x"\n'
           '        return "flashinfer_b12x"\n')
    out, root = run(tmp_path, RENAME, {"pkg/spec.py": src})
    assert (out.status, out.reason) == ("failed", "ambiguous-anchor")
    assert "2 places" in out.message
    assert (root / "pkg/spec.py").read_text() == src


def test_file_missing_is_anchor_missing(tmp_path):
    out, _ = run(tmp_path, RENAME, {"pkg/other.py": "x = 1\n"})
    assert (out.status, out.reason) == ("failed", "anchor-missing")
    assert "pkg/spec.py does not exist" in out.message


def test_postcondition_must_hold_after(tmp_path):
    code = RENAME.replace("value='\"b12x\"'", "value='\"cutlass\"'")
    out, _ = run(tmp_path, code, {"pkg/spec.py": 'class Spec:\n    def backend(self):\n        return "flashinfer_b12x"\n'})
    assert (out.status, out.reason) == ("failed", "error")
    assert "postcondition does not hold after" in out.message


def test_result_must_compile(tmp_path):
    code = HEADER + '''
class Broken(Transform):
    path = "pkg/spec.py"

    def postcondition(self, module):
        return "return" in module.code and "yield" in module.code

    def transform(self, module):
        # a return outside a function parses but does not compile... at module level it does not
        return cst.parse_module(module.code + "return 1\\nyield 2\\n")
'''
    out, root = run(tmp_path, code, {"pkg/spec.py": "x = 1\n"})
    assert (out.status, out.reason) == ("failed", "error")
    assert "does not compile" in out.message
    assert (root / "pkg/spec.py").read_text() == "x = 1\n"


def test_exception_in_author_code_is_a_failure_not_a_crash(tmp_path):
    code = HEADER + '''
class Boom(Transform):
    path = "pkg/spec.py"

    def postcondition(self, module):
        return False

    def transform(self, module):
        raise ValueError("bad idea")
'''
    out, _ = run(tmp_path, code, {"pkg/spec.py": "x = 1\n"})
    assert (out.status, out.reason) == ("failed", "error")
    assert "Boom (pkg/spec.py): ValueError: bad idea" in out.message


def test_sys_exit_in_author_code_is_a_failure_not_the_end_of_the_run(tmp_path):
    code = HEADER + '''
class Quits(Transform):
    path = "pkg/spec.py"

    def postcondition(self, module):
        return False

    def transform(self, module):
        import sys
        sys.exit(3)
'''
    out, root = run(tmp_path, code, {"pkg/spec.py": "x = 1\n"})
    assert (out.status, out.reason, out.message) == (
        "failed", "error", "Quits (pkg/spec.py): SystemExit: 3")
    assert (root / "pkg/spec.py").read_text() == "x = 1\n"


def test_all_or_nothing_across_classes(tmp_path):
    code = RENAME + '''

class Second(Transform):
    path = "pkg/other.py"

    def postcondition(self, module):
        return False

    def transform(self, module):
        self.anchor(module, m.Name("nowhere"), "a name that is not there")
        return module
'''
    src = 'class Spec:\n    def backend(self):\n        return "flashinfer_b12x"\n'
    out, root = run(tmp_path, code, {"pkg/spec.py": src, "pkg/other.py": "y = 2\n"})
    assert (out.status, out.reason) == ("failed", "anchor-missing")
    assert out.files == ["pkg/spec.py", "pkg/other.py"]
    assert (root / "pkg/spec.py").read_text() == src  # the first class's edit was not written


def test_unsafe_path(tmp_path):
    code = RENAME.replace('path = "pkg/spec.py"', 'path = "../escape.py"')
    out, _ = run(tmp_path, code, {"pkg/spec.py": "x = 1\n"})
    assert (out.status, out.reason) == ("failed", "unsafe-path")
    assert not (tmp_path / "escape.py").exists()


@pytest.mark.parametrize("code,needle", [
    ("x = (\n", "import failed: SyntaxError"),
    ("import libcst\n", "defines no patchkit.transform.Transform subclass"),
    (HEADER + "class NoPath(Transform):\n    pass\n", "NoPath sets no `path`"),
    (HEADER + "class IntPath(Transform):\n    path = 5\n",
     "IntPath.path must be a checkout-relative path string, not 5"),
    ("import sys\nsys.exit(5)\n", "import failed: SystemExit: 5"),
])
def test_load_errors(tmp_path, code, needle):
    out, _ = run(tmp_path, code, {"pkg/spec.py": "x = 1\n"})
    assert (out.status, out.reason) == ("failed", "error")
    assert needle in out.message


# ------------------------------------------------------------------------------ kept results

SPEC_BEFORE = '''\
class Spec:
    def backend(self):
        return "flashinfer_b12x"   # the default
'''


def _counting(monkeypatch) -> list[str]:
    """The transforms that really ran (parsed their file), by class name: each run of the
    author's code (in the transform worker) adds a line to a file."""
    ran: list[str] = []
    real = kind.run_transform_file

    def counted(py_file, root, version, cache=None, timeout=30.0):
        out = real(py_file, root, version, cache, timeout)
        if not out.wrote_only_files and out.status in ("applied", "upstream"):
            ran.append(_names(Path(py_file)))
        return out

    monkeypatch.setattr(kind, "run_transform_file", counted)
    monkeypatch.setitem(globals(), "run_transform_file", counted)
    return ran


def _names(py_file: Path) -> str:
    return ", ".join(name for name, _path in kind.listed(py_file)[0])


def test_the_same_transform_on_the_same_file_is_not_run_twice(tmp_path, monkeypatch):
    ran = _counting(monkeypatch)
    first, root = run(tmp_path / "a", RENAME, {"pkg/spec.py": SPEC_BEFORE})
    second, other = run(tmp_path / "b", RENAME, {"pkg/spec.py": SPEC_BEFORE})
    assert (first.status, second.status) == ("applied", "applied")
    assert ran == ["UseB12x"]   # the second tree got the kept result
    assert (other / "pkg/spec.py").read_bytes() == (root / "pkg/spec.py").read_bytes()
    assert second.wrote_only_files and not first.wrote_only_files
    assert second.files == first.files == ["pkg/spec.py"]


@pytest.mark.parametrize("change", ["input", "transform", "sibling", "version"])
def test_a_kept_result_is_never_stale(tmp_path, monkeypatch, change):
    """What the result depends on changes: it runs again."""
    ran = _counting(monkeypatch)
    run(tmp_path / "a", RENAME, {"pkg/spec.py": SPEC_BEFORE})
    code, text, version = RENAME, SPEC_BEFORE, None
    if change == "input":
        text = SPEC_BEFORE.replace("# the default", "# the default, still")
    elif change == "transform":
        code = RENAME + "\n# a comment is a change too\n"
    elif change == "sibling":   # a transform may load the files beside it
        (tmp_path / "b").mkdir()
        (tmp_path / "b" / "helper.py").write_text("X = 1\n")
    else:
        from packaging.version import Version
        version = Version("0.34.0")
    root = tmp_path / "b" / "tree"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg/spec.py").write_text(text)
    (tmp_path / "b" / "t.py").write_text(code)
    out = run_transform_file(tmp_path / "b" / "t.py", root, version, KEPT())
    assert out.status == "applied" and ran == ["UseB12x", "UseB12x"]
    assert '"b12x"' in (root / "pkg/spec.py").read_text()


def test_a_transform_that_says_it_is_not_pure_runs_every_time(tmp_path, monkeypatch):
    ran = _counting(monkeypatch)
    impure = RENAME.replace('    path = "pkg/spec.py"\n', '    path = "pkg/spec.py"\n    pure = False\n')
    run(tmp_path / "a", impure, {"pkg/spec.py": SPEC_BEFORE})
    out, _ = run(tmp_path / "b", impure, {"pkg/spec.py": SPEC_BEFORE})
    assert out.status == "applied" and ran == ["UseB12x", "UseB12x"]


# ------------------------------------------------------------------------------ the worker
# Inputs found by fuzzing: the author's code is stopped wherever it is, and whatever it
# raises is one line.

STUCK = HEADER + '''
import itertools


class Stuck(Transform):
    path = "pkg/spec.py"

    def postcondition(self, module):
        return False

    def transform(self, module):
        any(itertools.repeat(False))   # C code that never returns to the interpreter
        return module
'''


def test_a_transform_stuck_in_c_code_is_stopped_at_its_deadline(tmp_path):
    import time

    start = time.monotonic()
    root = tmp_path / "tree"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg/spec.py").write_text("x = 1\n")
    (tmp_path / "t.py").write_text(STUCK)
    out = run_transform_file(tmp_path / "t.py", root, None, KEPT(), timeout=1.0)
    assert time.monotonic() - start < 20
    assert (out.status, out.reason) == ("failed", "error")
    assert out.message.endswith("t.py: transform ran past its deadline of 1 s of CPU "
                                "time (--timeout) and was stopped"), out.message
    assert (root / "pkg/spec.py").read_text() == "x = 1\n"
    # the next transform gets a new worker
    assert_transform(tmp_path / "next", RENAME, SPEC_BEFORE, SPEC_BEFORE.replace(
        '"flashinfer_b12x"', '"b12x"'))


@pytest.mark.parametrize("raised,said", [
    ("GeneratorExit()", "GeneratorExit: "),
    ("BaseException('odd')", "BaseException: odd"),
    ("ValueError('x' * 100_000)", "ValueError: " + "x" * 80 + "…"),
    ("ValueError('first line\\nsecond line')", "ValueError: first line …"),
])
def test_anything_the_author_raises_is_one_short_line(tmp_path, raised, said):
    code = HEADER + f'''
class Odd(Transform):
    path = "pkg/spec.py"

    def postcondition(self, module):
        return False

    def transform(self, module):
        raise {raised}
'''
    out, _ = run(tmp_path, code, {"pkg/spec.py": "x = 1\n"})
    assert (out.status, out.reason, out.message) == (
        "failed", "error", f"Odd (pkg/spec.py): {said}")


def test_generator_exit_at_import_is_one_line(tmp_path):
    out, _ = run(tmp_path, "raise GeneratorExit\n", {"pkg/spec.py": "x = 1\n"})
    assert (out.status, out.reason) == ("failed", "error")
    assert out.message.endswith("t.py: import failed: GeneratorExit: ")


def test_a_transform_that_ends_its_process_fails_alone(tmp_path):
    code = HEADER + '''
class Gone(Transform):
    path = "pkg/spec.py"

    def postcondition(self, module):
        return False

    def transform(self, module):
        import os
        os._exit(7)
'''
    out, root = run(tmp_path, code, {"pkg/spec.py": "x = 1\n"})
    assert (out.status, out.reason) == ("failed", "error")
    assert out.message.endswith("t.py: transform ended (exit 7) before it finished"), out.message
    assert (root / "pkg/spec.py").read_text() == "x = 1\n"


def test_the_worker_holds_no_lock_of_ours(tmp_path):
    """A lock taken before the worker was forked is free once we let go of it: the worker
    keeps no descriptor of ours."""
    import fcntl
    import os

    from patchkit import filelocks

    kind.WORKER.stop()
    lock = tmp_path / "a.lock"
    with filelocks.held(lock, "a test lock"):
        out, _ = run(tmp_path, RENAME, {"pkg/spec.py": SPEC_BEFORE})   # forks the worker
        assert out.status == "applied"
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)   # BlockingIOError if the worker held it
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------ cache faults
# A kept entry that does not read as expected is dropped and made again, and -v says so.

class _Details:
    """The lines ``-v`` would show (``progress.detail``)."""

    def __init__(self, monkeypatch) -> None:
        from patchkit import progress

        self.lines: list[str] = []
        sink = progress.Sink()
        sink.detail = self.lines.append   # type: ignore[method-assign]
        monkeypatch.setattr(progress, "_sink", sink)


def _entries(space: str) -> list[Path]:
    return sorted((KEPT() / space).glob("*.json"))


def _fault(path: Path, how: str) -> None:
    import json

    if how == "folder":
        path.unlink()
        path.mkdir()
        (path / "x").write_text("x")
        return
    entry = json.loads(path.read_text())
    if how == "changed":        # valid JSON, the seal no longer holds
        entry["value"] = [["UseB12x", "pkg/other.py"]] if isinstance(entry["value"], list) \
            else dict(entry["value"], status="upstream", texts={})
    elif how == "resealed":     # the seal holds, the content is another file's
        from patchkit.kinds import memo
        entry = memo._sealed([["UseB12x", "pkg/other.py"]] if isinstance(entry["value"], list)
                             else {"status": "applied", "reason": None, "message": "",
                                   "texts": {"pkg/spec.py": 5}})
    elif how == "shape":
        entry = {"seal": "x", "value": None}
    elif how == "garbage":
        path.write_bytes(b"\x00\xff not json")
        return
    path.write_text(json.dumps(entry))


@pytest.mark.parametrize("space", ["transform-listings", "transforms"])
@pytest.mark.parametrize("how", ["changed", "resealed", "shape", "garbage", "folder"])
def test_a_damaged_kept_entry_is_dropped_and_made_again(tmp_path, monkeypatch, space, how):
    said = _Details(monkeypatch)
    first, root = run(tmp_path / "a", RENAME, {"pkg/spec.py": SPEC_BEFORE})
    assert first.status == "applied"
    (entry,) = _entries(space)
    _fault(entry, how)
    for n in range(2):   # and on every later run
        out, other = run(tmp_path / f"b{n}", RENAME, {"pkg/spec.py": SPEC_BEFORE})
        assert (out.status, out.reason) == ("applied", None), out.message
        assert (other / "pkg/spec.py").read_bytes() == (root / "pkg/spec.py").read_bytes()
    assert any("dropped" in line and "made again" in line for line in said.lines), said.lines
    assert entry.is_file()   # made again, whole


def test_a_transform_that_waits_without_working_is_stopped_at_ten_times_its_deadline(tmp_path):
    code = STUCK.replace("any(itertools.repeat(False))", "import time; time.sleep(600)")
    root = tmp_path / "tree"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg/spec.py").write_text("x = 1\n")
    (tmp_path / "t.py").write_text(code)
    kind.listed(tmp_path / "t.py", KEPT())   # the worker has imported it, and libcst
    out = run_transform_file(tmp_path / "t.py", root, None, KEPT(), timeout=0.3)
    assert (out.status, out.reason) == ("failed", "error")
    assert out.message.endswith("t.py: transform ran for 3 s (10 times its deadline) "
                                "(--timeout) and was stopped"), out.message
