"""Nothing survives patchkit: a real ``kill -9`` during a real ``pip download`` (served slowly
by an index on 127.0.0.1) leaves no child running, and the next run cleans the partial
download and finishes."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from testing import patchkit, spawn
from testing.trickle import TrickleIndex, pinned_project

VERSION = "0.99.0"


def children(pid: int) -> list[int]:
    """Live processes whose parent is ``pid``."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[1]) == pid and fields[0] != "Z":
                out.append(int(entry.name))
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"   # a zombie is dead; only its parent's reaping is left


def wait_for(check, what: str, deadline: float = 120.0) -> None:
    end = time.monotonic() + deadline
    while not check():
        assert time.monotonic() < end, f"still waiting after {deadline:.0f} s for {what}"
        time.sleep(0.1)


def test_kill_9_during_a_download_leaves_no_child_and_the_rerun_cleans(tmp_path):
    proj = pinned_project(tmp_path, VERSION)
    cache = Path(os.environ["PATCHKIT_CACHE_DIR"])
    with TrickleIndex("vllm", VERSION, 64 * 1024 * 1024) as index:
        env = index.pip_env()
        run = spawn("apply", cwd=proj, env=env)
        try:
            wait_for(lambda: index.sent > 1024 * 1024, "the download to begin")
            pips = [c for c in children(run.pid)
                    if b"download" in Path(f"/proc/{c}/cmdline").read_bytes()]
            assert pips, "pip download is not a child of patchkit"
            os.kill(run.pid, signal.SIGKILL)
            run.wait(timeout=30)
        finally:
            if run.poll() is None:
                run.kill()
        # the kernel ends pip at once; the whole wheel would take a minute at this pace
        wait_for(lambda: not any(alive(p) for p in pips), "pip to die with patchkit", 10)
        time.sleep(1)   # a write already under way may still land
        sent = index.sent
        time.sleep(1)
        assert index.sent == sent, "the download went on after patchkit was killed"
        assert sent < len(index.wheel)
        wheels = cache / "pypi" / "wheels"
        left = list(wheels.glob(f"download.vllm-{VERSION}.*"))
        assert left, "the partial download should be inside the cache, in its own folder"
        assert not list(wheels.glob("*.whl"))

        index.fast = True
        p = patchkit("apply", cwd=proj, env=env)
        assert p.returncode == 0, p.stderr
        assert f"removing {left[0].name}, the download of a run that was killed" in p.stderr
        assert not list(wheels.glob("download.*"))
        assert [w.name for w in wheels.glob("*.whl")] == [index.wheel_name]
        assert (proj / ".patchkit/vllm/vllm/__init__.py").is_file()


def test_a_python_without_pip_is_named_in_one_line(tmp_path):
    """pip is a dependency; a Python that lacks it anyway (a venv made --without-pip, with
    patchkit's other dependencies) gets one line naming pip, not "no source has vLLM"."""
    import site
    import subprocess
    import sys

    from testing import SRC

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    ours = next(Path(p) for p in site.getsitepackages() if (Path(p) / "click").is_dir())
    theirs = next((venv / "lib").glob("python*/site-packages"))
    for entry in ours.iterdir():   # every dependency but pip
        if not entry.name.lower().startswith("pip") and not entry.name.startswith("_") \
                and entry.suffix != ".pth":
            (theirs / entry.name).symlink_to(entry)
    proj = pinned_project(tmp_path, VERSION)
    p = subprocess.run([str(venv / "bin/python"), "-m", "patchkit", "apply"], cwd=proj,
                       env=dict(os.environ, PYTHONPATH=str(SRC)), text=True,
                       capture_output=True, check=False)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert lines[-1].startswith("patchkit") and "pip is missing" in lines[-1], p.stderr
    assert "no source has" not in p.stderr and "Traceback" not in p.stderr


def test_prune_waits_for_a_running_download_then_removes_what_its_kill_left(tmp_path):
    proj = pinned_project(tmp_path, VERSION)
    cache = Path(os.environ["PATCHKIT_CACHE_DIR"])
    with TrickleIndex("vllm", VERSION, 64 * 1024 * 1024) as index:
        env = index.pip_env()
        run = spawn("apply", cwd=proj, env=env)
        try:
            wait_for(lambda: index.sent > 512 * 1024, "the download to begin")
            p = patchkit("cache", "prune", "--wait", "0.5", cwd=proj)
            assert p.returncode == 2, p.stdout + p.stderr
            assert "another patchkit run is using the cache" in p.stderr
            left = list((cache / "pypi" / "wheels").glob("download.*"))
            assert left   # the download under way was not touched
            os.kill(run.pid, signal.SIGKILL)
            run.wait(timeout=30)
        finally:
            if run.poll() is None:
                run.kill()
    p = patchkit("cache", "prune", cwd=proj)
    assert p.returncode == 0, p.stderr
    assert "removed leftover a download a killed run left" in p.stdout
    assert not list((cache / "pypi" / "wheels").glob("download.*"))


SCRIPT = """
import sys
from patchkit import process
print("started", flush=True)
process.run_user(["sh", "-c", "sleep 613.25 & sleep 613.25; wait"], env={}, timeout=600)
"""


def test_what_a_users_command_started_dies_with_patchkit_too(tmp_path):
    """bisect --series --run's command, and what it starts, do not outlive a kill -9."""
    import subprocess
    import sys

    from testing import cli_env

    def sleepers() -> list[int]:
        out = []
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and alive(int(entry.name)) and \
                        (entry / "cmdline").read_bytes() == b"sleep\x00613.25\x00":
                    out.append(int(entry.name))
            except OSError:
                continue
        return out

    runner = subprocess.Popen([sys.executable, "-c", SCRIPT], env=cli_env(),
                              stdout=subprocess.PIPE, text=True)
    try:
        assert runner.stdout.readline().strip() == "started"
        wait_for(lambda: len(sleepers()) == 2, "the command and its child to start", 30)
        os.kill(runner.pid, signal.SIGKILL)
        runner.wait(timeout=30)
    finally:
        if runner.poll() is None:
            runner.kill()
    wait_for(lambda: not sleepers(), "the command and what it started to die", 10)
