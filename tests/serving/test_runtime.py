"""Runtime markers: the manifest's `runtime:` entries, judged by `patchkit verify --log` against
server logs together with the applied checkout that says which patches are in."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from testing import patchkit
from testing.project import MANIFEST, make_project

from patchkit import manifest
from patchkit.errors import LogError, ManifestError
from patchkit.manifest import Marker
from patchkit.serving import runtime
from testing.releases import RELEASES

# The fixture project's three patches, each with markers; fast-mode is out of range on v1
# (skipped), so its markers, which these logs would fail, must not count.
RUNTIME_MANIFEST = (MANIFEST
                    .replace("""    diff: patches/table.diff
""", """    diff: patches/table.diff
    runtime:
      - log: 'table has nvfp4'
      - log: 'event=layer_load'
        count: 3
      - log: 'mode=plain'
        absent: true
""")
                    .replace("""    transform: patches/fast.py
""", """    transform: patches/fast.py
    vllm: '<1'
    runtime:
      - log: 'fast mode on'
      - log: 'event='
        absent: true
""")
                    .replace("""    overlay: overlays/extra
""", """    overlay: overlays/extra
    runtime:
      - log: 'extra loaded'
        min: 2
""") + """\
runtime:
  - log: 'Application startup complete'
    unless: 'headless'
  - log: 'died unexpectedly'
    absent: true
""")

RANK0 = """\
INFO 05-12 10:00:01 [model.py:744] table has nvfp4
INFO 05-12 10:00:02 [loader.py:10] event=layer_load layer=0
INFO 05-12 10:00:02 [loader.py:10] event=layer_load layer=1
(Worker pid=7) INFO 05-12 10:00:03 [extra.py:3] extra loaded
(APIServer pid=1) INFO:     Application startup complete.
"""
RANK1 = """\
INFO 05-12 10:00:00 [serve.py:225] Launching vLLM (v0.33.0) headless multiproc executor
INFO 05-12 10:00:02 [loader.py:10] event=layer_load layer=2
(Worker pid=9) INFO 05-12 10:00:03 [extra.py:3] extra loaded
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """The fixture project applied (fast-mode skipped), with the two nodes' logs beside it."""
    proj = make_project(tmp_path_factory.mktemp("runtime"), RUNTIME_MANIFEST)
    applied = patchkit("apply", cwd=proj)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert "skipped   fast-mode" in applied.stdout
    (proj / "rank0.log").write_text(RANK0)
    (proj / "rank1.log").write_text(RANK1)
    return proj


def verify(proj: Path, *args: str, **kw):
    return patchkit("verify", "--tree", ".patchkit/vllm", *args, cwd=proj, **kw)


def write_log(proj: Path, name: str, text: str) -> str:
    (proj / name).write_text(text)
    return name


# ------------------------------------------------------------------------------ the verdicts

def test_two_good_logs_hold_together(project):
    out = verify(project, "--log", "rank0.log", "--log", "rank1.log")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.splitlines() == [
        "ok: 2/2 assertions passed on .patchkit/vllm",
        "ok: 6/6 runtime markers hold in rank0.log, rank1.log"]


def test_json_adds_runtime_and_keeps_the_rest(project):
    plain = verify(project, "--format", "json")
    judged = verify(project, "--log", "rank0.log", "--log", "rank1.log", "--format", "json")
    assert plain.returncode == judged.returncode == 0
    before, after = json.loads(plain.stdout), json.loads(judged.stdout)
    assert list(after) == ["ok", "status", "target", "verify", "runtime", "starts", "evidence"]
    assert {k: v for k, v in after.items()
            if k not in ("runtime", "starts", "evidence")} == before
    # logs of a server whose build is not named: judged, nothing recorded, and said
    assert after["evidence"] == {"said": ["evidence: the build is unknown (no --container or "
                                          "--build): nothing recorded"]}
    # one start in each log: each judged from its first line
    assert after["starts"] == [{"log": "rank0.log", "starts": 1, "line": 1, "stop": None},
                               {"log": "rank1.log", "starts": 1, "line": 1, "stop": None}]
    assert plain.stdout.rstrip().rstrip("}").rstrip().rstrip("]") in judged.stdout.split(
        '"evidence"')[0]
    rows = after["runtime"]
    assert [(r["patch"], r["log"], r["ok"], r["found"]) for r in rows] == [
        ("table-nvfp4", "table has nvfp4", True, 1),
        ("table-nvfp4", "event=layer_load", True, 3),     # 2 on rank 0 + 1 on rank 1
        ("table-nvfp4", "mode=plain", True, 0),
        ("extra-file", "extra loaded", True, 2),          # 1 + 1
        (None, "Application startup complete", True, 1),
        (None, "died unexpectedly", True, 0)]
    assert all(set(r) >= {"patch", "log", "ok", "found", "lines", "message"} for r in rows)
    assert rows[1]["lines"] == [
        "rank0.log:2: INFO 05-12 10:00:02 [loader.py:10] event=layer_load layer=0",
        "rank0.log:3: INFO 05-12 10:00:02 [loader.py:10] event=layer_load layer=1",
        "rank1.log:2: INFO 05-12 10:00:02 [loader.py:10] event=layer_load layer=2"]


def test_a_skipped_patchs_markers_are_left_out(project):
    """fast-mode is skipped: 'fast mode on' never appears and 'event=' does, yet all holds."""
    out = verify(project, "--log", "rank0.log", "--log", "rank1.log", "--format", "json")
    assert out.returncode == 0
    assert "fast-mode" not in {r["patch"] for r in json.loads(out.stdout)["runtime"]}
    # The same markers count once the report says the patch is in.
    m = manifest.load(project / "patchset.yaml")
    ids = runtime.patches_in(m, {"table-nvfp4": "applied", "fast-mode": "upstream",
                                 "extra-file": "applied"}, "1")
    results = runtime.judge(runtime.markers_of(m, ids),
                            [runtime.Log("rank0.log", RANK0.splitlines(keepends=True))])
    failed = [(r.patch, r.log) for r in results if not r.ok]
    assert ("fast-mode", "fast mode on") in failed and ("fast-mode", "event=") in failed


def test_which_patches_are_in():
    m = manifest.load(_manifest_file(RUNTIME_MANIFEST))
    assert runtime.patches_in(m, {"table-nvfp4": "applied", "fast-mode": "skipped",
                                  "extra-file": "upstream"}, "1") == {"table-nvfp4", "extra-file"}
    assert runtime.patches_in(m, {"table-nvfp4": "failed", "extra-file": "applied"},
                              None) == {"extra-file"}
    # No report or labels: the release's range decides, as for the AST assertions.
    assert runtime.patches_in(m, {}, "1") == {"table-nvfp4", "extra-file"}
    assert runtime.patches_in(m, {}, None) == {"table-nvfp4", "fast-mode", "extra-file"}


def test_a_forbidden_line_names_the_patch_the_marker_and_file_line(project):
    bad = write_log(project, "bad0.log", RANK0 + "INFO 05-12 10:00:04 [cfg.py:1] mode=plain\n")
    out = verify(project, "--log", bad, "--log", "rank1.log")
    assert out.returncode == 1
    assert out.stdout.splitlines()[1:] == [
        "bad0.log:6: [table-nvfp4] forbidden 'mode=plain': INFO 05-12 10:00:04 [cfg.py:1] "
        "mode=plain",
        "FAILED: 5/6 runtime markers hold in bad0.log, rank1.log"]
    row = next(r for r in json.loads(verify(project, "--log", bad, "--log", "rank1.log",
                                            "--format", "json").stdout)["runtime"]
               if r["log"] == "mode=plain")
    assert row["ok"] is False and row["found"] == 1
    assert row["lines"] == ["bad0.log:6: INFO 05-12 10:00:04 [cfg.py:1] mode=plain"]
    assert "bad0.log:6:" in row["message"]


def test_a_missing_required_line_names_the_patch(project):
    bad = write_log(project, "nostart.log", RANK0.replace("table has nvfp4", "table as before"))
    out = verify(project, "--log", bad, "--log", "rank1.log")
    assert out.returncode == 1
    assert ("[table-nvfp4] required line 'table has nvfp4' appears in none of nostart.log, "
            "rank1.log") in out.stdout.splitlines()


def test_counts_are_exact_and_summed(project):
    extra = write_log(project, "extra1.log", RANK1 + "event=layer_load layer=3\n")
    out = verify(project, "--log", "rank0.log", "--log", extra)
    assert out.returncode == 1
    assert ("[table-nvfp4] expected exactly 3 lines matching 'event=layer_load', found 4 in "
            "rank0.log, extra1.log") in out.stdout.splitlines()
    # Rank 0 alone: 2 of the 3 layer loads and 1 of the 2 'extra loaded'.
    out = verify(project, "--log", "rank0.log")
    assert out.returncode == 1
    assert out.stdout.splitlines()[1:] == [
        "[table-nvfp4] expected exactly 3 lines matching 'event=layer_load', found 2 in "
        "rank0.log",
        "[extra-file] expected at least 2 lines matching 'extra loaded', found 1 in rank0.log",
        "FAILED: 4/6 runtime markers hold in rank0.log"]


def test_unless_leaves_out_each_log_that_matches_it(project):
    """Rank 1 runs headless: it never logs the API's startup and is not judged for it."""
    out = verify(project, "--log", "rank1.log", "--format", "json")
    row = next(r for r in json.loads(out.stdout)["runtime"] if r["patch"] is None
               and r["log"] == "Application startup complete")
    assert row["ok"] is True and row["judged"] is False
    # With rank 0 judged, its missing startup line fails, and rank 1 still does not count.
    bad = write_log(project, "crashed0.log", RANK0.replace("Application startup complete",
                                                           "Application starting"))
    out = verify(project, "--log", bad, "--log", "rank1.log")
    assert ("[series] required line 'Application startup complete' appears in none of "
            "crashed0.log (rank1.log left out: 'headless')") in out.stdout.splitlines()


def test_stdin_is_a_log(project):
    out = verify(project, "--log", "-", "--log", "rank1.log", input=RANK0 + "Worker proc "
                 "VllmWorker-0 died unexpectedly (exit code: -9)\n")
    assert out.returncode == 1
    assert ("<stdin>:6: [series] forbidden 'died unexpectedly': Worker proc VllmWorker-0 died "
            "unexpectedly (exit code: -9)") in out.stdout.splitlines()
    twice = verify(project, "--log", "-", "--log", "-", input=RANK0)
    assert twice.returncode == 2 and len(twice.stderr.splitlines()) == 1
    assert "standard input can be read only once" in twice.stderr


def test_colours_and_carriage_returns_are_not_part_of_a_line(project):
    coloured = "\x1b[32mINFO\x1b[0m table has nvfp4\r\n" + RANK0
    (project / "tty0.log").write_bytes(coloured.encode())
    out = verify(project, "--log", "tty0.log", "--log", "rank1.log", "--format", "json")
    row = json.loads(out.stdout)["runtime"][0]
    assert row["lines"][0] == "tty0.log:1: INFO table has nvfp4"


@pytest.mark.parametrize("given, message", [
    ("absent.log", "--log absent.log: no such file"),
    ("patches", "--log patches: is a directory, not a log file"),
])
def test_a_log_that_cannot_be_read_is_one_line_and_exit_2(project, given, message):
    out = verify(project, "--log", "rank0.log", "--log", given)
    assert out.returncode == 2
    assert out.stdout == ""
    assert out.stderr.splitlines() == [f"patchkit verify: error: {message}"]
    as_json = verify(project, "--log", given, "--format", "json")
    assert as_json.returncode == 2
    assert json.loads(as_json.stdout) == {"ok": False, "error": message, "exit_code": 2}


def test_validate_counts_the_markers(project):
    out = patchkit("validate", cwd=project)
    assert out.returncode == 0
    assert out.stdout.strip() == ("patchset.yaml: ok (3 patches, 1 diff parsed, 1 transform imported, 1 "
                                  "overlay listed, 3 assertions, 8 runtime markers, vLLM v1)")


# ------------------------------------------------------------------------------ the last start

# The first line of a server start, as vLLM 0.27.1 to 0.33.0 log it (see the real-source test
# below): rank 0's version line; a headless rank's first config line.
VERSION = ("(APIServer pid=1) INFO 05-12 10:00:00 [launcher.py:367] vLLM server version 0.33.0, "
           "serving model /models/m\n")
ARCH = "INFO 05-12 10:00:00 [model.py:744] Resolved architecture: DeepseekV4ForCausalLM\n"
DIED = ("(EngineCore_DP0 pid=120) ERROR 05-12 10:02:41 [multiproc_executor.py:381] Worker proc "
        "VllmWorker-0 died unexpectedly (exit code: -9)\n")


def _numbered(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def test_a_restarted_rank0_log_is_judged_on_its_last_start(project):
    """The first start died; the restart appended to the same file came up whole."""
    crashed = VERSION + RANK0.replace("(APIServer pid=1) INFO:     Application startup complete.\n",
                                      DIED)
    log = crashed + VERSION + RANK0
    write_log(project, "restart0.log", log)
    second = len(crashed.splitlines()) + 1
    out = verify(project, "--log", "restart0.log", "--log", "rank1.log")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.splitlines() == [
        "ok: 2/2 assertions passed on .patchkit/vllm",
        f"note: restart0.log: 2 server starts; judged on the last, from line {second}",
        "ok: 6/6 runtime markers hold in restart0.log, rank1.log"]
    report = json.loads(verify(project, "--log", "restart0.log", "--log", "rank1.log",
                               "--format", "json").stdout)
    assert report["starts"] == [{"log": "restart0.log", "starts": 2, "line": second, "stop": None},
                                {"log": "rank1.log", "starts": 1, "line": 1, "stop": None}]
    died = next(r for r in report["runtime"] if r["log"] == "died unexpectedly")
    assert died["ok"] and died["found"] == 0 and died["lines"] == []
    assert died["earlier"] == [f"restart0.log:1-{second - 1}"]
    assert died["message"] == (
        f"no line matches forbidden 'died unexpectedly' in restart0.log from line {second}, "
        f"rank1.log (1 in an earlier start, lines 1-{second - 1} of restart0.log, not counted)")
    # the lines shown are numbered in the whole file
    nvfp4 = next(r for r in report["runtime"] if r["log"] == "table has nvfp4")
    assert nvfp4["lines"] == [f"restart0.log:{second + 1}: {RANK0.splitlines()[0]}"]


def test_a_marker_only_an_earlier_start_satisfies_fails_and_says_so(project):
    log = VERSION + RANK0 + VERSION + RANK0.replace("table has nvfp4", "table as before")
    write_log(project, "again0.log", log)
    second = len((VERSION + RANK0).splitlines()) + 1
    out = verify(project, "--log", "again0.log", "--log", "rank1.log")
    assert out.returncode == 1
    assert out.stdout.splitlines()[1:] == [
        f"note: again0.log: 2 server starts; judged on the last, from line {second}",
        f"[table-nvfp4] required line 'table has nvfp4' appears in none of again0.log from line "
        f"{second}, rank1.log: only in an earlier start (lines 1-{second - 1} of again0.log)",
        "FAILED: 5/6 runtime markers hold in again0.log, rank1.log"]
    row = json.loads(verify(project, "--log", "again0.log", "--log", "rank1.log",
                            "--format", "json").stdout)["runtime"][0]
    assert (row["log"], row["ok"], row["found"], row["lines"]) == ("table has nvfp4", False, 0,
                                                                   [])
    assert row["earlier"] == [f"again0.log:1-{second - 1}"]


def test_a_restarted_headless_log_is_cut_at_its_next_config(project):
    """A headless rank logs its config before its launch line: the start after a headless
    launch begins at the next 'Resolved architecture', so the restart's own config lines (here
    its first 'extra loaded' is missing) are its own."""
    first = ARCH + RANK1
    log = first + ARCH + RANK1.replace("extra loaded", "extra skipped")
    write_log(project, "restart1.log", log)
    second = len(first.splitlines()) + 1
    assert _numbered(log, "Resolved architecture") == 1
    out = verify(project, "--log", "rank0.log", "--log", "restart1.log")
    assert out.returncode == 1
    assert out.stdout.splitlines()[1:] == [
        f"note: restart1.log: 2 server starts; judged on the last, from line {second}",
        f"[extra-file] expected at least 2 lines matching 'extra loaded', found 1 in rank0.log, "
        f"restart1.log from line {second} (1 in an earlier start, lines 1-{second - 1} of "
        "restart1.log, not counted)",
        "FAILED: 5/6 runtime markers hold in rank0.log, restart1.log"]
    # The draft's config line in the same start does not begin another one, and the crashed
    # start's forbidden line does not count against the good restart.
    good = ARCH + RANK1 + DIED + ARCH + "INFO [model.py:744] Resolved architecture: DSparkDraftModel\n" + RANK1
    write_log(project, "good1.log", good)
    out = verify(project, "--log", "rank0.log", "--log", "good1.log", "--format", "json")
    assert out.returncode == 0, out.stdout
    assert json.loads(out.stdout)["starts"][1] == {
        "log": "good1.log", "starts": 2, "line": len((ARCH + RANK1 + DIED).splitlines()) + 1,
        "stop": None}


def _cut(*lines: str) -> runtime.Start:
    return runtime.assess([], [runtime.Log("x.log", list(lines))]).starts[0]


def test_where_starts_begin():
    # the first start begins at line 1, whatever its first lines are
    assert _cut("INFO platform", VERSION, "Resolved architecture: A") == runtime.Start("x.log", 1, 1)
    # rank 0: each later version line, in each wording vLLM used
    assert _cut(VERSION, "a", VERSION, "b") == runtime.Start("x.log", 3, 2)
    assert _cut(VERSION, "a", "INFO [api_server.py:1951] vLLM API server version 0.10.0", "b"
                ) == runtime.Start("x.log", 3, 2)
    # a headless start, then rank 0's (a node that changed roles), then a headless one again
    headless = "INFO [serve.py:225] Launching vLLM (v0.33.0) headless multiproc executor, with"
    assert _cut(ARCH, headless, VERSION, ARCH, ARCH, headless, "w", ARCH, "w") == runtime.Start(
        "x.log", 8, 3)
    dp = "INFO [serve.py:240] Launching 2 data parallel engine(s) in headless mode, with head"
    assert _cut(ARCH, dp, "w", ARCH) == runtime.Start("x.log", 4, 2)
    # headless launches with no config line between them: each launch line begins a start
    assert _cut(headless, "w", headless, "w", headless) == runtime.Start("x.log", 5, 3)
    assert _cut(ARCH, dp, ARCH, dp) == runtime.Start("x.log", 3, 2)
    # a line each process logs once per start, logged again by the same process, in a log
    # without version lines: a start began there (engine cores of two DP ranks do not)
    engine = ("({}) INFO 05-12 10:00:20 [core.py:140] Initializing a V1 LLM engine (v0.33.0) "
              "with config: model='/models/m'")
    assert _cut(engine.format("EngineCore_DP0 pid=120"), engine.format("EngineCore_DP1 pid=121"),
                "w", engine.format("EngineCore_DP0 pid=300"), engine.format("EngineCore_DP1 pid=301")
                ) == runtime.Start("x.log", 4, 2)
    serving = "(APIServer pid=1) INFO 05-12 10:06:01 [api_server.py:2011] Starting vLLM API server 0 on http://0.0.0.0:8000"
    assert _cut("m", serving, "m", serving, "m") == runtime.Start("x.log", 4, 2)
    assert _cut("m", serving.replace("API server 0", "server"), "m", serving, "m") == (
        runtime.Start("x.log", 1, 1))   # two wordings: two kinds of line
    # with the version lines, each start is cut there and only there
    assert _cut(VERSION, engine.format("EngineCore pid=2"), serving, VERSION,
                engine.format("EngineCore pid=3"), serving) == runtime.Start("x.log", 4, 2)
    # with no start line at all, the whole log is one start
    assert _cut("a", "b", ARCH, ARCH) == runtime.Start("x.log", 1, 1)


def test_the_logo_record_begins_a_start_in_colour_too():
    """vLLM's own formatter logs the version as a logo, one header per row; colour codes are
    stripped before the rows are looked at."""
    rows = ["       \x1b[1m█     █     █▄   ▄█\x1b[0m",
            " \x1b[93m▄▄\x1b[0m \x1b[94m▄█\x1b[0m \x1b[1m█     █     █ ▀▄▀ █\x1b[0m  version "
            "\x1b[1m0.33.0\x1b[0m",
            "  \x1b[93m█\x1b[0m\x1b[94m▄█▀\x1b[0m \x1b[1m█     █     █     █\x1b[0m  model   "
            "\x1b[1m/models/m\x1b[0m"]
    head = "(APIServer pid=1) INFO 05-12 10:00:00 [launcher.py:367] "
    logo = [head + "\r"] + [head + row + "\r" for row in rows]
    # the start begins at the logo record's header, the line before its top row
    assert _cut(*logo, "a", *logo, "b") == runtime.Start("x.log", 6, 2)
    assert _cut(*logo, "a", *logo[1:], "b") == runtime.Start("x.log", 6, 2)
    [result] = judge([Marker("table has nvfp4")], "\n".join(
        [*logo, "table has nvfp4", *logo, "b"]))
    assert not result.ok and result.earlier == ["r0.log:1-5"]
    assert result.message == ("required line 'table has nvfp4' appears in none of r0.log from "
                              "line 6: only in an earlier start (lines 1-5 of r0.log)")


def test_each_start_is_judged_for_unless_on_its_own_lines():
    """A V4.1 launch then a V4 one in the same log: the V4 start is judged by V4's marker."""
    v4_only = Marker("nvfp4_ds_mla", unless="DeepseekV41ForCausalLM")
    v41 = VERSION + "Resolved architecture: DeepseekV41ForCausalLM\nfp8_ds_mla\n"
    [result] = judge([v4_only], v41 + VERSION + ARCH + "fp8_ds_mla\n")
    assert result.judged and not result.ok
    [result] = judge([v4_only], VERSION + ARCH + "nvfp4_ds_mla\n" + v41)
    assert not result.judged


@pytest.mark.real_vllm
@pytest.mark.parametrize("release", RELEASES)   # every release the series supports
def test_the_start_lines_are_the_real_releases_words(real_vllm, release):
    """Each wording the start rule reads is logged by every release patchkit supports, and the
    lines those format strings make are cut where they should be."""
    from patchkit.source import pypi
    from testing.upstream import sh

    repo, tag = pypi.ensure_release(real_vllm, release)
    words = {"version": "vLLM server version %s, serving model %s",
             "logo": "█     █     █▄   ▄█",
             "headless": "Launching vLLM (v%s) headless multiproc executor, ",
             "dp": "Launching %d data parallel engine(s) in headless mode, ",
             "config": '"Resolved architecture: %s"'}
    for what, text in words.items():
        assert sh("git", "grep", "-l", "-F", text, tag, "--", "vllm", cwd=repo), (what, text)
    version = words["version"] % (release[1:], "/models/m")
    headless = words["headless"] % release[1:] + "with head node address 10.0.0.1:29501"
    config = words["config"].strip('"') % "DeepseekV4ForCausalLM"
    assert _cut(version, "a", version) == runtime.Start("x.log", 3, 2)
    assert _cut(config, config, headless, "w", config, config, headless) == runtime.Start(
        "x.log", 5, 2)
    assert _cut("x", "       " + words["logo"]) == runtime.Start("x.log", 1, 1)


# ------------------------------------------------------------------------------ bounded reading

MEMORY = 1 << 30   # the address space a verify run gets: far below what a whole log would take


def _bounded() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


def bounded_verify(proj: Path, *args: str, **kw):
    """``verify`` under a 1 GiB address space and a time bound: a log read whole would fail."""
    return verify(proj, *args, preexec_fn=_bounded, timeout=120, **kw)


def test_dev_zero_ends_as_not_a_log_in_bounded_memory(project):
    out = bounded_verify(project, "--log", "rank0.log", "--log", "/dev/zero")
    assert out.returncode == 2, out.stderr
    assert out.stdout == ""
    assert out.stderr.splitlines() == [
        "patchkit verify: error: --log /dev/zero: line 1 runs on past 64 MiB with no line end: "
        "not a text log"]


GENERATOR = """\
import sys
line = b"INFO 05-12 10:00:02 [loader.py:10] " + b"x" * 989 + b"\\n"
block = line * 1000
for _ in range(200):
    sys.stdout.buffer.write(block)
sys.stdout.buffer.write(b"Worker proc VllmWorker-0 died unexpectedly\\n" + block)
"""


def test_a_200_mb_log_through_stdin_names_the_forbidden_line_near_its_end(project):
    gen = subprocess.Popen([sys.executable, "-c", GENERATOR], stdout=subprocess.PIPE)
    try:
        out = bounded_verify(project, "--log", "-", "--log", "rank1.log", stdin=gen.stdout)
    finally:
        gen.stdout.close()
        gen.wait(timeout=30)
    assert out.returncode == 1, out.stderr
    assert ("<stdin>:200001: [series] forbidden 'died unexpectedly': Worker proc VllmWorker-0 "
            "died unexpectedly") in out.stdout.splitlines()
    assert "note:" not in out.stdout


RESTARTS = """\
import sys
version = b"(APIServer pid=1) INFO 05-12 10:00:00 [launcher.py:367] vLLM server version 0.33.0, serving model m\\n"
line = b"INFO 05-12 10:00:02 [loader.py:10] " + b"x" * 989 + b"\\n"
block = line * 1000
good = (b"table has nvfp4\\n" + b"event=layer_load\\n" * 2 + b"extra loaded\\n"
        + b"Application startup complete\\n")
for start in range(200):
    sys.stdout.buffer.write(version + block)
    if start == 100:
        sys.stdout.buffer.write(b"Worker proc VllmWorker-0 died unexpectedly\\n")
sys.stdout.buffer.write(version + good + block)
"""


def test_200_mb_of_restarts_through_stdin_is_judged_on_the_last_in_bounded_memory(project):
    """201 starts of 1001 lines each, then the good one: one pass, state per start only."""
    gen = subprocess.Popen([sys.executable, "-c", RESTARTS], stdout=subprocess.PIPE)
    try:
        out = bounded_verify(project, "--log", "-", "--log", "rank1.log", stdin=gen.stdout)
    finally:
        gen.stdout.close()
        gen.wait(timeout=30)
    assert out.returncode == 0, out.stdout + out.stderr
    last = 200 * 1001 + 2   # the crashed start's extra line is before it
    assert out.stdout.splitlines()[1] == (f"note: <stdin>: 201 server starts; judged on the "
                                          f"last, from line {last}")


def test_a_binary_log_is_judged_with_bad_bytes_replaced(project):
    junk = bytes(range(256)) * 64   # every byte, newlines among them
    lines = junk.count(b"\n")
    (project / "binary.log").write_bytes(
        junk + b"\n\xff\xfe\x00 Worker proc X died unexpectedly \xc3\n" + RANK0.encode())
    out = bounded_verify(project, "--log", "binary.log", "--log", "rank1.log")
    assert out.returncode == 1, out.stderr
    # stderr holds nothing of the log; only that the verdict is recorded against no build
    assert out.stderr == ("evidence: the build is unknown (no --container or --build): "
                          "nothing recorded\n")
    assert (f"binary.log:{lines + 2}: [series] forbidden 'died unexpectedly': \ufffd\ufffd\x00 "
            "Worker proc X died unexpectedly \ufffd") in out.stdout.splitlines()
    # RANK0's required lines are still found after the junk
    assert out.stdout.splitlines()[-1] == ("FAILED: 5/6 runtime markers hold in binary.log, "
                                           "rank1.log")


def test_a_long_line_is_judged_on_its_first_part_and_noted(project):
    limit = runtime.MAX_LINE
    first = "Worker proc X died unexpectedly " + "x" * limit     # the marker in its first part
    second = "y" * limit + " table has nvfp4"                   # the marker past the cut
    write_log(project, "long.log", first + "\n" + RANK0 + second + "\n")
    out = bounded_verify(project, "--log", "long.log", "--log", "rank1.log")
    assert out.returncode == 1, out.stderr
    lines = out.stdout.splitlines()
    note = ("note: long.log: 2 lines are longer than 64 KiB (lines 1, 7); each judged on its "
            "first 64 KiB")
    assert lines[1] == note
    shown = first[:runtime.HIT_SHOWN] + "..."
    assert f"long.log:1: [series] forbidden 'died unexpectedly': {shown}" in lines
    as_json = json.loads(bounded_verify(project, "--log", "long.log", "--log", "rank1.log",
                                        "--format", "json").stdout)
    assert as_json["notes"] == [note.removeprefix("note: ")]
    nvfp4 = next(r for r in as_json["runtime"] if r["log"] == "table has nvfp4")
    assert nvfp4["found"] == 1 and nvfp4["lines"][0].startswith("long.log:2: ")


def _lines(data: bytes, size: int) -> tuple[list[str], runtime.LogLines]:
    reader = runtime.LogLines((data[i:i + size] for i in range(0, len(data), size)), "--log x")
    return list(reader), reader


@pytest.mark.parametrize("size", [1, 7, 4096, runtime.MAX_LINE + 3, 1 << 20])
def test_lines_do_not_depend_on_how_the_bytes_come(size):
    limit = runtime.MAX_LINE
    data = (b"a\r\n\nb" + b"c" * (limit + 10) + b"\nd\n" + b"e" * limit + b"\n"
            + b"f" * (3 * limit) + b"\ng")
    lines, reader = _lines(data, size)
    assert lines == ["a\r", "", "b" + "c" * (limit - 1), "d", "e" * limit, "f" * limit, "g"]
    assert (reader.cut_count, reader.cut) == (2, [3, 6])


def test_a_note_names_the_first_lines_cut_and_counts_them_all():
    data = b"".join(b"x" * (runtime.MAX_LINE + 1) + b"\nok\n" for _ in range(5))
    lines, reader = _lines(data, 1 << 16)
    assert len(lines) == 10 and lines[1] == "ok"
    assert reader.note("big.log") == ("big.log: 5 lines are longer than 64 KiB (lines 1, 3, 5, "
                                      "...); each judged on its first 64 KiB")
    assert runtime.LogLines([b"short\n"], "--log x").note("x") is None


def test_a_line_without_end_past_the_run_bound_is_an_error():
    def zeros():
        chunk = bytes(1 << 16)
        while True:
            yield chunk

    reader = runtime.LogLines(zeros(), "--container c")
    with pytest.raises(LogError, match=r"^--container c: line 1 runs on past 64 MiB with no "
                                       "line end: not a text log$"):
        list(reader)


# ------------------------------------------------------------------------------ the judge alone

def _manifest_file(text: str) -> Path:
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="pk-runtime-"))
    (root / "patches").mkdir()
    (root / "patches/table.diff").write_text("--- a/pkg/mod.py\n+++ b/pkg/mod.py\n"
                                             "@@ -1 +1 @@\n-a\n+b\n")
    (root / "patches/fast.py").write_text("# a transform\n")
    (root / "overlays/extra/pkg").mkdir(parents=True)
    (root / "overlays/extra/pkg/extra.py").write_text("EXTRA = 1\n")
    (root / "patchset.yaml").write_text(textwrap.dedent(text).format(repo="pypi"))
    return root / "patchset.yaml"


def judge(markers, *logs: str):
    scoped = [runtime.ScopedMarker("p", m) for m in markers]
    return runtime.judge(scoped, [runtime.Log(f"r{i}.log", text.splitlines())
                                  for i, text in enumerate(logs)])


def test_forbidden_lines_are_all_counted_and_the_first_twenty_kept():
    [result] = judge([Marker("boom", absent=True)], "boom\n" * 15, "ok\n" + "boom\n" * 10)
    assert not result.ok and result.found == 25
    assert len(result.lines) == 20
    assert result.lines[15] == "r1.log:2: boom"
    assert result.failure_lines()[-1] == "[p] ... and 5 more lines matching 'boom'"


def test_count_zero_and_min():
    zero, least = judge([Marker("x", count=0), Marker("y", minimum=2)], "a\ny\n", "y again\n")
    assert zero.ok and zero.found == 0
    assert least.ok and least.found == 2


def test_a_regex_is_searched_in_each_line():
    [anchored, fp4] = judge([Marker(r"^INFO"), Marker(r"resolved to 'fp4'$")],
                            "  INFO indented\nDeepSeek V4 expert_dtype resolved to 'fp4'\n")
    assert not anchored.ok and fp4.ok


# ------------------------------------------------------------------------------ bad manifests

HEAD = """\
name: demo
vllm:
  repo: pypi
  ref: v0.33.0
"""
PATCH = """\
patches:
  - id: one
    summary: a patch
    diff: patches/table.diff
    runtime:
"""

BAD = [
    ("runtime:\n  - lgo: x\n",
     "patchset.yaml:6: runtime[0]: unknown key 'lgo'; did you mean 'log'?"),
    ("runtime:\n  - log: x\n    minimum: 2\n",
     "patchset.yaml:7: runtime[0]: unknown key 'minimum'; did you mean 'min'?"),
    ("runtime:\n  - absent: true\n", "patchset.yaml:6: runtime[0]: missing required key 'log'"),
    ("runtime:\n  - log: 'x('\n", "patchset.yaml:6: runtime[0].log: 'x(' is not a valid regular "
     "expression: missing ), unterminated subpattern at position 1"),
    ("runtime:\n  - log: a\n    unless: '[a'\n", "patchset.yaml:7: runtime[0].unless: '[a' is not "
     "a valid regular expression: unterminated character set at position 0"),
    ("runtime:\n  - log: 'a|'\n", "patchset.yaml:6: runtime[0].log: 'a|' matches the empty "
     "string, so every line matches it"),
    ("runtime:\n  - log: ''\n", "patchset.yaml:6: runtime[0].log: must not be empty"),
    ("runtime:\n  - log: 12\n", "patchset.yaml:6: runtime[0].log: expected a string, got the "
     "number 12 (quote it to make it a string)"),
    ("runtime:\n  - log: a\n    count: 2\n    min: 1\n", "patchset.yaml:8: runtime[0]: count and "
     "min together; give one (count: exactly N lines, min: at least N)"),
    ("runtime:\n  - log: a\n    count: -1\n", "patchset.yaml:7: runtime[0].count: -1 is negative; "
     "give a number of lines (0 or more)"),
    ("runtime:\n  - log: a\n    min: 1.5\n", "patchset.yaml:7: runtime[0].min: expected a whole "
     "number of lines, got the number 1.5"),
    ("runtime:\n  - log: a\n    count: '3'\n", "patchset.yaml:7: runtime[0].count: expected a "
     "whole number of lines, got the string '3'"),
    ("runtime:\n  - log: a\n    count: true\n", "patchset.yaml:7: runtime[0].count: expected a "
     "whole number of lines, got the boolean true"),
    ("runtime:\n  - log: a\n    min: 0\n", "patchset.yaml:7: runtime[0].min: 0 always holds; "
     "give min: 1 or more, or absent: true"),
    ("runtime:\n  - log: a\n    absent: true\n    count: 1\n", "patchset.yaml:8: runtime[0]: "
     "absent: true with count; a forbidden line has no count (absent: true is count: 0)"),
    ("runtime:\n  - log: a\n    absent: true\n    min: 2\n", "patchset.yaml:8: runtime[0]: "
     "absent: true with min; a forbidden line has no count (absent: true is count: 0)"),
    ("runtime:\n  - log: a\n    absent: 'no'\n", "patchset.yaml:7: runtime[0].absent: expected "
     "true or false, got the string 'no'"),
    ("runtime:\n  log: a\n", "patchset.yaml:6: runtime: expected a list of markers "
     "({log: REGEX, ...}), got a mapping"),
    ("runtime:\n  - a\n", "patchset.yaml:6: runtime[0]: expected a marker (a mapping with "
     "log: REGEX), got the string 'a'"),
    # In a patch entry the message names the entry.
    (PATCH + "      - log: a\n        count: 1\n        min: 1\n",
     "patchset.yaml:12: patches[0] (id=one): runtime[0]: count and min together; give one "
     "(count: exactly N lines, min: at least N)"),
    (PATCH + "      - log: 'a)'\n",
     "patchset.yaml:10: patches[0] (id=one): runtime[0].log: 'a)' is not a valid regular "
     "expression: unbalanced parenthesis at position 1"),
    (PATCH + "      - {log: a, count: 2, cuont: 3}\n",
     "patchset.yaml:10: patches[0] (id=one): runtime[0]: unknown key 'cuont'; did you mean "
     "'count'?"),
]


@pytest.mark.parametrize("body, message", BAD, ids=[m.split(": ", 1)[1][:60] for _, m in BAD])
def test_a_bad_marker_is_one_line_with_its_line(tmp_path, monkeypatch, body, message):
    (tmp_path / "patches").mkdir()
    (tmp_path / "patches/table.diff").write_text("--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n")
    (tmp_path / "patchset.yaml").write_text(HEAD + body)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ManifestError) as info:
        manifest.load("patchset.yaml")
    assert str(info.value) == message


def test_a_bad_marker_exits_2_from_validate(tmp_path):
    (tmp_path / "patchset.yaml").write_text(HEAD + "runtime:\n  - log: a\n    count: 1\n"
                                            "    min: 1\n")
    out = patchkit("validate", cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.splitlines() == [
        "patchkit validate: error: patchset.yaml:8: runtime[0]: count and min together; give one "
        "(count: exactly N lines, min: at least N)"]


def test_markers_load_into_frozen_values(tmp_path, monkeypatch):
    (tmp_path / "patches").mkdir()
    (tmp_path / "patches/table.diff").write_text("--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n")
    (tmp_path / "patchset.yaml").write_text(
        HEAD + PATCH + "      - log: 'event=layer_load'\n        count: 43\n"
        "runtime:\n  - {log: 'startup complete', unless: headless}\n"
        "  - {log: boom, absent: true}\n  - {log: ready, min: 2}\n")
    monkeypatch.chdir(tmp_path)
    m = manifest.load("patchset.yaml")
    assert m.patches[0].runtime == (Marker("event=layer_load", count=43, line=10),)
    assert m.runtime == (Marker("startup complete", unless="headless", line=13),
                         Marker("boom", absent=True, line=14),
                         Marker("ready", minimum=2, line=15))
    with pytest.raises(AttributeError):
        m.runtime[0].log = "x"  # type: ignore[misc]
