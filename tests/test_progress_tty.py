"""A download's progress on a real terminal (tmux): one line that moves and ends; off a
terminal two plain lines; nothing with -q.  The wheel is trickled by an index on 127.0.0.1."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from testing import SRC, patchkit
from testing.trickle import TrickleIndex, pinned_project

VERSION = "0.98.0"
LINE = re.compile(r"vLLM 0\.98\.0 wheel:\s+(\d+)%\|.*\|\s*([\d.]+)([kMG]?)/([\d.]+)([kMG]?)")


def _bytes(number: str, unit: str) -> float:
    return float(number) * {"": 1, "k": 1e3, "M": 1e6, "G": 1e9}[unit]


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_the_progress_line_moves_and_ends_on_a_terminal(tmp_path):
    proj = pinned_project(tmp_path, VERSION)
    sock = tmp_path / "tmux.sock"
    with TrickleIndex("vllm", VERSION, 12 * 1024 * 1024) as index:
        env = index.pip_env()
        env["PYTHONPATH"] = str(SRC)
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()
                           if k.startswith(("PIP_", "PATCHKIT_", "GIT_", "PYTHONPATH")))
        cmd = (f"cd {shlex.quote(str(proj))} && env {exports} {shlex.quote(sys.executable)} "
               f"-m patchkit apply; echo EXIT=$?; sleep 300")
        tmux = ["tmux", "-S", str(sock)]
        subprocess.run([*tmux, "new-session", "-d", "-x", "150", "-y", "30", cmd], check=True)
        try:
            seen: list[tuple[int, float]] = []
            screen = ""
            end = time.monotonic() + 180
            while "EXIT=" not in screen:
                assert time.monotonic() < end, f"patchkit did not end:\n{screen}"
                screen = subprocess.run([*tmux, "capture-pane", "-p"], capture_output=True,
                                        text=True, check=True).stdout
                lines = [LINE.search(ln) for ln in screen.splitlines()]
                found = [m for m in lines if m]
                assert len(found) <= 1, f"the progress is one line, redrawn:\n{screen}"
                if found:
                    m = found[0]
                    seen.append((int(m.group(1)), _bytes(m.group(2), m.group(3))))
                time.sleep(0.3)
        finally:
            subprocess.run([*tmux, "kill-server"], check=False)
    assert "EXIT=0" in screen, screen
    done = [s for s in seen if s[0] == 100]
    moving = [s for s in seen if s[0] < 100]
    assert done, f"the line never ended at 100%:\n{screen}"
    assert len({b for _, b in moving}) >= 2, f"the line did not move: {seen}"
    assert LINE.search(screen) and "B/s" in screen   # the rate, on the finished line


def test_off_a_terminal_two_plain_lines_and_with_q_none(tmp_path):
    proj = pinned_project(tmp_path, VERSION)
    with TrickleIndex("vllm", VERSION, 2 * 1024 * 1024, delay=0.01) as index:
        p = patchkit("apply", cwd=proj, env=index.pip_env())
        assert p.returncode == 0, p.stderr
        said = [ln for ln in p.stderr.splitlines()
                if ln.startswith(("vLLM 0.98.0 wheel", "downloaded vLLM 0.98.0"))]
        assert len(said) == 2, p.stderr
        assert re.fullmatch(r"vLLM 0\.98\.0 wheel: [\d.]+ MB", said[0])
        assert re.match(r"downloaded vLLM 0\.98\.0 wheel: [\d.]+ MB in [\d.]+ s \([\d.]+ [KMG]?B/s\)",
                        said[1])
        assert "\r" not in p.stderr
        shutil.rmtree(proj / ".patchkit")
        shutil.rmtree(Path(os.environ["PATCHKIT_CACHE_DIR"]))
        p = patchkit("apply", "-q", cwd=proj, env=index.pip_env())
        assert p.returncode == 0, p.stderr
        assert p.stderr == ""
        p = patchkit("apply", "-v", cwd=proj, env=index.pip_env())
        assert p.returncode == 0, p.stderr
        assert "+ git " in p.stderr


def test_releases_of_a_rebase_check_download_side_by_side(tmp_path):
    proj = pinned_project(tmp_path, VERSION)
    with TrickleIndex("vllm", VERSION, 3 * 1024 * 1024, more=("0.98.1", "0.98.2")) as index:
        p = patchkit("rebase-check", "--to", "v0.98.1", "--to", "v0.98.2", cwd=proj,
                     env=index.pip_env())
        assert p.returncode == 0, p.stderr
        assert index.most_at_once >= 2, p.stderr
        for v in ("0.98.1", "0.98.2"):
            assert f"downloaded vLLM {v} wheel" in p.stderr
