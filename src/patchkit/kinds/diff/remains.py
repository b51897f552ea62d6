"""What of a diff's upstream code a release still has: the proof, or the refusal, of a
``retired:`` claim on a diff.

A file the diff changes is gone, or each of its hunks is: a hunk that removes or changes
lines is gone when none of those lines is left in the file; a hunk that only adds is gone when
the context it adds to is no longer there, in order.  Lines that say nothing on their own
(blank, a bracket, ``else:``) prove nothing either way."""

from __future__ import annotations

import re

from unidiff import PatchSet

from patchkit.kinds.base import Reader, Remains
from patchkit.kinds.diff.text import strip_prefix

_TRIVIAL = {"else:", "try:", "finally:", "pass", "return", "break", "continue", "}", "{", ")",
            "]", "};", "),", "],", "});"}
_WORD = re.compile(r"[A-Za-z0-9_]")


def _telling(line: str) -> bool:
    return bool(_WORD.search(line)) and line not in _TRIVIAL


def remains(patch: PatchSet, read: Reader) -> Remains:
    still: list[str] = []
    gone: list[str] = []
    for pf in patch:
        path = strip_prefix(pf.source_file)
        if path is None:   # a file the diff adds: nothing of the release's to be gone
            continue
        data = read(path)
        if data is None:
            gone.append(f"{path} is gone")
            continue
        lines = [ln.strip() for ln in data.decode("utf-8", "replace").splitlines()]
        have = set(lines)
        telling_lines = [ln for ln in lines if _telling(ln)]
        for n, hunk in enumerate(pf, 1):
            changed = [ln.value.strip() for ln in hunk if ln.is_removed]
            changed = [ln for ln in changed if _telling(ln)]
            if changed:
                left = [ln for ln in changed if ln in have]
                if left:
                    still.append(f"{path} still has `{left[0]}` (hunk {n})")
                else:
                    gone.append(f"{path}: the {_lines(len(changed))} hunk {n} changes "
                                f"{'is' if len(changed) == 1 else 'are'} gone (`{changed[0]}`)")
                continue
            context = [ln.value.strip() for ln in hunk if ln.is_context]
            context = [ln for ln in context if _telling(ln)]
            if not context:
                still.append(f"{path}: hunk {n} adds lines with no context to prove gone")
            elif _in_order(context, telling_lines):
                still.append(f"{path} still has the lines hunk {n} adds to (`{context[0]}`)")
            else:
                gone.append(f"{path}: the lines hunk {n} adds to are gone (`{context[0]}`)")
    if not still and not gone:
        still.append("the diff only adds files: nothing of the release's is gone to prove it "
                     "unneeded")
    return Remains(tuple(still), tuple(gone))


def _lines(n: int) -> str:
    return "line" if n == 1 else f"{n} lines"


def _in_order(block: list[str], lines: list[str]) -> bool:
    """Is ``block`` a run of consecutive entries of ``lines``?"""
    n = len(block)
    return any(lines[i:i + n] == block for i in range(len(lines) - n + 1))
