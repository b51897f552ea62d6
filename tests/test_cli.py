from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from testing import patchkit, spawn
from testing.project import Hold, add_slow, make_project
from testing.upstream import sh


def test_version_and_help(tmp_path):
    assert patchkit("--version", cwd=tmp_path).stdout.startswith("patchkit, version ")
    out = patchkit("--help", cwd=tmp_path).stdout
    for cmd in ("apply", "verify", "validate"):
        assert cmd in out


def test_apply_text_and_exit_0(tmp_path):
    proj = make_project(tmp_path)
    p = patchkit("apply", cwd=proj)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith("applied   table-nvfp4 [")
    assert lines[-1].startswith("ok: 3 applied; 3/3 assertions passed")
    assert (proj / ".patchkit/vllm/pkg/extra.py").exists()


def test_apply_json_report_on_failure_exit_1(tmp_path):
    proj = make_project(tmp_path)
    p = patchkit("apply", "--vllm-ref", "v4", "--format", "json", cwd=proj)
    assert p.returncode == 1
    report = json.loads(p.stdout)
    assert report["ok"] is False
    assert report["vllm"]["ref"] == "v4" and len(report["vllm"]["commit"]) == 40
    assert [(x["id"], x["status"], x["reason"]) for x in report["patches"]] == [
        ("table-nvfp4", "upstream", None), ("fast-mode", "failed", "anchor-missing"),
        ("extra-file", "applied", None)]
    assert {"patch", "file", "line", "ok", "message"} <= set(report["verify"][0])
    assert not (proj / ".patchkit/vllm").exists()


def test_manifest_error_exit_2_one_line(tmp_path):
    proj = make_project(tmp_path)
    text = (proj / "patchset.yaml").read_text().replace("summary: make the mode fast", "sumary: x")
    (proj / "patchset.yaml").write_text(text)
    for cmd in ("validate", "apply"):
        p = patchkit(cmd, cwd=proj)
        assert p.returncode == 2
        assert len(p.stderr.strip().splitlines()) == 1, p.stderr
        assert "patchset.yaml:" in p.stderr and "id=fast-mode" in p.stderr
        assert "Traceback" not in p.stderr


def test_unknown_ref_exit_2_naming_it(tmp_path):
    proj = make_project(tmp_path)
    p = patchkit("apply", "--vllm-ref", "v1.5", cwd=proj)
    assert p.returncode == 2
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("patchkit apply: error: unknown vLLM ref 'v1.5' in ")
    assert last.endswith("(did you mean v1?)") and "Traceback" not in p.stderr


def test_bad_flag_is_one_line_exit_2(tmp_path):
    p = patchkit("apply", "--frobnicate", cwd=tmp_path)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        "patchkit apply: error: No such option '--frobnicate'. Did you mean '--format'? "
        "(see 'patchkit apply --help')"]
    p = patchkit("apply", "--format", "xml", cwd=tmp_path)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("flag", ["--max-jobs", "--nvcc-threads"])
def test_build_image_counts_must_be_positive(tmp_path, flag):
    p = patchkit("build-image", flag, "0", cwd=tmp_path)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1
    assert f"Invalid value for '{flag}': 0 is not in the range x>=1" in p.stderr


def test_verify_tree(tmp_path):
    proj = make_project(tmp_path)
    assert patchkit("apply", cwd=proj).returncode == 0
    ok = patchkit("verify", "--tree", ".patchkit/vllm", cwd=proj)
    assert ok.returncode == 0 and "3/3 assertions passed" in ok.stdout
    (proj / ".patchkit/vllm/pkg/extra.py").write_text("OTHER = 1\n")
    bad = patchkit("verify", "--tree", ".patchkit/vllm", cwd=proj)
    assert bad.returncode == 1
    assert bad.stdout.startswith("pkg/extra.py:1:0: [extra-file] ")


def test_pypi_source_needs_release_tag(tmp_path):
    proj = make_project(tmp_path)
    p = patchkit("apply", "--vllm-repo", "pypi", "--vllm-ref", "main", cwd=proj)
    assert p.returncode == 2 and "takes a release tag such as v0.27.1" in p.stderr


# where the held patch sits: first, between two patches, or last (stopped before the swap)
HELD_BEFORE = {"first": "table-nvfp4", "middle": "extra-file", "last": None}


@pytest.mark.parametrize("where", list(HELD_BEFORE))
@pytest.mark.parametrize("prior", [False, True], ids=["no-checkout", "prior-checkout"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_leaves_workdir_absent_or_complete(tmp_path, sig, prior, where):
    """A signal while the series runs stops it: exit 130 for SIGINT, 143 for SIGTERM, and the
    workdir exactly as it was.  The run is held inside a patch while the signal is sent."""
    proj = make_project(tmp_path)
    add_slow(proj, "pkg/mod.py", before=HELD_BEFORE[where])
    wd = proj / ".patchkit/vllm"
    if prior:  # a previous good checkout must survive any interruption
        assert patchkit("apply", cwd=proj).returncode == 0
        (wd / ".git/marker").write_text("old")
    hold = Hold(tmp_path / "hold")
    proc = spawn("apply", cwd=proj, env=hold.env)
    hold.wait(proc)
    proc.send_signal(sig)
    hold.release()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == {signal.SIGINT: 130, signal.SIGTERM: 143}[sig], err
    assert "Traceback" not in err
    # patchkit's own line, not Python's KeyboardInterrupt (which also exits 130)
    assert err.splitlines()[-1] == f"patchkit: interrupted by {sig.name}; nothing was changed"
    # interrupted: the workdir is exactly what it was before
    assert wd.exists() == prior
    if prior:
        assert (wd / ".git/marker").read_text() == "old"
    if wd.exists():  # never half-made: complete, clean, and verified
        last = "slow: takes a while" if where == "last" else "extra-file: add a new module"
        assert sh("git", "status", "--porcelain", cwd=wd) == ""
        assert sh("git", "log", "-1", "--format=%s", cwd=wd) == f"patchkit: {last}"
        assert patchkit("verify", cwd=proj).returncode == 0
    leftovers = [p.name for p in (proj / ".patchkit").iterdir() if "patchkit-" in p.name] \
        if (proj / ".patchkit").exists() else []
    assert leftovers == []
    # the cache still works
    assert patchkit("apply", cwd=proj).returncode == 0


def test_concurrent_applies_share_one_cache(tmp_path):
    proj = make_project(tmp_path)
    procs = [spawn("apply", "--workdir", f"wd{i % 2}", "--format", "json", cwd=proj)
             for i in range(4)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], [o[1] for o in outs]
    heads = {json.loads(o[0])["patches"][-1]["commit"] for o in outs}
    assert len(heads) == 1
    trees = {sh("git", "rev-parse", "HEAD^{tree}", cwd=proj / f"wd{i}") for i in range(2)}
    assert len(trees) == 1
    assert [p.name for p in proj.iterdir() if "patchkit-" in p.name] == []


def test_unexpected_error_is_one_line_and_logged(tmp_path, monkeypatch, capsys):
    from patchkit import cli
    from patchkit.series import applier

    proj = make_project(tmp_path)
    monkeypatch.chdir(proj)

    def boom(*a, **k):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(applier, "apply_series", boom)
    assert cli.main(["apply"]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "patchkit apply: error: unexpected error: RuntimeError: disk on fire")
    log = Path(err[0].rsplit("traceback in ", 1)[1].rstrip(")"))
    assert "Traceback" in log.read_text() and "disk on fire" in log.read_text()


def test_relative_local_repo_is_taken_from_the_manifest_folder(tmp_path):
    proj = make_project(tmp_path)
    text = (proj / "patchset.yaml").read_text()
    text = text.replace(f"repo: {tmp_path / 'upstream'}", "repo: ../upstream")
    (proj / "patchset.yaml").write_text(text)
    (proj / "sub").mkdir()
    p = patchkit("apply", "--manifest", "../patchset.yaml", "--workdir", "wd", cwd=proj / "sub")
    assert p.returncode == 0, p.stderr
    assert (proj / "sub/wd/pkg/extra.py").exists()


def test_scratch_of_a_killed_run_is_removed_by_the_next(tmp_path):
    proj = make_project(tmp_path)
    add_slow(proj, "pkg/mod.py")
    hold = Hold(tmp_path / "hold")
    proc = spawn("apply", cwd=proj, env=hold.env)
    hold.wait(proc)  # inside the series, in its scratch checkout
    proc.kill()  # SIGKILL: no cleanup runs
    proc.communicate()
    orphans = list((proj / ".patchkit").glob(".vllm.patchkit-*"))
    assert orphans
    assert patchkit("apply", cwd=proj).returncode == 0
    assert not any(p.exists() for p in orphans)
    assert (proj / ".patchkit/vllm/pkg/extra.py").exists()


def test_error_under_format_json_is_also_json_on_stdout(tmp_path):
    proj = make_project(tmp_path)
    p = patchkit("apply", "--vllm-ref", "v9", "--format", "json", cwd=proj)
    assert p.returncode == 2
    answer = json.loads(p.stdout)
    assert answer["ok"] is False and answer["exit_code"] == 2
    assert answer["error"].startswith("unknown vLLM ref 'v9'")
    assert p.stderr.strip().splitlines()[-1].startswith("patchkit apply: error: unknown vLLM ref 'v9'")
    text = patchkit("apply", "--vllm-ref", "v9", cwd=proj)
    assert text.returncode == 2 and text.stdout == ""


def test_bad_flag_under_format_json_is_json_too(tmp_path):
    p = patchkit("apply", "--format", "json", "--frobnicate", cwd=tmp_path)
    assert p.returncode == 2
    assert json.loads(p.stdout) == {"ok": False, "exit_code": 2,
                                    "error": "No such option '--frobnicate'. Did you mean '--format'?"}


# ------------------------------------------------------------------------------ the smaller list

def test_patchkit_alone_prints_the_short_usage_and_exits_2(tmp_path):
    p = patchkit(cwd=tmp_path)
    assert p.returncode == 2 and p.stdout == ""
    lines = p.stderr.splitlines()
    assert lines[0] == "usage: patchkit [--version] [-h | --help] COMMAND [ARGS]..."
    assert len(lines) < 15 and "Options:" not in p.stderr and "error" not in p.stderr


def test_the_verb_list_of_help_is_never_cut_mid_phrase(tmp_path):
    out = patchkit("--help", cwd=tmp_path).stdout
    listed = out.split("Commands:\n", 1)[1]
    assert "..." not in listed
    assert "  verify        Run the AST assertions on a tree or an image\n" in listed


def test_every_verb_says_its_name_in_its_error_line(tmp_path):
    proj = make_project(tmp_path)
    for verb, *args in (("apply",), ("verify",), ("validate",), ("rebase-check", "--to", "v2"),
                        ("lock",), ("export",), ("bisect", "fast-mode")):
        p = patchkit(verb, *args, "--manifest", "nope.yaml", cwd=proj)
        assert p.returncode == 2, (verb, p.stderr)
        assert p.stderr.splitlines()[-1] == f"patchkit {verb}: error: nope.yaml: no such file"


def test_a_bad_pypi_ref_from_the_manifest_blames_no_flag(tmp_path):
    proj = make_project(tmp_path)
    yaml = proj / "patchset.yaml"
    yaml.write_text("\n".join("  repo: pypi" if line.startswith("  repo: ") else line
                              for line in yaml.read_text().splitlines()) + "\n")
    p = patchkit("rebase-check", "--to", "nonsense", cwd=proj)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "--vllm-repo" not in p.stderr
    assert p.stderr.splitlines()[-1] == ("patchkit rebase-check: error: the vLLM source pypi "
                                         "takes a release tag such as v0.27.1, not 'nonsense'")


def test_verify_of_a_folder_that_is_no_checkout_is_one_line(tmp_path):
    proj = make_project(tmp_path)
    (tmp_path / "elsewhere" / "docs").mkdir(parents=True)
    p = patchkit("verify", "--tree", str(tmp_path / "elsewhere"), cwd=proj)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.splitlines() == [
        f"patchkit verify: error: --tree {tmp_path / 'elsewhere'}: no vLLM checkout there (no "
        "apply report, and none of the 2 files the assertions read: pkg/extra.py, pkg/mod.py)"]


def test_one_patch_and_one_target_are_singular(tmp_path):
    proj = make_project(tmp_path)
    yaml = proj / "patchset.yaml"
    text = yaml.read_text()
    yaml.write_text(text[:text.index("  - id: fast-mode")])
    p = patchkit("validate", cwd=proj)
    assert p.stdout.startswith("patchset.yaml: ok (1 patch, 1 diff parsed, 1 assertion, ")
    p = patchkit("rebase-check", "--to", "v2", cwd=proj)
    assert p.stdout.splitlines()[0] == "demo: 1 patch x 1 vLLM target (pinned at v1)"


def test_copy_image_takes_manifest_and_copies_its_build_without_image(tmp_path):
    from patchkit import manifest
    from patchkit.commands import copy_image

    proj = make_project(tmp_path)
    assert copy_image.built_image(manifest.load(proj / "patchset.yaml")) == "demo:v1"
    env = {"DOCKER_HOST": f"unix://{tmp_path}/no.sock", "PATH": "/usr/bin:/bin"}
    p = patchkit("copy-image", "--to", "tcp://127.0.0.1:9", "--manifest", "patchset.yaml",
                 cwd=proj, env=env)
    assert p.returncode == 1   # read, then the engine is asked for demo:v1
    assert p.stderr.splitlines()[-1].startswith("patchkit copy-image: error: no Docker Engine "
                                                "answers at unix://")
    p = patchkit("copy-image", "--to", "tcp://127.0.0.1:9", "--manifest", "nope.yaml",
                 cwd=proj, env=env)
    assert (p.returncode, p.stderr.splitlines()[-1]) == (
        2, "patchkit copy-image: error: nope.yaml: no such file")


@pytest.mark.parametrize("where", ["before", "after"])
def test_quiet_and_verbose_work_before_or_after_the_verb(tmp_path, where):
    proj = make_project(tmp_path)

    def run(flag: str, verb: str = "apply"):
        args = (flag, verb) if where == "before" else (verb, flag)
        p = patchkit(*args, cwd=proj)
        assert p.returncode == 0, p.stderr
        return p

    assert run("-q").stderr == ""
    assert "+ git " in run("-v").stderr
    assert "+ git " in run("--verbose").stderr
    assert run("--quiet", "cache").stderr == ""
    assert run("-q").stdout.splitlines()[-1].startswith("ok: 3 applied")


STUCK = '''\
import itertools
import os
from pathlib import Path

from patchkit.transform import Transform


class Stuck(Transform):
    path = "pkg/mod.py"

    def postcondition(self, module):
        return False

    def transform(self, module):
        Path(os.environ["PK_TEST_STUCK"]).write_text(str(os.getpid()))
        any(itertools.repeat(False))   # C code: no signal handler of Python runs in here
        return module
'''


def _stuck_project(tmp_path: Path) -> Path:
    proj = make_project(tmp_path)
    (proj / "patches/fast.py").write_text(STUCK)
    return proj


def test_a_stuck_transform_fails_at_the_deadline_and_json_stays_json(tmp_path):
    proj = _stuck_project(tmp_path)
    env = {"PK_TEST_STUCK": str(tmp_path / "stuck.pid")}
    p = patchkit("apply", "--timeout", "1", "--format", "json", cwd=proj, env=env, timeout=60)
    assert p.returncode == 1, p.stderr
    fates = {x["id"]: (x["status"], x["reason"], x["message"])
             for x in json.loads(p.stdout)["patches"]}
    assert fates["fast-mode"][:2] == ("failed", "error")
    assert fates["fast-mode"][2].endswith("fast.py: transform ran past its deadline of 1 s "
                                          "of CPU time (--timeout) and was stopped")
    assert fates["table-nvfp4"][0] == fates["extra-file"][0] == "applied"   # the rest ran
    if (tmp_path / "stuck.pid").exists():   # it got as far as the loop: the worker is gone
        assert not Path("/proc", (tmp_path / "stuck.pid").read_text()).exists()
    assert not (proj / ".patchkit/vllm").exists()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_a_transform_stuck_in_c_code(tmp_path, sig):
    import time

    proj = _stuck_project(tmp_path)
    marker = tmp_path / "stuck.pid"
    proc = spawn("apply", cwd=proj, env={"PK_TEST_STUCK": str(marker)})
    deadline = time.monotonic() + 60
    while not marker.exists() or not marker.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.02)
    sent = time.monotonic()
    proc.send_signal(sig)   # to patchkit alone, not its worker
    _, err = proc.communicate(timeout=30)
    assert time.monotonic() - sent < 10
    assert proc.returncode == 128 + sig, err
    assert err.splitlines()[-1] == f"patchkit: interrupted by {sig.name}; nothing was changed"
    assert not Path("/proc", marker.read_text()).exists()   # the worker is gone too
    assert not (proj / ".patchkit/vllm").exists()


@pytest.mark.parametrize("args", [
    ("--vllm-ref", "r" * 100_000), ("--vllm-repo", "h" * 100_000), ("--vllm-repo", "h" * 3000),
])
def test_an_error_quotes_a_huge_value_cut_short(tmp_path, args):
    proj = make_project(tmp_path)
    for fmt in ("text", "json"):
        p = patchkit("apply", *args, "--format", fmt, cwd=proj)
        assert p.returncode == 2, p.stderr
        assert "Traceback" not in p.stderr
        if fmt == "json":
            said = json.loads(p.stdout)["error"]
        else:
            said = p.stderr.strip().splitlines()[-1]
        assert len(said) < 300 and "…" in said, said


def test_cache_faults_are_no_failure_on_this_run_or_a_later_one(tmp_path):
    """Found by fuzzing: a kept JSON file still valid but changed was a KeyError, on every
    later run; now it is dropped and made again, and -v says so.  A lock file replaced by a
    folder is named in one line, exit 2."""
    proj = make_project(tmp_path)
    env = {"PATCHKIT_CACHE_DIR": str(tmp_path / "cache")}
    assert patchkit("apply", cwd=proj, env=env).returncode == 0
    kept = sorted((tmp_path / "cache").glob("transform*/*.json"))
    assert kept
    for path in kept:
        entry = json.loads(path.read_text())
        entry["value"] = [["Fast", "pkg/elsewhere.py"]] if isinstance(entry["value"], list) \
            else dict(entry["value"], texts={})
        path.write_text(json.dumps(entry))
    for n in range(2):
        p = patchkit("apply", "-v", "--workdir", f"wd{n}", cwd=proj, env=env)
        assert p.returncode == 0, p.stderr
        assert ("dropped the cache entry" in p.stderr) == (n == 0), p.stderr
    locks = sorted((tmp_path / "cache" / "repos").glob("*.lock"))   # the mirror's
    assert locks
    locks[0].unlink()
    locks[0].mkdir()
    p = patchkit("apply", "--workdir", "wd3", cwd=proj, env=env)
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().splitlines()[-1].endswith(
        f"the lock {locks[0]} is a folder, not a lock file; remove it when no patchkit run is "
        "going"), p.stderr


def test_a_transform_worker_dies_with_patchkit_even_by_sigkill(tmp_path):
    import time

    proj = _stuck_project(tmp_path)
    marker = tmp_path / "stuck.pid"
    proc = spawn("apply", cwd=proj, env={"PK_TEST_STUCK": str(marker)})
    deadline = time.monotonic() + 60
    while not marker.exists() or not marker.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.02)
    proc.kill()
    proc.communicate(timeout=30)
    status = Path("/proc", marker.read_text(), "status")
    deadline = time.monotonic() + 10
    while True:
        try:
            if "State:\tZ" in status.read_text():
                break   # dead, waiting for init to reap it
        except FileNotFoundError:
            break
        assert time.monotonic() < deadline, "the worker outlived patchkit"
        time.sleep(0.05)
