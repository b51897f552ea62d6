"""The diff kind: a git-style unified diff, owner of unidiff and ``git apply``.

Policy: offsets are fine and reported; fuzz is never accepted (``git apply`` demands every
context line, and a diff that would go in only with reduced context is reported as ``fuzz``);
a diff that applies in reverse is ``upstream``; every path is checked before git sees it.

Everything about diffs lives here: the manifest check, applying, naming the hunk that did not
apply, and what ``rebase`` does with a diff -- move its hunk headers after an offset, merge it
with conflict markers at a stop, and turn the user's resolution into the new diff.  Every diff
patchkit writes comes from :func:`patchkit.git.diff`, which pins every output option.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from unidiff import PatchSet
from unidiff.errors import UnidiffParseError

from patchkit import files
from patchkit import git as g
from patchkit import paths
from patchkit.errors import PatchkitError, UsageError
from patchkit.kinds.base import KindError, Rebase, Stop, Target
from patchkit.kinds.common import ABORT, commit_message, generic_stop
from patchkit.process import run
from patchkit.report import Hunk, InTheWay, Offset, Outcome, PatchResult


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


def _checked(diff_file: Path, root: Path) -> tuple[str, PatchSet, list[str]] | Outcome:
    """The diff's text, its parse and the paths it names, each checked before git sees it;
    the failed Outcome when it is no diff, or one patchkit does not apply."""
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
    return text, patch, files


def apply_file(diff_file: Path, root: Path) -> Outcome:
    """Apply ``diff_file`` to the checkout at ``root`` (index and tree), all or nothing."""
    checked = _checked(diff_file, root)
    if isinstance(checked, Outcome):
        return checked
    text, patch, files = checked
    # git's own view of the paths, before git writes: it expands renames and copies, and
    # unquotes the names git quotes (non-ASCII, spaces), which are the names the tree has.  A
    # diff that names its files as git reads them (git's a/ b/ names, none renamed, none
    # quoted) has no other view, so git is asked only when the diff does not go in.
    plain = _names_are_gits(patch, text)
    seen = files if plain else _git_view(root, diff_file, files)
    if isinstance(seen, Outcome):
        return seen
    fwd = g.apply(root, diff_file, index=True, verbose=True)
    if fwd.ok:
        return Outcome("applied", None, "", seen, _offsets(fwd.stderr))
    if plain:  # the tree is as it was: the failure is told as for any diff
        seen = _git_view(root, diff_file, files)
        if isinstance(seen, Outcome):
            return seen
    files = seen
    if g.apply(root, diff_file, check=True, reverse=True).ok:
        return Outcome("upstream", None, "the tree already has this change (it reverse-applies)",
                           files)
    in_the_way = find_in_the_way(patch, diff_file, root)
    missing = re.search(r"error: (\S+): (No such file or directory|does not exist in index)",
                        fwd.stderr)
    if missing:
        message = f"{missing.group(1)}: the file to patch does not exist"
        return Outcome("failed", "anchor-missing", _with_summary(message, patch, in_the_way),
                       files, in_the_way=in_the_way)
    if not _FAILED_AT.search(fwd.stderr) and "already exists" not in fwd.stderr:
        # not a hunk that missed its lines: git could not use the diff at all
        return Outcome("failed", "error", f"{diff_file.name}: {_first_line(fwd.stderr)}", files)
    crlf = _crlf_mismatch(diff_file, root, files)
    if crlf:
        return Outcome("failed", "error", f"{diff_file.name} has CRLF line ends and {crlf} has LF "
                       "ones: convert the diff (e.g. dos2unix) and try again", files)
    reason = "fuzz" if _applies_with_fuzz(diff_file, root) else "conflict"
    message, hunk = _conflict_message(patch, fwd.stderr, root)
    if reason == "fuzz":
        message += " (it would apply only with fuzz, which is never accepted)"
    return Outcome("failed", reason, _with_summary(message, patch, in_the_way), files, hunk=hunk,
                   in_the_way=in_the_way)


def apply_together(diff_files: Sequence[Path], root: Path) -> list[Outcome | None] | None:
    """Diffs that touch distinct files, applied by one ``git apply`` of them all: each one's
    Outcome as ``apply_file`` one after the other gives it, when every one goes in.  When some
    do not, the tree is untouched and each of those is None in the list (git checks every file
    before it writes any); None when they cannot go in together, or git's answer does not say
    which were in the way."""
    outcomes: list[Outcome] = []
    seen: set[str] = set()
    parts: list[str] = []
    for diff_file in diff_files:
        checked = _checked(diff_file, root)
        if isinstance(checked, Outcome):
            return None
        text, patch, files = checked
        # one input of them all is checked whole before git writes any of it
        if seen.intersection(files) or not _names_are_gits(patch, text) or \
                not text.endswith("\n"):
            return None
        seen.update(files)
        parts.append(text)
        outcomes.append(Outcome("applied", None, "", files, staged=True))
    with tempfile.TemporaryDirectory(prefix="patchkit-diffs-") as tmp:
        joined = Path(tmp) / "together.diff"
        joined.write_text("".join(parts), encoding="utf-8", errors="surrogateescape")
        fwd = g.apply(root, joined, index=True, verbose=True)
    if not fwd.ok:
        return _in_the_way(fwd.stderr, outcomes)
    offsets = _offsets(fwd.stderr)
    for out in outcomes:
        out.offsets = [o for o in offsets if o.path in out.files]
    return outcomes


def _in_the_way(stderr: str, outcomes: list[Outcome]) -> list[Outcome | None] | None:
    """``outcomes`` with None for each diff one of whose files git named an error for, from
    the ``Checking patch P...`` line each file's checks start with; None when git's errors
    cannot all be put to a file of the diffs, or name none."""
    failed: set[str] = set()
    current = None
    for line in stderr.splitlines():
        m = _CHECKING.match(line.strip())
        if m:
            current = m.group(1)
        elif line.startswith("error: "):
            if current is None or not any(current in out.files for out in outcomes):
                return None
            failed.add(current)
    if not failed:
        return None
    return [None if failed.intersection(out.files) else out for out in outcomes]


_RENAMED = re.compile(r"^(rename|copy) (from|to) ", re.MULTILINE)
_FILE_HEADER = re.compile(r"^diff --git ", re.MULTILINE)
_PLAIN_NAME = re.compile(r"[!#-\[\]-~]+")   # printable ASCII but space, '"' and '\\'


def _names_are_gits(patch: PatchSet, text: str) -> bool:
    """True when the paths git reads from the diff are the diff's own (``touched``): a
    ``diff --git`` header for every file, each named ``a/P`` and ``b/P`` (or /dev/null), no
    rename or copy, no name git would quote."""
    if _RENAMED.search(text) or len(_FILE_HEADER.findall(text)) != len(patch):
        return False
    for pf in patch:
        names = {_strip(n) for n in (pf.source_file, pf.target_file) if n != "/dev/null"}
        if len(names) != 1:
            return False
        name = names.pop()
        if not name or not _PLAIN_NAME.fullmatch(name) or not all(
                n in ("/dev/null", f"a/{name}", f"b/{name}")
                for n in (pf.source_file, pf.target_file)):
            return False
    return True


def _git_view(root: Path, diff_file: Path, files: list[str]) -> list[str] | Outcome:
    """The paths ``git apply`` reads from the diff, each checked; the failed Outcome when git
    cannot read the diff or a path is unsafe."""
    numstat = g.apply(root, diff_file, numstat=True)
    if not numstat.ok:
        return Outcome("failed", "error", _first_line(numstat.stderr), files)
    files = _numstat_paths(numstat.stdout) or files
    for rel in files:
        try:
            paths.safe_join(root, rel)
        except paths.UnsafePathError as exc:
            return Outcome("failed", "unsafe-path", str(exc), files)
    return files


_GONE = re.compile(r"error: (.+?): (No such file or directory|does not exist in index)$")
_EXISTS = re.compile(r"error: (.+?): already exists in (working directory|index)$")


def find_in_the_way(patch: PatchSet, diff_file: Path, root: Path) -> list[InTheWay]:
    """Every hunk and file of the diff that does not apply to ``root``, in diff order.  One
    ``git apply --check --reject``: with ``--reject`` git checks every hunk of every file
    instead of stopping at the first, and ``--check`` leaves the tree alone."""
    said = g.apply(root, diff_file, check=True, reject=True, verbose=True).stderr
    numbers: dict[tuple[str, int], int] = {}
    for pf in patch:
        for n, hunk in enumerate(pf, 1):
            for name in (_strip(pf.source_file), _strip(pf.target_file)):
                if name:
                    numbers.setdefault((name, hunk.source_start), n)
    found: list[InTheWay] = []
    for line in said.splitlines():
        line = line.strip()
        m = _FAILED_AT.match(line)
        if m:
            path, at = m.group(1), int(m.group(2))
            found.append(InTheWay(path, numbers.get((path, at)), "conflict", at))
            continue
        m = _GONE.match(line) or _EXISTS.match(line)
        if m:
            found.append(InTheWay(m.group(1), None, "gone" if m.re is _GONE else "exists"))
    return found


def _with_summary(message: str, patch: PatchSet, in_the_way: list[InTheWay]) -> str:
    """``message`` (the first thing in the way) after one sentence naming all of them, when
    there is more than that one."""
    if len(in_the_way) < 2:
        return message
    return f"{in_the_way_summary(patch, in_the_way)}; first: {message}"


def in_the_way_summary(patch: PatchSet, in_the_way: list[InTheWay]) -> str:
    """"3 of 41 hunks in 2 of 12 files conflict: a.py hunks 2, 5; b.py hunk 1; 1 file is gone:
    c.py"."""
    hunks: dict[str, list[str]] = {}
    for w in in_the_way:
        if w.reason == "conflict":
            hunks.setdefault(w.file, []).append(str(w.hunk) if w.hunk else f"at line {w.line}")
    parts = []
    if hunks:
        total = sum(len(pf) for pf in patch)
        n = sum(len(v) for v in hunks.values())
        listed = "; ".join(f"{f} hunk{'s' if len(v) > 1 else ''} {', '.join(v)}"
                           for f, v in hunks.items())
        parts.append(f"{n} of {total} hunk{'s' if total != 1 else ''} in {len(hunks)} of "
                     f"{len(patch)} file{'s' if len(patch) != 1 else ''} "
                     f"conflict{'s' if n == 1 else ''}: {listed}")
    for reason, said in (("gone", "gone"), ("exists", "there already")):
        named = [w.file for w in in_the_way if w.reason == reason]
        if named:
            parts.append(f"{len(named)} file{' is' if len(named) == 1 else 's are'} {said}: "
                         f"{', '.join(named)}")
    return "; ".join(parts)


def _applies_with_fuzz(diff_file: Path, root: Path) -> bool:
    """Would a fuzzy tool take it?  Only to name the refusal: the tree is never touched."""
    if shutil.which("patch"):
        proc = run(["patch", "--dry-run", "--batch", "--silent", "--fuzz=2", "-p1", "-i",
                    str(diff_file.absolute())], cwd=root, check=False)
        return proc.returncode == 0
    # Without GNU patch, git's reduced-context mode is the nearest equivalent.
    return g.apply(root, diff_file, check=True, context=1).ok


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


def _offsets(stderr: str) -> list[Offset]:
    found: list[Offset] = []
    current = "?"
    for line in stderr.splitlines():
        m = _CHECKING.match(line.strip())
        if m:
            current = m.group(1)
            continue
        m = _OFFSET.search(line)
        if m:
            hunk, at, off = m.groups()
            found.append(Offset(int(hunk), current, int(at), int(off)))
    return found


_FAILED_AT = re.compile(r"error: patch failed: (.+):(\d+)")


def _conflict_message(patch: PatchSet, stderr: str, root: Path) -> tuple[str, Hunk | None]:
    m = _FAILED_AT.search(stderr)
    if not m:
        return _first_line(stderr), None
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
                    return f"{where}: {first}", Hunk(path, n)
                shown = " | ".join(s.strip() for s in expected[:3] if s.strip())
                return f"{where}: {shown!r} not found", Hunk(path, n)
    return f"hunk at line {line} of {path} does not apply", None


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


# ------------------------------------------------------------------------------ writing diffs

def preamble(text: str) -> str:
    """Whatever precedes the first file header: a description ``git apply`` ignores, kept
    when a diff is rewritten."""
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.startswith("diff --git ") or (
                line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ")):
            return "".join(lines[:i])
    return ""


_HEADER = re.compile(r"^@@ -(\d+)(,\d+)? \+(\d+)(,\d+)? @@")


# ------------------------------------------------------------------------------ taking diffs in

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
        diff = Path(tmp) / "p.diff"
        diff.write_text(text, encoding="utf-8", errors="surrogateescape")
        tree, said = g.tree_with_diff(repo, diff, parent)
        return tree is not None and "(offset " not in said and tree == g.tree_of(repo, expect)


_MARKER = re.compile(r"^\+(<{7}|>{7})( |$)|^\+={7}$")


def conflict_markers(text: str) -> list[str]:
    """``path:line`` of each conflict marker a diff adds."""
    found: list[str] = []
    path, line_no, left_new = "", 0, 0
    for line in text.splitlines():
        if left_new <= 0 and line.startswith("+++ "):
            path = _header_path(line[4:])
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


def write_text_if_changed(path: Path, text: str) -> bool:
    return files.write_if_changed(path, text.encode("utf-8", errors="surrogateescape"))


# ------------------------------------------------------------------------------ rebase

def _count_markers(tree: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    for rel in g.modified(tree):
        try:
            text = (tree / rel).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        n = sum(1 for line in text.splitlines() if line.startswith("<<<<<<< "))
        if n:
            out[rel] = n
    return out


def _merge_from_old_pin(rebase: Rebase, patch) -> tuple[dict[str, int] | None, list[str]]:
    """Three-way merge per file: base = the file at the old pin with the patches before it,
    theirs = that with the patch, ours = the new checkout.  None when the old pin cannot give
    it."""
    with rebase.old_pin(patch) as got:
        if got is None:
            return None, []
        old, r = got
        tree, to, frm, label = rebase.tree, rebase.to, rebase.frm, rebase.label
        marked: dict[str, int] = {}
        notes: list[str] = []
        for rel in r.files:
            base = g.show(old, f"HEAD~1:{rel}")
            theirs = g.show(old, f"HEAD:{rel}")
            ours = tree / rel
            if not ours.exists():
                if base is None and theirs is not None:
                    ours.parent.mkdir(parents=True, exist_ok=True)
                    ours.write_text(theirs)
                elif base is not None:
                    notes.append(f"{rel}: not in {label} {to} any more; make the change {patch.id} "
                                 f"made there (see {patch.path}) wherever that code went")
                continue
            if theirs is None:
                if ours.read_text(errors="replace") == base:
                    ours.unlink()
                else:
                    notes.append(f"{rel}: {patch.id} deletes it, but upstream changed it; delete "
                                 "it if that is still right")
                continue
            with tempfile.TemporaryDirectory(prefix="patchkit-merge-") as tmp:
                b, t = Path(tmp) / "base", Path(tmp) / "theirs"
                b.write_text(base or "")
                t.write_text(theirs)
                conflicts = g.merge_file(ours, b, t, (f"{label} {to}", f"{label} {frm}", patch.id))
            if conflicts < 0:
                return None, []
            if conflicts:
                marked[rel] = conflicts
        return marked, notes


def _merge_into(rebase: Rebase, patch, diff_file: Path) -> tuple[dict[str, int], list[str]]:
    """Merge the diff into the checkout with conflict markers: per file against the old pin,
    else ``git apply --3way``, else ``--reject``.  The files with markers (and how many), and
    notes about files that could not be merged."""
    marked, notes = _merge_from_old_pin(rebase, patch)
    if marked is not None:
        return marked, notes
    tree = rebase.tree
    r = g.apply(tree, diff_file, three_way=True)
    if "lacks the necessary blob" not in r.stderr and "--3way" not in r.stderr:
        g.unstage_all(tree)  # leave the index at HEAD, the markers in the files
        found = _count_markers(tree)
        if found or r.ok:
            return found, []
    g.discard_changes(tree, check=False)
    g.apply(tree, diff_file, reject=True)
    rejects = g.untracked(tree, "*.rej")
    return {}, ([f"{r}: the hunks that did not apply (delete the .rej file when done)"
                 for r in rejects] or ["nothing of the diff applies"])


class DiffKind:
    name = "diff"
    is_folder = False
    replaces_files = False
    writes_only_named = True

    def check(self, full: Path, rel: str) -> str | None:
        try:
            text = full.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            return f"{rel} is not UTF-8 text ({exc.reason} at byte {exc.start})"
        except OSError as exc:
            return f"cannot read {rel}: {exc.strerror}"
        try:
            patch_set = PatchSet(text)
        except UnidiffParseError as exc:
            return f"{rel} is not a valid unified diff: {exc}"
        if len(patch_set) == 0:
            return f"{rel} holds no file changes (not a unified diff?)"
        binary = binary_without_data(text)
        if binary:
            return (f"{rel} names a binary change without its content ({binary!r}); "
                    "make it with `git diff --binary`")
        for patched in patch_set:
            try:
                paths.check_relative(patched.path)
            except paths.UnsafePathError as exc:
                return f"{rel} touches an unsafe path: {exc}"
        return None

    def sources(self, full: Path, rel: str) -> list[str]:
        return [rel]

    def touched(self, full: Path) -> list[str]:
        try:
            return touched(parse(read_text(full)))
        except (OSError, DiffParseError) as exc:
            raise KindError(str(exc)) from None

    def compile(self, full: Path, rel: str) -> str:
        patch_set = parse(read_text(full))   # the loader's check has parsed it once already
        files = len(patch_set)
        hunks = sum(len(f) for f in patch_set)
        return (f"{files} file{'s' if files != 1 else ''}, {hunks} "
                f"hunk{'s' if hunks != 1 else ''}")

    def apply(self, patch, full: Path, target: Target) -> Outcome:
        out = apply_file(full, target.root)
        out.staged = True  # `git apply --index` has staged it, deletions included
        return out

    def apply_together(self, fulls: Sequence[Path], target: Target
                       ) -> list[Outcome | None] | None:
        return apply_together(fulls, target.root)

    def refresh(self, patch, full: Path, tree: Path, result: PatchResult) -> str | None:
        """Rewrite a diff that applied at an offset to apply exactly at its commit's parent.
        Moving the hunk headers keeps every other byte; git's own diff of the commit is the
        fallback when that is not exact."""
        if not result.offsets:
            return None
        old = read_text(full)
        new = shift_hunks(old, {(o.path, o.hunk): o.offset for o in result.offsets})
        how = "hunk headers moved"
        parent, commit = f"{result.commit}~1", str(result.commit)
        if not applies_exactly(tree, new, parent, commit):
            new = preamble(old) + g.diff(tree, parent, commit)
            how = "rewritten from the commit"
            if not applies_exactly(tree, new, parent, commit):
                raise PatchkitError(f"{patch.path}: could not rewrite it to apply exactly")
        write_text_if_changed(full, new)
        return f"{how}: " + "; ".join(map(str, result.offsets))

    def stop(self, rebase: Rebase, patch, result: PatchResult, head: str) -> Stop:
        if result.reason not in ("conflict", "fuzz", "anchor-missing"):
            return generic_stop(rebase, patch, result, head)
        marked, notes = _merge_into(rebase, patch, rebase.manifest.root / patch.path)
        shown = rebase.shown
        lines = [head, "",
                 (f"The checkout {shown} holds {rebase.label} {rebase.to} with the patches "
                  f"before {patch.id}, and {patch.id} merged in as far as it goes:")]
        lines += [f"  {f}: {n} conflict{'s' if n != 1 else ''} between <<<<<<< and >>>>>>>"
                  for f, n in marked.items()]
        lines += [f"  {n}" for n in notes]
        lines += ["", (f"Edit the checkout until it makes the change {patch.id} should make (no "
                       "conflict marker left), then"),
                  f"`patchkit rebase --continue` writes that change to {patch.path} and goes on.",
                  ("Leaving the checkout as upstream has it (no change) marks the patch as "
                   "upstream."), ABORT]
        return Stop(patch.id, self.name, result.reason or "error", result.message,
                    [f"{shown}/{f}" for f in marked] or [shown], lines)

    def resume(self, rebase: Rebase, patch, stop: Stop) -> None:
        """The edited checkout becomes the new diff (or, unchanged, marks it upstream)."""
        tree = rebase.tree
        leftovers = [f for f in g.untracked(tree) if f.endswith((".rej", ".orig"))]
        if leftovers:
            raise UsageError(f"remove {', '.join(leftovers)} from {rebase.shown} first "
                             "(what they hold must be in the files by now)")
        g.stage_all(tree)
        text = g.diff(tree, "HEAD", cached=True)
        markers = conflict_markers(text)
        if markers:
            g.unstage_all(tree)
            raise UsageError(f"conflict markers left in {rebase.shown}: {', '.join(markers[:5])}"
                             f"{' ...' if len(markers) > 5 else ''}; resolve them, then "
                             "`patchkit rebase --continue`")
        if not text.strip():
            rebase.mark_upstream(patch, "resolved to no change")
            return
        file = rebase.manifest.root / patch.path
        new = preamble(read_text(file)) + text
        commit = g.commit_all(tree, commit_message(patch))
        assert commit
        if not applies_exactly(tree, new, f"{commit}~1", commit):
            raise PatchkitError(f"{patch.path}: the resolution does not turn into a clean diff")
        write_text_if_changed(file, new)
        rebase.resolved(patch, commit, f"{patch.path} rewritten from the checkout")



KIND = DiffKind()
