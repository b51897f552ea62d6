"""The source image through an engine: vLLM's ``docker/Dockerfile`` on the patched checkout,
with GB10's build arguments; through ``docker buildx`` when the Dockerfile needs BuildKit,
else through the engine's classic builder."""

from __future__ import annotations

import re

from patchkit.errors import ImageError
from patchkit.image.build import (SOURCE_MODE, Built, ModeChoice, packages_of, patchset_digest,
                                  source_date)
from patchkit.image.builders.protocol import EnginePath, Job
from patchkit.engines.docker import Engine
from patchkit.image.labels import run_labels
from patchkit.imageref import Platform

GB10_ARCH = "12.1a"
SOURCE_TARGET = "vllm-openai"
DOCKERFILE = "docker/Dockerfile"
# Dockerfile syntax the classic builder does not know.
BUILDKIT_ONLY = re.compile(r"^\s*(?:#\s*syntax\s*=|(?:RUN|COPY|ADD)\b[^\n]*?(?:--mount|--link|"
                           r"--chmod|--parents|--exclude|--checksum|--security|--network)\b|"
                           r"(?:RUN|COPY)\b[^\n]*<<-?\s*['\"]?\w+)", re.I | re.M)


def buildkit_need(dockerfile_text: str) -> str | None:
    """The first line that needs BuildKit, or None when the classic builder can run it."""
    m = BUILDKIT_ONLY.search(dockerfile_text)
    if not m:
        return None
    line_no = dockerfile_text.count("\n", 0, m.start()) + 1
    line = dockerfile_text.splitlines()[line_no - 1].strip()
    return f"line {line_no}: {line[:80]}"


class EngineSource(EnginePath):
    name = "engine-source"
    mode = SOURCE_MODE

    def unfit(self, choice: ModeChoice) -> str | None:
        why = super().unfit(choice)
        if why is None and choice.packages:
            # vLLM's Dockerfile builds vLLM alone: it has no step that lays other packages
            return (f"source mode builds vLLM's Dockerfile, which does not lay the changed "
                    f"files of {', '.join(choice.packages)}: ship them in an overlay image "
                    "(change no native vLLM file), or build with --package vllm")
        return why

    def build(self, job: Job) -> Built:
        engine = job.engine
        assert engine is not None, "a path through an engine is given one"
        tree, tag, platform, log = job.tree, job.tag, job.platform, job.log
        dockerfile = tree.root / DOCKERFILE
        if not dockerfile.is_file():
            raise ImageError(f"source mode needs {DOCKERFILE} in the checkout, and {tree.root} "
                             "has none")
        buildargs = {"torch_cuda_arch_list": GB10_ARCH}
        if job.max_jobs is not None:
            buildargs["max_jobs"] = str(job.max_jobs)
        if job.nvcc_threads is not None:
            buildargs["nvcc_threads"] = str(job.nvcc_threads)
        labels = run_labels(job.manifest, tree, mode=SOURCE_MODE, created=source_date(tree),
                            digest=patchset_digest(job.manifest),
                            packages=packages_of(job.manifest, tree), project=job.project)
        need = buildkit_need(dockerfile.read_text(errors="replace"))
        options = dict(dockerfile=DOCKERFILE, target=SOURCE_TARGET, buildargs=buildargs,
                       labels=labels, tag=tag, platform=platform, log=log)
        if need:
            if not engine.buildx_available():
                raise ImageError(f"{DOCKERFILE} needs BuildKit ({need}) and 'docker buildx' is "
                                 "not installed here: install the buildx plugin, or run "
                                 "build-image on the DGX Spark")
            log(f"{DOCKERFILE} needs BuildKit ({need}): building with docker buildx")
            engine.buildx_build(tree.root, push=job.push, **options)
        else:
            log(f"building {DOCKERFILE} (target {SOURCE_TARGET}) with the engine's builder")
            engine.build(tree.root, **options)
        pushed_by_build = bool(need) and job.push
        image_id = None if pushed_by_build else _check_platform(engine, tag, platform)
        log(f"tagged {tag}")
        return Built(image_id, buildargs=buildargs, pushed_by_build=pushed_by_build)


def _check_platform(engine: Engine, tag: str, platform: Platform) -> str | None:
    """The id of the image built, once it is known to be of ``platform``."""
    built = engine.inspect(tag)
    if built is None:
        return None
    if not built.platform.matches(platform):
        raise ImageError(f"the build gave a {built.platform} image, not {platform}")
    return built.id


BUILDER = EngineSource()
