"""The test area's normalizer and word error rate (they judge every transcript)."""

from __future__ import annotations

import pytest


def test_numbers_as_digits_or_words_normalize_alike(text_metrics):
    assert text_metrics.normalize("What is 12 times 4?") == "what is twelve times four".split()
    assert (
        text_metrics.normalize("a table for 2 at 7:45")
        == "a table for two at seven forty five".split()
    )
    assert (
        text_metrics.normalize("555-1234")
        == "five hundred fifty five one thousand two hundred thirty four".split()
    )
    assert (
        text_metrics.normalize("It's 2024, isn't it.")
        == "it's two thousand twenty four isn't it".split()
    )


@pytest.mark.parametrize(
    ("reference", "hypothesis", "expected"),
    [
        ("what is twelve times four", "What is 12 times 4?", 0.0),
        ("the quick brown fox", "the quit brown fox", 0.25),  # one substitution
        ("the quick brown fox", "the brown fox", 0.25),  # one deletion
        ("the quick brown fox", "the quick brown fox jumps", 0.25),  # one insertion
        ("the quick brown fox", "", 1.0),
        ("yes", "no no no", 3.0),
    ],
)
def test_word_error_rate(text_metrics, reference, hypothesis, expected):
    assert text_metrics.wer(reference, hypothesis) == pytest.approx(expected)
