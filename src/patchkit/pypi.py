"""vLLM releases from PyPI, laid out as a cached local git repository.

Each release's wheel holds its Python sources.  ``ensure_release`` downloads the wheel once,
commits its files (no compiled objects) as an orphan commit tagged ``vX.Y.Z`` in
``<cache>/pypi/vllm.git``, and from then on that repository serves like any git upstream.
Orphan commits with a fixed identity make the commit id depend on the release alone, so every
cache on every machine agrees.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

from filelock import FileLock
from packaging.version import InvalidVersion, Version

from patchkit import git as g
from patchkit.errors import CommandError, SourceError, UsageError
from patchkit.util import cache_subdir, discard, run

PACKAGE = "vllm"
WORD = "pypi"


def release_of(ref: str) -> str:
    """``v0.27.1`` or ``0.27.1`` -> ``0.27.1``; anything else is a usage error."""
    text = ref.removeprefix("v")
    try:
        Version(text)
    except InvalidVersion:
        raise UsageError(f"--vllm-repo pypi takes a release tag such as v0.27.1, not {ref!r}") from None
    if not re.fullmatch(r"[0-9][0-9A-Za-z.+\-]*", text):
        raise UsageError(f"--vllm-repo pypi takes a release tag such as v0.27.1, not {ref!r}")
    return text


def repo_path(cache: Path) -> Path:
    return cache / WORD / f"{PACKAGE}.git"


def ensure_release(cache: Path, ref: str, log=lambda msg: None) -> tuple[Path, str]:
    """The cached repo and the tag holding release ``ref``, building it if needed."""
    version = release_of(ref)
    tag = f"v{version}"
    repo = repo_path(cache)
    base = cache_subdir(cache, WORD)
    with FileLock(str(base / "vllm.lock")):
        if os.path.lexists(repo) and not g.is_repository(repo):
            # The cache is disposable: a repository broken by outside hands is made again.
            log(f"the cached repository {repo} is broken; making it again")
            discard(repo)
        if not (repo / "HEAD").exists():
            tmp = Path(tempfile.mkdtemp(prefix="vllm.git.", dir=base))
            g.git("init", "--quiet", "--bare", str(tmp))
            tmp.rename(repo)
        if g.resolve_commit(repo, tag):
            return repo, tag
        wheel = _wheel(cache, version, log)
        log(f"laying out vLLM {version} from {wheel.name}")
        try:
            _commit_wheel(repo, wheel, version, tag)
        except zipfile.BadZipFile:
            # Only outside hands truncate a cached wheel (downloads land by rename): fetch it anew.
            log(f"the cached {wheel.name} is not a valid wheel; downloading it again")
            wheel.unlink(missing_ok=True)
            wheel = _wheel(cache, version, log)
            try:
                _commit_wheel(repo, wheel, version, tag)
            except zipfile.BadZipFile:
                wheel.unlink(missing_ok=True)
                raise SourceError(f"PyPI gave a wheel for vLLM {version} that is not a valid "
                                  "zip file") from None
        except CommandError:
            if not g.is_repository(repo):
                raise SourceError(f"the cached repository {repo} went away while vLLM {version} "
                                  "was laid out into it (was the cache deleted?); run again") from None
            raise
    return repo, tag


def _wheel(cache: Path, version: str, log) -> Path:
    wheels = cache_subdir(cache, WORD, "wheels")
    found = sorted(wheels.glob(f"{PACKAGE}-{version}-*.whl"))
    if found:
        return found[0]
    log(f"downloading the vLLM {version} wheel from PyPI")
    tmp = Path(tempfile.mkdtemp(prefix="download.", dir=wheels))
    try:
        try:
            run([sys.executable, "-m", "pip", "download", f"{PACKAGE}=={version}", "--no-deps",
                 "--only-binary", ":all:", "--disable-pip-version-check", "-q", "-d", str(tmp)])
        except CommandError as exc:
            if "No matching distribution" in exc.output or "Could not find a version" in exc.output:
                raise SourceError(f"vLLM release {version} is not on PyPI") from None
            last = [line for line in exc.output.splitlines() if line.strip()][-1:] or ["?"]
            raise SourceError(f"could not download vLLM {version} from PyPI: {last[0].strip()}") from None
        got = sorted(tmp.glob("*.whl"))
        if not got:
            raise SourceError(f"PyPI gave no wheel for vLLM {version}")
        dest = wheels / got[0].name
        got[0].replace(dest)  # atomic: a half-downloaded wheel never lands in the cache
        return dest
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _is_source(name: str, head: bytes) -> bool:
    if name.endswith("/") or name.endswith(".so") or ".so." in name.rsplit("/", 1)[-1]:
        return False
    return not head.startswith(b"\x7fELF")


def _commit_wheel(repo: Path, wheel: Path, version: str, tag: str) -> None:
    work = Path(tempfile.mkdtemp(prefix=f"layout-{version}.", dir=repo.parent))
    try:
        with zipfile.ZipFile(wheel) as zf:
            for info in zf.infolist():
                name = info.filename
                if not name.startswith(f"{PACKAGE}/") or info.is_dir():
                    continue
                with zf.open(info) as fh:
                    data = fh.read()
                if not _is_source(name, data[:4]):
                    continue
                dest = work / name
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(data)
        index = work.parent / f"{work.name}.index"
        env = dict(g.IDENTITY, GIT_INDEX_FILE=str(index), GIT_DIR=str(repo), GIT_WORK_TREE=str(work))
        g.git("add", "--all", "--force", ".", cwd=work, env=env)
        tree = g.out("write-tree", cwd=work, env=env)
        commit = g.out("commit-tree", tree, "-m", f"vLLM {version}\n\nPython sources of {wheel.name}",
                       cwd=work, env=env)
        g.git("update-ref", f"refs/tags/{tag}", commit, cwd=repo)
        index.unlink(missing_ok=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def release_versions(pre: bool = False) -> list[str]:
    """Every vLLM release version on PyPI, oldest first; pre-releases too with ``pre``."""
    try:
        proc = run([sys.executable, "-m", "pip", "index", "versions", PACKAGE,
                    "--disable-pip-version-check", *(["--pre"] if pre else [])])
    except CommandError as exc:
        raise SourceError(f"could not list vLLM releases on PyPI: {exc.output.strip()[:200]}") from None
    for line in proc.stdout.splitlines():
        if line.strip().startswith("Available versions:"):
            items = [v.strip() for v in line.split(":", 1)[1].split(",") if v.strip()]
            return sorted(items, key=Version)
    raise SourceError("could not read vLLM releases from `pip index versions vllm`")
