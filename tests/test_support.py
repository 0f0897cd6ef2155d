"""The test helpers' own rules, where a test's verdict depends on them."""

from tests.support import word_recall


def test_word_recall_counts_a_word_spelled_nearly_the_same():
    # As Whisper heard piper's answer in one full run.
    heard = "and, harris, ace of the capitol, a france."
    assert word_recall("Hmm, Paris is the capital of France.", heard) == 4 / 7


def test_word_recall_does_not_count_other_words():
    assert word_recall("Paris is the capital", "Harris was a cap") == 0.0
    assert word_recall("the capital of France", "") == 0.0
    assert word_recall("", "anything") == 1.0


def test_word_recall_wants_short_words_exactly():
    assert word_recall("of the", "off they") == 0.0
