"""build-image (overlay mode, warm base) vs `docker build` of a hand-written COPY-only Dockerfile.

Both lay the same patched files of the real vLLM v0.27.1 over the same arm64 base through the
engine that DOCKER_HOST names (start it with .ci/services.sh).  Measured, side by side:

* a cold build (no image of these inputs in the engine; `docker build --no-cache`),
* a rebuild with nothing changed (build-image: the same image id; docker: its build cache),
* the size of the new layer against the patched files' own bytes plus tar overhead
  (512-byte header and padding per entry, two end blocks, rounding to a 10 KiB record).

Targets: layer bytes within 5% of the files plus tar overhead; the unchanged rebuild reuses
the same image id in at most 2 s.

    python bench/bench_image.py [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

import docker  # noqa: E402

from testing import baseimage  # noqa: E402
from testing import imageproject as ip  # noqa: E402
from patchkit import manifest  # noqa: E402
from patchkit.commands.build_image import run as build_image  # noqa: E402
from patchkit.series.applier import apply_series  # noqa: E402

SITE = "usr/local/lib/python3.11/dist-packages"

def _summary(report):
    """``(exit code, --format json object)`` of a build-image run."""
    return (0 if report.ok else 1), report.to_dict()


def tar_overhead_size(entries: list[tuple[str, int]]) -> int:
    """Bytes of the smallest ustar/pax archive of these (name, size) entries."""
    total = 0
    for name, size in entries:
        total += 512 + (size + 511) // 512 * 512
        if len(name) > 100:
            total += 1024  # a pax header block and its data block for the long name
    total += 1024
    return (total + 10239) // 10240 * 10240


def docker_build(client, base: str, files: dict[str, bytes], tag: str, nocache: bool) -> float:
    """The hand-written equivalent: COPY the patched files into the package, set labels."""
    with tempfile.TemporaryDirectory() as ctx:
        # One COPY of a staged tree: one layer, as build-image makes.
        stage = Path(ctx) / "stage"
        for rel, data in files.items():
            (stage / SITE / rel).parent.mkdir(parents=True, exist_ok=True)
            (stage / SITE / rel).write_bytes(data)
        (Path(ctx) / "Dockerfile").write_text(
            f"FROM {base}\nCOPY stage/ /\nLABEL org.opencontainers.image.title=\"bench\"\n")
        t = time.monotonic()
        client.images.build(path=ctx, tag=tag, platform="linux/arm64", nocache=nocache, rm=True)
        return time.monotonic() - t


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    client = docker.from_env(timeout=900)
    registry = os.environ.get("PK_REGISTRY", "127.0.0.1:5055")
    base = baseimage.ensure_base(client, ip.RELEASE, f"{registry}/pk-test/vllm-base:{ip.RELEASE}",
                                 log=lambda m: print(m, file=sys.stderr))
    cache = Path(os.environ.get("PATCHKIT_REAL_CACHE") or Path.home() / ".cache" / "patchkit")
    with tempfile.TemporaryDirectory(prefix="bench-image-") as tmp:
        root = Path(tmp)
        m = manifest.load(ip.make_project(root, base=base["repo_digest"] or base["tag"],
                                          tag="pk-bench/dspark:{ref}"))
        workdir = root / "vllm"
        report = apply_series(m, workdir=workdir, cache=cache)
        assert report.ok, report.to_json()
        patched = {rel: (workdir / rel).read_bytes() for rel in (ip.SPEC, ip.DTYPES, ip.NEW)}

        cold, warm, dcold, dwarm = [], [], [], []
        summary = None
        for _ in range(args.runs):
            for img in client.images.list(filters={"label": "io.patchkit.patchset.name=pk-e2e"}):
                client.images.remove(img.id, force=True)
            t = time.monotonic()
            _, summary = _summary(build_image(m, workdir=workdir, apply=False))
            cold.append(time.monotonic() - t)
            assert not summary["reused"]
            t = time.monotonic()
            _, again = _summary(build_image(m, workdir=workdir, apply=False))
            warm.append(time.monotonic() - t)
            assert again["reused"] and again["image_id"] == summary["image_id"]
            dcold.append(docker_build(client, base["tag"], patched, "pk-bench/docker:cold", True))
            dwarm.append(docker_build(client, base["tag"], patched, "pk-bench/docker:cold", False))

        layer = summary["layer"]
        serve = (m.root / "build" / "serve.sh").read_bytes()
        content = sum(len(v) for v in patched.values()) + len(serve)
        names = [(f"{SITE}/{rel}", len(v)) for rel, v in patched.items()]
        names.append(("usr/local/bin/patchkit-serve", len(serve)))
        names += [(f"{SITE}/vllm/x/__pycache__/.wh.whiteout-of-a-cache.cpython-311.pyc", 0)] \
            * layer["whiteouts"]
        names.append((f"{SITE}/vllm/patchkit_extra", 0))  # the new package folder
        expected = tar_overhead_size(names)
        docker_top = next(h["Size"] for h in client.api.history("pk-bench/docker:cold")
                          if "COPY" in h["CreatedBy"])
        ours_top = client.api.history(summary["tag"])[0]["Size"]

        med = statistics.median
        print(f"runs: {args.runs}; base {base['tag']} ({base['repo_digest']})")
        print(f"patched files: {len(patched)} + serve script, {content} bytes of content")
        print(f"layer: {layer['files']} files, {layer['whiteouts']} whiteouts, {layer['bytes']} bytes;"
              f" files + tar overhead = {expected} bytes; ratio {layer['bytes'] / expected:.3f}"
              f" (target <= 1.05)")
        print(f"layer size as the engine counts it: build-image {ours_top} B,"
              f" docker build COPY {docker_top} B (which leaves the stale byte-code in place)")
        print(f"cold build:      build-image {med(cold):6.2f} s   docker build --no-cache "
              f"{med(dcold):6.2f} s   ratio {med(cold) / med(dcold):.2f}")
        print(f"unchanged build: build-image {med(warm):6.2f} s   docker build (cached)   "
              f"{med(dwarm):6.2f} s   ratio {med(warm) / med(dwarm):.2f}   (target <= 2 s)")
        ok = layer["bytes"] <= 1.05 * expected and med(warm) <= 2.0
        print("targets met" if ok else "TARGETS MISSED")
        return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
