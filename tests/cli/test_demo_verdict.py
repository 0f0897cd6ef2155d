"""`kame demo` says plainly whether the stt heard the question it asked: the
agent answers what was heard, so a misheard question gets another answer."""

from __future__ import annotations

import pytest

from kame_cli.demo import QUESTION, hearing_verdict


@pytest.mark.parametrize(
    "heard", [QUESTION, "what is the capital of france", "What is the capital of France."]
)
def test_the_question_heard_right_is_said_so(heard):
    assert hearing_verdict(QUESTION, heard).startswith("(heard right")


def test_numbers_as_digits_are_the_same_words():
    assert hearing_verdict("What is twelve times four?", "What is 12 times 4?").startswith(
        "(heard right"
    )


def test_a_misheard_question_is_called_misheard_with_its_count():
    verdict = hearing_verdict(QUESTION, "What is the capital of friends?")
    assert verdict.startswith("MISHEARD: 1 of the question's 6 words"), verdict
    assert "answered what the stt heard, not the question" in verdict


def test_nothing_heard_is_misheard():
    assert hearing_verdict(QUESTION, "").startswith("MISHEARD: the stt heard nothing")
