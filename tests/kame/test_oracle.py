"""The oracle feed schedule, oracle text tokenization and agent word timing."""

from __future__ import annotations

import pytest

from services.frontend.engines.kame import checkpoint
from services.frontend.engines.kame.oracle import OracleFeed
from services.frontend.engines.kame.text import WordAssembler, oracle_token_ids

INITIAL, PAD = 96, 3


def fed(feed: OracleFeed, steps: range) -> list[int]:
    return [feed.token_for(step) for step in steps]


def test_a_new_feed_has_no_oracle():
    feed = OracleFeed(INITIAL, PAD)
    assert not feed.has_oracle
    assert fed(feed, range(5)) == [PAD] * 5


def test_reset_anchors_the_oracle_at_the_next_step_then_pads():
    feed = OracleFeed(INITIAL, PAD)
    feed.reset(next_step=3)
    assert feed.append(next_step=3, tokens=[10, 11]) == 0
    assert fed(feed, range(8)) == [PAD, PAD, PAD, INITIAL, 10, 11, PAD, PAD]


def test_append_never_reanchors_and_late_tokens_are_skipped():
    feed = OracleFeed(INITIAL, PAD)
    feed.reset(next_step=2)
    feed.append(next_step=2, tokens=[10, 11, 12])  # steps 3, 4, 5
    late = feed.append(next_step=7, tokens=[13, 14, 15])  # steps 6 (passed), 7, 8
    assert late == 1
    assert fed(feed, range(7, 10)) == [14, 15, PAD]


def test_append_without_oracle_acts_as_reset_first():
    feed = OracleFeed(INITIAL, PAD)
    feed.append(next_step=4, tokens=[20, 21])
    assert fed(feed, range(3, 8)) == [PAD, INITIAL, 20, 21, PAD]


def test_reset_replaces_the_previous_oracle_and_clear_removes_it():
    feed = OracleFeed(INITIAL, PAD)
    feed.append(next_step=0, tokens=[20, 21, 22, 23])
    assert fed(feed, range(2)) == [INITIAL, 20]
    feed.reset(next_step=2)
    assert fed(feed, range(2, 5)) == [INITIAL, PAD, PAD]
    feed.clear()
    assert not feed.has_oracle and fed(feed, range(5)) == [PAD] * 5


@pytest.fixture(scope="module")
def tokenizer(tiny_checkpoint):
    return checkpoint.load_tokenizer(checkpoint.read(tiny_checkpoint))


def test_oracle_text_is_tokenized_whole_words(tokenizer):
    text = "the capital of france is paris"
    chunks = ["the capital", "of", "france is paris"]
    whole = oracle_token_ids(tokenizer, text)
    assert whole == tokenizer.encode(text)
    assert [t for chunk in chunks for t in oracle_token_ids(tokenizer, chunk)] == whole
    assert oracle_token_ids(tokenizer, "  ") == []


def test_words_are_timed_to_the_frames_their_pieces_were_spoken_in(tokenizer):
    words = WordAssembler(tokenizer, padding_ids=(PAD, 0))
    pieces = [tokenizer.encode(word) for word in ("paris", "moon")]
    got = []
    frame = 0
    for token in [PAD, *pieces[0], PAD, PAD, *pieces[1], None]:
        got += words.push(token, frame, generation=7)
        frame += 1
    assert [w.text for w in got] == ["paris", "moon"]
    first_end = 1 + len(pieces[0])
    assert got[0].start_s == pytest.approx(0.08)
    assert got[0].end_s == pytest.approx(first_end * 0.08)
    assert got[1].start_s == pytest.approx((first_end + 2) * 0.08)
    assert all(word.generation == 7 for word in got)
