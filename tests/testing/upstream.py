"""Small upstream git repositories built on the fly: no network, one commit and tag a release."""

from __future__ import annotations

import difflib
import os
import subprocess
import textwrap
from collections.abc import Mapping
from pathlib import Path

ENV = {"GIT_AUTHOR_NAME": "upstream", "GIT_AUTHOR_EMAIL": "up@example.invalid",
       "GIT_COMMITTER_NAME": "upstream", "GIT_COMMITTER_EMAIL": "up@example.invalid",
       "GIT_AUTHOR_DATE": "2020-01-01T00:00:00+0000", "GIT_COMMITTER_DATE": "2020-01-01T00:00:00+0000"}


def sh(*args: str, cwd: Path | None = None) -> str:
    """Run a command (git, mostly) with the fixture identity and dates; its stripped stdout."""
    env = dict(os.environ, **ENV)
    return subprocess.run(args, cwd=cwd, env=env, check=True, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE).stdout.strip()


def dedent(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def write_files(root: Path, files: Mapping[str, str | None]) -> None:
    """Write each file under ``root`` (parents made); None deletes it."""
    for rel, text in files.items():
        path = root / rel
        if text is None:
            path.unlink()
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def commit(root: Path, message: str, files: Mapping[str, str | None] | None = None) -> str:
    """Write ``files`` (None deletes), commit everything in ``root``; the new commit's sha."""
    write_files(root, files or {})
    sh("git", "add", "-A", cwd=root)
    sh("git", "commit", "-q", "--allow-empty", "-m", message, cwd=root)
    return sh("git", "rev-parse", "HEAD", cwd=root)


def make_upstream(root: Path, releases: Mapping[str, Mapping[str, str | None]]) -> Path:
    """A git repo at ``root``: for each tag in order, write the files (None deletes), commit, tag.

    Files carry over from one release to the next unless overwritten or deleted.
    """
    root.mkdir(parents=True, exist_ok=True)
    sh("git", "init", "-q", "-b", "main", str(root))
    for tag, files in releases.items():
        commit(root, f"release {tag}",
               {rel: None if text is None else dedent(text) for rel, text in files.items()})
        sh("git", "tag", tag, cwd=root)
    return root


def unified(path: str, before: str | None, after: str | None) -> str:
    """A git-style unified diff turning ``before`` into ``after`` at ``path``, texts as given
    (None: the file is new, or removed)."""
    a = before.splitlines(keepends=True) if before is not None else []
    b = after.splitlines(keepends=True) if after is not None else []
    head = f"diff --git a/{path} b/{path}\n"
    if before is None:
        head += "new file mode 100644\n"
    if after is None:
        head += "deleted file mode 100644\n"
    old = f"a/{path}" if before is not None else "/dev/null"
    new = f"b/{path}" if after is not None else "/dev/null"
    return head + "".join(difflib.unified_diff(a, b, old, new))


def make_diff(before: str, after: str, path: str) -> str:
    """A git-style unified diff turning ``before`` into ``after`` (both dedented) at ``path``."""
    return unified(path, dedent(before), dedent(after))
