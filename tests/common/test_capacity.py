"""Capacity from measurements (kame_common/capacity.py), on a fake clock."""

from __future__ import annotations

import pytest

from kame_common.capacity import LoadMeter, SessionCapacity
from tests.support.clock import FakeClock


def busy_for(meter: LoadMeter, clock: FakeClock, seconds: float) -> None:
    with meter.busy():
        clock.advance(seconds)


def test_utilization_is_the_busy_share_of_the_window_up_to_the_parallelism():
    clock = FakeClock(1000.0)
    meter = LoadMeter(parallelism=2, window_s=10.0, clock=clock)
    clock.advance(20.0)
    assert meter.utilization() == 0.0
    busy_for(meter, clock, 4.0)  # one of two workers for 4 s: 0.2 of the window
    clock.advance(1.0)
    assert meter.utilization() == pytest.approx(0.2)
    with meter.busy(), meter.busy(), meter.busy():  # three units on two workers: full
        clock.advance(5.0)
        # 4 s at half, 1 s idle, 5 s at full
        assert meter.utilization() == pytest.approx((4 * 0.5 + 5 * 1.0) / 10)
    clock.advance(10.0)
    assert meter.utilization() == 0.0  # the window has moved past all of it


def test_the_prior_sets_the_limit_until_sessions_are_measured():
    clock = FakeClock(1000.0)
    meter = LoadMeter(window_s=10.0, clock=clock)
    capacity = SessionCapacity(meter, prior_session_load=0.25, target_utilization=0.8, clock=clock)
    assert capacity.total_slots == 3  # 0.8 / 0.25
    capacity.sessions_changed(2)
    assert capacity.free_slots == 1
    capacity.sessions_changed(3)
    assert capacity.free_slots == 0


def test_measured_sessions_move_the_estimate_a_third_of_the_way_per_window():
    clock = FakeClock(1000.0)
    meter = LoadMeter(window_s=10.0, clock=clock)
    capacity = SessionCapacity(meter, prior_session_load=0.4, target_utilization=0.8, clock=clock)
    assert capacity.total_slots == 2
    capacity.sessions_changed(2)
    for _ in range(10):  # two sessions keep the resource a fifth busy: 0.1 each
        busy_for(meter, clock, 0.2)
        clock.advance(0.8)
    assert capacity.total_slots == 2  # 0.4 + (0.1 - 0.4) / 3 = 0.3 -> 0.8 / 0.3
    assert capacity.session_load == pytest.approx(0.3)
    for _ in range(60):
        busy_for(meter, clock, 0.2)
        clock.advance(0.8)
        capacity.total_slots  # noqa: B018 - reading folds in each window that passed
    assert capacity.session_load == pytest.approx(0.1 + 0.2 * (2 / 3) ** 6)  # six windows on
    assert capacity.total_slots == 6


def test_a_saturated_replica_has_no_free_slot_and_the_only_caller_always_fits():
    clock = FakeClock(1000.0)
    meter = LoadMeter(window_s=10.0, clock=clock)
    capacity = SessionCapacity(meter, prior_session_load=5.0, clock=clock)
    assert capacity.total_slots == 1  # even a session heavier than the whole resource
    assert capacity.free_slots == 1
    light = SessionCapacity(meter, prior_session_load=0.01, max_sessions=4, clock=clock)
    assert light.total_slots == 4  # the service's own hard limit caps the estimate
    light.sessions_changed(1)
    with meter.busy():
        clock.advance(9.0)
        assert light.free_slots == 0  # 90 % busy: over the 80 % target, whatever the estimate


def test_a_prior_must_be_positive():
    with pytest.raises(ValueError, match="prior_session_load"):
        SessionCapacity(LoadMeter(), prior_session_load=0.0)
