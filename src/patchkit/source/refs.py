"""What a vLLM ref or source may be: lexical checks, so the manifest loader can say them
before anything is fetched."""

from __future__ import annotations

import re

from patchkit.errors import clipped

# The ref that means "what the base image holds": ``--vllm-ref base`` / ``vllm.ref: base``.
BASE_REF = "base"
# The source that is what the base image holds: ``--vllm-repo image`` / ``repo: image``.
IMAGE_SOURCE = "image"

# What git's ref names may not hold (git check-ref-format), and what makes a revision expression.
_REF_SPACE = re.compile(r"[\x00-\x20\x7f]")
_REF_EXPRESSION = re.compile(r"[~^:?*\[\\]|\.\.|@\{")
_COMMIT_ID = re.compile(r"[0-9a-f]{7,40}\Z")
REF_MAX = 1024      # characters in a ref (git keeps each of its names in a file name)
SOURCE_MAX = 4096   # characters in a repository's URL or path (Linux's PATH_MAX)


def is_commit_id(ref: str) -> bool:
    """A ref that can only name a commit: hex digits, abbreviated or whole."""
    return _COMMIT_ID.match(ref.lower()) is not None


def ref_problem(ref: str) -> str | None:
    """Why ``ref`` cannot name a tag, branch or commit, or None.

    Lexical only, so that the manifest loader can say it before anything is fetched.  A revision
    expression (``HEAD~1``, ``v1^``, ``main@{1}``) is refused: it names no fixed commit, and a
    mirror never refetches what it does not know to be a branch.
    """
    if not ref:
        return "the ref is empty"
    if len(ref) > REF_MAX:
        return f"{clipped(ref)!r} is {len(ref)} characters long; a ref has at most {REF_MAX}"
    if ref.startswith("-"):
        return f"{ref!r} starts with '-'"
    if _REF_SPACE.search(ref):
        return f"{ref!r} holds whitespace or a control character"
    if _REF_EXPRESSION.search(ref) or ref == "@":
        return f"{ref!r} is a revision expression; give a tag, branch or commit"
    if ref == "HEAD":
        return "'HEAD' is whatever the mirror's default branch was when it was made; name the branch"
    if (ref.startswith("/") or ref.endswith(("/", ".", ".lock")) or "//" in ref
            or any(part.startswith(".") for part in ref.split("/"))):
        return f"{ref!r} is not a valid git ref name"
    return None


def source_problem(source: str) -> str | None:
    """Why ``source`` cannot be a vLLM source, or None."""
    if not source.strip():
        return "the repository is empty"
    if len(source) > SOURCE_MAX:
        return (f"{clipped(source)!r} is {len(source)} characters long; a repository's URL or "
                f"path has at most {SOURCE_MAX}")
    if source.startswith("-"):
        return f"{source!r} starts with '-'"
    return None
