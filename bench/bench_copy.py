"""copy-image of the DSpark image to the second node behind ssh, direct and --via a registry.

The image is this repository's own DSpark series (patchset.yaml) applied to the real vLLM
v0.33.0 (its PyPI layout) and laid over the arm64 test base of that release, built through the
engine that DOCKER_HOST names.  The node is the second Docker Engine behind sshd that
.ci/services.sh starts (PK_NODE2, an ssh:// URL; PK_NODE2_SOCKET, its own socket, which the
bench uses only to look at the node and to forget its own images there).  The node keeps the
shared test base (other tests use it); the bench removes only images it made.  Each run, side
by side, bytes and seconds of:

1. first copy to a node that holds the base: a new image each run (the DSpark image and a
   fresh 4 KiB layer, so no engine or registry holds its top layer), through a relay of our
   own between ssh and sshd (tests/testing/link.py) that counts what crosses the link: the
   bytes sent up it (the archive, the API requests, ssh's own) against the layers the node
   lacks plus config and manifest (target <= 1.05x); the bytes that came back are shown;
2. full copy, to a node that holds nothing of the image (a single-layer image of the same
   files, made for the bench alone), against ``docker save | ssh NODE docker load`` of it
   (target <= 1.0x the pipe's time), the two taking turns to go first from run to run;
3. two targets against one (target <= 1.3x), when a second target is set (PK_NODE3, with
   PK_NODE3_SOCKET); otherwise it says so;
4. ``--via`` the registry (PK_REGISTRY, through a relay that counts what is uploaded) against
   the direct copy of 1.: bytes on the ssh link, pushed to the registry, pulled by the node.

    .ci/services.sh; python bench/bench_copy.py [--runs 2] [--part N ...] [--loaded]
        [--synthetic MIB] [--split SMALL,LARGE]

``--split SMALL,LARGE`` runs only part 5: full copies of two sizes, copy-image against the
pipe, and the line through each side's two medians: its fixed part (at 0 bytes) and its part
per byte.

``--loaded`` runs each pair of 2. twice: quiet, then beside a fixed CPU load (one busy process
per core, started before the pair and stopped after it, the same for both sides of the pair);
it prints the ratio of each pair and the median, quiet and loaded.  ``--synthetic MIB`` takes
images made by the bench of random layers of MIB MiB instead of the DSpark image (which needs
the real vLLM release and its base built first): for 1. a base of two such layers, copied to
the node first, and a fresh layer of 1 MiB on it; for 2. and 3. an image of three.

Where the time went before the copy was spliced (py-spy, 200 Hz, a full copy of 192 MiB in
three layers to node 2 over ssh; 494 samples of the threads at work): 272 in the thread that
streamed the load: 141 of them reading the export's HTTP response into Python (``socket
readinto`` 120, urllib3's chunked framing), 60 walking the tar archive (tarfile's
``_Stream.read`` and ``_FileInFile``), 75 handing chunks to ssh's pipe (``_SshStream``'s
``select`` and ``write``); 50 in the thread draining ssh's stderr; the rest imports and
waits.  Every byte crossed the interpreter three times (the response, the tar walk, the
request body).  Now a full copy is ``docker save`` and ``ssh NODE docker load`` as children,
with ``os.splice`` between their pipes a megabyte a call, and a partial copy reads only the tar
headers and small JSON members: the layers it keeps are spliced into the load, those the node
holds into /dev/null.  The same copy profiled after (py-spy, 200 Hz, idle samples included):
of the pump thread's 210 samples, 185 wait in ``poll`` for the children, 22 are inside
``os.splice`` (the kernel moving pages) and 3 in Python.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

import docker  # noqa: E402

from testing import baseimage  # noqa: E402
from testing.link import Link  # noqa: E402
from testing.regproxy import RegistryProxy  # noqa: E402
from patchkit import manifest  # noqa: E402
from patchkit.commands import copy_image  # noqa: E402
from patchkit.commands.build_image import run as build_image  # noqa: E402

RELEASE = "0.33.0"
TAG = f"pk-bench/dspark-copy:v{RELEASE}"
FULL = f"pk-bench/dspark-copy-full:v{RELEASE}"   # one layer: nothing of it on any node
med = statistics.median


def forget(client, *refs: str) -> None:
    for what in refs:
        try:
            client.images.remove(what, force=True)
        except docker.errors.NotFound:
            pass


def archive_sizes(client, ref: str) -> dict:
    """From the source's ``docker save`` of ``ref``: each layer's tar size by diff_id, and the
    sizes of its config and manifest."""
    with tempfile.TemporaryFile() as fh:
        for chunk in client.api.get_image(ref):
            fh.write(chunk)
        fh.seek(0)
        with tarfile.open(fileobj=fh) as tar:
            sizes = {m.name: m.size for m in tar.getmembers()}
            (entry,) = json.load(tar.extractfile("manifest.json"))
            config = json.load(tar.extractfile(entry["Config"]))
    diff_ids = config["rootfs"]["diff_ids"]
    return {"layers": {d: sizes[p] for d, p in zip(diff_ids, entry["Layers"])},
            "config": sizes[entry["Config"]], "manifest": sizes["manifest.json"]}


def fresh(client, parent: str, n: int) -> str:
    """``parent`` and a fresh layer of 4 KiB of random bytes, tagged for run ``n``."""
    import io

    tag = f"pk-bench/dspark-copy:fresh-{n}"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in (("Dockerfile", f"FROM {parent}\nCOPY fresh /opt/pk-bench-fresh\n"),
                           ("fresh", os.urandom(2048).hex())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data.encode()))
    buf.seek(0)
    client.images.build(fileobj=buf, custom_context=True, tag=tag, platform="linux/arm64",
                        rm=True, forcerm=True)
    return tag


def squashed(client, image: str) -> None:
    """FULL: ``image``'s files as one layer, made once."""
    try:
        client.images.get(FULL)
        return
    except docker.errors.NotFound:
        pass
    env = dict(os.environ)
    cid = subprocess.run(["docker", "create", "--platform", "linux/arm64", image, "/x"],
                         check=True, stdout=subprocess.PIPE, text=True, env=env).stdout.strip()
    try:
        subprocess.run(f"docker export {cid} | docker import --platform linux/arm64 - {FULL}",
                       shell=True, check=True, stdout=subprocess.DEVNULL, env=env)
    finally:
        subprocess.run(["docker", "rm", cid], stdout=subprocess.DEVNULL, env=env)


def pipe(node: str, ref: str) -> tuple[float, int]:
    """``docker save REF | ssh NODE docker load``, the two children joined by a pipe as a
    shell joins them: seconds, and the bytes of the archive (counted apart, untimed)."""
    url = urlsplit(node)
    settle()
    t = time.monotonic()
    save = subprocess.Popen(["docker", "save", ref], stdout=subprocess.PIPE)
    load = subprocess.Popen(["ssh", "-p", str(url.port), url.hostname, "docker", "load", "-q"],
                            stdin=save.stdout, stdout=subprocess.DEVNULL)
    save.stdout.close()
    assert save.wait() == 0 and load.wait() == 0
    took = time.monotonic() - t
    size = subprocess.Popen(["docker", "save", ref], stdout=subprocess.PIPE)
    sent = 0
    while chunk := size.stdout.read(1 << 20):
        sent += len(chunk)
    size.wait()
    return took, sent


def settle() -> None:
    """The previous load's files written out before the next timing starts: a vfs load
    writes the whole layer twice, and its write-back would otherwise slow whichever copy
    comes next (seen here: the second of a pair 1 to 3 s slower, whichever it was)."""
    os.sync()


def timed(fn):
    settle()
    t = time.monotonic()
    out = fn()
    return time.monotonic() - t, out


def build(client, registry: str) -> dict:
    base = baseimage.ensure_base(client, RELEASE, f"{registry}/pk-test/vllm-base:{RELEASE}",
                                 log=lambda m: print(m, file=sys.stderr))
    with tempfile.TemporaryDirectory(prefix="bench-copy-") as tmp:
        m = manifest.load(ROOT / "patchset.yaml")
        os.environ.setdefault("PATCHKIT_CACHE_DIR", str(baseimage.cache_root()))
        built = build_image(m, workdir=Path(tmp) / "vllm", ref=f"v{RELEASE}", repos=["pypi"],
                            base=base["tag"], tag=TAG).to_dict()
    if not built["ok"]:
        raise SystemExit(f"the DSpark image did not build: {built.get('error')}")
    built["base"] = base
    return built


def warm(client, base: str, relay: str) -> None:
    """The base pushed under the relay's address, untimed: the registry holds it already, so
    nothing is uploaded, but the engine learns where it is there and mounts it into the new
    repositories of the runs instead of sending it again (as with a cluster's registry, whose
    address does not change)."""
    ref = f"{relay}/pk-test/vllm-base:{RELEASE}"
    client.api.tag(base, *ref.rsplit(":", 1))
    try:
        for line in client.api.push(ref, stream=True, decode=True):
            assert "error" not in line, line
    finally:
        client.api.remove_image(ref, noprune=True)


def copied(report, engine_count: int = 1):
    assert len(report.targets) == engine_count
    for t in report.targets:
        assert t.status == "copied", (t.status, t.error)
    return report.targets[0]


def one_run(n: int, ctx: dict) -> None:
    parts = ctx["parts"]
    if ctx.get("synthetic_base") and 1 in parts:
        first_synthetic(n, ctx)
    elif 1 in parts or 4 in parts:
        first_and_via(n, ctx)
    if 2 in parts:
        full_and_pipe(n, ctx)
    if 3 in parts and ctx["node3"]:
        two_and_one(ctx)


def first_synthetic(n: int, ctx: dict) -> None:
    """1. with ``--synthetic``: the node holds a base of two layers of MIB MiB (copied there
    untimed), and the image is that base and a fresh layer of 1 MiB."""
    client, direct, node, rows = ctx["client"], ctx["direct"], ctx["node"], ctx["rows"]
    base = ctx["synthetic_base"]
    tag = f"pk-bench/copy-synthetic-top:{n}"
    from testing import smallimage
    smallimage.build(client, tag, [{"opt/pk-bench/top": os.urandom(1 << 20)}], parent=base)
    sizes = archive_sizes(client, tag)
    node_has = set(direct.api.inspect_image(base)["RootFS"]["Layers"])
    need = (sum(s for d, s in sizes["layers"].items() if d not in node_has)
            + sizes["config"] + sizes["manifest"])
    forget(direct, tag)
    with Link(urlsplit(node).port) as link:
        s, r = timed(lambda: copy_image.run(tag, [link.url(urlsplit(node).hostname)]))
        up, down = link.up, link.down
    t = copied(r)
    rows["first"].append({"s": s, "sent": up, "down": down, "archive": t.sent.bytes,
                          "need": need})
    forget(direct, tag)
    forget(client, tag)


def first_and_via(n: int, ctx: dict) -> None:
    client, direct, node, relay, rows = (ctx[k] for k in ("client", "direct", "node", "relay",
                                                          "rows"))
    built = ctx["built"]
    tag = fresh(client, TAG, n)
    sizes = archive_sizes(client, tag)
    need = (sum(s for d, s in sizes["layers"].items() if d not in ctx["node_base"])
            + sizes["config"] + sizes["manifest"])
    iid = client.images.get(tag).id
    mine = (tag, iid, TAG, built["image_id"])
    forget(direct, *mine)
    with Link(urlsplit(node).port) as link:
        s, r = timed(lambda: copy_image.run(tag, [link.url(urlsplit(node).hostname)]))
        up, down = link.up, link.down
    t = copied(r)
    rows["first"].append({"s": s, "sent": up, "down": down, "archive": t.sent.bytes,
                          "need": need})
    forget(direct, *mine)
    relay.reset()
    with Link(urlsplit(node).port) as link:
        s, r = timed(lambda: copy_image.run(tag, [link.url(urlsplit(node).hostname)],
                                            via=relay.addr))
        on_link = link.up + link.down
    traffic = relay.reset()
    t = copied(r)
    rows["via"].append({"s": s, "link": on_link, "uploaded": traffic.body,
                        "pushed": r.via.transfer.moved, "push_s": r.via.seconds,
                        "pulled": t.pulled.bytes, "pulled_layers": t.pulled.moved,
                        "pull_s": t.seconds})
    forget(direct, *mine[:2])
    forget(client, tag)


def full_and_pipe(n: int, ctx: dict) -> None:
    direct, node, rows = ctx["direct"], ctx["node"], ctx["rows"]
    for load in ((False, True) if ctx["loaded"] else (False,)):
        suffix = "_loaded" if load else ""
        with Busy(os.cpu_count() or 1) if load else _nothing():
            for which in (("full", "pipe") if n % 2 == 0 else ("pipe", "full")):
                forget(direct, ctx["full"])
                if which == "full":
                    s, r = timed(lambda: copy_image.run(ctx["full"], [node]))
                    rows["full" + suffix].append({"s": s, "sent": copied(r).sent.bytes})
                else:
                    s, sent = pipe(node, ctx["full"])
                    rows["pipe" + suffix].append({"s": s, "sent": sent})
        forget(direct, ctx["full"])


class Busy:
    """A fixed CPU load: ``n`` processes that spin until stopped, started before a pair and
    stopped after it."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> "Busy":
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                      for _ in range(self.n)]
        time.sleep(0.5)   # each has begun to spin
        return self

    def __exit__(self, *exc) -> None:
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait()


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


def synthetic(client, mib: int) -> str:
    """An image of three layers of ``mib`` MiB of random bytes each, made once."""
    tag = f"pk-bench/copy-synthetic:{mib}"
    try:
        client.images.get(tag)
    except docker.errors.NotFound:
        from testing import smallimage
        smallimage.build(client, tag, [{f"opt/pk-bench/{n}": os.urandom(mib << 20)}
                                       for n in range(3)])
    return tag


def two_and_one(ctx: dict) -> None:
    direct, node, rows = ctx["direct"], ctx["node"], ctx["rows"]
    third, full = ctx["direct3"], ctx["full"]
    forget(third, full)
    s, r = timed(lambda: copy_image.run(full, [node, ctx["node3"]]))
    copied(r, 2)
    rows["two"].append({"s": s})
    forget(direct, full)
    forget(third, full)
    s, r = timed(lambda: copy_image.run(full, [node]))
    copied(r)
    rows["one"].append({"s": s})
    forget(direct, full)


def split(ctx: dict, small: int, large: int, runs: int) -> None:
    """5. the cost of a full copy split in two: a fixed part and a part per byte, from full
    copies of two sizes (images of three layers of SMALL and of LARGE MiB, which the node
    lacks), copy-image and the pipe taking turns to go first; the line through the two
    medians of each gives its fixed part (where it meets 0 bytes) and its per-byte part (its
    slope)."""
    client, direct, node = ctx["client"], ctx["direct"], ctx["node"]
    rows: dict = {}
    for mib in (small, large):
        image = synthetic(client, mib)
        for n in range(runs):
            for which in (("copy", "pipe") if n % 2 == 0 else ("pipe", "copy")):
                forget(direct, image)
                if which == "copy":
                    s, r = timed(lambda: copy_image.run(image, [node]))
                    sent = copied(r).sent.bytes
                else:
                    s, sent = pipe(node, image)
                rows.setdefault((which, mib), []).append((s, sent))
        forget(direct, image)
    print(f"5. full copies of {3 * small} and {3 * large} MiB, {runs} run(s) each; load "
          f"average {ctx['load']} at the start, {os.getloadavg()[0]:.2f} at the end")
    parts = {}
    for which in ("copy", "pipe"):
        (t1, b1), (t2, b2) = ((med(r[0] for r in rows[(which, m)]),
                               med(r[1] for r in rows[(which, m)])) for m in (small, large))
        per_byte = (t2 - t1) / (b2 - b1)
        fixed = t1 - per_byte * b1
        parts[which] = (fixed, per_byte)
        print(f"   {'copy-image' if which == 'copy' else 'docker save | ssh docker load':<30} "
              f"{t1:6.2f} s for {b1:,} bytes, {t2:6.2f} s for {b2:,}: fixed {fixed:5.2f} s, "
              f"{per_byte * 1e6 * 2**20 / 1e6:.4f} s per MiB")
    (fc, bc), (fp, bp) = parts["copy"], parts["pipe"]
    print(f"   fixed part: copy-image {fc:.2f} s vs the pipe's {fp:.2f} s (target < 0.5 s); "
          f"per byte: ratio {bc / bp:.2f} to the pipe's (target 1.0)")


def report(rows: dict, ctx: dict, runs: int) -> bool:
    ok = True
    m = {k: {f: med(r[f] for r in v) for f in v[0]} for k, v in rows.items() if v}
    print(f"runs: {runs} (medians; ratios of 1. and 3.: the worst run, of 2.: the median "
          f"pair); load average {ctx['load']} at "
          f"the start, {os.getloadavg()[0]:.2f} at the end")
    if rows["first"]:
        ok &= _first_and_via(rows, m)
    if rows["full"]:
        ok &= _full_and_pipe(rows, m)
    if 3 in ctx["parts"]:
        ok &= _two_and_one(rows, m)
    print("targets met" if ok else "TARGETS MISSED")
    print(json.dumps(rows), file=sys.stderr)
    return ok


def _first_and_via(rows: dict, m: dict) -> bool:
    first, via = m["first"], m.get("via")
    ratio = max(r["sent"] / r["need"] for r in rows["first"])
    print(f"1. first copy, the node holds the base: {first['s']:6.2f} s  {int(first['sent']):>13,} "
          f"bytes sent up the link ({int(first['archive']):,} of them the archive; "
          f"{int(first['down']):,} came back); the node lacked {int(first['need']):,} (new "
          f"layers + config + manifest): ratio {ratio:.3f} (target <= 1.05)")
    if via is None:
        return ratio <= 1.05
    print(f"4. --via the registry: {via['s']:6.2f} s (push {via['push_s']:.2f} s, pull "
          f"{via['pull_s']:.2f} s): {int(via['link']):,} bytes on the ssh link (both ways: the "
          f"API calls), "
          f"{int(via['uploaded']):,} bytes uploaded ({via['pushed']:.0f} layer(s)), "
          f"{int(via['pulled']):,} bytes pulled ({via['pulled_layers']:.0f} layer(s)); direct "
          f"(1.) {first['s']:.2f} s, {int(first['sent'] + first['down']):,} bytes on the link: "
          f"time ratio "
          f"{via['s'] / first['s']:.2f}")
    return ratio <= 1.05


def _full_and_pipe(rows: dict, m: dict) -> bool:
    ok = True
    for suffix, how in (("", "quiet"), ("_loaded", "beside one busy process per core")):
        if not rows.get("full" + suffix):
            continue
        full, pipe_ = m["full" + suffix], m["pipe" + suffix]
        each = [f["s"] / p["s"] for f, p in zip(rows["full" + suffix], rows["pipe" + suffix])]
        tr = med(each)
        print(f"2. full copy, the node holds nothing, {how}: {full['s']:6.2f} s "
              f"{int(full['sent']):>13,} bytes sent; docker save | ssh docker load "
              f"{pipe_['s']:6.2f} s {int(pipe_['sent']):,} bytes: median ratio {tr:.2f} "
              f"(target <= 1.0; per pair {', '.join(f'{r:.2f}' for r in each)})")
        ok &= tr <= 1.0
    return ok


def _two_and_one(rows: dict, m: dict) -> bool:
    if rows["two"]:
        tr2 = max(t["s"] / o["s"] for t, o in zip(rows["two"], rows["one"]))
        print(f"3. two targets {m['two']['s']:6.2f} s, one target {m['one']['s']:6.2f} s "
              f"(the full image): time ratio {tr2:.2f} (target <= 1.3)")
        return tr2 <= 1.3
    print("3. two targets vs one: not measured, there is no second target "
          "(PK_NODE3 and PK_NODE3_SOCKET are not set)")
    return True


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--part", type=int, action="append", choices=(1, 2, 3, 4),
                    help="run only this part (repeatable; 1 and 4 run together); default all")
    ap.add_argument("--loaded", action="store_true",
                    help="run each pair of 2. quiet and beside one busy process per core")
    ap.add_argument("--synthetic", type=int, metavar="MIB",
                    help="images of random layers of MIB MiB instead of the DSpark image: for "
                         "1., a base of two on the node and a fresh 1 MiB layer; for 2. and 3., "
                         "three (without part 4, nothing else is built)")
    ap.add_argument("--split", metavar="SMALL,LARGE",
                    help="only 5.: the fixed and per-byte parts of a full copy, from images of "
                         "three layers of SMALL and of LARGE MiB")
    args = ap.parse_args()
    node, socket = os.environ.get("PK_NODE2"), os.environ.get("PK_NODE2_SOCKET")
    if not node or not socket:
        print("PK_NODE2 and PK_NODE2_SOCKET are not set: run .ci/services.sh first",
              file=sys.stderr)
        return 2
    registry = os.environ.get("PK_REGISTRY", "127.0.0.1:5055")
    client = docker.from_env(timeout=900)
    direct = docker.DockerClient(base_url=socket, timeout=900)
    node3, socket3 = os.environ.get("PK_NODE3"), os.environ.get("PK_NODE3_SOCKET")
    parts = set(args.part or (1, 2, 3, 4))
    rows: dict = {k: [] for k in ("first", "via", "full", "pipe", "full_loaded", "pipe_loaded",
                                  "one", "two")}
    ctx = {"client": client, "direct": direct, "node": node, "rows": rows, "parts": parts,
           "loaded": args.loaded, "node3": node3 if socket3 else None,
           "direct3": docker.DockerClient(base_url=socket3, timeout=900) if node3 and socket3
           else None}
    if args.split:
        small, large = (int(x) for x in args.split.split(","))
        ctx["load"] = f"{os.getloadavg()[0]:.2f}"
        split(ctx, small, large, args.runs)
        return 0
    if args.synthetic and 4 not in parts:
        ctx["full"] = synthetic(client, args.synthetic)
        if 1 in parts:   # the base of 1.: two layers, on the node before the runs
            base = f"pk-bench/copy-synthetic-base:{args.synthetic}"
            try:
                client.images.get(base)
            except docker.errors.NotFound:
                from testing import smallimage
                smallimage.build(client, base, [{f"opt/pk-bench/b{n}": os.urandom(
                    args.synthetic << 20)} for n in range(2)])
            assert copy_image.run(base, [node]).ok
            ctx["synthetic_base"] = base
        attrs = client.api.inspect_image(ctx["full"])
        print(f"image {ctx['full']}: {len(attrs['RootFS']['Layers'])} layers, "
              f"{attrs['Size']:,} bytes; node {node}; {os.cpu_count()} cores")
        ctx["load"] = f"{os.getloadavg()[0]:.2f}"
        for n in range(args.runs):
            one_run(n, ctx)
        return 0 if report(rows, ctx, args.runs) else 1
    built = build(client, registry)
    base = built["base"]["tag"]
    direct.images.pull(*base.rsplit(":", 1), platform="linux/arm64")  # as a cluster node has it
    squashed(client, TAG)
    ctx["full"] = synthetic(client, args.synthetic) if args.synthetic else FULL
    attrs = client.api.inspect_image(TAG)
    print(f"image {TAG}: {len(attrs['RootFS']['Layers'])} layers, {attrs['Size']:,} bytes (the "
          f"DSpark layer: {built['layer']['files']} files, {built['layer']['bytes']:,} bytes); "
          f"node {node}, holding the base {base}; registry {registry}")
    ctx["load"] = f"{os.getloadavg()[0]:.2f}"
    with RegistryProxy(registry) as relay:
        warm(client, base, relay.addr)
        ctx.update(relay=relay, built=built,
                   node_base=set(direct.api.inspect_image(base)["RootFS"]["Layers"]))
        for n in range(args.runs):
            one_run(n, ctx)
    return 0 if report(rows, ctx, args.runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
