"""The shared decode queue: finals first, one waiting partial per session, cancellation,
batches. The requests here are callables, run by a batch runner that calls each."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client import REGISTRY

from services.stt.scheduler import DecodeScheduler


def _run_each(jobs: list[Callable[[], Any]]) -> list[Any]:
    return [job() for job in jobs]


def _scheduler(workers: int, max_batch: int = 1) -> DecodeScheduler:
    return DecodeScheduler(workers, _run_each, max_batch=max_batch, name="test-decode")


def _superseded() -> float:
    return (
        REGISTRY.get_sample_value("kame_stt_partials_skipped_total", {"reason": "superseded"})
        or 0.0
    )


@pytest.fixture
def blocked_scheduler():
    """One worker, held busy until `release` is set, so jobs pile up in the queue."""
    scheduler = _scheduler(workers=1)
    release = threading.Event()
    busy = scheduler.submit_final("blocker", release.wait)
    while not busy.running():
        time.sleep(0.001)
    yield scheduler, release
    release.set()
    scheduler.close()


def test_finals_run_before_partials_and_newer_partials_replace_waiting_ones(blocked_scheduler):
    scheduler, release = blocked_scheduler
    order: list[str] = []
    skipped = _superseded()
    old_a = scheduler.submit_partial("a", lambda: order.append("partial a1"))
    scheduler.submit_partial("b", lambda: order.append("partial b"))
    new_a = scheduler.submit_partial("a", lambda: order.append("partial a2"))
    final = scheduler.submit_final("a", lambda: order.append("final a") or "text")
    assert scheduler.depth == 3 and old_a.cancelled()
    assert _superseded() == skipped + 1
    release.set()
    assert final.result(timeout=5) == "text"
    new_a.result(timeout=5)
    assert order == ["final a", "partial b", "partial a2"]


def test_withdrawn_and_cancelled_jobs_never_run(blocked_scheduler):
    scheduler, release = blocked_scheduler
    ran: list[str] = []
    partial = scheduler.submit_partial("a", lambda: ran.append("partial"))
    final_a = scheduler.submit_final("a", lambda: ran.append("final a"))
    final_b = scheduler.submit_final("b", lambda: ran.append("final b"))
    assert scheduler.withdraw_partial("a") and not scheduler.withdraw_partial("a")
    scheduler.cancel_owner("a")
    assert partial.cancelled() and final_a.cancelled() and scheduler.depth == 1
    release.set()
    final_b.result(timeout=5)
    assert ran == ["final b"]


def test_an_exception_reaches_whoever_waits_and_the_worker_goes_on():
    scheduler = _scheduler(workers=2)
    try:
        failed = scheduler.submit_final("a", lambda: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            failed.result(timeout=5)
        assert scheduler.submit_partial("a", lambda: 42).result(timeout=5) == 42
    finally:
        scheduler.close()
    with pytest.raises(RuntimeError, match="closed"):
        scheduler.submit_final("a", lambda: None)


def _wait_running(future) -> None:
    while not future.running():
        time.sleep(0.001)


def test_partials_leave_a_worker_free_for_finals_and_run_one_per_session():
    scheduler = _scheduler(workers=3)
    release = threading.Event()
    try:
        # Three workers: partials may hold two of them, one running per session.
        running_a = scheduler.submit_partial("a", release.wait)
        _wait_running(running_a)
        waiting_a = scheduler.submit_partial("a", release.wait)
        running_b = scheduler.submit_partial("b", release.wait)
        _wait_running(running_b)
        waiting_c = scheduler.submit_partial("c", release.wait)
        time.sleep(0.05)
        assert not waiting_a.running() and not waiting_c.running()
        # The third worker stays free for a final, even with partials waiting.
        assert scheduler.submit_final("c", lambda: "final").result(timeout=5) == "final"
        release.set()
        for future in (running_a, waiting_a, running_b, waiting_c):
            future.result(timeout=5)
    finally:
        release.set()
        scheduler.close()


def test_a_round_decodes_what_waits_in_one_batch_finals_apart_from_partials():
    batches: list[list[str]] = []
    release = threading.Event()

    def run(requests: list[str]) -> list[str]:
        if requests == ["blocker"]:
            release.wait()
        batches.append(requests)
        return [f"text of {r}" for r in requests]

    scheduler = DecodeScheduler(1, run, max_batch=3, name="test-decode")
    try:
        busy = scheduler.submit_final("x", "blocker")
        _wait_running(busy)
        partial_a = scheduler.submit_partial("a", "partial a")
        partial_b = scheduler.submit_partial("b", "partial b")
        partial_x = scheduler.submit_partial("x", "partial x")
        final_c = scheduler.submit_final("c", "final c")
        final_d = scheduler.submit_final("d", "final d")
        cancelled = scheduler.submit_final("e", "final e")
        scheduler.cancel(cancelled)
        release.set()
        assert final_c.result(timeout=5) == "text of final c"
        assert partial_b.result(timeout=5) == "text of partial b"
        assert busy.result(timeout=5) == "text of blocker"
    finally:
        release.set()
        scheduler.close()
    # The round after the blocker: the finals, alone; then the partials together.
    assert batches[1] == ["final c", "final d"]
    assert batches[2] == ["partial a", "partial b", "partial x"]
    assert batches[3:] == []  # max_batch 3: all of them in one round
    assert partial_a.result() == "text of partial a" and final_d.done() and partial_x.done()


def test_a_failed_batch_fails_every_request_in_it():
    def run(requests: list[str]) -> list[str]:
        raise RuntimeError("decoder fell over")

    scheduler = DecodeScheduler(1, run, max_batch=4, name="test-decode")
    try:
        futures = [scheduler.submit_final(owner, owner) for owner in "abc"]
        for future in futures:
            with pytest.raises(RuntimeError, match="fell over"):
                future.result(timeout=5)
    finally:
        scheduler.close()
