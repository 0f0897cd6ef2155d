"""AnswerTimes (kame_common.answer_time): the answer-time bound on admission,
on an injected clock, and its effect on a replica's published capacity."""

from __future__ import annotations

import pytest

from kame_common.answer_time import DEFAULT_RETRY_AFTER_S, MIN_RETRY_AFTER_S, AnswerTimes
from kame_common.capacity import LoadMeter, SessionCapacity
from tests.support.clock import FakeClock


def measured(factor: float, unloaded_s: float, per_call: float, up_to: int) -> AnswerTimes:
    """Answers that grow by `per_call` x unloaded for each extra call held."""
    answers = AnswerTimes(factor)
    for _ in range(5):
        answers.answered(unloaded_s, 1)
    for calls in range(2, up_to + 1):
        answers.answered(unloaded_s * (1 + per_call * (calls - 1)), calls)
    return answers


def test_before_any_answer_there_is_no_limit() -> None:
    answers = AnswerTimes(1.5)
    assert answers.limit() is None and answers.admits(50)


def test_a_crowd_is_admitted_in_steps_as_its_answers_come_in() -> None:
    """Slow start: one caller at a time says nothing about a crowd, so answer time
    sets no limit until load was measured; then twice the calls measured is as
    far as a prediction goes."""
    answers = AnswerTimes(1.5)
    for _ in range(5):
        answers.answered(0.7, 1)
    assert answers.predicted_s(8) == pytest.approx(0.7)  # no growth measured yet
    assert answers.limit() is None and answers.admits(7)
    answers.answered(0.7, 2)  # two calls answered no slower
    assert answers.limit() == 4
    answers.answered(0.7, 4)
    assert answers.limit() == 8


def test_the_limit_keeps_the_predicted_median_within_the_factor() -> None:
    # Each extra call adds 10 % of an unloaded answer: 1.5x allows 1 + 0.5 / 0.1 calls.
    answers = measured(1.5, 0.7, 0.10, up_to=8)
    assert answers.growth() == pytest.approx(0.10)
    assert answers.limit() == 6
    assert answers.predicted_s(6) == pytest.approx(1.5 * 0.7)
    assert answers.admits(5) and not answers.admits(6)


def test_a_looser_factor_admits_more() -> None:
    assert measured(2.0, 0.7, 0.10, 8).limit() == 11
    assert measured(1.0, 0.7, 0.10, 8).limit() == 1  # one call is always admitted


def test_the_growth_is_a_median_so_one_slow_answer_does_not_close_the_doors() -> None:
    answers = measured(1.5, 0.7, 0.10, up_to=8)
    answers.answered(30.0, 2)  # one stall (a cold prompt, a page fault storm)
    assert answers.limit() == 6


def test_answers_that_do_not_slow_with_load_are_limited_by_the_calls_measured_only() -> None:
    assert measured(1.5, 0.7, 0.0, up_to=8).limit() == 16


def test_before_any_unloaded_answer_the_fastest_one_stands_in() -> None:
    answers = AnswerTimes(1.5)
    answers.answered(1.0, 2)
    answers.answered(2.0, 4)
    assert answers.unloaded_s() == 1.0  # errs towards refusing
    assert answers.limit() == 4  # growth: median of 0 and 1/3, 1/6


def test_nonsense_answers_are_ignored() -> None:
    answers = AnswerTimes(1.5)
    for seconds, calls in ((float("nan"), 2), (-1.0, 2), (0.0, 3), (1.0, 0)):
        answers.answered(seconds, calls)
    assert answers.unloaded_s() is None and answers.limit() is None


def test_factor_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="factor"):
        AnswerTimes(0.5)


def test_retry_after_is_when_the_oldest_held_call_is_expected_to_end() -> None:
    clock = FakeClock()
    answers = AnswerTimes(1.5, clock=clock)
    assert answers.retry_after_s() == DEFAULT_RETRY_AFTER_S  # nothing has ended yet
    for _ in range(3):  # calls of 20 s
        number = answers.call_started()
        clock.now += 20
        answers.call_ended(number)
    first = answers.call_started()
    clock.now += 5
    answers.call_started()
    clock.now += 3
    assert answers.calls_held == 2
    assert answers.retry_after_s() == pytest.approx(12.0)  # the first is 8 s into its 20
    clock.now += 30
    assert answers.retry_after_s() == MIN_RETRY_AFTER_S  # overdue: any moment now
    answers.call_ended(first)
    assert answers.calls_held == 1


def test_the_bound_caps_a_replicas_published_sessions() -> None:
    clock = FakeClock()
    meter = LoadMeter(parallelism=1, window_s=10.0, clock=clock)
    answers = AnswerTimes(1.5)
    capacity = SessionCapacity(meter, 0.01, 0.8, clock=clock, answers=answers)
    assert capacity.total_slots == 80  # utilization alone: 0.8 / 0.01

    def work(seconds: float, sessions: int) -> None:
        capacity.sessions_changed(sessions)
        with meter.busy():
            clock.now += seconds

    for _ in range(3):
        work(0.4, 1)
    work(0.6, 3)  # 0.25 of an unloaded answer per extra session
    assert answers.limit() == 3
    assert capacity.total_slots == 3
    capacity.sessions_changed(3)
    assert capacity.free_slots == 0


def test_a_meter_whose_work_is_not_the_answer_reports_only_what_it_is_told() -> None:
    """The oracle: an LLM request's whole stream is not what its caller waits for,
    its first token is."""
    clock = FakeClock()
    meter = LoadMeter(parallelism=1, window_s=10.0, clock=clock, busy_is_answer=False)
    answers = AnswerTimes(1.5)
    SessionCapacity(meter, 0.01, 0.8, clock=clock, answers=answers).sessions_changed(1)
    with meter.busy():
        clock.now += 3.0  # a long stream
        meter.answered(0.4)  # its first token
    assert answers.unloaded_s() == pytest.approx(0.4)
