"""Small arm64 images made on the fly, for tests that move images between engines.

A copy test needs layers to send, to leave out and to cut, not a big base: these images have
a few layers of a few hundred KB to a few MB each, so that a copy takes seconds.  Each layer is
one ``COPY`` of generated files in a ``FROM scratch`` (or ``FROM`` a parent) Dockerfile, built
by the classic builder; ``filler`` gives incompressible bytes, new on every call, so that no
engine or registry holds a test's layers from an earlier run or another test.

``vllm_files`` lays out the few files of a real vLLM release that ``build-image`` reads from a
base (the package's ``__init__.py`` and version, the modules a series replaces, the dist-info),
as the release's wheel has them: on top of filler layers, a base that build-image takes for one
holding that release.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import zipfile

import docker

from testing.baseimage import SITE, find_wheel

MiB = 2**20
PLATFORM = "linux/arm64"


def filler(size: int) -> bytes:
    return os.urandom(size)


def build(client: docker.DockerClient, tag: str, layers: list[dict[str, bytes]], *,
          parent: str = "scratch", env: dict[str, str] | None = None,
          labels: dict[str, str] | None = None) -> str:
    """``tag``: ``parent`` and one layer per item of ``layers`` (``{path in the image:
    bytes}``), for linux/arm64, with ``labels``; its image id."""
    lines = [f"FROM {parent}"]
    ctx = io.BytesIO()
    with tarfile.open(fileobj=ctx, mode="w") as tar:
        for n, files in enumerate(layers):
            for path, body in files.items():
                info = tarfile.TarInfo(f"layer{n}/{path.lstrip('/')}")
                info.size, info.mode, info.mtime = len(body), 0o644, 1_700_000_000
                tar.addfile(info, io.BytesIO(body))
            lines.append(f"COPY layer{n}/ /")
        # after the layers: a first step from scratch that makes no layer (ENV) would make
        # an image of the builder's own platform, whatever the build asked for
        lines += [f"ENV {k}={v}" for k, v in (env or {}).items()]
        lines += [f"LABEL {json.dumps(k)}={json.dumps(v)}" for k, v in (labels or {}).items()]
        dockerfile = ("\n".join(lines) + "\n").encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile)
        tar.addfile(info, io.BytesIO(dockerfile))
    ctx.seek(0)
    image, _ = client.images.build(fileobj=ctx, custom_context=True, tag=tag, rm=True,
                                   forcerm=True, platform=PLATFORM)
    return image.id


def push(client: docker.DockerClient, tag: str) -> None:
    for line in client.api.push(tag, stream=True, decode=True):
        if "error" in line:
            raise RuntimeError(f"push of {tag} failed: {line['error']}")


def forget_tagged(client: docker.DockerClient, suffix: str) -> None:
    """Remove every tag ending in ``suffix`` (a run's own) from the engine, and so the images
    that no other tag holds."""
    for image in client.images.list():
        for tag in image.tags:
            if tag.endswith(suffix):
                try:
                    client.images.remove(tag)
                except docker.errors.NotFound:
                    pass


def vllm_files(version: str, modules: list[str]) -> dict[str, bytes]:
    """vLLM ``version``'s ``modules`` (``vllm/...``), its ``__init__.py`` and version modules,
    and its dist-info (without RECORD, as the test bases have it), at their installed paths."""
    wanted = {"vllm/__init__.py", "vllm/_version.py", "vllm/version.py", *modules}
    out = {}
    with zipfile.ZipFile(find_wheel(version)) as zf:
        for name in zf.namelist():
            info = name.split("/")[0]
            if name in wanted or (info.endswith(".dist-info") and not name.endswith("/RECORD")):
                out[f"{SITE}/{name}"] = zf.read(name)
    missing = wanted - {k[len(SITE) + 1:] for k in out}
    assert not missing, f"vLLM {version}'s wheel lacks {sorted(missing)}"
    return out
