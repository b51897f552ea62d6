"""The text of a diff, read and edited byte for byte (unidiff parses it).

What a diff names (its files, its binary changes), its description (the preamble before the
first file, a ``format-patch`` subject), its files cut apart and kept or dropped (``add-pr``,
``import``), its hunk headers moved after an offset (``rebase``), and the conflict markers a
resolution must not add.  Nothing here runs git: every diff patchkit writes comes from
:func:`patchkit.git.diff`, which pins every output option.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from pathlib import Path

from unidiff import PatchSet
from unidiff.errors import UnidiffParseError

from patchkit import files
from patchkit.report import Hunk


class DiffParseError(Exception):
    pass


def strip_prefix(path: str | None) -> str | None:
    if path is None or path == "/dev/null":
        return None
    return path[2:] if path[:2] in ("a/", "b/") else path


def parse(text: str) -> PatchSet:
    """Parse a unified diff; raise DiffParseError for anything that is not one.  A text is
    parsed once per process (a matrix's workers inherit what the command parsed before them):
    the PatchSet is shared, for reading only."""
    return _parsed(text)


@functools.lru_cache(maxsize=64)
def _parsed(text: str) -> PatchSet:
    try:
        patch = PatchSet(text)
    except UnidiffParseError as exc:
        raise DiffParseError(f"not a unified diff: {exc}") from None
    if not len(patch):
        raise DiffParseError("holds no file changes")
    return patch


def touched(patch: PatchSet) -> list[str]:
    """Every checkout-relative path the diff reads or writes, in order."""
    out: list[str] = []
    for pf in patch:
        for p in (strip_prefix(pf.source_file), strip_prefix(pf.target_file)):
            if p and p not in out:
                out.append(p)
    return out


# `git diff` without --binary names a binary change without carrying it
_BINARY_WITHOUT_DATA = re.compile(r"^Binary files (.+) and (.+) differ$", re.MULTILINE)


def binary_without_data(text: str) -> str | None:
    """The line of a diff that names a binary change it does not carry, or None."""
    m = _BINARY_WITHOUT_DATA.search(text)
    return m.group(0) if m else None


def read_text(diff_file: Path) -> str:
    return diff_file.read_text(encoding="utf-8", errors="surrogateescape")


def hunk_text(diff_file: Path, hunk: Hunk) -> str | None:
    """The text of one hunk of ``diff_file``, or None when it cannot be found."""
    try:
        parsed = parse(diff_file.read_text(encoding="utf-8", errors="replace"))
    except (OSError, DiffParseError):
        return None
    for pf in parsed:
        if hunk.path in (pf.path, pf.source_file[2:], pf.target_file[2:]) and 0 < hunk.number <= len(pf):
            return str(pf[hunk.number - 1])
    return None


def preamble(text: str) -> str:
    """Whatever precedes the first file header: a description ``git apply`` ignores, kept
    when a diff is rewritten."""
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.startswith("diff --git ") or (
                line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ")):
            return "".join(lines[:i])
    return ""


HUNK_HEADER = re.compile(r"^@@ -(\d+)(,\d+)? \+(\d+)(,\d+)? @@")


def _section_starts(lines: list[str]) -> list[int]:
    """Where each file section begins: its ``diff --git`` line, or for a diff without them its
    ``---`` line followed by a ``+++`` line.  Hunk lines never start with either."""
    starts = [i for i, line in enumerate(lines) if line.startswith("diff --git ")]
    if starts:
        return starts
    return [i for i, line in enumerate(lines)
            if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ")]


def file_sections(text: str) -> tuple[str, list[tuple[list[str], str]]]:
    """``text`` cut into what precedes the first file and each file's section (its paths, and
    its text byte for byte: binary patches and trailing lines included)."""
    lines = text.splitlines(keepends=True)
    starts = _section_starts(lines)
    if not starts:
        raise DiffParseError("holds no file changes")
    sections = []
    for n, start in enumerate(starts):
        chunk = "".join(lines[start:starts[n + 1] if n + 1 < len(starts) else len(lines)])
        try:
            parsed = PatchSet(chunk)
        except UnidiffParseError as exc:
            raise DiffParseError(f"not a unified diff: {exc}") from None
        paths = touched(parsed) if len(parsed) else []
        if not paths:
            raise DiffParseError(f"cannot tell which file this section changes: "
                                 f"{lines[start].strip()[:80]!r}")
        sections.append((paths, chunk))
    return "".join(lines[:starts[0]]), sections


def keep_files(text: str, keep) -> tuple[str, list[str], list[str]]:
    """``text`` with only the file sections that have a path ``keep(path)`` is true of; the kept
    and the dropped paths.  A mail header and message before the files stay, but not a
    ``git format-patch`` diffstat, which would name the dropped files."""
    head, sections = file_sections(text)
    out = [_without_diffstat(head)]
    kept: list[str] = []
    dropped: list[str] = []
    for named, chunk in sections:
        if any(keep(p) for p in named):
            out.append(chunk)
            kept += [p for p in named if p not in kept]
        else:
            dropped += [p for p in named if p not in dropped]
    return "".join(out), kept, dropped


def _without_diffstat(head: str) -> str:
    lines = head.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.rstrip("\n") == "---":  # format-patch: the message ends, the diffstat follows
            return "".join(lines[:i])
    return head


# `[PATCH]`, `[PATCH v2 3/7]`, `[RFC PATCH]`: added by format-patch; a title's own `[Bugfix]` stays
_SUBJECT_PREFIX = re.compile(r"^\s*(\[[^\]]*\bPATCH\b[^\]]*\]\s*)+", re.IGNORECASE)


def subject(text: str) -> str | None:
    """The title of a ``git format-patch`` style diff (its ``Subject:`` header, unfolded and
    decoded, without ``[PATCH n/m]``), or None."""
    import email.header

    lines = preamble(text).splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("Subject:"):
            continue
        value = line[len("Subject:"):]
        for more in lines[i + 1:]:
            if not more[:1].isspace() or not more.strip():
                break
            value += more
        try:
            value = str(email.header.make_header(email.header.decode_header(value)))
        except (ValueError, LookupError, UnicodeDecodeError):
            pass
        value = " ".join(_SUBJECT_PREFIX.sub("", value).split())
        return value or None
    return None


def _header_path(path: str) -> str:
    path = path.split("\t", 1)[0].rstrip("\n")
    return path[2:] if path[:2] in ("a/", "b/") else path


def shift_hunks(text: str, offsets: Mapping[tuple[str, int], int]) -> str:
    """``text`` with each hunk header moved by its offset (``{(path, hunk number): lines}``);
    every other byte is kept, so a refreshed diff differs from the old one only in the ``@@``
    lines that had to move."""
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
            old_path, n = _header_path(line[4:]), 0
        elif line.startswith("+++ "):
            new = _header_path(line[4:])
            path = old_path if new == "/dev/null" else new
        m = HUNK_HEADER.match(line)
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


_MARKER = re.compile(r"^\+(<{7}|>{7})( |$)|^\+={7}$")


def conflict_markers(text: str) -> list[str]:
    """``path:line`` of each conflict marker a diff adds."""
    found: list[str] = []
    path, line_no, left_new = "", 0, 0
    for line in text.splitlines():
        if left_new <= 0 and line.startswith("+++ "):
            path = _header_path(line[4:])
            continue
        m = HUNK_HEADER.match(line)
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


def write_text_if_changed(path: Path, text: str) -> bool:
    return files.write_if_changed(path, text.encode("utf-8", errors="surrogateescape"))
