"""A Docker Engine of a test's own whose data-root is a small tmpfs: a target that runs out of
space when the test says so.

``small_disk_engine(root, size)`` mounts a tmpfs of ``size`` bytes on ``root/disk``, starts a
dockerd (vfs, no network, as .ci/services.sh starts the others) with its data-root there and
its socket, exec-root and pid file beside it, and yields a :class:`SmallDisk`.  ``fill(leave)``
writes a ballast file beside the data-root until only ``leave`` bytes are free; ``free()``
deletes it again.  On exit the dockerd (this one, by its pid) is stopped and the tmpfs
unmounted.  It needs root and dockerd: without them it raises :class:`Unavailable`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker


class Unavailable(Exception):
    pass


@dataclass
class SmallDisk:
    url: str                        # unix:// of the engine
    client: docker.DockerClient
    mount: Path                     # the tmpfs

    @property
    def ballast(self) -> Path:
        return self.mount / "ballast"

    def available(self) -> int:
        st = os.statvfs(self.mount)
        return st.f_bavail * st.f_frsize

    def fill(self, leave: int) -> None:
        """Take the tmpfs's free space down to about ``leave`` bytes."""
        with open(self.ballast, "ab") as f:
            want = self.available() - leave
            block = b"\0" * 2**16
            while want > 0:
                f.write(block[:want])
                want -= len(block)

    def free(self) -> None:
        self.ballast.unlink(missing_ok=True)


def _run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)


@contextlib.contextmanager
def small_disk_engine(root: Path, size: int) -> Iterator[SmallDisk]:
    if os.geteuid() != 0 or not shutil.which("dockerd"):
        raise Unavailable("a small-disk engine needs root and dockerd")
    mount = root / "disk"
    mount.mkdir(parents=True)
    got = _run("mount", "-t", "tmpfs", "-o", f"size={size}", "pk-small-disk", str(mount))
    if got.returncode:
        raise Unavailable(f"cannot mount a tmpfs on {mount}: {got.stderr.strip()}")
    sock, pidfile = root / "engine.sock", root / "engine.pid"
    proc = None
    try:
        with open(root / "dockerd.log", "wb") as log:
            proc = subprocess.Popen(
                ["dockerd", "--storage-driver=vfs", "--iptables=false", "--ip6tables=false",
                 "--bridge=none", "--data-root", str(mount / "docker"), "--exec-root",
                 str(root / "exec"), "--pidfile", str(pidfile), "--host", f"unix://{sock}"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        client = _ping(f"unix://{sock}", proc, root / "dockerd.log")
        try:
            yield SmallDisk(f"unix://{sock}", client, mount)
        finally:
            client.close()
    finally:
        if proc is not None:
            _stop(proc)
        if _run("umount", str(mount)).returncode:
            _run("umount", "-l", str(mount))


def _ping(url: str, proc: subprocess.Popen, log: Path) -> docker.DockerClient:
    deadline = time.monotonic() + 60
    while True:
        try:
            client = docker.DockerClient(base_url=url, timeout=60)
            client.ping()
            return client
        except Exception as exc:
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace").splitlines()[-5:]
                raise Unavailable(f"the small-disk dockerd did not answer ({exc}): "
                                  + " | ".join(tail)) from None
            time.sleep(0.2)


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
