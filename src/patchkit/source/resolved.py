"""A ref pinned to a commit, the release a commit is, and the cached repository holding it."""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from patchkit import git
from patchkit import versions
from patchkit.files import discard

Log = Callable[[str], None]


@dataclass(frozen=True)
class Resolved:
    """A ref pinned to a commit in a local repository we may borrow objects from."""

    source: str      # what the user named (URL, path, "pypi" or "image")
    repo: Path       # the local mirror
    ref: str
    commit: str
    version: str | None


def bare_repository(repo: Path, log: Log) -> None:
    """Makes sure a bare repository is at ``repo`` (the caller holds its lock): made empty when
    missing, made again when outside hands broke it (the cache is disposable)."""
    if os.path.lexists(repo) and not git.is_repository(repo):
        log(f"the cached repository {repo} is broken; making it again")
        discard(repo)
    if not (repo / "HEAD").exists():
        tmp = Path(tempfile.mkdtemp(prefix=f"{repo.name}.", dir=repo.parent))
        git.init_bare(tmp)
        tmp.rename(repo)


def version_of(repo: Path, commit: str, top: str = "vllm") -> str | None:
    """The release at ``commit``: its release tag, else ``<top>/_version.py`` (``top`` the
    package's import folder), else the nearest release tag below it with the commit as a
    local version segment."""
    for tag in git.tags_at(repo, commit):
        v = versions.tag_version(tag)
        if v:
            return v
    text = git.show(repo, f"{commit}:{top}/_version.py") if top else None
    if text:
        m = re.search(r"""__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", text)
        if m and versions.tag_version(m.group(1)):
            return m.group(1)
    near = git.nearest_tag(repo, commit)
    v = versions.tag_version(near) if near else None
    return f"{v}+g{commit[:9]}" if v else None
