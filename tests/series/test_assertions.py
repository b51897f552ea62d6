"""AST assertions on small sources: every predicate both ways, scopes, `not`, and failures."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from patchkit.kinds import memo
from patchkit.manifest import Assertion, Patch
from patchkit.report import AssertionResult
from patchkit.series.assertions import run_assertions, tree_reader

SOURCE = textwrap.dedent('''\
    import os
    import vllm.envs as envs
    import torch.nn
    from typing import TYPE_CHECKING

    STR_DTYPE_TO_TORCH_DTYPE = {
        "half": torch.half,
        "fp8": torch.uint8,
    }
    OPTIONS: dict = dict(fast=1, slow=2)
    OTHER = {"elsewhere": 1}

    if TYPE_CHECKING:
        from foo import Bar as Baz

    class SpeculativeConfig:
        method: str = "eagle"

        def __post_init__(self):
            self.draft = None
            self._verify_draft_quant_path(self.method)
            if self.method == "dspark":
                logger.warning("dspark %s", self.moe_backend)

            def inner():
                helper.run()

        @property
        def kind(self):
            return "x"

        @kind.setter
        def kind(self, value):
            self._kind = value

    async def serve():
        await start(verbose=True)
    ''')


def check(predicate: str, value: str, scope: str | None = None, *, negate: bool = False,
          source: str = SOURCE) -> AssertionResult:
    assertion = Assertion(file="m.py", scope=scope, predicate=predicate, value=value)
    if negate:
        assertion = Assertion(file="m.py", scope=scope, predicate="not", value=None,
                              negated=assertion)
    patch = Patch(id="p", summary="s", kind="diff", path="x.diff", verify=(assertion,))
    files = {"m.py": source}
    (result,) = run_assertions([patch], files.get)
    return result


def where(result: AssertionResult) -> tuple[int | None, int | None]:
    return result.line, result.col


# ---------------------------------------------------------------------------------- defines

@pytest.mark.parametrize("scope, name, line, col", [
    (None, "SpeculativeConfig", 16, 0),                        # a class
    (None, "serve", 36, 0),                                    # an async function
    ("SpeculativeConfig", "__post_init__", 19, 4),             # a method
    ("SpeculativeConfig", "method", 17, 4),                    # an annotated class attribute
    ("SpeculativeConfig.__post_init__", "draft", 20, 8),       # self.NAME
    ("SpeculativeConfig.__post_init__", "inner", 25, 8),       # a nested function
    (None, "STR_DTYPE_TO_TORCH_DTYPE", 6, 0),                  # a module assignment
    (None, "envs", 2, 7),                                      # an import alias
    (None, "os", 1, 7),                                        # an import
    (None, "torch", 3, 7),                                     # `import a.b` binds a
    (None, "Baz", 14, 20),                                     # an import inside `if`
])
def test_defines(scope: str | None, name: str, line: int, col: int) -> None:
    result = check("defines", name, scope)
    assert result.ok, result.message
    assert where(result) == (line, col)


def test_defines_missing_lists_what_is_there() -> None:
    result = check("defines", "draft_quant", "SpeculativeConfig.__post_init__")
    assert not result.ok
    assert where(result) == (19, 4)
    assert result.message == ("draft_quant is not defined in SpeculativeConfig.__post_init__; "
                              "defined there: self.draft, inner")


def test_defines_does_not_count_the_scope_itself() -> None:
    assert not check("defines", "SpeculativeConfig", "SpeculativeConfig").ok


def test_defines_is_scoped() -> None:
    assert not check("defines", "serve", "SpeculativeConfig").ok
    assert not check("defines", "draft", "SpeculativeConfig.kind").ok


def test_property_getter_and_setter_are_both_the_scope() -> None:
    result = check("defines", "_kind", "SpeculativeConfig.kind")
    assert result.ok and where(result) == (34, 8)


# ---------------------------------------------------------------------------------- calls

def test_calls_matches_a_dotted_suffix() -> None:
    result = check("calls", "_verify_draft_quant_path", "SpeculativeConfig.__post_init__")
    assert result.ok
    assert where(result) == (21, 8)
    assert result.message == ("SpeculativeConfig.__post_init__ calls "
                              "self._verify_draft_quant_path")


def test_calls_matches_the_full_dotted_name() -> None:
    assert check("calls", "self._verify_draft_quant_path", "SpeculativeConfig").ok
    assert check("calls", "logger.warning", "SpeculativeConfig.__post_init__").ok


def test_calls_needs_a_whole_name_part() -> None:
    result = check("calls", "_draft_quant_path", "SpeculativeConfig.__post_init__")
    assert not result.ok
    assert result.message == ("no call to _draft_quant_path in SpeculativeConfig.__post_init__; "
                              "calls there: self._verify_draft_quant_path, logger.warning, "
                              "helper.run")


def test_calls_is_scoped() -> None:
    assert not check("calls", "start", "SpeculativeConfig").ok
    assert check("calls", "start", "serve").ok


def test_calls_in_a_nested_function_scope() -> None:
    result = check("calls", "helper.run", "SpeculativeConfig.__post_init__.inner")
    assert result.ok and where(result) == (26, 12)
    assert not check("calls", "logger.warning", "SpeculativeConfig.__post_init__.inner").ok


def test_long_listings_are_cut() -> None:
    source = "def f():\n" + "".join(f"    g{i}()\n" for i in range(15))
    result = check("calls", "h", "f", source=source)
    assert result.message == ("no call to h in f; calls there: g0, g1, g2, g3, g4, g5, g6, g7, "
                              "g8, g9, ... (5 more)")


def test_calls_through_call_results() -> None:
    source = "class A(B):\n    def __init__(self):\n        super().__init__()\n"
    assert check("calls", "__init__", "A.__init__", source=source).ok


# ---------------------------------------------------------------------------------- has_key

def test_has_key_in_an_assignment_scope() -> None:
    result = check("has_key", "fp8", "STR_DTYPE_TO_TORCH_DTYPE")
    assert result.ok and where(result) == (8, 4)


def test_has_key_missing_lists_the_keys() -> None:
    result = check("has_key", "nvfp4_ds_mla", "STR_DTYPE_TO_TORCH_DTYPE")
    assert not result.ok
    assert where(result) == (6, 0)
    assert result.message == ("no key 'nvfp4_ds_mla' in STR_DTYPE_TO_TORCH_DTYPE; keys there: "
                              "'half', 'fp8'")


def test_has_key_only_looks_inside_the_scope() -> None:
    assert not check("has_key", "elsewhere", "STR_DTYPE_TO_TORCH_DTYPE").ok
    assert check("has_key", "elsewhere").ok


def test_has_key_of_a_dict_call() -> None:
    result = check("has_key", "slow", "OPTIONS")
    assert result.ok and where(result) == (10, 29)


def test_has_key_ignores_values_that_are_strings() -> None:
    source = 'M = {"a": "b"}\n'
    assert not check("has_key", "b", "M", source=source).ok


# ---------------------------------------------------------------------------------- contains

@pytest.mark.parametrize("text, line, col", [
    ("dspark", 22, 26),               # a string literal
    ("self.moe_backend", 23, 40),     # a dotted attribute
    ("logger", 23, 12),               # a name
])
def test_contains(text: str, line: int, col: int) -> None:
    result = check("contains", text, "SpeculativeConfig.__post_init__")
    assert result.ok, result.message
    assert where(result) == (line, col)


def test_contains_needs_the_whole_text() -> None:
    result = check("contains", "dspar", "SpeculativeConfig.__post_init__")
    assert not result.ok
    assert result.message.startswith("no string or name 'dspar' in "
                                     "SpeculativeConfig.__post_init__; closest there: 'dspark'")


def test_contains_missing_with_nothing_close() -> None:
    result = check("contains", "qqqqqqqq", "serve")
    assert result.message == ("no string or name 'qqqqqqqq' in serve; nothing close among 2 "
                              "strings and names there")


def test_contains_a_constant() -> None:
    assert check("contains", "True", "serve").ok


# ---------------------------------------------------------------------------------- not

def test_not_passes_when_absent() -> None:
    result = check("calls", "flashinfer_b12x", "SpeculativeConfig", negate=True)
    assert result.ok
    assert where(result) == (16, 0)
    assert result.message == "no call to flashinfer_b12x in SpeculativeConfig"


def test_not_fails_at_what_it_found() -> None:
    result = check("contains", "dspark", "SpeculativeConfig.__post_init__", negate=True)
    assert not result.ok
    assert where(result) == (22, 26)
    assert result.message == "SpeculativeConfig.__post_init__ contains 'dspark', which it must not"


def test_not_with_a_missing_scope_fails() -> None:
    result = check("calls", "anything", "SpeculativeConfig.gone", negate=True)
    assert not result.ok
    assert result.message.startswith("scope SpeculativeConfig.gone not found")


def test_not_with_a_missing_file_fails() -> None:
    patch = Patch(id="p", summary="s", kind="diff", path="x.diff", verify=(
        Assertion(file="gone.py", scope=None, predicate="not", value=None,
                  negated=Assertion(file="gone.py", scope=None, predicate="defines", value="x")),))
    (result,) = run_assertions([patch], {}.get)
    assert not result.ok and result.message == "no such file"


# ---------------------------------------------------------------------------------- scopes

def test_missing_scope_points_at_the_deepest_part_found() -> None:
    result = check("calls", "x", "SpeculativeConfig.__post_init_")
    assert not result.ok
    assert where(result) == (16, 0)
    assert result.message == ("scope SpeculativeConfig.__post_init_ not found (did you mean "
                              "SpeculativeConfig.__post_init__?); SpeculativeConfig defines: "
                              "method, __post_init__, kind")


def test_missing_first_scope_step() -> None:
    result = check("calls", "x", "Nope.f")
    assert where(result) == (1, 0)
    assert result.message.startswith("scope Nope.f not found; the module defines: "
                                     "STR_DTYPE_TO_TORCH_DTYPE, OPTIONS, OTHER, SpeculativeConfig")


def test_a_scope_under_an_assignment() -> None:
    result = check("has_key", "x", "STR_DTYPE_TO_TORCH_DTYPE.half")
    assert where(result) == (6, 0)
    assert result.message == ("scope STR_DTYPE_TO_TORCH_DTYPE.half not found; "
                              "STR_DTYPE_TO_TORCH_DTYPE is an assignment, with no scopes inside")


def test_scope_steps_do_not_skip_levels() -> None:
    # `inner` lives in __post_init__, not directly in the class
    assert not check("calls", "helper.run", "SpeculativeConfig.inner").ok


def test_scope_inside_a_guard_block() -> None:
    source = textwrap.dedent("""\
        try:
            import fast
        except ImportError:
            def helper():
                return slow()
        """)
    result = check("calls", "slow", "helper", source=source)
    assert result.ok and where(result) == (5, 15)


# ---------------------------------------------------------------------------------- files

def test_missing_file() -> None:
    result = check("defines", "x", source=None)  # type: ignore[arg-type]
    assert not result.ok
    assert (result.line, result.col, result.message) == (None, None, "no such file")
    assert result.failure_line() == "m.py: [p] no such file"


def test_syntax_error_gives_its_location() -> None:
    result = check("defines", "x", source="def f(:\n    pass\n")
    assert not result.ok
    assert where(result) == (1, 6)
    assert result.message.startswith("does not parse: ")
    assert result.failure_line().startswith("m.py:1:6: [p] does not parse: ")


def test_a_failure_line_says_where_and_what() -> None:
    result = check("has_key", "nvfp4_ds_mla", "STR_DTYPE_TO_TORCH_DTYPE")
    assert result.failure_line() == (
        "m.py:6:0: [p] no key 'nvfp4_ds_mla' in STR_DTYPE_TO_TORCH_DTYPE; keys there: "
        "'half', 'fp8'")


def test_each_file_is_read_once_and_results_keep_order() -> None:
    reads: list[str] = []
    files = {"a.py": "def f():\n    g()\n", "b.py": "X = {'k': 1}\n"}

    def read(rel: str) -> str | None:
        reads.append(rel)
        return files.get(rel)

    first = Patch(id="one", summary="s", kind="diff", path="1.diff", verify=(
        Assertion(file="a.py", scope="f", predicate="calls", value="g"),
        Assertion(file="b.py", scope="X", predicate="has_key", value="k"),
    ))
    second = Patch(id="two", summary="s", kind="diff", path="2.diff", verify=(
        Assertion(file="a.py", scope=None, predicate="defines", value="h"),
    ))
    results = run_assertions([first, second], read)
    assert [(r.patch, r.file, r.ok) for r in results] == [
        ("one", "a.py", True), ("one", "b.py", True), ("two", "a.py", False)]
    assert reads == ["a.py", "b.py"]


def test_tree_reader(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("X = 1\n")
    read = tree_reader(tmp_path)
    assert read("pkg/m.py") == "X = 1\n"
    assert read("pkg/nope.py") is None
    assert read("nope/m.py") is None


def test_a_file_through_a_symlink_fails(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "m.py").write_text("X = 1\n")
    os.symlink("real", tmp_path / "pkg")
    patch = Patch(id="p", summary="s", kind="diff", path="x.diff", verify=(
        Assertion(file="pkg/m.py", scope=None, predicate="defines", value="X"),))
    (result,) = run_assertions([patch], tree_reader(tmp_path))
    assert not result.ok
    assert "symlink" in result.message


# ---------------------------------------------------------------------------------- kept results

def test_results_are_kept_by_content_and_never_stale(tmp_path, monkeypatch) -> None:
    """What the assertions on a file found is kept under the digest of the file, the
    assertions and the judging code: the same again is read back (a parse is skipped), and a
    changed file is judged afresh; a failure is never kept (its message points at the lines
    the series changed, which the text alone does not say); without a cache nothing is."""
    cache = tmp_path / "cache"
    assertion = Assertion(file="m.py", scope="STR_DTYPE_TO_TORCH_DTYPE", predicate="has_key",
                          value="half")
    patch = Patch(id="p", summary="s", kind="diff", path="x.diff", verify=(assertion,))
    files = {"m.py": SOURCE}
    (first,) = run_assertions([patch], files.get, cache)
    assert first.ok, first.message
    (entry,) = (tmp_path / "cache" / "assertions").glob("*.json")
    data = json.loads(entry.read_text())["value"]   # kept sealed (kinds/memo.py)
    assert [AssertionResult.from_dict(d) for d in data] == [first]
    entry.write_text(json.dumps(memo._sealed([dict(data[0], message="read back")])))
    (again,) = run_assertions([patch], files.get, cache)
    assert again.message == "read back"
    files["m.py"] = SOURCE.replace('"half": torch.half,', "")
    (changed,) = run_assertions([patch], files.get, cache)
    assert not changed.ok and "no key 'half'" in changed.message
    assert len(list((cache / "assertions").glob("*.json"))) == 1
    (unkept,) = run_assertions([patch], {"m.py": SOURCE}.get)
    assert unkept.ok and unkept.message != "read back"
