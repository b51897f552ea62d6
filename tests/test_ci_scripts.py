"""`make test`'s driver (.ci/test.sh) and the services scripts: shellcheck-clean, and the driver
stops what its run started, only that, also on one Ctrl-C that the suite would sit out.

The set-up is a stand-in (PK_TEST_SETUP) that starts one "service" the way .ci/services.sh
does (a process of its own session, recorded in $PK_SERVICES_STARTED) and writes the env file;
the suite is a process that ignores SIGINT, as pytest-xdist's controller nearly does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from testing import REPO_ROOT

SCRIPTS = [REPO_ROOT / ".ci" / n for n in ("run", "setup.sh", "services.sh", "services-stop.sh",
                                           "test.sh")]

SETUP = """\
set -eu
setsid bash -c 'exec -a "pk-fake-service $PK_SERVICES_ROOT" sleep 300' </dev/null >/dev/null 2>&1 &
echo "fake $! $PK_SERVICES_ROOT" >>"$PK_SERVICES_STARTED"
echo "export PK_FAKE=$!" >"$PK_SERVICES_ENV"
"""


def test_the_scripts_are_shellcheck_clean():
    out = subprocess.run(["shellcheck", "--shell=bash", "-x", *map(str, SCRIPTS)],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def driver(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("make test runs as root")
    root = tmp_path / "services"
    (tmp_path / "setup.sh").write_text(SETUP)
    # a process of ours that was running before: the run must leave it alone
    before = subprocess.Popen(["bash", "-c", f'exec -a "pk-fake-service {root}" sleep 300'],
                              start_new_session=True)
    env = dict(os.environ, PK_SERVICES_ROOT=str(root), PK_TEST_SETUP=str(tmp_path / "setup.sh"))
    env.pop("PK_SERVICES_ENV", None)
    procs = []

    def start(*cmd: str) -> subprocess.Popen:
        p = subprocess.Popen(["bash", str(REPO_ROOT / ".ci" / "test.sh"), *cmd], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
        procs.append(p)
        return p

    yield start, before
    for p in procs:
        if p.poll() is None:
            p.kill()
    before.kill()
    before.wait()


def fake_of(err: str) -> int:
    (line,) = [ln for ln in err.splitlines() if ln.startswith("services: stopped fake (pid ")]
    return int(line.split("pid ")[1].rstrip(")"))


def test_one_ctrl_c_ends_the_run_and_stops_what_it_started(driver):
    start, before = driver
    ignores = ("import signal, sys, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
               "print('running', flush=True); time.sleep(300)")
    p = start(sys.executable, "-c", ignores)
    assert p.stdout.readline() == "running\n"
    t0 = time.monotonic()
    os.killpg(p.pid, signal.SIGINT)   # the terminal's Ctrl-C: to the foreground group
    _, err = p.communicate(timeout=30)
    took = time.monotonic() - t0
    assert p.returncode == 130 and took < 10, (took, err)
    assert "make test: SIGINT; ending the run" in err
    assert not alive(fake_of(err))
    assert alive(before.pid)          # running before the run: left running


def test_a_failing_suite_still_stops_what_it_started_and_keeps_its_exit_code(driver):
    start, before = driver
    p = start("bash", "-c", 'test -n "$PK_FAKE" && exit 3')   # the env file was sourced
    _, err = p.communicate(timeout=60)
    assert p.returncode == 3, err
    assert not alive(fake_of(err)) and alive(before.pid)
