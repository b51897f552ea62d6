"""build-image --no-daemon --push of the DSpark layer onto a base already in the registry.

This repository's patchset is applied to the real vLLM v0.33.0 (its PyPI layout) and built,
with no engine, straight in the registry onto the arm64 base that holds v0.33.0 (the image
tests' base, start the services with .ci/services.sh).  Every byte the client sends to the
registry is counted by a relay in front of it (tests/testing/regproxy.py).  Measured:

* cold: a fresh patchkit cache (the base's layers are read from the registry and indexed),
  pushed to a new repository;
* warm: the cache kept, a new layer each run (another SOURCE_DATE_EPOCH, so other bytes),
  pushed to a new repository: the base's layers are mounted, the layer, its config and the
  manifest go up;
* unchanged: the same inputs again: the tag already names the image, nothing goes up.

Bytes uploaded (request bodies, and everything sent including HTTP heads) are set against the
layer plus its config and manifest.  Target: uploaded <= 1.05 x (layer + config + manifest).

    python bench/bench_push.py [--runs 3]
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

from testing import baseimage  # noqa: E402
from patchkit import manifest  # noqa: E402
from patchkit.commands.build_image import run as build_image  # noqa: E402
from patchkit.series.applier import apply_series  # noqa: E402
from testing.regproxy import RegistryProxy  # noqa: E402

RELEASE = "0.33.0"


def raw_size(ref: str, *extra: str) -> int:
    return len(subprocess.run(["skopeo", "inspect", "--tls-verify=false", "--raw", *extra,
                               f"docker://{ref}"], check=True, stdout=subprocess.PIPE).stdout)


def forget(ref: str) -> None:
    subprocess.run(["skopeo", "delete", "--tls-verify=false", f"docker://{ref}"],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    registry = os.environ.get("PK_REGISTRY", "127.0.0.1:5055")
    client = docker.from_env(timeout=900)
    base = baseimage.ensure_base(client, RELEASE, f"{registry}/pk-test/vllm-base:{RELEASE}",
                                 log=lambda m: print(m, file=sys.stderr))
    real_cache = Path(os.environ.get("PATCHKIT_REAL_CACHE") or Path.home() / ".cache" / "patchkit")
    made: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-push-") as tmp, RegistryProxy(registry) as relay:
        tmp_path = Path(tmp)
        m = manifest.load(ROOT / "patchset.yaml")
        workdir = tmp_path / "vllm"
        report = apply_series(m, ref=f"v{RELEASE}", repos=("pypi",), workdir=workdir,
                              cache=real_cache)
        assert report.ok, report.to_json()
        base_ref = f"{relay.addr}/pk-test/vllm-base:{RELEASE}"
        os.environ["PATCHKIT_CACHE_DIR"] = str(tmp_path / "cache")

        def push(epoch: int | None = None) -> dict:
            repo = f"{relay.addr}/pk-bench/dspark-{secrets.token_hex(4)}"
            tag = f"{repo}:v{RELEASE}"
            made.append(tag)
            return one(tag, epoch)

        def one(tag: str, epoch: int | None) -> dict:
            if epoch is not None:
                os.environ["SOURCE_DATE_EPOCH"] = str(epoch)
            else:
                os.environ.pop("SOURCE_DATE_EPOCH", None)
            relay.reset()
            t = time.monotonic()
            summary = build_image(m, workdir=workdir, apply=False, push=True, no_daemon=True,
                                  base=base_ref, tag=tag).to_dict()
            seconds = time.monotonic() - t
            traffic = relay.reset()
            assert summary["ok"], summary
            need = (summary["layer"]["bytes"] + raw_size(tag, "--config") + raw_size(tag))
            return {"tag": tag, "seconds": seconds, "body": traffic.body, "sent": traffic.sent,
                    "need": need, "layer": summary["layer"], "reused": summary["reused"],
                    "writes": len(traffic.writes())}

        cold = push()
        warm = [push(1_700_000_000 + i) for i in range(args.runs)]
        same = [one(warm[-1]["tag"], 1_700_000_000 + args.runs - 1) for _ in range(args.runs)]
        for tag in made:
            forget(tag)

    med = statistics.median
    layer = cold["layer"]
    print(f"base {base['tag']} ({base['repo_digest']}); runs: {args.runs}")
    print(f"DSpark layer: {layer['files']} files, {layer['whiteouts']} whiteouts, {layer['bytes']} "
          f"bytes; layer + config + manifest = {cold['need']} bytes")
    rows = [("cold cache", [cold]), ("warm cache", warm)]
    ok = True
    for name, runs in rows:
        body = max(r["body"] / r["need"] for r in runs)
        sent = max(r["sent"] / r["need"] for r in runs)
        ok &= body <= 1.05
        print(f"{name:11} {med(r['seconds'] for r in runs):6.2f} s   uploaded "
              f"{int(med(r['body'] for r in runs))} B (ratio {body:.3f}, target <= 1.05); "
              f"sent with HTTP heads {int(med(r['sent'] for r in runs))} B (ratio {sent:.3f})")
    print(f"{'unchanged':11} {med(r['seconds'] for r in same):6.2f} s   uploaded "
          f"{max(r['body'] for r in same)} B in {max(r['writes'] for r in same)} write(s); "
          f"reused: {all(r['reused'] for r in same)}")
    ok &= all(r["reused"] and r["body"] == 0 for r in same)
    print("targets met" if ok else "TARGETS MISSED")
    print(json.dumps({"cold": cold, "warm": warm, "unchanged": same}), file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
