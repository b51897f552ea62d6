"""The file locks patchkit takes against another run of itself: a real flock held by a real other
process, waited for with a deadline, said once, free again when its holder dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from patchkit import filelocks
from patchkit.errors import PatchkitError

HOLD = ("import sys, time; from patchkit import filelocks\n"
        "with filelocks.held(sys.argv[1], 'x'):\n"
        "    print('in', flush=True); time.sleep(60)\n")


@pytest.fixture
def holder(tmp_path):
    """Another process holding tmp_path/m.lock until it is killed."""
    lock = tmp_path / "m.lock"
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(lock)], stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout.readline() == "in\n"
    yield lock, p
    p.kill()
    p.wait(timeout=10)


def test_another_runs_lock_is_waited_for_said_once_then_given_up_in_one_line(
        holder, monkeypatch):
    lock, _ = holder
    monkeypatch.setattr(filelocks, "WAIT", 0.6)
    monkeypatch.setattr(filelocks, "SAY_AFTER", 0.1)
    said = []
    start = time.monotonic()
    with pytest.raises(filelocks.BusyError) as e:
        with filelocks.held(lock, "the mirror of pypi", said.append):
            pytest.fail("entered a lock another process holds")
    waited = time.monotonic() - start
    assert 0.6 <= waited < 5
    assert said == [f"waiting for another patchkit run that holds the mirror of pypi ({lock}), "
                    "at most 0.6 s"]
    assert str(e.value) == (f"the mirror of pypi: another patchkit run has held {lock} for "
                            "more than 0.6 s; run again when it has ended")
    assert "\n" not in str(e.value) and isinstance(e.value, PatchkitError)


def test_a_lock_is_had_as_soon_as_its_holder_ends_even_by_kill_9(holder, monkeypatch):
    lock, p = holder
    monkeypatch.setattr(filelocks, "SAY_AFTER", 30)
    os.kill(p.pid, signal.SIGKILL)
    said = []
    with filelocks.held(lock, "x", said.append):
        pass
    assert said == [] and lock.exists()  # a cache's lock file stays


def test_a_free_lock_is_taken_without_a_word_and_a_second_take_waits(tmp_path,
                                                                     monkeypatch):
    monkeypatch.setattr(filelocks, "WAIT", 0.3)
    said = []
    with filelocks.held(tmp_path / "a.lock", "a", said.append):
        # a second take of the same lock, even in this process, is a second holder
        with pytest.raises(filelocks.BusyError):
            with filelocks.held(tmp_path / "a.lock", "a"):
                pass
    assert said == []


def test_a_run_never_waits_on_its_own_lock_as_on_another_run(tmp_path, monkeypatch):
    """Two threads of one run (rebase-check resolving targets side by side) take the cached
    releases' lock in turn, without a line saying that another run holds it."""
    import threading

    monkeypatch.setattr(filelocks, "SAY_AFTER", 0.05)
    lock = tmp_path / "vllm.lock"
    inside, done = threading.Event(), threading.Event()

    def worker():
        with filelocks.held(lock, "the cached vllm releases"):
            inside.set()
            time.sleep(0.5)
        done.set()

    t = threading.Thread(target=worker)
    t.start()
    assert inside.wait(10)
    said = []
    with filelocks.held(lock, "the cached vllm releases", said.append):
        assert done.is_set()   # had only once the other thread let go
    t.join(10)
    assert said == []


def test_a_lock_in_a_bad_state_is_named_in_one_line(tmp_path):
    """Found by fuzzing: a folder in place of a lock file was an IsADirectoryError (exit 3)
    on every later run."""
    lock = tmp_path / "m.lock"
    lock.mkdir()
    with pytest.raises(filelocks.LockError) as err:
        with filelocks.held(lock, "the mirror of x"):
            pass
    assert err.value.exit_code == 2
    assert str(err.value) == (f"the mirror of x: the lock {lock} is a folder, not a lock file; "
                              "remove it when no patchkit run is going")
