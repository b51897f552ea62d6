"""Source mode through the real engine, on a small upstream whose docker/Dockerfile is tiny."""

from __future__ import annotations

import io
import tarfile

import pytest

from testing.upstream import make_diff, make_upstream
from patchkit import manifest
from patchkit.commands.build_image import Request
from patchkit.commands.build_image import run as build_image
from patchkit.series.applier import apply_series
from patchkit.run import run_spec
from patchkit.errors import ImageError
from patchkit.timeouts import DEFAULT_TIMEOUT

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]

OPS_V1 = """\
__global__ void scale(float* x) { x[threadIdx.x] *= 2.0f; }
"""
OPS_PATCHED = """\
__global__ void scale(float* x) { x[threadIdx.x] *= 2.0f; }
// nvfp4_ds_mla: stage A
__global__ void pack_nvfp4(float* x) { x[threadIdx.x] = 0.0f; }
"""
# The shape of vLLM's own docker/Dockerfile: build arguments, a build stage, the vllm-openai
# target; only COPY and LABEL, so that the classic builder runs it without emulation.  (A layer
# first in each stage: the classic builder of Debian's engine gives a scratch stage whose first
# step makes no layer the host's platform.)
DOCKERFILE = """\
ARG torch_cuda_arch_list='7.0 8.0 9.0'
FROM scratch AS build
COPY csrc /workspace/csrc

FROM scratch AS vllm-openai
COPY csrc /workspace/csrc
ARG torch_cuda_arch_list='7.0 8.0 9.0'
ARG max_jobs=2
ARG nvcc_threads=8
LABEL fixture.arch-list="${torch_cuda_arch_list}" fixture.max-jobs="${max_jobs}" \\
      fixture.nvcc-threads="${nvcc_threads}"
"""
BUILDKIT_DOCKERFILE = DOCKERFILE.replace(
    "COPY csrc /workspace/csrc\n",
    "COPY csrc /workspace/csrc\nRUN --mount=type=cache,target=/root/.cache/ccache true\n", 1)

MANIFEST = """\
name: pk-src
vllm:
  repo: {repo}
  ref: v0.1.0
image:
  platform: linux/arm64
  tag: {tag}
patches:
  - id: nvfp4-pack-kernel
    summary: the nvfp4 pack kernel
    diff: patches/nvfp4-pack-kernel.diff
"""

def _summary(report):
    """``(exit code, --format json object)`` of a build-image run."""
    return (0 if report.ok else 1), report.to_dict()


def _project(root, dockerfile: str, tag: str):
    upstream = make_upstream(root / "upstream", {"v0.1.0": {
        "vllm/__init__.py": "__version__ = '0.1.0'\n",
        "csrc/ops.cu": OPS_V1,
        "docker/Dockerfile": dockerfile,
    }})
    proj = root / "proj"
    (proj / "patches").mkdir(parents=True)
    (proj / "patches" / "nvfp4-pack-kernel.diff").write_text(make_diff(OPS_V1, OPS_PATCHED,
                                                                       "csrc/ops.cu"))
    (proj / "patchset.yaml").write_text(MANIFEST.format(repo=upstream, tag=tag))
    m = manifest.load(proj / "patchset.yaml")
    workdir = proj / ".patchkit" / "vllm"
    report = apply_series(m, run=run_spec(m, cache=root / "cache"), workdir=workdir)
    assert report.ok, report.to_json()
    return m, workdir


def test_native_change_builds_vllm_from_the_patched_checkout(tmp_path, docker_client):
    tag = "pk-test/source-mode:v0.1.0"
    m, workdir = _project(tmp_path, DOCKERFILE, tag)
    code, summary = _summary(build_image(m, Request(workdir=workdir, apply=False, max_jobs=6,
                                                    nvcc_threads=3)))
    assert code == 0
    assert summary["mode"] == "source"
    assert summary["mode_reason"] == "csrc/ops.cu is outside the vllm package and feeds vLLM's build"
    assert summary["buildargs"] == {"torch_cuda_arch_list": "12.1a", "max_jobs": "6",
                                    "nvcc_threads": "3"}
    attrs = docker_client.api.inspect_image(tag)
    assert attrs["Id"] == summary["image_id"]
    assert attrs["Architecture"] == "arm64"
    labels = attrs["Config"]["Labels"]
    assert labels["fixture.arch-list"] == "12.1a"
    assert (labels["fixture.max-jobs"], labels["fixture.nvcc-threads"]) == ("6", "3")
    assert labels["io.patchkit.mode"] == "source"
    assert labels["io.patchkit.vllm.commit"] == summary["vllm"]["commit"]   # revision: the patchset's
    c = docker_client.api.create_container(tag, command=["/x"])
    try:
        stream, _ = docker_client.api.get_archive(c["Id"], "/workspace/csrc/ops.cu")
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            assert tar.extractfile(tar.next()).read().decode() == OPS_PATCHED
    finally:
        docker_client.api.remove_container(c["Id"], force=True)


def test_buildkit_dockerfile_needs_buildx(tmp_path, docker_client):
    from patchkit.engines.docker import Engine

    if Engine.connect(timeout=DEFAULT_TIMEOUT).buildx_available():
        pytest.skip("docker buildx is installed here; the refusal is for engines without it")
    tag = "pk-test/source-mode-bk:v0.1.0"
    m, workdir = _project(tmp_path, BUILDKIT_DOCKERFILE, tag)
    with pytest.raises(ImageError) as exc:
        build_image(m, Request(workdir=workdir, apply=False))
    text = str(exc.value)
    assert text.startswith("docker/Dockerfile needs BuildKit (line 4: RUN --mount=type=cache")
    assert "docker buildx" in text and "\n" not in text
