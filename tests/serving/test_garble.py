"""The garble walk of a long deterministic answer: the first bad place, never a false alarm on
an answer the token budget cut short."""

from __future__ import annotations

import pytest

from patchkit.serving.garble import Token, check_count, check_repeat, with_tokens

COUNT = " ".join(str(n) for n in range(1, 2001))


def test_a_right_count_and_one_cut_inside_its_last_number_are_no_garble():
    assert check_count(COUNT) == (None, 2000)
    assert check_count(COUNT + " 20")[0] is None        # 2001 cut after two digits
    assert check_count("Here you go:\n1, 2, 3,\n4")[0] is None   # a short preamble, any separator


@pytest.mark.parametrize("tail, offset, words", [
    (" 2002", 1, "expected 2001, got 2002"),
    (" 2000 2000 2000", 1, "a run of repeats: 2000 again"),
    (" \ufffd", 1, "U+FFFD"),
    (" 2001 ### 2002", 6, "'### ' where 2002 should come"),
    (" 2001 abababababab", 6, "a run of repeats of 'ab'"),
])
def test_the_first_bad_place_is_found_with_its_offset(tail, offset, words):
    garble, _ = check_count(COUNT + tail)
    assert garble.char == len(COUNT) + offset and words in garble.what
    assert "1999 2000" in garble.context and len(garble.context) <= 80   # what led up to it


def test_an_answer_that_does_not_count_is_garbled_at_0():
    assert check_count("I cannot do that.")[0].char == 0


def test_repeats_are_walked_to_the_first_wrong_character():
    text = "alpha beta " * 100
    assert check_repeat(text, "alpha beta") is None
    assert check_repeat(text + "alp", "alpha beta") is None    # cut inside a repeat
    bad = check_repeat(text + "alpha bet\ufffd", "alpha beta")
    assert bad.char == len(text) + 9 and "U+FFFD" in bad.what


def test_token_offsets_come_from_the_answers_tokens_when_they_make_it_up():
    tokens = [Token(t) for t in ["1", " 2", " 3", " 5"]]
    garble, _ = check_count("".join(t.text for t in tokens))
    assert with_tokens(garble, "1 2 3 5", tokens).token == 3
    assert with_tokens(garble, "1 2 3 5", [Token("1 2 3")]).token is None   # not the answer


# A byte-level BPE tokenizer: "€" is E2 82 AC; a model on a broken path emits its first two
# bytes, then goes on.  The answer's text holds one U+FFFD for the two bytes.
BROKEN = [b"1", b" 2", b" 3", b" \xe2", b"\x82", b" 4"]
ANSWER = b"".join(BROKEN).decode("utf-8", "replace")


def test_a_garble_is_placed_by_the_tokens_bytes_when_their_texts_do_not_join():
    assert ANSWER == "1 2 3 \ufffd 4"
    garble, _ = check_count(ANSWER)
    assert "U+FFFD" in garble.what
    # each token's text decoded alone, as an OpenAI server gives it: two U+FFFD for one
    tokens = [Token(b.decode("utf-8", "replace"), b) for b in BROKEN]
    assert "".join(t.text for t in tokens) != ANSWER
    assert with_tokens(garble, ANSWER, tokens).token == 3


def test_vllms_bytes_of_the_decoded_text_are_aligned_by_text():
    # vLLM gives as bytes the token's decoded text encoded again: the raw bytes are lost
    texts = [b.decode("utf-8", "replace") for b in BROKEN]
    tokens = [Token(t, t.encode()) for t in texts]
    garble, _ = check_count(ANSWER)
    assert with_tokens(garble, ANSWER, tokens).token == 3
    assert with_tokens(garble, ANSWER, [Token(t) for t in texts]).token == 3   # no bytes


def test_a_garble_after_a_token_that_does_not_match_is_still_placed():
    # a partial character that the next token completes: the answer is right up to " 5"
    pieces = [b"1", b" 2", b" \xe2\x82", b"\xac", b" 3", b" 5"]
    answer = b"".join(pieces).decode()
    tokens = [Token(p.decode("utf-8", "replace")) for p in pieces]
    garble = check_repeat(answer, "1 2 \u20ac 3 4")
    assert garble is not None
    assert with_tokens(garble, answer, tokens).token == 5
