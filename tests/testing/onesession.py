"""An sshd of a test's own in front of a node's engine that opens one session per connection.

patchkit opens every session on a node over one ssh connection (the API's session is its
master).  ``one_session_sshd(node)`` starts a second sshd for node ``node`` of .ci/services.sh
(its own config, keys and engine, read from ``$PK_SERVICES_ROOT/pk-nodeN-ssh/sshd_config``),
on a port of its own, with ``MaxSessions 1``: it answers the API's session and refuses any
other session on that connection, so that ssh opens a connection of its own for it (which a
``testing.link`` relay in front can then refuse: a node that drops the load's own session).
It yields the port; on exit this sshd (and only it, by its pid) is stopped.  It needs root
and sshd: without them it raises :class:`Unavailable`.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path


class Unavailable(Exception):
    pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def one_session_sshd(node: int, folder: Path) -> Iterator[int]:
    root = os.environ.get("PK_SERVICES_ROOT", "/tmp/patchkit-tests")
    config = Path(root) / f"pk-node{node}-ssh" / "sshd_config"
    sshd = shutil.which("sshd") or "/usr/sbin/sshd"
    if os.geteuid() != 0 or not os.path.exists(sshd) or not config.is_file():
        raise Unavailable(f"an sshd of the test's own needs root, sshd and {config}")
    port = _free_port()
    text = re.sub(r"(?m)^(Port|PidFile) .*\n", "", config.read_text())
    mine = folder / "sshd_config"
    mine.write_text(f"Port {port}\nPidFile {folder / 'sshd.pid'}\nMaxSessions 1\n{text}")
    proc = subprocess.Popen([sshd, "-D", "-e", "-f", str(mine)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=open(folder / "sshd.log", "w"))
    try:
        until = time.monotonic() + 20
        while not _listening(port):
            if proc.poll() is not None or time.monotonic() > until:
                raise Unavailable(f"sshd on {port} did not start: "
                                  f"{(folder / 'sshd.log').read_text()[-500:]}")
            time.sleep(0.1)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
