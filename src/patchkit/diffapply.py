"""The diff kind: preflight with unidiff, apply with ``git apply``.

Policy: offsets are fine and reported; fuzz is never accepted (``git apply`` demands every
context line, and a diff that would go in only with reduced context is reported as ``fuzz``);
a diff that applies in reverse is ``upstream``; every path is checked before git sees it.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from unidiff import PatchSet
from unidiff.errors import UnidiffParseError

from patchkit import git as g
from patchkit import paths
from patchkit.report import Outcome
from patchkit.util import run


class DiffParseError(Exception):
    pass


def _strip(path: str | None) -> str | None:
    if path is None or path == "/dev/null":
        return None
    return path[2:] if path[:2] in ("a/", "b/") else path


def parse(text: str) -> PatchSet:
    """Parse a unified diff; raise DiffParseError for anything that is not one."""
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
        for p in (_strip(pf.source_file), _strip(pf.target_file)):
            if p and p not in out:
                out.append(p)
    return out


_SYMLINK = re.compile(r"^(new file mode|new mode|old mode|deleted file mode) 120000", re.MULTILINE)
# `git diff` without --binary names a binary change without carrying it
_BINARY_WITHOUT_DATA = re.compile(r"^Binary files (.+) and (.+) differ$", re.MULTILINE)


def binary_without_data(text: str) -> str | None:
    """The line of a diff that names a binary change it does not carry, or None."""
    m = _BINARY_WITHOUT_DATA.search(text)
    return m.group(0) if m else None


def _numstat_paths(stdout: str) -> list[str]:
    """The paths of ``git apply --numstat -z``: ``added TAB deleted TAB path NUL``, or for a
    rename or copy ``added TAB deleted TAB NUL old NUL new NUL``."""
    out: list[str] = []
    fields = stdout.split("\0")
    i = 0
    while i < len(fields):
        head = fields[i]
        i += 1
        if not head:
            continue
        path = head.split("\t", 2)[2] if head.count("\t") >= 2 else ""
        found = [path] if path else fields[i:i + 2]
        if not path:
            i += 2
        for p in found:
            if p and p not in out:
                out.append(p)
    return out


def _crlf_mismatch(diff_file: Path, root: Path, files: list[str]) -> str | None:
    """A diff with CRLF line ends against files with LF ones: the usual harm of an editor or a
    checkout that converted the diff.  Names the first such file."""
    if b"\r\n" not in diff_file.read_bytes():
        return None
    for rel in files:
        target = root / rel
        if target.is_file() and b"\r\n" not in target.read_bytes():
            return rel
    return None


def apply(diff_file: Path, root: Path) -> Outcome:
    """Apply ``diff_file`` to the checkout at ``root`` (index and tree), all or nothing."""
    text = diff_file.read_text(encoding="utf-8", errors="surrogateescape")
    try:
        patch = parse(text)
    except DiffParseError as exc:
        return Outcome("failed", "error", f"{diff_file.name}: {exc}")
    files = touched(patch)
    for rel in files:
        try:
            paths.safe_join(root, rel)
        except paths.UnsafePathError as exc:
            return Outcome("failed", "unsafe-path", str(exc), files)
    if _SYMLINK.search(text):
        return Outcome("failed", "unsafe-path", "the diff creates or changes a symlink", files)
    binary = binary_without_data(text)
    if binary:
        return Outcome("failed", "error", f"{diff_file.name}: {binary!r}: the diff names a binary "
                       "change without its content (make it with `git diff --binary`)", files)
    # Ask git for its own view of the paths too: it expands renames and copies, and unquotes
    # the names git quotes (non-ASCII, spaces), which are the names the tree has.
    numstat = g.git("apply", "--numstat", "-z", str(diff_file), cwd=root, check=False)
    if numstat.returncode != 0:
        return Outcome("failed", "error", _first_line(numstat.stderr), files)
    files = _numstat_paths(numstat.stdout) or files
    for rel in files:
        try:
            paths.safe_join(root, rel)
        except paths.UnsafePathError as exc:
            return Outcome("failed", "unsafe-path", str(exc), files)

    fwd = g.git("apply", "--index", "--verbose", "--whitespace=nowarn", str(diff_file),
                cwd=root, check=False)
    if fwd.returncode == 0:
        return Outcome("applied", None, "", files, _offsets(fwd.stderr))
    rev = g.git("apply", "--check", "--reverse", "--whitespace=nowarn", str(diff_file),
                cwd=root, check=False)
    if rev.returncode == 0:
        return Outcome("upstream", None, "the tree already has this change (it reverse-applies)",
                           files)
    missing = re.search(r"error: (\S+): (No such file or directory|does not exist in index)",
                        fwd.stderr)
    if missing:
        return Outcome("failed", "anchor-missing",
                           f"{missing.group(1)}: the file to patch does not exist", files)
    if not _FAILED_AT.search(fwd.stderr) and "already exists" not in fwd.stderr:
        # not a hunk that missed its lines: git could not use the diff at all
        return Outcome("failed", "error", f"{diff_file.name}: {_first_line(fwd.stderr)}", files)
    crlf = _crlf_mismatch(diff_file, root, files)
    if crlf:
        return Outcome("failed", "error", f"{diff_file.name} has CRLF line ends and {crlf} has LF "
                       "ones: convert the diff (e.g. dos2unix) and try again", files)
    reason = "fuzz" if _applies_with_fuzz(diff_file, root) else "conflict"
    message = _conflict_message(patch, fwd.stderr, root)
    if reason == "fuzz":
        message += " (it would apply only with fuzz, which is never accepted)"
    return Outcome("failed", reason, message, files)


def _applies_with_fuzz(diff_file: Path, root: Path) -> bool:
    """Would a fuzzy tool take it?  Only to name the refusal: the tree is never touched."""
    if shutil.which("patch"):
        proc = run(["patch", "--dry-run", "--batch", "--silent", "--fuzz=2", "-p1", "-i",
                    str(diff_file.absolute())], cwd=root, check=False)
        return proc.returncode == 0
    # Without GNU patch, git's reduced-context mode is the nearest equivalent.
    return g.git("apply", "--check", "-C1", "--whitespace=nowarn", str(diff_file), cwd=root,
                 check=False).returncode == 0


def _first_difference(root: Path, path: str, line: int, expected: list[str]) -> str:
    """Where the file differs from what the hunk expects at its own position, or ''."""
    try:
        have = paths.safe_join(root, path).read_text(encoding="utf-8", errors="replace").splitlines()
    except (OSError, paths.UnsafePathError):
        return ""
    for k, want in enumerate(expected):
        at = line + k
        if at > len(have):
            return f"the file ends at line {len(have)}, the hunk expects {want!r} at line {at}"
        if have[at - 1] != want:
            return f"line {at} is {have[at - 1]!r}, the hunk expects {want!r}"
    return ""


def _first_line(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for ln in lines:
        if ln.startswith("error:"):
            return ln[len("error:"):].strip()
    return lines[0] if lines else "git apply failed"


_OFFSET = re.compile(r"Hunk #(\d+) succeeded at (\d+) \(offset (-?\d+) lines?\)")
_CHECKING = re.compile(r"^Checking patch (.+?)\.\.\.$")


def _offsets(stderr: str) -> list[str]:
    found: list[str] = []
    current = "?"
    for line in stderr.splitlines():
        m = _CHECKING.match(line.strip())
        if m:
            current = m.group(1)
            continue
        m = _OFFSET.search(line)
        if m:
            hunk, at, off = m.groups()
            found.append(f"hunk {hunk} of {current} at line {at} (offset {int(off):+d})")
    return found


_FAILED_AT = re.compile(r"error: patch failed: (.+):(\d+)")


def _conflict_message(patch: PatchSet, stderr: str, root: Path) -> str:
    m = _FAILED_AT.search(stderr)
    if not m:
        return _first_line(stderr)
    path, line = m.group(1), int(m.group(2))
    for pf in patch:
        if path not in (_strip(pf.source_file), _strip(pf.target_file)):
            continue
        for n, hunk in enumerate(pf, 1):
            if hunk.source_start == line:
                expected = [ln.value.rstrip("\r\n") for ln in hunk
                            if ln.is_context or ln.is_removed]
                where = (f"hunk {n} of {path}: expected at line {line} "
                         f"(lines {line}-{line + max(hunk.source_length - 1, 0)})")
                first = _first_difference(root, path, line, expected)
                if first:
                    return f"{where}: {first}"
                shown = " | ".join(s.strip() for s in expected[:3] if s.strip())
                return f"{where}: {shown!r} not found"
    return f"hunk at line {line} of {path} does not apply"
