"""vLLM releases from PyPI, laid out as a cached local git repository.

Each release's wheel holds its Python sources.  ``ensure_release`` downloads the wheel once,
commits its files (no compiled objects) as an orphan commit tagged ``vX.Y.Z`` in
``<cache>/pypi/vllm.git``, and from then on that repository serves like any git upstream.
Orphan commits with a fixed identity make the commit id depend on the release alone, so every
cache on every machine agrees.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

from filelock import FileLock
from patchkit import git as g
from patchkit import versions
from patchkit.errors import CommandError, SourceError
from patchkit.source.resolved import Log, Resolved, version_of
from patchkit.cache import cache_subdir
from patchkit.files import discard
from patchkit.process import run

PACKAGE = "vllm"
WORD = "pypi"
NAME = WORD
HOLDS_COMMITS = False  # releases only: their commits are patchkit's, not upstream's
READS_BASE = False
# One orphan commit per release: there is no history between two releases to search.
HISTORY = False


def resolve(source: str, ref: str, cache: Path, log: Log, *, base=None) -> Resolved:
    repo, tag = ensure_release(cache, ref, log)
    commit = g.resolve_commit(repo, tag)
    assert commit
    return Resolved(source, repo, ref, commit, version_of(repo, commit))


def tags(source: str, cache: Path, log: Log) -> list[str]:
    return [f"v{v}" for v in release_versions(pre=True)]


def repo_path(cache: Path) -> Path:
    return cache / WORD / f"{PACKAGE}.git"


def ensure_release(cache: Path, ref: str, log=lambda msg: None) -> tuple[Path, str]:
    """The cached repo and the tag holding release ``ref``, building it if needed."""
    version = versions.pypi_release(ref)
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
            g.init_bare(tmp)
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
        commit = g.commit_directory(repo, work, f"vLLM {version}\n\nPython sources of {wheel.name}")
        g.update_ref(repo, f"refs/tags/{tag}", commit)
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
            return sorted(items, key=versions.sort_key)
    raise SourceError("could not read vLLM releases from `pip index versions vllm`")
