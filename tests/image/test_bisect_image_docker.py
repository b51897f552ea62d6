"""bisect --series --image on the real engine: each prefix of two of the image tests' patches
(real vLLM 0.27.1) built into an image over the arm64 test base, CMD reading the patched file out
of PATCHKIT_IMAGE; the images are untagged once CMD has run.  Two patches are the fewest with a
prefix between the good and the bad end: each run is an image, so one patch fewer is one image
and one container fewer."""

from __future__ import annotations

import json
import os

import pytest
from testing import imageproject as ip
from testing import patchkit

from patchkit import manifest
from patchkit.manifest.edit import ManifestText

pytestmark = [pytest.mark.docker, pytest.mark.real_vllm]

SITE = "/usr/local/lib/python3.11/dist-packages"
REPOSITORY = "pk-test/bisect-series"


def project(root, base: str, tag: str, *, drop: str):
    """The image tests' project under ``root``, its series without patch ``drop``."""
    root.mkdir()
    path = ip.make_project(root, base=base, tag=tag)
    edit = ManifestText.read(path)
    edit.delete_item(("patches",), manifest.load(path).patch(drop).index)
    edit.write(path)
    assert len(manifest.load(path).patches) == 2


def test_each_prefix_is_an_image_and_cmd_reads_it(bases, registry, docker_client, tmp_path,
                                                   real_vllm):
    root = tmp_path / "proj"
    project(root, bases[ip.RELEASE]["tag"], f"{registry}/{REPOSITORY}:{{ref}}",
            drop="draft-guard")
    cmd = tmp_path / "in-image.sh"
    cmd.write_text(f"""#!/bin/sh
cid=$(docker create --platform linux/arm64 "$PATCHKIT_IMAGE") || exit 200
docker cp "$cid:{SITE}/{ip.DTYPES}" - > "$PATCHKIT_TREE/../dtypes.tar"; got=$?
docker rm "$cid" >/dev/null
[ $got = 0 ] || exit 200
grep -aq nvfp4_ds_mla "$PATCHKIT_TREE/../dtypes.tar" &&
  {{ echo "mapped in $PATCHKIT_IMAGE"; exit 1; }}
exit 0
""")
    cmd.chmod(0o755)
    cp = patchkit("bisect", "--series", "--image", "--run", str(cmd), "--timeout", "120",
                  "--format", "json", cwd=root)
    assert cp.returncode == 0, cp.stderr
    data = json.loads(cp.stdout)
    assert data["image"] is True and data["first_bad"]["id"] == "nvfp4-ds-mla-dtype"
    runs = {r["patches"]: r for r in data["runs"]}
    assert sorted(runs) == [0, 1, 2] and data["tested"] <= data["limit"]
    for k, r in runs.items():
        assert r["image"] == f"{registry}/{REPOSITORY}:bisect-{k}"
    assert "mapped in" in runs[2]["output"] and runs[1]["outcome"] == "good"
    # the tags were put back where they were: nowhere
    assert docker_client.images.list(name=f"{registry}/{REPOSITORY}") == []


def test_no_daemon_pushes_each_prefix_to_the_registry(bases, registry, tmp_path, real_vllm):
    root = tmp_path / "proj"
    project(root, bases[ip.RELEASE]["tag"], f"{registry}/{REPOSITORY}-nd:{{ref}}",
            drop="draft-quant-config")
    cmd = tmp_path / "in-registry.sh"
    cmd.write_text(f"""#!/bin/sh
skopeo inspect --tls-verify=false "docker://$PATCHKIT_IMAGE" | grep -q '"Layers"' || exit 200
test -f "$PATCHKIT_TREE/{ip.NEW}" && exit 1
exit 0
""")
    cmd.chmod(0o755)
    cp = patchkit("bisect", "--series", "--image", "--no-daemon", "--run", str(cmd),
                  "--timeout", "120", cwd=root,
                  env=dict(os.environ, DOCKER_HOST="tcp://127.0.0.1:1"))  # no engine used
    assert cp.returncode == 0, cp.stderr
    assert "first bad patch: draft-guard (2 of 2)" in cp.stdout
    assert f"image {registry}/{REPOSITORY}-nd:bisect-2" in cp.stdout
