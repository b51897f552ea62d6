"""Two variants of one series as two images through the real Docker Engine (real vLLM 0.27.1)."""

from __future__ import annotations

import json

import pytest

from testing import imageproject as ip
from testing.dockersdk import files_of
from testing.imageproject import RELEASE, SITE
from patchkit import manifest
from patchkit.commands.build_image import Request
from patchkit.commands.build_image import run as build_image
from patchkit.commands.verify import verify_image
from testing import release_cache

pytestmark = [pytest.mark.docker, pytest.mark.real_vllm, pytest.mark.timeout(1800)]


def test_the_default_build_and_a_variant_are_two_images(tmp_path, bases, registry, docker_client,
                                                        monkeypatch):
    monkeypatch.setenv("PATCHKIT_CACHE_DIR", str(release_cache()))
    path = ip.make_project(tmp_path, base=bases[RELEASE]["tag"],
                           tag=f"{registry}/pk-test/pk-variants:{{ref}}-{{variant}}")
    text = path.read_text()
    text = text.replace("patches:\n", "variants:\n  diag: with the draft guard\npatches:\n", 1)
    text = text.replace("    diff: patches/draft-guard.diff\n",
                        "    diff: patches/draft-guard.diff\n    variants: [diag]\n")
    path.write_text(text)
    m = manifest.load(path)
    workdir = tmp_path / ".patchkit" / "vllm"
    guard = f"{SITE}/{ip.NEW}"

    plain = build_image(m, Request(workdir=workdir))
    assert plain.ok, plain.to_dict()
    diag = build_image(m, Request(workdir=workdir, variant="diag"))
    assert diag.ok, diag.to_dict()
    assert plain.tag == f"{registry}/pk-test/pk-variants:v{RELEASE}"
    assert diag.tag == f"{registry}/pk-test/pk-variants:v{RELEASE}-diag"
    assert plain.image_id != diag.image_id

    for built, variant, has_guard in ((plain, "", False), (diag, "diag", True)):
        attrs = docker_client.api.inspect_image(built.tag)
        assert attrs["Id"] == built.image_id
        labels = attrs["Config"]["Labels"]
        assert labels["io.patchkit.variant"] == variant
        statuses = {p["id"]: p["status"] for p in json.loads(labels["io.patchkit.patches"])}
        assert statuses["draft-guard"] == ("applied" if has_guard else "skipped")
        assert (files_of(docker_client, built.tag, [guard])[guard] is not None) is has_guard
        # verify --image takes the variant from the labels: the guard's assertion only in diag
        results = verify_image(m, built.tag)
        assert all(r.ok for r in results)
        assert ("draft-guard" in {r.patch for r in results}) is has_guard
