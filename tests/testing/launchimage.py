"""A small x86-64 image that stands in for the DSpark serving image in build/launch.sh's tests.

It holds the real ``build/serve.sh`` as its command (at the place build-image puts it), bash to
run it, and two small static programs in place of what a GPU node runs: ``vllm`` (rank 1 logs
vLLM's headless-executor line and waits; rank 0 answers HTTP on ``--port``; both log the NCCL
and GLOO settings they were given) and ``python3`` (the readiness probe launch.sh runs in rank
0's container: a GET of the URL in its code, exit 0 on a 200).  The image carries the label
``io.patchkit.jit.workspace`` as build-image writes it when a patch feeds a JIT module."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

from testing import REPO_ROOT

WORKSPACE = "/root/.cache/patchkit-jit/0f1e2d3c4b5a"

VLLM = r"""
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static void bye(int sig) { (void)sig; _exit(0); }

static const char *env(const char *name) { const char *v = getenv(name); return v ? v : "-"; }

int main(int argc, char **argv) {
    int headless = 0, port = 8000;
    const char *rank = "?", *master = "?", *mport = "?";
    signal(SIGTERM, bye);   /* PID 1 has no default action for SIGTERM */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--headless")) headless = 1;
        else if (i + 1 < argc && !strcmp(argv[i], "--port")) port = atoi(argv[i + 1]);
        else if (i + 1 < argc && !strcmp(argv[i], "--node-rank")) rank = argv[i + 1];
        else if (i + 1 < argc && !strcmp(argv[i], "--master-addr")) master = argv[i + 1];
        else if (i + 1 < argc && !strcmp(argv[i], "--master-port")) mport = argv[i + 1];
    }
    printf("stand-in vllm rank %s: NCCL_SOCKET_IFNAME=%s GLOO_SOCKET_IFNAME=%s NCCL_IB_HCA=%s\n",
           rank, env("NCCL_SOCKET_IFNAME"), env("GLOO_SOCKET_IFNAME"), env("NCCL_IB_HCA"));
    fflush(stdout);
    if (headless) {
        printf("INFO Launching vLLM (v0.34.0) headless multiproc executor, with head node "
               "address %s:%s for torch.distributed process group.\n", master, mport);
        fflush(stdout);
        for (;;) pause();
    }
    sleep(2);   /* a start takes a while */
    int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(s, (struct sockaddr *)&a, sizeof a) || listen(s, 8)) { perror("listen"); return 1; }
    printf("INFO Application startup complete.\n");
    fflush(stdout);
    for (;;) {
        int c = accept(s, 0, 0);
        if (c < 0) continue;
        char buf[1024];
        (void)read(c, buf, sizeof buf);
        const char *ok = "HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n";
        (void)write(c, ok, strlen(ok));
        close(c);
    }
}
"""

PYTHON3 = r"""
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int main(int argc, char **argv) {
    const char *at = argc > 2 ? strstr(argv[2], "127.0.0.1:") : 0;
    if (!at) return 2;
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons(atoi(at + 10));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(s, (struct sockaddr *)&a, sizeof a)) return 1;
    const char *get = "GET /health HTTP/1.0\r\n\r\n";
    (void)write(s, get, strlen(get));
    char buf[64] = {0};
    (void)read(s, buf, sizeof buf - 1);
    return strstr(buf, " 200 ") ? 0 : 1;
}
"""


def _static(source: str, dest: Path) -> None:
    c = dest.with_suffix(".c")
    c.write_text(source)
    subprocess.run(["gcc", "-static", "-O2", "-o", str(dest), str(c)], check=True)


def _libraries(binary: str) -> list[str]:
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    return [part for line in out.splitlines() for part in line.split() if part.startswith("/")]


def build(folder: Path, engines: list[str], tag: str) -> None:
    """Build the image as ``tag`` on each of ``engines`` (DOCKER_HOST values)."""
    folder.mkdir(parents=True, exist_ok=True)
    _static(VLLM, folder / "vllm")
    _static(PYTHON3, folder / "python3")
    files = {"usr/bin/vllm": folder / "vllm", "usr/bin/python3": folder / "python3",
             "usr/local/bin/patchkit-serve": REPO_ROOT / "build" / "serve.sh"}
    for binary in (shutil.which("bash") or "/bin/bash", shutil.which("env") or "/usr/bin/env"):
        files["usr/bin/" + Path(binary).name] = Path(binary)
        for lib in _libraries(binary):
            files[lib.lstrip("/")] = Path(lib)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, path in sorted(files.items()):
            info = tar.gettarinfo(str(Path(path).resolve()), arcname=name)
            info.mode = 0o755
            with open(path, "rb") as fh:
                tar.addfile(info, fh)
        for empty in ("tmp", "models", "root"):
            info = tarfile.TarInfo(empty)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if empty == "tmp" else 0o755
            tar.addfile(info)
        info = tarfile.TarInfo("bin")
        info.type, info.linkname = tarfile.SYMTYPE, "usr/bin"
        tar.addfile(info)
    (folder / "rootfs.tar").write_bytes(buf.getvalue())
    (folder / "Dockerfile").write_text(
        "FROM scratch\nADD rootfs.tar /\nENV PATH=/usr/local/bin:/usr/bin\n"
        f"LABEL io.patchkit.jit.workspace={WORKSPACE}\n"
        'CMD ["/usr/local/bin/patchkit-serve"]\n')
    for engine in engines:
        subprocess.run(["docker", "build", "-q", "-t", tag, str(folder)], check=True,
                       env={**os.environ, "DOCKER_HOST": engine, "DOCKER_BUILDKIT": "0"},
                       capture_output=True, timeout=300)
