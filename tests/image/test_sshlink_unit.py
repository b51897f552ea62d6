"""One ssh connection per node: what ``sshlink.SshLink`` runs, and that it leaves nothing.

The system's ``ssh`` is replaced on PATH by a script that writes down each command line and
then relays its input to its output, as ``docker system dial-stdio`` on a node does: the test
reads what patchkit asked ssh for, without a node.  The copies over a real sshd (one
connection for the API and the load, a node that takes one session per connection) are in
test_copy_docker.py.
"""

from __future__ import annotations

import gc
import os
import tempfile
import time
from pathlib import Path

import pytest

from patchkit.commands import copy_image
from patchkit.engines.sshlink import SshLink
from patchkit.errors import ImageError

STANDIN = """#!/bin/sh
echo "$*" >> "{log}"
exec cat
"""


@pytest.fixture
def ssh_log(tmp_path, monkeypatch) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "ssh.log"
    (bindir / "ssh").write_text(STANDIN.format(log=log))
    (bindir / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return log


def _lines(log: Path, n: int) -> list[str]:
    until = time.monotonic() + 10
    while time.monotonic() < until:
        lines = log.read_text().splitlines() if log.exists() else []
        if len(lines) >= n:
            return lines
        time.sleep(0.02)
    raise AssertionError(f"ssh ran {log.read_text() if log.exists() else 'never'}")


def _option(line: str, name: str) -> str:
    words = line.split()
    return next(words[i + 1].split("=", 1)[1] for i, w in enumerate(words)
                if w == "-o" and words[i + 1].startswith(f"{name}="))


def test_the_master_starts_with_the_link_and_every_session_shares_it(ssh_log):
    link = SshLink("node", 2222, 5.0)
    try:
        # ssh is running before anything asks the engine: it connects meanwhile
        (first,) = _lines(ssh_log, 1)
        assert first.endswith("-p 2222 -- node docker system dial-stdio"), first
        assert _option(first, "ControlMaster") == "auto"
        assert _option(first, "ControlPersist") == "no"
        socket = _option(first, "ControlPath")
        folder = os.path.dirname(socket)
        assert os.stat(folder).st_mode & 0o077 == 0   # this user's alone
        stream = link.session(5.0)
        stream.sendall(b"ping")
        assert stream.recv_into(bytearray(4)) == 4
        assert _lines(ssh_log, 1) == [first]   # the first session is the one started early
        # the load's and the export's ssh: over the master, never a master of their own
        argv = link.argv()
        assert "ControlMaster=no" in argv and f"ControlPath={socket}" in argv
        assert argv[-2:] == ["--", "node"]
        second = link.session(5.0)
        assert _lines(ssh_log, 2)[1] == first   # another API session: the same link
        procs = [stream.proc, second.proc]
    finally:
        link.close()
    assert all(p.poll() is not None for p in procs)
    assert not os.path.exists(folder)


def test_a_link_never_used_ends_its_master_and_folder(ssh_log):
    link = SshLink("node", 22, 5.0)
    (first,) = _lines(ssh_log, 1)
    folder = os.path.dirname(_option(first, "ControlPath"))
    master = link._first.proc
    link.close()
    assert not os.path.exists(folder)
    assert master.poll() is not None


def test_the_folder_of_a_link_never_closed_goes_with_it(ssh_log):
    link = SshLink("node", 22, 5.0)
    (first,) = _lines(ssh_log, 1)
    folder = os.path.dirname(_option(first, "ControlPath"))
    master = link._first.proc
    del link
    gc.collect()
    assert not os.path.exists(folder)
    master.kill()
    master.wait(timeout=10)


def test_copy_image_starts_the_nodes_connection_before_the_source_answers(ssh_log, tmp_path,
                                                                         monkeypatch):
    # the source engine is not there: the run fails on it, and the node's ssh, started at
    # once beside it, has ended with the run, its folder gone
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/none.sock")
    with pytest.raises(ImageError, match="no Docker Engine answers at unix://"):
        copy_image.run("pk-test/x:1", ["ssh://node:2222"])
    (line,) = _lines(ssh_log, 1)
    assert line.endswith("-p 2222 -- node docker system dial-stdio"), line
    assert not [p for p in os.listdir(tmp_path) if p.startswith("pk-ssh-")]
