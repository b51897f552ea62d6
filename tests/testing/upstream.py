"""Small upstream git repositories built on the fly: no network, one commit and tag a release."""

from __future__ import annotations

import subprocess
import textwrap
from collections.abc import Mapping
from pathlib import Path

ENV = {"GIT_AUTHOR_NAME": "upstream", "GIT_AUTHOR_EMAIL": "up@example.invalid",
       "GIT_COMMITTER_NAME": "upstream", "GIT_COMMITTER_EMAIL": "up@example.invalid",
       "GIT_AUTHOR_DATE": "2020-01-01T00:00:00+0000", "GIT_COMMITTER_DATE": "2020-01-01T00:00:00+0000"}


def sh(*args: str, cwd: Path | None = None) -> str:
    import os

    env = dict(os.environ, **ENV)
    return subprocess.run(args, cwd=cwd, env=env, check=True, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE).stdout.strip()


def dedent(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def make_upstream(root: Path, releases: Mapping[str, Mapping[str, str | None]]) -> Path:
    """A git repo at ``root``: for each tag in order, write the files (None deletes), commit, tag.

    Files carry over from one release to the next unless overwritten or deleted.
    """
    root.mkdir(parents=True, exist_ok=True)
    sh("git", "init", "-q", "-b", "main", str(root))
    for tag, files in releases.items():
        for rel, text in files.items():
            path = root / rel
            if text is None:
                path.unlink()
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(dedent(text))
        sh("git", "add", "-A", cwd=root)
        sh("git", "commit", "-q", "--allow-empty", "-m", f"release {tag}", cwd=root)
        sh("git", "tag", tag, cwd=root)
    return root


def make_diff(before: str, after: str, path: str) -> str:
    """A git-style unified diff turning ``before`` into ``after`` at ``path``."""
    import difflib

    a = dedent(before).splitlines(keepends=True)
    b = dedent(after).splitlines(keepends=True)
    body = "".join(difflib.unified_diff(a, b, f"a/{path}", f"b/{path}"))
    return f"diff --git a/{path} b/{path}\n" + body
