"""A Docker Engine of a test's own that reports the same engine ID as an engine already
running: what machines cloned from one image, or two dockerds given one key file, look like.

Before Docker 23 a dockerd takes its ID from a key file (``/etc/docker/key.json`` unless its
config's ``deprecated-key-path`` names another): the twin is given the running engine's.  From
23 on the ID is ``<data-root>/engine-id``: the twin's data root starts with a copy of it.
``twin_engine(root, of)`` starts it (vfs, no network, as .ci/services.sh starts the others),
checks that the two IDs agree, and on exit stops it by its pid.  Without root, dockerd, or an
ID it can share it raises :class:`smalldisk.Unavailable`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker

from testing.smalldisk import Unavailable, _ping, _stop

DEFAULT_KEY = Path("/etc/docker/key.json")


@dataclass
class Twin:
    url: str
    client: docker.DockerClient
    root: Path                       # its data root


def dockerd_major() -> int:
    out = subprocess.run(["dockerd", "--version"], capture_output=True, text=True,
                         timeout=30).stdout
    got = re.search(r"version (\d+)\.", out)
    if not got:
        raise Unavailable(f"dockerd --version said {out.strip()!r}")
    return int(got.group(1))


@contextlib.contextmanager
def twin_engine(root: Path, of: docker.DockerClient, key: Path = DEFAULT_KEY
                ) -> Iterator[Twin]:
    if os.geteuid() != 0 or not shutil.which("dockerd"):
        raise Unavailable("a twin engine needs root and dockerd")
    info = of.info()
    data, sock, pidfile = root / "data", root / "engine.sock", root / "engine.pid"
    data.mkdir(parents=True)
    args = []
    if dockerd_major() < 23:
        if not key.is_file():
            raise Unavailable(f"no key file {key} to share")
        (root / "daemon.json").write_text(json.dumps({"deprecated-key-path": str(key)}))
        args = ["--config-file", str(root / "daemon.json")]
    else:
        source = Path(info["DockerRootDir"]) / "engine-id"
        if not source.is_file():
            raise Unavailable(f"no {source} to share")
        shutil.copyfile(source, data / "engine-id")
    proc = None
    try:
        with open(root / "dockerd.log", "wb") as log:
            proc = subprocess.Popen(
                ["dockerd", *args, "--storage-driver=vfs", "--iptables=false",
                 "--ip6tables=false", "--bridge=none", "--data-root", str(data),
                 "--exec-root", str(root / "exec"), "--pidfile", str(pidfile),
                 "--host", f"unix://{sock}"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        client = _ping(f"unix://{sock}", proc, root / "dockerd.log")
        try:
            if client.info()["ID"] != info["ID"]:
                raise Unavailable(f"the twin's ID {client.info()['ID']} is not {info['ID']}: "
                                  f"the engine does not take its ID from {key}")
            yield Twin(f"unix://{sock}", client, data)
        finally:
            client.close()
    finally:
        if proc is not None:
            _stop(proc)
