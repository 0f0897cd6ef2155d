"""Local agreement: stable words are agreed by consecutive hypotheses and never revised."""

from __future__ import annotations

from services.stt.agreement import LocalAgreement, Word


def _hypothesis(text: str, start: float = 0.0, step: float = 0.3) -> list[Word]:
    return [
        Word(w, start + i * step, start + (i + 1) * step, 0.9) for i, w in enumerate(text.split())
    ]


def _texts(words: list[Word]) -> str:
    return " ".join(w.text for w in words)


def test_words_become_stable_when_two_hypotheses_agree():
    agreement = LocalAgreement()
    tail = agreement.update(_hypothesis("what is"))
    assert agreement.stable == [] and _texts(tail) == "what is"
    assert agreement.stability(tail) == 0.0
    tail = agreement.update(_hypothesis("What is twelve"))
    assert _texts(agreement.stable) == "What is" and _texts(tail) == "twelve"
    assert agreement.stability(tail) == 2 / 3
    tail = agreement.update(_hypothesis("What is 12 times"))
    assert _texts(agreement.stable) == "What is" and _texts(tail) == "12 times"


def test_the_newest_last_word_is_never_committed():
    agreement = LocalAgreement()
    agreement.update(_hypothesis("the quick brown"))
    tail = agreement.update(_hypothesis("the quick brown"))
    assert _texts(agreement.stable) == "the quick" and _texts(tail) == "brown"


def test_a_revised_stable_word_keeps_the_prefix_and_the_tail_follows_by_time():
    agreement = LocalAgreement()
    agreement.update(_hypothesis("the quit brown fox"))
    agreement.update(_hypothesis("the quit brown fox jumps"))
    assert _texts(agreement.stable) == "the quit brown fox"
    # The model changes its mind about "quit": the stable prefix stays, and the tail is
    # what was heard after the last stable word (1.2 s), not a count of words.
    tail = agreement.update(_hypothesis("the quick brown fox jumps over"))
    assert _texts(agreement.stable) == "the quit brown fox jumps" and _texts(tail) == "over"
    tail = agreement.update(_hypothesis("the quick brown fox jumps over the"))
    assert _texts(agreement.stable) == "the quit brown fox jumps over" and _texts(tail) == "the"


def test_punctuation_and_case_do_not_count_as_disagreement():
    agreement = LocalAgreement()
    agreement.update(_hypothesis("What is... twelve"))
    agreement.update(_hypothesis("what is twelve times?"))
    assert _texts(agreement.stable) == "what is twelve"


def test_a_final_decode_is_settled_only_as_an_extension_of_the_stable_words():
    agreement = LocalAgreement()
    agreement.update(_hypothesis("i would like to"))
    agreement.update(_hypothesis("i would like to book"))
    assert _texts(agreement.stable) == "i would like to"
    settled = agreement.settled(_hypothesis("I would like to book a table."))
    assert settled is not None
    assert _texts(settled) == "i would like to book a table."  # stable words keep their spelling
    assert agreement.settled(_hypothesis("I wood like to book a table.")) is None  # a revision
