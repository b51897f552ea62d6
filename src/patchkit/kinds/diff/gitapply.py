"""A diff applied by ``git apply``: the one policy, and what is said when it does not go in.

Offsets are fine and reported; fuzz is never accepted (``git apply`` demands every context line,
and a diff that would go in only with reduced context is reported as ``fuzz``); a diff that
applies in reverse is ``upstream``; every path is checked before git sees it.  When it does not
go in, the hunk and the line in the way are named, and every other hunk and file in the way.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from unidiff import PatchSet

from patchkit import git
from patchkit import paths
from patchkit.kinds.diff.text import (DiffParseError, binary_without_data, parse, strip_prefix,
                                      touched)
from patchkit.process import run
from patchkit.report import Hunk, InTheWay, Offset, Outcome, Reason, Status


_SYMLINK = re.compile(r"^(new file mode|new mode|old mode|deleted file mode) 120000", re.MULTILINE)


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
        return Outcome(Status.FAILED, Reason.ERROR, f"{diff_file.name}: {exc}")
    files = touched(patch)
    for rel in files:
        try:
            paths.safe_join(root, rel)
        except paths.UnsafePathError as exc:
            return Outcome(Status.FAILED, Reason.UNSAFE_PATH, str(exc), files)
    if _SYMLINK.search(text):
        return Outcome(Status.FAILED, Reason.UNSAFE_PATH, "the diff creates or changes a symlink",
                       files)
    binary = binary_without_data(text)
    if binary:
        return Outcome(Status.FAILED, Reason.ERROR,
                       f"{diff_file.name}: {binary!r}: the diff names a binary change without its "
                       "content (make it with `git diff --binary`)", files)
    return text, patch, files


def apply_file(diff_file: Path, root: Path) -> Outcome:
    """Apply ``diff_file`` to the work tree at ``root``, all or nothing; the index is not
    touched (the caller commits the files named)."""
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
    fwd = git.apply(root, diff_file, verbose=True)
    if fwd.ok:
        return Outcome(Status.APPLIED, None, "", seen, _offsets(fwd.stderr))
    if plain:  # the tree is as it was: the failure is told as for any diff
        seen = _git_view(root, diff_file, files)
        if isinstance(seen, Outcome):
            return seen
    files = seen
    if git.apply(root, diff_file, check=True, reverse=True).ok:
        return Outcome(Status.UPSTREAM, None,
                       "the tree already has this change (it reverse-applies)", files)
    in_the_way = find_in_the_way(patch, diff_file, root)
    missing = re.search(r"error: (\S+): (No such file or directory|does not exist in index)",
                        fwd.stderr)
    if missing:
        message = f"{missing.group(1)}: the file to patch does not exist"
        return Outcome(Status.FAILED, Reason.ANCHOR_MISSING,
                       _with_summary(message, patch, in_the_way), files, in_the_way=in_the_way)
    if not _FAILED_AT.search(fwd.stderr) and "already exists" not in fwd.stderr:
        # not a hunk that missed its lines: git could not use the diff at all
        return Outcome(Status.FAILED, Reason.ERROR,
                       f"{diff_file.name}: {_first_line(fwd.stderr)}", files)
    crlf = _crlf_mismatch(diff_file, root, files)
    if crlf:
        return Outcome(Status.FAILED, Reason.ERROR,
                       f"{diff_file.name} has CRLF line ends and {crlf} has LF ones: convert the "
                       "diff (e.g. dos2unix) and try again", files)
    reason = Reason.FUZZ if _applies_with_fuzz(diff_file, root) else Reason.CONFLICT
    message, hunk = _conflict_message(patch, fwd.stderr, root)
    if reason is Reason.FUZZ:
        message += " (it would apply only with fuzz, which is never accepted)"
    return Outcome(Status.FAILED, reason, _with_summary(message, patch, in_the_way), files,
                   hunk=hunk, in_the_way=in_the_way)


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
        outcomes.append(Outcome(Status.APPLIED, None, "", files))
    with tempfile.TemporaryDirectory(prefix="patchkit-diffs-") as tmp:
        joined = Path(tmp) / "together.diff"
        joined.write_text("".join(parts), encoding="utf-8", errors="surrogateescape")
        fwd = git.apply(root, joined, verbose=True)
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
        names = {strip_prefix(n) for n in (pf.source_file, pf.target_file) if n != "/dev/null"}
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
    numstat = git.apply(root, diff_file, numstat=True)
    if not numstat.ok:
        return Outcome(Status.FAILED, Reason.ERROR, _first_line(numstat.stderr), files)
    files = _numstat_paths(numstat.stdout) or files
    for rel in files:
        try:
            paths.safe_join(root, rel)
        except paths.UnsafePathError as exc:
            return Outcome(Status.FAILED, Reason.UNSAFE_PATH, str(exc), files)
    return files


_GONE = re.compile(r"error: (.+?): (No such file or directory|does not exist in index)$")
_EXISTS = re.compile(r"error: (.+?): already exists in (working directory|index)$")


def find_in_the_way(patch: PatchSet, diff_file: Path, root: Path) -> list[InTheWay]:
    """Every hunk and file of the diff that does not apply to ``root``, in diff order.  One
    ``git apply --check --reject``: with ``--reject`` git checks every hunk of every file
    instead of stopping at the first, and ``--check`` leaves the tree alone."""
    said = git.apply(root, diff_file, check=True, reject=True, verbose=True).stderr
    numbers: dict[tuple[str, int], int] = {}
    for pf in patch:
        for n, hunk in enumerate(pf, 1):
            for name in (strip_prefix(pf.source_file), strip_prefix(pf.target_file)):
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
    return git.apply(root, diff_file, check=True, context=1).ok


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
        if path not in (strip_prefix(pf.source_file), strip_prefix(pf.target_file)):
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


def applies_exactly(repo: Path, text: str, parent: str, expect: str) -> bool:
    """Does ``text`` turn commit ``parent`` into commit ``expect``'s tree with no offset and no
    fuzz?  Checked in a throwaway index; the checkout is not touched."""
    with tempfile.TemporaryDirectory(prefix="patchkit-check-") as tmp:
        diff = Path(tmp) / "p.diff"
        diff.write_text(text, encoding="utf-8", errors="surrogateescape")
        tree, said = git.tree_with_diff(repo, diff, parent)
        return tree is not None and "(offset " not in said and tree == git.tree_of(repo, expect)
