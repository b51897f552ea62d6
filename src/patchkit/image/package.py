"""Finding the installed vllm package inside an image, by looking at its files."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Protocol

from patchkit.errors import ImageError

PYC_SUFFIXES = ("", ".opt-1", ".opt-2")
PYTHON_MINORS = tuple(range(14, 7, -1))
# Prefixes searched for an installed vllm package when the image's own env says nothing better.
COMMON_PREFIXES = ("/usr/local", "/usr", "/opt/venv", "/opt/conda", "/venv", "/root/.local")


class Files(Protocol):
    """Read access to an image's file system (through an engine, or a registry's layers)."""

    image: str

    def exists(self, path: str) -> bool: ...

    def read(self, path: str) -> bytes | None: ...


@dataclass(frozen=True)
class Package:
    """Where an image's vllm package lives, and which Python owns it."""

    site: str                      # the folder holding vllm/, absolute in the image
    python: str | None             # "3.12" when known from the path
    others: tuple[str, ...] = ()   # further installs that were found and not used

    @property
    def dir(self) -> str:
        return self.site.rstrip("/") + "/vllm"

    def path_of(self, rel: str) -> str:
        """``vllm/config/x.py`` (checkout-relative) -> its absolute path in the image."""
        return self.site.rstrip("/") + "/" + rel


def candidate_sites(env: dict[str, str]) -> tuple[list[str], list[str]]:
    """Where an installed ``vllm`` may be, most likely first, from the image's own env:
    folders that may hold it directly (PYTHONPATH), and prefixes with ``lib/python3.N``."""
    sites = [e.rstrip("/") for e in (env.get("PYTHONPATH") or "").split(":") if e.startswith("/")]
    prefixes: list[str] = []
    for key in ("VIRTUAL_ENV", "CONDA_PREFIX", "UV_PROJECT_ENVIRONMENT"):
        if env.get(key, "").startswith("/"):
            prefixes.append(env[key].rstrip("/"))
    for entry in (env.get("PATH") or "").split(":"):
        if entry.endswith("/bin") and entry.startswith("/"):
            prefixes.append(entry[: -len("/bin")])
    prefixes.extend(COMMON_PREFIXES)
    ordered: list[str] = []
    for p in prefixes:
        if p and p not in ordered:
            ordered.append(p)
    return sites, ordered


def find_package(files: Files, env: dict[str, str]) -> Package:
    """Where the image's ``vllm`` package is installed, found by looking, not assumed."""
    found: list[Package] = []
    sites, prefixes = candidate_sites(env)
    for site in sites:
        if files.exists(f"{site}/vllm/__init__.py"):
            found.append(Package(site, _python_of(site)))
    for prefix in prefixes:
        for minor in PYTHON_MINORS:
            lib = f"{prefix}/lib/python3.{minor}"
            if not files.exists(lib):
                continue
            for sub in ("dist-packages", "site-packages"):
                site = f"{lib}/{sub}"
                if files.exists(f"{site}/vllm/__init__.py"):
                    found.append(Package(site, f"3.{minor}"))
        debian = f"{prefix}/lib/python3/dist-packages"
        if files.exists(f"{debian}/vllm/__init__.py"):
            found.append(Package(debian, None))
    unique: list[Package] = []
    for p in found:
        if all(p.site != q.site for q in unique):
            unique.append(p)
    if not unique:
        raise ImageError(f"{files.image} has no installed vllm package (looked under "
                         f"{', '.join((sites + prefixes)[:6])} ...)")
    first = unique[0]
    return Package(first.site, first.python, tuple(p.site for p in unique[1:]))


def _python_of(site: str) -> str | None:
    m = re.search(r"/python(3\.\d+)/", site + "/")
    return m.group(1) if m else None


def installed_version(files: Files, pkg: Package, expected: str | None) -> str | None:
    """The vLLM version installed in the image: from ``vllm/_version.py``, confirmed by its
    ``dist-info``; None when neither says."""
    text = files.read(f"{pkg.dir}/_version.py")
    version = None
    if text is not None:
        m = re.search(r"""^(?:__version__|version)\s*(?::\s*\w+\s*)?=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""",
                      text.decode("utf-8", "replace"), re.M)
        if m:
            version = m.group(1)
    for guess in [v for v in (version, expected) if v]:
        meta = files.read(f"{pkg.site}/vllm-{guess}.dist-info/METADATA")
        if meta is not None:
            m = re.search(r"^Version:\s*(\S+)", meta.decode("utf-8", "replace"), re.M)
            if m:
                return m.group(1)
    return version


def stale_caches(files: Files, pkg: Package, module_path: str) -> list[str]:
    """The byte-code caches of ``module_path`` (absolute, ``.py``) present in the image."""
    p = PurePosixPath(module_path)
    cache_dir = str(p.parent / "__pycache__")
    if not files.exists(cache_dir):
        return []
    minors = [pkg.python.split(".")[1]] if pkg.python else [str(m) for m in PYTHON_MINORS]
    found = []
    for minor in minors:
        for suffix in PYC_SUFFIXES:
            cand = f"{cache_dir}/{p.stem}.cpython-3{minor}{suffix}.pyc"
            if files.exists(cand):
                found.append(cand)
    return found
