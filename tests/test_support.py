"""The test helpers' own rules, where a test's verdict depends on them."""

from tests.support import letter_similarity, voice_says, word_recall


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


def test_a_voice_says_its_words_across_word_boundaries_whisper_moved():
    # As Whisper heard piper's answer in one full CI run: word recall 3/7.
    said = "The capital is Quorvan, by the old river."
    assert voice_says(said, "the capitalist corbin ideal river.")
    assert word_recall(said, "the capitalist corbin ideal river.") < 0.5


def test_a_voice_saying_something_else_or_half_does_not_say_the_words():
    said = "The capital is Quorvan, by the old river."
    assert not voice_says(said, "One moment, let me check.")
    assert not voice_says(said, "The capital is")
    assert not voice_says(said, "")
    assert letter_similarity("Paris", "paris!") == 1.0


def test_a_voice_that_goes_on_past_the_collected_words_says_them():
    # As the GPT-Live delegation test collected them in one full run: the text
    # deltas stopped at "the", the audio went on.
    assert voice_says("Hmm, Paris is the", "and, harris is the capital of france.")
