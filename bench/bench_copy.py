"""copy-image of the DSpark image to the second node behind ssh: a first copy, then a second.

The image is this repository's own DSpark series (patchset.yaml) applied to the real vLLM
v0.33.0 (its PyPI layout) and laid over the arm64 test base of that release, built through the
engine that DOCKER_HOST names.  The node is the second Docker Engine behind sshd that
.ci/services.sh starts (PK_NODE2, an ssh:// URL; PK_NODE2_SOCKET, its own socket, which the
bench uses only to empty the node between runs).  Each run: the node forgets the image, then
`copy-image --to $PK_NODE2` twice.  Printed beside the times: the layer bytes each copy sent.
Target: the second copy sends 0 layer bytes.  For reference, one `docker save | ssh NODE
docker load` of the same image.

    .ci/services.sh; python bench/bench_copy.py [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

import docker  # noqa: E402

from testing import baseimage  # noqa: E402
from patchkit import manifest  # noqa: E402
from patchkit.commands import copy_image  # noqa: E402
from patchkit.commands.build_image import run as build_image  # noqa: E402

RELEASE = "0.33.0"


def forget(client, ref: str, image_id: str) -> None:
    for what in (ref, image_id):
        try:
            client.images.remove(what, force=True)
        except docker.errors.ImageNotFound:
            pass


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    node = os.environ.get("PK_NODE2")
    socket = os.environ.get("PK_NODE2_SOCKET")
    if not node or not socket:
        print("PK_NODE2 and PK_NODE2_SOCKET are not set: run .ci/services.sh first",
              file=sys.stderr)
        return 2
    client = docker.from_env(timeout=900)
    direct = docker.DockerClient(base_url=socket, timeout=900)
    registry = os.environ.get("PK_REGISTRY", "127.0.0.1:5055")
    base = baseimage.ensure_base(client, RELEASE, f"{registry}/pk-test/vllm-base:{RELEASE}",
                                 log=lambda m: print(m, file=sys.stderr))
    tag = f"pk-bench/dspark-copy:v{RELEASE}"
    with tempfile.TemporaryDirectory(prefix="bench-copy-") as tmp:
        m = manifest.load(ROOT / "patchset.yaml")
        os.environ.setdefault("PATCHKIT_CACHE_DIR", str(baseimage.cache_root()))
        built = build_image(m, workdir=Path(tmp) / "vllm", ref=f"v{RELEASE}", repos=["pypi"],
                            base=base["tag"], tag=tag).to_dict()
    if not built["ok"]:
        print(f"the DSpark image did not build: {built.get('error')}", file=sys.stderr)
        return 1
    attrs = client.api.inspect_image(tag)
    print(f"image {tag} {built['image_id'][:19]}: {len(attrs['RootFS']['Layers'])} layers, "
          f"{attrs['Size']:,} bytes (the DSpark layer: {built['layer']['files']} files, "
          f"{built['layer']['bytes']:,} bytes); node {node}")

    first, second = [], []
    for _ in range(args.runs):
        forget(direct, tag, built["image_id"])
        t = time.monotonic()
        a = copy_image.run(tag, [node]).targets[0]
        first.append((time.monotonic() - t, a))
        t = time.monotonic()
        b = copy_image.run(tag, [node]).targets[0]
        second.append((time.monotonic() - t, b))
        assert (a.status, b.status) == ("copied", "present"), (a, b)
        assert a.fingerprint == b.fingerprint

    forget(direct, tag, built["image_id"])
    url = urlsplit(node)
    t = time.monotonic()
    subprocess.run(f"docker save {tag} | ssh -p {url.port} {url.hostname} docker load -q",
                   shell=True, check=True, stdout=subprocess.DEVNULL)
    pipe = time.monotonic() - t

    med = statistics.median
    f_time, s_time = med(x[0] for x in first), med(x[0] for x in second)
    f_bytes = first[-1][1].sent.layer_bytes
    s_bytes = max(x[1].sent.layer_bytes for x in second)
    print(f"runs: {args.runs}")
    print(f"first copy:  {f_time:6.2f} s   {f_bytes:>13,} layer bytes sent "
          f"({first[-1][1].sent.bytes:,} archive bytes, {first[-1][1].sent.layers} layers)")
    print(f"second copy: {s_time:6.2f} s   {s_bytes:>13,} layer bytes sent (present)   "
          f"time ratio {s_time / f_time:.2f}")
    print(f"for reference, docker save | ssh docker load: {pipe:6.2f} s")
    ok = s_bytes == 0
    print("targets met" if ok else "TARGETS MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
