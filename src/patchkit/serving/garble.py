"""Garble in a long deterministic answer: where a model that started right stops making sense.

``patchkit smoke --long N`` asks for N tokens of something whose every next token is known: the
numbers counting from 1, or a given text over and over.  A broken kernel or cache path often
answers the first few hundred tokens right and garbles later, so the whole answer is walked
and the first place it goes wrong is found:

* the sequence breaks (a number skipped or wrong, a stray piece between numbers, a wrong word
  in a repeat);
* a run of repeats (the same number, or the same short piece, again and again);
* U+FFFD, the replacement character a detokenizer writes for bytes that are not UTF-8.

An answer cut off by the token budget may end inside a number or a repeat: that is no garble.
A short answer is judged whole (:func:`degenerate`): one piece over and over, or bytes that are
not text.  Pure: the caller makes the request.
"""

from __future__ import annotations

import codecs
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

from patchkit import http

CONTEXT = 40         # characters shown each side of the first bad one

_ITEM = re.compile(r"\d+|\D+")
_SEPARATOR = re.compile(r"[ \t\r\n,;]{1,8}")   # between two numbers
_START = re.compile(r"(?<!\d)1(?!\d)")
_GAP = re.compile(r"[\s,;]*")                   # between two repeats of the text
_RUN = re.compile(r"(.{1,12}?)\1{3,}", re.S)
PREAMBLE_MAX = 200   # characters a model may say before its first number


def count_prompt(tokens: int) -> str:
    return ("Count from 1 upwards: write the whole numbers in order, 1 2 3 4 and so on, "
            f"separated by single spaces, and nothing else. Do not stop before {tokens} numbers.")


def repeat_prompt(text: str) -> str:
    return (f"Repeat the following text over and over, separated by single spaces, and write "
            f"nothing else: {text}")


@dataclass(frozen=True)
class Garble:
    """The first bad place: ``char`` its character offset in the answer, ``token`` its token
    offset when the answer's tokens are known."""

    char: int
    what: str
    context: str
    token: int | None = None

    @property
    def where(self) -> str:
        if self.token is not None:
            return f"token {self.token} (character {self.char})"
        return f"character {self.char}"

    def describe(self) -> str:
        return f"garbled at {self.where}: {self.what}; around it: {self.context!r}"

    def to_dict(self) -> dict:
        return {"token": self.token, "char": self.char, "what": self.what,
                "context": self.context}


def check_count(text: str) -> tuple[Garble | None, int]:
    """The first garble in an answer that counts from 1, and the last number reached."""
    start = _START.search(text)
    if start is None or start.start() > PREAMBLE_MAX:
        return _at(text, 0, "the answer does not count from 1"), 0
    expected, last = 1, 0
    for m in _ITEM.finditer(text, start.start()):
        piece, at = m.group(), m.start()
        if piece.isdigit() and piece.isascii():
            if int(piece) == expected:
                expected, last = expected + 1, expected
                continue
            if m.end() == len(text) and str(expected).startswith(piece):
                break   # cut off by the token budget inside the number
            if int(piece) == last:
                return _at(text, at, f"a run of repeats: {piece} again after {last}"), last
            return _at(text, at, f"the sequence breaks: expected {expected}, got {piece}"), last
        if _SEPARATOR.fullmatch(piece) or (m.end() == len(text) and not piece.strip(" \n.,")):
            continue
        lead = len(piece) - len(piece.lstrip(" \t\r\n,;"))
        return _at(text, at + lead, _stray(piece[lead:], expected)), last
    return _fffd(text) if "\ufffd" in text else None, last


def check_repeat(text: str, unit: str) -> Garble | None:
    """The first garble in an answer that repeats ``unit`` over and over."""
    unit = unit.strip()
    i = _GAP.match(text).end()
    while i < len(text):
        if text.startswith(unit, i):
            i = _GAP.match(text, i + len(unit)).end()
            continue
        if unit.startswith(text[i:]):
            break   # cut off by the token budget inside a repeat
        same = next((n for n, (a, b) in enumerate(zip(unit, text[i:])) if a != b), len(unit))
        i += same   # the first character that differs from the repeat
        got = text[i:i + len(unit) - same]
        run = _RUN.match(text, i)
        what = (f"a run of repeats of {run.group(1)!r}" if run else
                f"the repeat breaks: expected {unit[same:]!r}, got {got!r}")
        if "\ufffd" in got:
            return _fffd(text)
        return _at(text, i, what)
    return _fffd(text) if "\ufffd" in text else None


def _stray(piece: str, expected: int) -> str:
    if "\ufffd" in piece:
        return "a replacement character (U+FFFD): bytes that are not text"
    run = _RUN.match(piece)
    if run:
        return f"a run of repeats of {run.group(1)!r} where {expected} should come"
    return f"the sequence breaks: {piece[:CONTEXT]!r} where {expected} should come"


def _fffd(text: str) -> Garble:
    return _at(text, text.index("\ufffd"),
               "a replacement character (U+FFFD): bytes that are not text")


def _at(text: str, char: int, what: str) -> Garble:
    return Garble(char, what, text[max(0, char - CONTEXT):char + CONTEXT])


@dataclass(frozen=True)
class Token:
    """One token of the answer as the API gives it: its text and, where given, its bytes
    (OpenAI's ``logprobs.content[].bytes``)."""

    text: str
    raw: bytes | None = None


def with_tokens(garble: Garble | None, text: str, tokens: Sequence[Token]) -> Garble | None:
    """``garble`` with the index of the token its first bad character comes from, when the
    answer's ``tokens`` can be laid along ``text``: their texts joined; else their bytes
    decoded as one stream (a byte-level BPE token may hold part of a character); else their
    texts matched one by one, a run that does not match (a partial character decoded alone as
    U+FFFD) ending where the next token's text is found."""
    if garble is None or not tokens:
        return garble
    for place in (_by_text, _by_bytes, _by_alignment):
        index = place(text, garble.char, tokens)
        if index is not None:
            return Garble(garble.char, garble.what, garble.context, index)
    return garble


def _by_text(text: str, char: int, tokens: Sequence[Token]) -> int | None:
    if "".join(t.text for t in tokens) != text:
        return None
    end = 0
    for index, token in enumerate(tokens):
        end += len(token.text)
        if char < end:
            return index
    return None


def _by_bytes(text: str, char: int, tokens: Sequence[Token]) -> int | None:
    """Each character of the decoded stream is owned by the token of its first byte; a
    replacement character by the token whose bytes began the bad sequence."""
    if any(t.raw is None for t in tokens):
        return None
    owner = [i for i, t in enumerate(tokens) for _ in t.raw]
    data = b"".join(t.raw for t in tokens)
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    chars: list[str] = []
    owners: list[int] = []
    pending = 0   # where the bytes not yet decoded begin
    for i in range(len(data)):
        got = decoder.decode(data[i:i + 1])
        owners += [owner[pending]] + [owner[i]] * (len(got) - 1) if got else []
        chars.append(got)
        pending = i + 1 - len(decoder.getstate()[0])
    rest = decoder.decode(b"", final=True)
    owners += [owner[min(pending, len(owner) - 1)]] * len(rest)
    chars.append(rest)
    if "".join(chars) != text or char >= len(owners):
        return None
    return owners[char]


RUN = 8   # tokens in a run whose texts do not match before the alignment gives up


def _by_alignment(text: str, char: int, tokens: Sequence[Token]) -> int | None:
    pos, k = 0, 0
    while k < len(tokens) and pos <= char:
        piece = tokens[k].text
        if text.startswith(piece, pos):
            if char < pos + len(piece):
                return k
            pos, k = pos + len(piece), k + 1
            continue
        # a run of tokens that do not match here: each stands for a few characters at most
        for j in range(k + 1, min(k + RUN, len(tokens))):
            after = tokens[j].text
            if not after:
                continue
            bound = sum(len(t.text) + 1 for t in tokens[k:j])
            at = text.find(after, pos, pos + bound + len(after))
            if at >= 0:
                if char < at:
                    return k
                pos, k = at, j
                break
        else:   # no later token matches: a run that reaches the end holds the rest
            return k if k + RUN >= len(tokens) else None
    return None


# ------------------------------------------------------------------------ a short answer

_REPEAT = re.compile(r"(.{1,8}?)\1{3,}", re.S)


def degenerate(text: str) -> str | None:
    """Why ``text`` is not a real answer, or None: what a model on a broken kernel or cache
    path says (one token over and over, bytes that are not text)."""
    if "\ufffd" in text:
        return f"undecodable bytes (U+FFFD) in {http.snippet(text, 40)!r}"
    if any(unicodedata.category(c) == "Cc" and c not in "\n\r\t" for c in text):
        return f"control characters in {http.snippet(text, 40)!r}"
    flat = " ".join(text.split())
    m = _REPEAT.fullmatch(flat) or _REPEAT.fullmatch(flat + " ")
    if len(flat) >= 8 and m:
        return f"{m.group(1).strip() or m.group(1)!r} over and over"
    return None
