"""The word error rate `kame bench --stt-wer` and `kame demo` judge transcripts by
(kame_cli/wer.py): its edits are counted by kind, and what is only how Whisper
writes a word is not an error."""

from __future__ import annotations

import pytest

from kame_cli.wer import NO_ERRORS, Errors, normalize, word_errors


@pytest.mark.parametrize(
    ("reference", "hypothesis", "expected"),
    [
        ("the quick brown fox", "the quick brown fox", Errors(0, 0, 0, 4)),
        ("the quick brown fox", "the quit brown fox", Errors(1, 0, 0, 4)),
        ("the quick brown fox", "the brown fox", Errors(0, 1, 0, 4)),
        ("the quick brown fox", "the quick brown fox jumps", Errors(0, 0, 1, 4)),
        ("the quick brown fox", "a the quick fox", Errors(0, 1, 1, 4)),
        ("the quick brown fox", "", Errors(0, 4, 0, 4)),
        ("", "uh", Errors(0, 0, 1, 0)),
    ],
)
def test_edits_are_counted_by_kind(reference, hypothesis, expected):
    assert word_errors(reference, hypothesis) == expected


def test_errors_add_up_over_sentences():
    total = NO_ERRORS + word_errors("a b c d", "a x c") + word_errors("e f", "e f g")
    assert total == Errors(1, 1, 1, 6)
    assert total.rate == pytest.approx(3 / 6)


def test_a_split_off_ending_and_a_number_are_how_whisper_writes_not_errors():
    assert normalize("Call me at 5 o 'clock, I 'm late") == normalize(
        "call me at five o'clock i'm late"
    )
    assert word_errors("Remind me at five o'clock.", "Remind me at 5 o 'clock.").edits == 0
    # A quote is not an ending: its words stay apart.
    assert normalize("he said 'hello'") == ["he", "said", "hello"]
