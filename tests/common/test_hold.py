"""kame_common/hold.py: the one home of the hold's limits and default, which the
gateway and the frontend both check with."""

from __future__ import annotations

import math

import pytest

from kame_common.hold import (
    DEFAULT_HOLD_MAX_S,
    MAX_HOLD_MAX_S,
    MAX_HOLD_PHRASE_CHARS,
    MAX_HOLD_PHRASES,
    check_hold_delay_s,
    check_hold_max_s,
    hold_phrases,
    split_hold_phrases,
)


def test_phrases_are_collapsed_and_empty_ones_dropped():
    assert hold_phrases(["  Hmm, ", "", "Let \t me  see,", "   "]) == ("Hmm,", "Let me see,")
    assert split_hold_phrases("Hmm,| Let me see, |") == ("Hmm,", "Let me see,")
    assert split_hold_phrases("") == ()


def test_phrases_up_to_the_limits_pass_and_past_them_fail_naming_the_field():
    at_limit = ["x" * MAX_HOLD_PHRASE_CHARS] * MAX_HOLD_PHRASES
    assert hold_phrases(at_limit) == tuple(at_limit)
    with pytest.raises(ValueError, match=r"^hold\.phrases: at most 8 phrases, got 9$"):
        hold_phrases(["Hmm,"] * (MAX_HOLD_PHRASES + 1), "hold.phrases")
    with pytest.raises(ValueError, match=r"^hold_phrases: at most 60 characters each"):
        hold_phrases(["x" * (MAX_HOLD_PHRASE_CHARS + 1)])


@pytest.mark.parametrize("value", [0.0, 0.5, DEFAULT_HOLD_MAX_S, MAX_HOLD_MAX_S])
def test_a_hold_time_in_range_is_kept_as_given(value):
    assert check_hold_max_s(value) == value  # 0 stays 0: the frontend applies the default


@pytest.mark.parametrize("value", [-0.1, MAX_HOLD_MAX_S + 0.1, math.inf, math.nan])
def test_a_hold_time_out_of_range_fails_naming_the_field(value):
    with pytest.raises(ValueError, match=r"^hold\.max_s: must be 0 \(the default, 5 s\) to 10"):
        check_hold_max_s(value, "hold.max_s")


@pytest.mark.parametrize("value", [0.0, 0.4, MAX_HOLD_MAX_S])
def test_a_hold_delay_up_to_the_longest_hold_is_kept(value):
    assert check_hold_delay_s(value) == value


@pytest.mark.parametrize("value", [-0.1, MAX_HOLD_MAX_S + 0.1, math.nan])
def test_a_hold_delay_out_of_range_fails_naming_the_field(value):
    with pytest.raises(ValueError, match=r"^hold\.delay_s: must be 0 \(at once\) to 10 seconds"):
        check_hold_delay_s(value, "hold.delay_s")
