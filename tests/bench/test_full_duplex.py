"""Full-Duplex-Bench v1's figures (kame_cli/bench/full_duplex.py) on timelines made by
hand, where the answer is known by construction."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kame_cli.bench import full_duplex as fdb
from kame_cli.bench.full_duplex import Sample, Speech, Task
from kame_client.caller import speech_intervals
from kame_common.audio import SAMPLE_RATE

# A caller who says a sentence, pauses 0.8 s mid-sentence, and finishes at 4.0 s.
PAUSED = (Speech(0.0, 2.0), Speech(2.8, 4.0))


def sample(task: Task, agent: tuple[Speech, ...], caller=PAUSED, duration_s=10.0, **kw) -> Sample:
    return Sample(task, duration_s, caller, agent, **kw)


# -- takes the turn --------------------------------------------------------------------


def test_a_second_of_speech_takes_the_turn_and_less_does_not():
    assert fdb.takes_turn([Speech(3.0, 4.0)])
    assert not fdb.takes_turn([Speech(3.0, 3.9)])
    assert not fdb.takes_turn([])


def test_the_span_runs_from_the_first_start_to_the_last_end_across_gaps():
    assert fdb.takes_turn([Speech(3.0, 3.3), Speech(3.8, 4.1)])  # 1.1 s from first to last


def test_more_than_three_words_take_the_turn_in_under_a_second():
    assert fdb.takes_turn([Speech(3.0, 3.6, words=4)])
    assert not fdb.takes_turn([Speech(3.0, 3.6, words=3)])
    # one interval's count unknown: the words clause is not used
    assert not fdb.takes_turn([Speech(3.0, 3.3, words=4), Speech(3.4, 3.6)])


# -- pause handling ----------------------------------------------------------------------


def test_talking_in_the_pause_is_a_take_over():
    assert fdb.score(sample(Task.PAUSE, (Speech(2.1, 3.4),))).took_turn


def test_a_short_backchannel_in_the_pause_is_not():
    assert not fdb.score(sample(Task.PAUSE, (Speech(2.2, 2.6),))).took_turn


def test_no_agent_speech_is_not():
    score = fdb.score(sample(Task.PAUSE, ()))
    assert not score.took_turn
    assert score.latency_s is None


def test_speech_after_the_recording_ends_is_not_scored():
    # FDB's output is as long as its input: an answer after 4.5 s is cut to 0.3 s
    assert not fdb.score(sample(Task.PAUSE, (Speech(4.2, 6.0),), duration_s=4.5)).took_turn


# -- smooth turn-taking -----------------------------------------------------------------


def test_an_answer_0_3_s_after_the_caller_ends_has_latency_0_3():
    score = fdb.score(sample(Task.SMOOTH, (Speech(4.3, 6.0),)))
    assert score.took_turn
    assert score.latency_s == pytest.approx(0.3)


def test_an_answer_that_starts_over_the_caller_has_latency_0():
    score = fdb.score(sample(Task.SMOOTH, (Speech(3.8, 6.0),)))
    assert score.took_turn
    assert score.latency_s == 0.0


def test_no_answer_has_no_latency_and_no_turn():
    score = fdb.score(sample(Task.SMOOTH, (Speech(4.3, 4.7),)))
    assert (score.took_turn, score.latency_s) == (False, None)


# -- user interruption -----------------------------------------------------------------

# The caller asks (0-2 s), the agent answers, the caller interrupts (5.0-6.0 s).
INTERRUPTED = (Speech(0.0, 2.0), Speech(5.0, 6.0))


def test_an_agent_that_stops_and_answers_0_4_s_after_the_interruption():
    agent = (Speech(2.5, 5.2), Speech(6.4, 8.0))
    score = fdb.score(sample(Task.INTERRUPTION, agent, caller=INTERRUPTED))
    assert score.took_turn
    assert score.latency_s == pytest.approx(0.4)


def test_an_agent_that_talks_through_the_interruption_scores_latency_0():
    score = fdb.score(sample(Task.INTERRUPTION, (Speech(2.5, 9.0),), caller=INTERRUPTED))
    assert (score.took_turn, score.latency_s) == (True, 0.0)


def test_an_agent_that_stops_and_only_says_okay_does_not_take_the_turn():
    agent = (Speech(2.5, 5.2), Speech(6.2, 6.6))
    score = fdb.score(sample(Task.INTERRUPTION, agent, caller=INTERRUPTED))
    assert not score.took_turn


# -- backchannel -------------------------------------------------------------------------


def test_short_segments_are_backchannels_counted_per_second():
    agent = (Speech(1.0, 1.4), Speech(4.0, 4.5), Speech(7.0, 7.3))
    score = fdb.score(sample(Task.BACKCHANNEL, agent))
    assert (score.took_turn, score.backchannels) == (False, 3)
    assert score.frequency_hz == pytest.approx(0.3)
    assert score.jsd is None  # no reference given


def test_a_long_segment_is_a_turn_and_not_a_backchannel():
    agent = (Speech(1.0, 1.4), Speech(4.0, 5.5), Speech(7.0, 7.3))
    score = fdb.score(sample(Task.BACKCHANNEL, agent))
    assert (score.took_turn, score.backchannels) == (True, 2)


def test_a_short_segment_with_three_words_is_a_turn():
    score = fdb.score(sample(Task.BACKCHANNEL, (Speech(1.0, 1.6, words=3),)))
    assert (score.took_turn, score.backchannels) == (True, 0)


def test_backchannel_bins_cover_each_segment_from_start_to_end():
    bins = fdb.backchannel_bins([Speech(0.1, 0.5), Speech(0.45, 0.5)], 1.0)
    assert bins.tolist() == [1, 1, 2, 0, 0, 0]  # 0.45-0.5 s: bin 2 only


def test_js_distance_is_0_for_the_same_shape_and_sqrt_ln2_for_disjoint():
    assert fdb.js_distance(np.array([0.0, 2.0, 2.0, 0.0]), [0, 1, 1, 0]) == pytest.approx(
        0, abs=1e-4
    )
    disjoint = fdb.js_distance(np.array([1.0, 1.0, 0.0, 0.0]), [0, 0, 1, 1])
    assert disjoint == pytest.approx(math.sqrt(math.log(2)), abs=1e-4)


def test_js_distance_stretches_the_reference_to_the_observed_bins():
    # the same step, 2 reference bins against 4 observed: only the interpolated middle differs
    assert fdb.js_distance(np.array([1.0, 1.0, 0.0, 0.0]), [1, 0]) < 0.5


def test_backchannels_where_people_made_them_score_a_low_jsd():
    reference = tuple(fdb.backchannel_bins([Speech(2.0, 2.4), Speech(6.0, 6.4)], 10.0))
    here = fdb.score(
        sample(Task.BACKCHANNEL, (Speech(2.0, 2.4), Speech(6.0, 6.4)), reference=reference)
    )
    elsewhere = fdb.score(
        sample(Task.BACKCHANNEL, (Speech(8.0, 8.4), Speech(9.0, 9.4)), reference=reference)
    )
    none = fdb.score(sample(Task.BACKCHANNEL, (Speech(3.0, 5.0),), reference=reference))
    assert here.jsd == pytest.approx(0, abs=1e-3)
    assert elsewhere.jsd is not None and elsewhere.jsd > 0.8
    assert none.jsd == 1.0


# -- figures, targets, table ----------------------------------------------------------


def test_aggregate_averages_latency_over_the_turns_taken_only():
    scores = [
        fdb.score(sample(Task.SMOOTH, (Speech(4.2, 6.0),))),
        fdb.score(sample(Task.SMOOTH, (Speech(4.6, 6.0),))),
        fdb.score(sample(Task.SMOOTH, ())),
        fdb.score(sample(Task.PAUSE, (Speech(2.1, 3.4),))),
    ]
    figures = fdb.aggregate(scores)
    smooth = figures[Task.SMOOTH]
    assert (smooth.samples, smooth.tor) == (3, pytest.approx(2 / 3, abs=1e-4))
    assert smooth.latency_mean_s == pytest.approx(0.4)
    assert figures[Task.PAUSE].tor == 1.0
    assert Task.BACKCHANNEL not in figures


def test_targets_of_issue_44():
    quick = fdb.aggregate(
        [
            fdb.score(sample(Task.SMOOTH, (Speech(4.3, 6.0),))),
            fdb.score(sample(Task.PAUSE, ())),
        ]
    )
    assert fdb.meets_targets(quick) == {
        "smooth_latency_s": True,
        "interruption_latency_s": None,
        "pause_tor": True,
    }
    slow = fdb.aggregate([fdb.score(sample(Task.SMOOTH, (Speech(4.4, 6.0),)))])
    assert fdb.meets_targets(slow)["smooth_latency_s"] is False


def test_the_table_puts_our_row_above_the_published_ones():
    figures = fdb.aggregate([fdb.score(sample(Task.SMOOTH, (Speech(4.3, 6.0),)))])
    lines = fdb.render_table("kame tandem", figures)
    rows = [line for line in lines if line.startswith("| ")]
    header, ours, *published = rows
    assert header.count(" | ") == ours.count(" | ") == published[0].count(" | ") == 9
    assert ours == "| **kame tandem** | - | - | - | - | 1.000 | 0.300 | - | - | - |"
    assert published[0].startswith("| Moshi | 0.985 / 0.980 | 1.000 | 0.001 | 0.957 |")
    assert [row.split(" | ")[0][2:] for row in published] == list(fdb.PUBLISHED)


# -- from audio ---------------------------------------------------------------------------


def tone(seconds: float) -> np.ndarray:
    t = np.arange(round(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    return (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


def quiet(seconds: float) -> np.ndarray:
    return np.zeros(round(seconds * SAMPLE_RATE), np.float32)


def test_speech_intervals_join_short_gaps_and_drop_clicks():
    audio = np.concatenate([tone(0.5), quiet(0.06), tone(0.5), quiet(0.5), tone(0.1), quiet(1)])
    assert speech_intervals(audio) == [
        pytest.approx((0.0, 1.06), abs=0.021),
        pytest.approx((1.56, 1.66), abs=0.021),
    ]
    assert len(speech_intervals(audio, min_s=0.25)) == 1
    assert speech_intervals(quiet(1)) == []


def test_a_sample_from_audio_times_the_answer_by_level():
    caller = np.concatenate([tone(1.0), quiet(0.8), tone(1.0), quiet(3.2)])
    agent = np.concatenate([quiet(3.1), tone(1.5), quiet(1.4)])
    made = fdb.sample_from_audio(Task.SMOOTH, caller, agent)
    assert made.duration_s == pytest.approx(6.0)
    assert len(made.caller) == 2
    assert made.caller_end_s == pytest.approx(2.8, abs=0.021)
    assert fdb.score(made).latency_s == pytest.approx(0.3, abs=0.041)


def test_the_agents_words_are_counted_in_the_stretch_they_start_in():
    caller = np.concatenate([tone(1.0), quiet(2.0)])
    agent = np.concatenate([quiet(1.2), tone(0.6), quiet(1.2)])  # 0.6 s: no turn by length
    quick = fdb.sample_from_audio(Task.SMOOTH, caller, agent, words_at=[1.15, 1.3, 1.5, 1.7])
    assert [s.words for s in quick.agent] == [4]
    assert fdb.score(quick).took_turn  # 4 words in under a second
    two = fdb.sample_from_audio(Task.SMOOTH, caller, agent, words_at=[1.3, 2.5])
    assert [s.words for s in two.agent] == [1]
    assert not fdb.score(two).took_turn


def test_an_annotated_end_of_turn_wins_over_the_level():
    caller = np.concatenate([tone(1.0), quiet(2.0)])
    agent = np.concatenate([quiet(1.5), tone(1.5)])
    made = fdb.sample_from_audio(Task.SMOOTH, caller, agent, end_s=1.2)
    assert fdb.score(made).latency_s == pytest.approx(0.3, abs=0.021)
