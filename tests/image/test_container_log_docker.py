"""`patchkit verify --container`: a container's log read through the real Docker Engine.

A small arm64 image (Debian's busybox-static and a stand-in vllm package with one module) prints
a server's startup lines on stdout and stderr under qemu; it runs to completion, then its log is
judged against the markers of the patches the image's labels say are in, together with the AST
assertions on the image's files.
"""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from testing.baseimage import cache_root, fetch_debs
from patchkit import cli

pytestmark = [pytest.mark.docker, pytest.mark.timeout(900)]

RELEASE = "0.33.0"
SITE = "usr/local/lib/python3.11/dist-packages"

DIFF = "--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -1 +1 @@\n-a = 1\n+a = 2\n"

MANIFEST = """\
name: pk-runtime
vllm:
  repo: pypi
  ref: v{release}
runtime:
  - log: 'Application startup complete'
  - log: 'Worker proc \\S+ died unexpectedly'
    absent: true
patches:
  - id: kv-cache
    summary: the KV line, written on stderr by the server
    diff: patches/kv.diff
    verify:
      - file: vllm/config/cache.py
        defines: CacheConfig
    runtime:
      - log: 'Using nvfp4_ds_mla data type to store kv cache'
      - log: 'event=layer_load'
        count: 3
  - id: draft-guard
    summary: the guard's startup line
    diff: patches/guard.diff
    runtime:
      - log: 'DSpark draft quantization path: quant_config=DeepseekV4FP8Config, moe_quant_algo='
      - log: 'w1_weight_scale_2 must match w3_weight_scale_2\\. Accuracy may be affected\\.'
        absent: true
  - id: other-model
    summary: skipped in the image, its marker never shows and must not count
    diff: patches/other.diff
    runtime:
      - log: 'a line this server never writes'
"""

# The server's stand-in: stdout and stderr interleaved, one line at a time.  With RESTART=1
# its first start is broken and the next ones are good (the container's own file says which
# start it is); with STAY=1 a good start keeps running, as a server does.
SCRIPT = r"""
if [ "$RESTART" = 1 ]; then
  if [ -e /started ]; then BROKEN=0; else : > /started; BROKEN=1; fi
fi
echo 'INFO 05-12 10:00:01 [model.py:744] Resolved architecture: DeepseekV4ForCausalLM'
echo 'INFO 05-12 10:00:01 [cache.py:478] Using nvfp4_ds_mla data type to store kv cache. It reduces the GPU memory footprint and boosts the performance.' >&2
for layer in 0 1 2; do echo "event=layer_load layer=$layer"; done
echo '(Worker_TP0 pid=201) INFO 05-12 10:00:05 [dspark.py:412] DSpark draft quantization path: quant_config=DeepseekV4FP8Config, moe_quant_algo='
if [ "$BROKEN" = 1 ]; then
  echo '(Worker_TP0 pid=201) WARNING 05-12 10:00:09 [modelopt.py:1059] w1_weight_scale_2 must match w3_weight_scale_2. Accuracy may be affected.' >&2
fi
if [ "$LONG" = 1 ]; then
  printf "Worker proc VllmWorker-1 died unexpectedly "
  /bin/busybox head -c 70000 /dev/zero | /bin/busybox tr "\\0" x; echo
fi
echo '(APIServer pid=1) INFO:     Application startup complete.'
if [ "$STAY" = 1 ] && [ "$BROKEN" = 0 ]; then exec /bin/busybox sleep 600; fi
"""


def _rootfs(out: Path) -> None:
    """busybox (as /bin/sh) and a vllm package holding vllm/config/cache.py, as a tar."""
    [busybox] = [d for d in fetch_debs(cache_root() / "test-image" / "debs")
                 if d.name.startswith("busybox-static_")]
    with tempfile.TemporaryDirectory(prefix="pk-rootfs-") as tmp:
        root = Path(tmp)
        subprocess.run(["dpkg", "-x", str(busybox), str(root)], check=True)
        (root / "bin" / "sh").symlink_to("busybox")
        package = root / SITE / "vllm"
        (package / "config").mkdir(parents=True)
        (package / "__init__.py").write_text("")
        (package / "config" / "cache.py").write_text("class CacheConfig:\n    pass\n")
        with tarfile.open(out, "w") as tar:
            for entry in sorted(root.iterdir()):
                tar.add(entry, arcname=entry.name)


def _settled(container, deadline: float = 60) -> None:
    """Until the engine has written all the container's lines: it copies stdout and stderr to
    the log on their own, so a line can land after the process has ended.  Settled is the same
    log read twice, a second apart."""
    end = time.monotonic() + deadline
    before = container.logs(stdout=True, stderr=True)
    while True:
        time.sleep(1)
        now = container.logs(stdout=True, stderr=True)
        if now == before:
            return
        assert time.monotonic() < end, f"{container.name}'s log is still growing"
        before = now


@pytest.fixture(scope="module")
def served(docker_client, tmp_path_factory):
    """The log-printing image (labels: kv-cache and draft-guard in, other-model skipped), a good
    and a broken container of it run to completion, and the manifest."""
    root = tmp_path_factory.mktemp("runtime-image")
    (root / "patches").mkdir()
    for name in ("kv", "guard", "other"):
        (root / "patches" / f"{name}.diff").write_text(DIFF)
    (root / "patchset.yaml").write_text(MANIFEST.format(release=RELEASE))
    context = root / "context"
    context.mkdir()
    _rootfs(context / "rootfs.tar")
    labels = json.dumps([{"id": "kv-cache", "status": "applied"},
                         {"id": "draft-guard", "status": "upstream"},
                         {"id": "other-model", "status": "skipped"}])
    (context / "Dockerfile").write_text(
        "FROM scratch\nADD rootfs.tar /\n"
        f"LABEL io.patchkit.patches={json.dumps(labels)} "
        f"io.patchkit.vllm.installed={RELEASE} io.patchkit.vllm.dir=/{SITE}/vllm\n"
        f"ENTRYPOINT [\"/bin/sh\", \"-c\", {json.dumps(SCRIPT)}]\n")
    tag = f"pk-test/runtime-log:{uuid.uuid4().hex[:8]}"
    image, _ = docker_client.images.build(path=str(context), tag=tag, platform="linux/arm64",
                                          rm=True, forcerm=True)
    containers = {}
    try:
        for which, broken, long in (("good", "0", "0"), ("broken", "1", "0"),
                                    ("long", "0", "1")):
            name = f"pk-runtime-{which}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
            container = docker_client.containers.run(tag, name=name, detach=True,
                                                     environment={"BROKEN": broken,
                                                                  "LONG": long},
                                                     network_disabled=True)
            containers[which] = container
            assert container.wait(timeout=300)["StatusCode"] == 0
            _settled(container)
        yield {"tag": tag, "manifest": str(root / "patchset.yaml"), "root": root,
               **{which: c.name for which, c in containers.items()},
               "good_id": containers["good"].id, "image": image}
    finally:
        for container in containers.values():
            container.remove(force=True)
        docker_client.images.remove(image.id, force=True)


def engine_order(docker_client, name: str) -> list[str]:
    """The container's log as the engine gives it: the order of stdout and stderr lines is the
    engine's (its copies of the two streams race), so line numbers are judged against it."""
    return docker_client.containers.get(name).logs(stdout=True, stderr=True).decode().splitlines()


def verify(capsys, served, *args: str) -> tuple[int, str, str]:
    code = cli.main(["verify", "--image", served["tag"], "--manifest", served["manifest"], *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_a_good_containers_log_holds(capsys, served, docker_client):
    code, out, err = verify(capsys, served, "--container", served["good"], "--format", "json")
    assert code == 0, out + err
    report = json.loads(out)
    assert list(report) == ["ok", "status", "target", "verify", "runtime", "starts", "holds",
                            "evidence"]
    # the server ran to its end: no build is running to record the verdict against
    assert report["evidence"] == {"said": [
        f"evidence: --container {served['good']} is not running: nothing recorded (--build TAG "
        "names the build)"]}
    assert report["status"] == "ok"
    assert [v["ok"] for v in report["verify"]] == [True]
    name = f"container:{served['good']}"
    rows = {(r["patch"], r["log"]): r for r in report["runtime"]}
    # other-model is skipped in the image: its marker is not there at all
    assert {patch for patch, _ in rows} == {"kv-cache", "draft-guard", None}
    kv = rows[("kv-cache", "Using nvfp4_ds_mla data type to store kv cache")]
    assert kv["ok"] and kv["found"] == 1
    logged = engine_order(docker_client, served["good"])
    number = next(i for i, line in enumerate(logged, 1) if "Using nvfp4_ds_mla" in line)
    assert kv["lines"] == [f"{name}:{number}: {logged[number - 1]}"]  # written on stderr
    assert rows[("kv-cache", "event=layer_load")]["found"] == 3
    assert all(r["ok"] for r in report["runtime"])


def test_a_broken_containers_log_names_the_patch_and_the_line(capsys, served, docker_client):
    code, out, err = verify(capsys, served, "--container", served["broken"])
    assert code == 1, out + err
    logged = engine_order(docker_client, served["broken"])
    number = next(i for i, line in enumerate(logged, 1) if "w1_weight_scale_2" in line)
    lines = out.splitlines()
    assert lines[0] == "ok: 1/1 assertions passed on " + served["tag"]
    assert lines[1] == (
        f"container:{served['broken']}:{number}: [draft-guard] forbidden 'w1_weight_scale_2 "
        "must match w3_weight_scale_2\\. Accuracy may be affected\\.': (Worker_TP0 pid=201) WARNING "
        "05-12 10:00:09 [modelopt.py:1059] w1_weight_scale_2 must match w3_weight_scale_2. "
        "Accuracy may be affected.")
    assert lines[2] == f"FAILED: 5/6 runtime markers hold in container:{served['broken']}"


def test_a_long_line_in_a_containers_log_is_cut_and_noted(capsys, served, docker_client):
    """The engine's log driver hands a 70 000-byte line over in pieces; patchkit's one line reader
    puts it back together, judges its first 64 KiB and says so."""
    code, out, err = verify(capsys, served, "--container", served["long"])
    assert code == 1, out + err
    logged = engine_order(docker_client, served["long"])
    number = next(i for i, line in enumerate(logged, 1) if "VllmWorker-1" in line)
    name = f"container:{served['long']}"
    lines = out.splitlines()
    assert lines[1] == (f"note: {name}: line {number} is longer than 64 KiB; judged on its "
                        "first 64 KiB")
    assert lines[2].startswith(f"{name}:{number}: [series] forbidden 'Worker proc \\S+ died "
                               "unexpectedly': Worker proc VllmWorker-1 died unexpectedly xxx")
    assert lines[3] == f"FAILED: 5/6 runtime markers hold in {name}"


def test_a_container_by_id_and_a_file_judged_together(capsys, served, tmp_path):
    """Rank 0's container and rank 1's log, copied off the other node: counts are summed."""
    rank1 = tmp_path / "rank1.log"
    rank1.write_text("event=layer_load layer=3\n")
    code, out, _ = verify(capsys, served, "--container", served["good_id"][:12], "--log",
                          str(rank1), "--format", "json")
    assert code == 1
    row = next(r for r in json.loads(out)["runtime"] if r["log"] == "event=layer_load")
    assert not row["ok"] and row["found"] == 4
    # files first, then containers
    assert row["message"] == ("expected exactly 3 lines matching 'event=layer_load', found 4 in "
                              f"{rank1}, container:{served['good_id'][:12]}")


def test_an_unknown_container_is_one_line_and_exit_2(capsys, served):
    code, out, err = verify(capsys, served, "--container", "pk-no-such-container")
    assert code == 2
    assert out == ""
    host = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    assert err.splitlines() == [
        f"patchkit verify: error: --container pk-no-such-container: no such container on the engine "
        f"at {host}"]


# ------------------------------------------------------------------------------ restarts

def _wait_for(container, text: str, times: int = 1, deadline: float = 300) -> None:
    """Until ``text`` is in the container's log ``times`` times (its server is up), and the log
    has settled."""
    end = time.monotonic() + deadline
    while container.logs(stdout=True, stderr=True).decode().count(text) < times:
        assert time.monotonic() < end, f"{container.name} never logged {text!r} {times} times"
        time.sleep(0.5)
    _settled(container)


@pytest.fixture(scope="module")
def restarted(docker_client, served):
    """Two containers whose first start was broken (the forbidden warning) and whose second,
    restarted in the same container, is good: one that ran to its end, one still running."""
    made = {}
    try:
        for which, stay in (("ended", "0"), ("running", "1")):
            name = f"pk-runtime-restart-{which}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
            container = docker_client.containers.run(
                served["tag"], name=name, detach=True, network_disabled=True,
                environment={"RESTART": "1", "STAY": stay, "LONG": "0"})
            made[which] = container
            assert container.wait(timeout=300)["StatusCode"] == 0
            _settled(container)
            container.start()
            if stay == "1":
                _wait_for(container, "Application startup complete", times=2)
            else:
                assert container.wait(timeout=300)["StatusCode"] == 0
                _settled(container)
        yield {which: c.name for which, c in made.items()}
    finally:
        for container in made.values():
            container.remove(force=True)


@pytest.mark.parametrize("which", ["ended", "running"])
def test_a_restarted_container_is_judged_on_its_current_start(capsys, served, restarted,
                                                              docker_client, which):
    """The engine keeps both starts' lines in the container's log; verify reads it from the
    current start on, so the first start's forbidden line and its lines are not counted."""
    name = restarted[which]
    whole = engine_order(docker_client, name)
    assert sum("w1_weight_scale_2" in line for line in whole) == 1   # the first start's
    assert sum("event=layer_load" in line for line in whole) == 6    # both starts'
    code, out, err = verify(capsys, served, "--container", name, "--format", "json")
    assert code == 0, out + err
    report = json.loads(out)
    assert report["starts"] == [{"log": f"container:{name}", "starts": 1, "line": 1, "stop": None}]
    rows = {r["log"]: r for r in report["runtime"]}
    assert rows["event=layer_load"]["found"] == 3
    # lines are numbered from the current start's first line, as `docker logs --since` gives
    # them: the current start logged what a good container logs, at the log's end
    current = whole[-len(engine_order(docker_client, served["good"])):]
    number = next(i for i, line in enumerate(current, 1) if "Using nvfp4_ds_mla" in line)
    assert rows["Using nvfp4_ds_mla data type to store kv cache"]["lines"] == [
        f"container:{name}:{number}: {current[number - 1]}"]
