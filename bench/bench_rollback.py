"""rollback on two nodes: the engine DOCKER_HOST names and the second node behind sshd, the
second reached through a relay of our own between ssh and sshd (tests/testing/link.py) that
counts every byte crossing the link.

The builds are images of the bench's own, labelled and tagged as build-image labels and tags
them (the moving tag and ``<moving>-<12 hex>``): a base of one layer and two builds of one
layer of ``--layer-mib`` MiB each on it, on both nodes (copied to node 2 by copy-image).  Then:

1. both nodes hold both builds: ``patchkit rollback`` and ``patchkit rollback --to NEWER`` in
   turn, each as its own process (a user's time, start-up included), against the least a
   person does by hand, ``docker tag`` here and ``ssh NODE docker tag`` there (targets: under
   2 s, and at most 64 KB to node 2, both ways);
2. node 2 lacks the older build (its immutable tag removed there, so the image goes): a rollback
   to it sends the layers node 2 lacks, against that build's own layer (target <= 1.1x the
   layer's bytes, up the link).

    .ci/services.sh; python bench/bench_rollback.py [--runs 3] [--layer-mib 8]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

import docker  # noqa: E402

from testing import smallimage  # noqa: E402
from testing.link import Link  # noqa: E402
from patchkit.commands import copy_image  # noqa: E402

REGISTRY = os.environ.get("PK_REGISTRY", "127.0.0.1:5055")
MiB = 2**20


def make_build(client, base: str, moving: str, patchset: str, n: int, size: int) -> dict:
    key = "sha256:" + secrets.token_hex(32)
    fixed = f"{moving}-{key[7:19]}"
    image_id = smallimage.build(client, fixed, [{f"opt/build{n}": smallimage.filler(size)}],
                                parent=base, labels={"io.patchkit.patchset.name": patchset,
                                                     "io.patchkit.inputs": key})
    client.api.tag(image_id, *moving.rsplit(":", 1))
    return {"id": image_id, "fixed": fixed}


def patchkit(args: list[str], cwd: Path, env: dict) -> tuple[float, str]:
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "patchkit", *args], cwd=cwd, env=env,
                          text=True, capture_output=True, check=False)
    took = time.monotonic() - started
    if proc.returncode:
        raise SystemExit(f"patchkit {' '.join(args)}: exit {proc.returncode}\n{proc.stdout}"
                         f"{proc.stderr}")
    return took, proc.stdout


def by_hand(node_alias: str, port: int, image_id: str, moving: str) -> float:
    """``docker tag`` here and over ssh on the node: the floor of a rollback by hand."""
    started = time.monotonic()
    subprocess.run(["docker", "tag", image_id, moving], check=True)
    subprocess.run(["ssh", "-p", str(port), node_alias, "docker", "tag", image_id, moving],
                   check=True)
    return time.monotonic() - started


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--layer-mib", type=int, default=8)
    opts = ap.parse_args()
    node2 = os.environ.get("PK_NODE2", "ssh://pk-node2:2222")
    node2_socket = os.environ["PK_NODE2_SOCKET"]
    alias, port = node2[len("ssh://"):].rsplit(":", 1)
    run = secrets.token_hex(4)
    patchset = f"pk-bench-rollback-{run}"
    base = f"{REGISTRY}/pk-bench/rollback-base:{run}"
    moving = f"{REGISTRY}/pk-bench/rollback:{run}"
    here = docker.from_env(timeout=600)
    there = docker.DockerClient(base_url=node2_socket, timeout=600)
    layer = opts.layer_mib * MiB
    work = Path(tempfile.mkdtemp(prefix="pk-bench-rollback-"))
    (work / "patchset.yaml").write_text(f"name: {patchset}\nvllm: {{repo: pypi, ref: v1.0.0}}\n"
                                        f"image:\n  tag: {moving}\npatches: []\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), PATCHKIT_CACHE_DIR=str(work / "cache"))
    try:
        smallimage.build(here, base, [{"opt/base": smallimage.filler(4 * MiB)}])
        old = make_build(here, base, moving, patchset, 1, layer)
        assert copy_image.run(moving, [node2]).ok
        new = make_build(here, base, moving, patchset, 2, layer)
        assert copy_image.run(moving, [node2]).ok
        patchkit(["images", "--node", node2], work, env)   # the history learns the order

        print(f"1. both nodes hold both builds ({opts.layer_mib} MiB layer each), "
              f"{opts.runs} run(s) each way")
        rows = []
        with Link(int(port)) as link:
            url = link.url(alias)
            for i in range(opts.runs):
                for args, to in ((["rollback", "--node", url], old),
                                 (["rollback", "--node", url, "--to", new["fixed"]], new)):
                    link.reset()
                    took, out = patchkit(args, work, env)
                    assert out.count("nothing sent") == 2, out
                    hand = by_hand(alias, link.port, to["id"], moving)
                    rows.append((took, link.up + link.down, link.up, hand))
                    print(f"   {' '.join(args[:1] + args[3:]) or 'rollback':<40} {took:5.2f} s, "
                          f"{link.up + link.down:,} bytes on the link to node 2 "
                          f"({link.up:,} up); by hand {hand:.2f} s")
        med = statistics.median
        t, b, hand = med(r[0] for r in rows), max(r[1] for r in rows), med(r[3] for r in rows)
        print(f"   median {t:.2f} s (target < 2 s), most bytes to node 2 {b:,} "
              f"(target <= 65,536); by hand {hand:.2f} s: ratio {t / hand:.2f}")

        print("2. node 2 lacks the older build")
        there.api.remove_image(old["fixed"])
        with Link(int(port)) as link:
            url = link.url(alias)
            took, out = patchkit(["rollback", "--node", url, "--format", "json"], work, env)
            data = json.loads(out)
            statuses = [n["status"] for n in data["nodes"]]
            assert statuses == ["moved", "copied"], data
            sent = data["nodes"][1]["sent"]
            print(f"   {took:.2f} s; {link.up:,} bytes up the link ({sent['bytes']:,} of them the "
                  f"archive, {sent['layers']} layer(s) sent, {sent['layers_skipped']} held "
                  f"there); the build's own layer {sent['layer_bytes']:,} bytes of archive: "
                  f"ratio {link.up / sent['layer_bytes']:.3f} (target <= 1.1)")
    finally:
        for client in (here, there):
            for image in client.images.list():
                for tag in image.tags:
                    if run in tag:
                        try:
                            client.images.remove(tag)
                        except docker.errors.APIError:
                            pass


if __name__ == "__main__":
    main()
