"""Writing diff files: the counterpart of ``diffapply``.

``rebase`` rewrites diffs that applied at an offset and turns a resolved conflict into a diff;
``export`` turns commits into diffs.  Every diff patchkit writes comes from :func:`diff_text`,
which pins every git option that changes the output (prefixes, context, algorithm, full blob
ids), so the same change gives the same bytes on every machine and every user's git config.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Mapping
from pathlib import Path

from patchkit import git as g

# Every option that a user's config could otherwise change.
DIFF_ARGS = ("--no-color", "--no-ext-diff", "--no-textconv", "--no-renames", "--no-relative",
             "--full-index", "--binary", "--unified=3", "--diff-algorithm=myers",
             "--indent-heuristic", "--src-prefix=a/", "--dst-prefix=b/")


def diff_text(repo: Path, *revs: str, cached: bool = False) -> str:
    """``git diff`` of ``revs`` (or of the index against ``revs[0]`` with ``cached``), stable."""
    args = ["-c", "diff.suppressBlankEmpty=false", "-c", "diff.mnemonicPrefix=false",
            "-c", "diff.noprefix=false", "diff", *DIFF_ARGS]
    if cached:
        args.append("--cached")
    return g.git(*args, *revs, "--", cwd=repo).stdout


def preamble(text: str) -> str:
    """Whatever precedes the first file header: a description ``git apply`` ignores, kept
    when a diff is rewritten."""
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.startswith("diff --git ") or (
                line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ")):
            return "".join(lines[:i])
    return ""


_OFFSET = re.compile(r"^hunk (\d+) of (.+) at line \d+ \(offset ([+-]\d+)\)$")
_HEADER = re.compile(r"^@@ -(\d+)(,\d+)? \+(\d+)(,\d+)? @@")


def parse_offsets(offsets: list[str]) -> dict[tuple[str, int], int]:
    """``PatchResult.offsets`` as ``{(path, hunk number): offset}``."""
    out: dict[tuple[str, int], int] = {}
    for text in offsets:
        m = _OFFSET.match(text)
        if m:
            out[(m.group(2), int(m.group(1)))] = int(m.group(3))
    return out


def _strip(path: str) -> str:
    path = path.split("\t", 1)[0].rstrip("\n")
    return path[2:] if path[:2] in ("a/", "b/") else path


def shift_hunks(text: str, offsets: Mapping[tuple[str, int], int]) -> str:
    """``text`` with each hunk header moved by its offset; every other byte is kept, so a
    refreshed diff differs from the old one only in the ``@@`` lines that had to move."""
    out: list[str] = []
    path, old_path, n = "", "", 0
    left_old = left_new = 0
    for line in text.splitlines(keepends=True):
        if left_old > 0 or left_new > 0:  # inside a hunk: count, never reinterpret
            tag = line[:1]
            if tag in (" ", "\n", "\r"):
                left_old, left_new = left_old - 1, left_new - 1
            elif tag == "-":
                left_old -= 1
            elif tag == "+":
                left_new -= 1
            out.append(line)
            continue
        if line.startswith("--- "):
            old_path, n = _strip(line[4:]), 0
        elif line.startswith("+++ "):
            new = _strip(line[4:])
            path = old_path if new == "/dev/null" else new
        m = _HEADER.match(line)
        if m:
            n += 1
            shift = offsets.get((path, n), 0)
            a, b, c, d = m.group(1), m.group(2), m.group(3), m.group(4)
            left_old = int(b[1:]) if b else 1
            left_new = int(d[1:]) if d else 1
            if shift and int(a) > 0:
                line = (f"@@ -{int(a) + shift}{b or ''} +{int(c) + shift}{d or ''} @@"
                        + line[m.end():])
        out.append(line)
    return "".join(out)


def applies_exactly(repo: Path, text: str, parent: str, expect: str) -> bool:
    """Does ``text`` turn commit ``parent`` into commit ``expect``'s tree with no offset and no
    fuzz?  Checked in a throwaway index; the checkout is not touched."""
    with tempfile.TemporaryDirectory(prefix="patchkit-check-") as tmp:
        index = Path(tmp) / "index"
        diff = Path(tmp) / "p.diff"
        diff.write_text(text, encoding="utf-8", errors="surrogateescape")
        env = {"GIT_INDEX_FILE": str(index)}
        g.git("read-tree", parent, cwd=repo, env=env)
        proc = g.git("apply", "--cached", "--verbose", "--whitespace=nowarn", str(diff),
                     cwd=repo, env=env, check=False)
        if proc.returncode != 0 or "(offset " in proc.stderr:
            return False
        return (g.out("write-tree", cwd=repo, env=env)
                == g.out("rev-parse", f"{expect}^{{tree}}", cwd=repo))


_MARKER = re.compile(r"^\+(<{7}|>{7})( |$)|^\+={7}$")


def conflict_markers(text: str) -> list[str]:
    """``path:line`` of each conflict marker a diff adds."""
    found: list[str] = []
    path, line_no, left_new = "", 0, 0
    for line in text.splitlines():
        if left_new <= 0 and line.startswith("+++ "):
            path = _strip(line[4:])
            continue
        m = _HEADER.match(line)
        if m and left_new <= 0:
            line_no = int(m.group(3))
            left_new = int(m.group(4)[1:]) if m.group(4) else 1
            continue
        if left_new > 0:
            if line.startswith("+"):
                if _MARKER.match(line):
                    found.append(f"{path}:{line_no}")
                line_no, left_new = line_no + 1, left_new - 1
            elif line.startswith(" ") or line == "":
                line_no, left_new = line_no + 1, left_new - 1
    return found
