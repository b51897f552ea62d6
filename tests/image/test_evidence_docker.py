"""Evidence kept with the build, on the real engine and the real registry.

Three builds of one patchset (the arm64 test base and one small layer each, labelled and tagged
as build-image does), pushed to the registry at PK_REGISTRY (Docker's registry 2.8, which has
no referrers API: the tag fallback is what gets written); the newest runs in a container under
qemu (a `sleep`), the server it stands for is ``testing.standin_vllm``: vLLM cannot serve here
(no GPU), so a stand-in on 127.0.0.1 streams completions at a token rate each test sets.

The records are read back by skopeo (a real OCI client) and by patchkit with another cache
folder, as another machine would.
"""

from __future__ import annotations

import io
import json
import re
import secrets
import subprocess
import tarfile
import tempfile

from pathlib import Path

import pytest
from testing import smallimage
from testing.baseimage import cache_root, fetch_debs
from testing.imageproject import RELEASE
from testing.smallimage import filler
from testing.standin_vllm import Behaviour, serve

from patchkit import cli
from patchkit.nodes import evidence
from patchkit.engines import registry

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]

from testing.imageproject import REGISTRY  # PK_REGISTRY, as .ci/services.sh wrote it
RUN = secrets.token_hex(4)
PATCHSET = f"pk-evidence-{RUN}"
MOVING = f"{REGISTRY}/pk-test/evidence:{RUN}"
TOLERANCE = 0.15
SPEED = ["--requests", "2", "--output-tokens", "24"]


def labels_of(key: str) -> dict[str, str]:
    return {"io.patchkit.patchset.name": PATCHSET, "io.patchkit.inputs": key,
            "io.patchkit.vllm.version": RELEASE,
            "io.patchkit.patches": json.dumps([{"id": "draft-guard", "status": "applied"}])}


def busybox_base(client) -> str:
    """A base of one file, Debian's static arm64 busybox (the deb the test bases use), small
    enough that three builds on it take seconds on a vfs store."""
    [deb] = [d for d in fetch_debs(cache_root() / "test-image" / "debs")
             if d.name.startswith("busybox-static")]
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["dpkg-deb", "-x", str(deb), tmp], check=True, timeout=60)
        data = (Path(tmp) / "bin" / "busybox").read_bytes()
    ctx = io.BytesIO()
    with tarfile.open(fileobj=ctx, mode="w") as tar:
        for name, body, mode in (("busybox", data, 0o755),
                                 ("Dockerfile", b"FROM scratch\nCOPY busybox /bin/busybox\n"
                                                b"ENTRYPOINT [\"/bin/busybox\"]\n", 0o644)):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(body), mode
            tar.addfile(info, io.BytesIO(body))
    ctx.seek(0)
    tag = f"{REGISTRY}/pk-test/evidence-base:{RUN}"
    client.images.build(fileobj=ctx, custom_context=True, tag=tag, rm=True, forcerm=True,
                        platform="linux/arm64")
    return tag


@pytest.fixture(scope="module")
def builds(docker_client, registry):
    """Three builds, oldest first, each pushed (so each has a repo digest); the moving tag on
    the newest, which a running container runs; a stopped container of the oldest."""
    base = busybox_base(docker_client)
    made = []
    for n in range(3):
        key = "sha256:" + secrets.token_hex(32)
        fixed = f"{MOVING}-{key[7:19]}"
        image_id = smallimage.build(docker_client, fixed, [{f"opt/build{n}": filler(1024)}],
                                    parent=base, labels=labels_of(key))
        docker_client.api.tag(image_id, *MOVING.rsplit(":", 1))
        smallimage.push(docker_client, fixed)
        digest = docker_client.api.inspect_image(fixed)["RepoDigests"][0]
        made.append({"id": image_id, "fixed": fixed, "repo_digest": digest})
    running = docker_client.containers.run(made[2]["fixed"], command=["sleep", "600"],
                                           detach=True,
                                           labels={"pk-run": RUN}, name=f"pk-ev-{RUN}")
    stopped = docker_client.containers.create(made[0]["fixed"], command=["true"],
                                              labels={"pk-run": RUN}, name=f"pk-ev-off-{RUN}")
    yield {"old": made[0], "mid": made[1], "new": made[2], "running": running.name,
           "stopped": stopped.name}
    for c in docker_client.api.containers(all=True, filters={"label": f"pk-run={RUN}"}):
        docker_client.api.remove_container(c["Id"], force=True)
    for image in docker_client.images.list():
        for tag in image.tags:
            if RUN in tag:
                docker_client.images.remove(tag)


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("evidence")
    (root / "patchset.yaml").write_text(
        f"name: {PATCHSET}\nvllm: {{repo: pypi, ref: v{RELEASE}}}\n"
        f"image:\n  tag: {MOVING}\npatches: []\n")
    return root / "patchset.yaml"


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(autouse=True)
def _one_cache(cache, monkeypatch):
    monkeypatch.setenv("PATCHKIT_CACHE_DIR", str(cache))


def main(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def skopeo_raw(ref: str) -> dict:
    out = subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false", f"docker://{ref}"],
                         capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)


def test_smoke_records_against_the_container_in_cache_and_registry(builds, capsys, tmp_path,
                                                                   project, monkeypatch):
    new = builds["new"]
    with serve(Behaviour(token_rate=40.0)) as s:
        code, out, err = main(capsys, "smoke", s.url, "--container", builds["running"], *SPEED,
                              "--format", "json")
    doc = json.loads(out)
    assert code == 0, (out, err)
    assert doc["build"]["image_id"] == new["id"] and doc["build"]["immutable_tag"] == new["fixed"]
    record = doc["evidence"]["record"]
    assert record["kind"] == "smoke" and record["verdict"] == "passed"
    assert record["figures"]["decode_tok_s"] == pytest.approx(40.0, rel=TOLERANCE)
    assert record["settings"]["requests"] == 2 and record["settings"]["output_tokens"] == 24
    assert record["server_version"] == "0.33.0" and record["patchkit"]
    assert doc["evidence"]["refused"] == [] and len(doc["evidence"]["pushed"]) == 1

    # a real OCI client sees it: the fallback tag's index lists it, its subject is the image
    repo, digest = new["repo_digest"].split("@")
    index = skopeo_raw(f"{repo}:{registry.fallback_tag(digest)}")
    [listed] = index["manifests"]
    assert listed["artifactType"] == evidence.ARTIFACT_TYPE
    artifact = skopeo_raw(f"{repo}@{listed['digest']}")
    assert artifact["subject"]["digest"] == digest
    assert artifact["layers"][0]["mediaType"] == evidence.ARTIFACT_TYPE

    # another machine's cache: images reads it from the registry, and keeps it
    monkeypatch.setenv("PATCHKIT_CACHE_DIR", str(tmp_path / "elsewhere"))
    code, out, _ = main(capsys, "images", "--manifest", str(project), "--format", "json")
    assert code == 0
    [node] = json.loads(out)["nodes"]
    shown = {i["id"]: i for i in node["images"]}
    assert shown[new["id"]]["last_evidence"]["figures"]["decode_tok_s"] == \
        record["figures"]["decode_tok_s"]
    assert shown[builds["old"]["id"]]["last_evidence"] is None
    code, out, _ = main(capsys, "images", "--manifest", str(project))
    assert "evidence: smoke passed, " in out and "tok/s" in out and "never served" in out
    assert list((tmp_path / "elsewhere" / "evidence").rglob("*.json"))
    code, out, _ = main(capsys, "images", "--manifest", str(project), "--evidence", new["fixed"])
    assert code == 0 and "1 record(s)" in out and "model deepseek-ai/DeepSeek-V4-Flash" in out


def test_the_gate_on_a_slower_and_a_faster_build(builds, capsys):
    old, new = builds["old"], builds["new"]
    with serve(Behaviour(token_rate=60.0)) as s:
        code, out, err = main(capsys, "smoke", s.url, "--build", old["fixed"], *SPEED)
    assert code == 0, (out, err)
    with serve(Behaviour(token_rate=30.0)) as s:
        code, out, err = main(capsys, "smoke", s.url, "--container", builds["running"], *SPEED,
                              "--against", old["fixed"], "--max-drop", "20")
    assert code == 1, (out, err)
    [line] = [x for x in out.splitlines() if x.startswith("FAILED: gate")]
    assert "decode tok/s fell" in line and old["fixed"] in line and new["fixed"] in line
    was, now = map(float, re.search(r"\(([\d.]+) on .* -> ([\d.]+) on ", line).groups())
    assert was == pytest.approx(60.0, rel=TOLERANCE) and now == pytest.approx(30.0, rel=TOLERANCE)
    with serve(Behaviour(token_rate=70.0)) as s:
        code, out, err = main(capsys, "smoke", s.url, "--container", builds["running"], *SPEED,
                              "--against", old["fixed"], "--max-drop", "20")
    assert code == 0, (out, err)
    assert out.splitlines()[-1].startswith("ok: gate: against " + old["fixed"])
    # previous: the build before this one on its node (mid), which has no evidence yet
    with serve(Behaviour(token_rate=70.0)) as s:
        code, out, err = main(capsys, "smoke", s.url, "--container", builds["running"], *SPEED,
                              "--against", "previous", "--max-drop", "20")
    assert code == 2 and out == ""
    assert err.strip().endswith("(smoke --requests N, with --container or --build, records it)")
    assert builds["mid"]["fixed"] in err and len(err.strip().splitlines()) == 1


def test_rollback_passes_over_a_build_whose_evidence_failed(builds, project, capsys):
    with serve(Behaviour(token_rate=60.0)) as s:
        assert main(capsys, "smoke", s.url, "--build", builds["old"]["fixed"])[0] == 0
    with serve(Behaviour(health_status=500)) as s:
        code, out, _ = main(capsys, "smoke", s.url, "--build", builds["mid"]["fixed"])
    assert code == 1 and "evidence: smoke failed" in out
    code, out, err = main(capsys, "rollback", "--manifest", str(project), "--dry-run")
    assert code == 0, (out, err)
    lines = out.splitlines()
    assert lines[0].startswith(f"passed over {builds['mid']['fixed']}: its last evidence failed")
    assert lines[1].startswith(f"would roll {MOVING} back to {builds['old']['fixed']}: the "
                               "newest earlier build whose last evidence passed (smoke passed")
    # --to forces
    code, out, _ = main(capsys, "rollback", "--manifest", str(project), "--dry-run", "--to",
                        builds["mid"]["fixed"])
    assert code == 0 and "--to: forced" in out


@pytest.mark.parametrize("args, said", [
    (["--build", f"{MOVING}-000000000000"], "no such image on the engine"),
    (["--container", f"pk-none-{RUN}"], "no such container on the engine"),
    (["--container", f"pk-ev-off-{RUN}"], "not running on the engine"),
    (["--build", "x", "--container", "y"], "not both"),
    (["--against", f"{MOVING}-000000000000", "--max-drop", "10"], "no speed evidence"),
    (["--against", "previous", "--max-drop", "10"], "--against previous needs the build"),
    (["--against", "previous", "--max-drop", "101"], "--max-drop 101.0: a percentage"),
    (["--against", "previous", "--max-drop", "-1"], "--max-drop -1.0: a percentage"),
    (["--max-drop", "5"], "go together")])
def test_bad_inputs_are_one_line_exit_2(builds, capsys, args, said):
    with serve() as s:
        code, out, err = main(capsys, "smoke", s.url, *args)
        asked = s.requests()
    assert code == 2 and out == "", out
    assert len(err.strip().splitlines()) == 1 and said in err, err
    assert asked == []   # refused before any request


def test_corrupt_records_are_named_and_skipped(builds, capsys, cache, project):
    new = builds["new"]
    store = evidence.Store(cache)
    folder = store.keep(evidence.Record("smoke", new["id"], new["fixed"], "here", 1.0, True,
                                        ())).parent
    (folder / "junk.json").write_text("{not json")
    registry.push_referrer(new["repo_digest"], evidence.ARTIFACT_TYPE, b'{"kind": "nope"}', {},
                           timeout=30)
    code, out, _ = main(capsys, "images", "--manifest", str(project), "--evidence", new["fixed"])
    assert code == 0
    skipped = [x for x in out.splitlines() if x.startswith("skipped: ")]
    assert any("junk.json: not an evidence record" in x for x in skipped), out
    assert any("kind 'nope' is not smoke or verify" in x for x in skipped), out


def test_verify_records_the_runtime_verdict_against_build(builds, tmp_path, cache):
    from testing import patchkit
    from testing.project import MANIFEST, make_project

    proj = make_project(tmp_path, MANIFEST)
    applied = patchkit("apply", cwd=proj)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    (proj / "server.log").write_text("INFO Application startup complete.\n")
    base = ("verify", "--tree", ".patchkit/vllm", "--log", "server.log")
    out = patchkit(*base, "--build", builds["mid"]["fixed"], "--format", "json", cwd=proj)
    assert out.returncode == 0, out.stderr
    kept = json.loads(out.stdout)["evidence"]
    assert kept["record"]["kind"] == "verify" and kept["record"]["verdict"] == "passed"
    assert kept["record"]["image_id"] == builds["mid"]["id"] and len(kept["pushed"]) == 1
    assert evidence.Store(cache).local(builds["mid"]["id"]).last.kind == "verify"
    # a --build naming no image: one line, exit 2, nothing judged
    out = patchkit(*base, "--build", f"{MOVING}-000000000000", cwd=proj)
    assert out.returncode == 2 and out.stdout == ""
    assert len(out.stderr.strip().splitlines()) == 1 and "no such image" in out.stderr


def test_a_record_on_a_second_node_behind_ssh(builds, node2, capsys, project):
    from patchkit.commands import copy_image

    new = builds["new"]
    assert copy_image.run(new["fixed"], [node2.url]).ok
    there = node2.direct.containers.run(new["fixed"], command=["sleep", "600"], detach=True,
                                        labels={"pk-run": RUN})
    try:
        with serve(Behaviour(token_rate=50.0)) as s:
            code, out, err = main(capsys, "smoke", s.url, "--container", there.name, "--node",
                                  node2.url, *SPEED, "--format", "json")
        doc = json.loads(out)
        assert code == 0, (out, err)
        assert doc["build"] == {"image_id": new["id"], "immutable_tag": new["fixed"],
                                "node": node2.url}
        assert doc["evidence"]["record"]["node"] == node2.url
        # the copy came by ssh, not from the registry: the record stays in the cache there
        assert doc["evidence"]["pushed"] == [] and doc["evidence"]["refused"] == []
        code, out, _ = main(capsys, "images", "--manifest", str(project), "--node", node2.url,
                            "--format", "json")
        assert code == 0
        for node in json.loads(out)["nodes"]:
            [image] = [i for i in node["images"] if i["id"] == new["id"]]
            where = {r["node"] for r in image["evidence"]}
            assert node2.url in where and any(w != node2.url for w in where), where
    finally:
        there.remove(force=True)
        for tag in node2.direct.images.get(new["fixed"]).tags:
            node2.direct.images.remove(tag)
