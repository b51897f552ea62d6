"""The vLLM a base image holds, read without running it: its version and its package files.

``--vllm-ref base`` pins from the installed version, ``--vllm-repo image`` takes its pristine
tree from the package files; both are served by :class:`BaseVllm`, the
:class:`patchkit.source.Base` of an image on an engine.  :func:`for_run` decides whether a run
needs one, and says in one line why it cannot have one.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from patchkit import git as g
from patchkit import source
from patchkit.errors import UsageError
from patchkit.image import package
from patchkit.image.docker import Engine, Log
from patchkit.image.layer import BaseImage
from patchkit.imageref import Platform, check_reference
from patchkit.manifest.runspec import RunSpec

SYMLINK, EXECUTABLE, REGULAR = 0o120000, 0o100755, 0o100644


@dataclass
class BaseVllm:
    """A base image on an engine, and the vllm package found in it."""

    engine: Engine
    image: BaseImage
    package: package.Package
    version: str | None

    @property
    def name(self) -> str:
        return self.image.name

    @property
    def key(self) -> str:
        return self.image.digest or self.image.image_id

    @property
    def platform(self) -> str:
        return str(self.image.platform)

    @property
    def package_dir(self) -> str:
        return self.package.dir

    def package_files(self) -> Iterator[g.TreeFile]:
        """Every file under the package folder as ``vllm/...``, streamed from one archive."""
        with self.engine.files(self.image.image_id, self.image.name) as files:
            top = None
            for info, data in files.walk(self.package.dir):
                head, _, rest = info.name.partition("/")
                top = top or head
                if head != top or not rest:
                    continue  # the folder itself
                rel = f"vllm/{rest.rstrip('/')}"
                if info.issym():
                    yield g.TreeFile(rel, SYMLINK, info.linkname.encode("utf-8", "surrogateescape"))
                elif info.islnk():
                    _, _, linked = info.linkname.partition("/")
                    yield g.TreeFile(rel, REGULAR, same_as=f"vllm/{linked}")
                elif info.isreg():
                    yield g.TreeFile(rel, EXECUTABLE if info.mode & 0o111 else REGULAR, data)


def env_of(config: dict) -> dict[str, str]:
    return dict(item.partition("=")[::2] for item in config.get("Env") or ())


def open_base(engine: Engine, ref: str, platform: Platform, log: Log = lambda m: None) -> BaseVllm:
    """The base ``ref`` (pulled for ``platform`` when missing) and the vLLM installed in it."""
    image = engine.resolve_base(ref, platform, log)
    with engine.files(image.image_id, image.name) as files:
        pkg = package.find_package(files, env_of(image.config))
        version = package.installed_version(files, pkg, None)
    log(f"base {ref} holds vLLM {version or '(version unknown)'} in {pkg.dir}")
    return BaseVllm(engine, image, pkg, version)


def needed(run: RunSpec, refs: Sequence[str] | None = None) -> str | None:
    """Why ``run`` (on ``refs``, default its ref) reads a base image, or None."""
    if any(source.kind_of(s).reads_base for s in run.sources):
        return "the vLLM source 'image' is the vllm package of a base image"
    if source.BASE_REF in ((run.ref,) if refs is None else refs):
        return f"--vllm-ref {source.BASE_REF} reads the pin from a base image"
    return None


def for_run(run: RunSpec, *, refs: Sequence[str] | None = None, engine: Engine | None = None,
            log: Log = lambda m: None) -> BaseVllm | None:
    """The base ``run`` reads vLLM from, when its sources or ``refs`` (default: its ref) need
    one; None when they do not."""
    why = needed(run, refs)
    if why is None:
        return None
    if not run.base:
        raise UsageError(f"{why}: give --base IMAGE or set image.base in patchset.yaml")
    check_reference("--base", run.base)
    return open_base(engine or Engine.connect(), run.base, Platform.parse(run.platform), log)
