"""The parts of a side stream that need no server: the drop-oldest buffer and
the reopening backoff. The stream itself (watchdog, reopening, notices) is
tested through whole sessions in test_session.py."""

from __future__ import annotations

import asyncio

import pytest

from services.gateway.sidestream import DropOldestBuffer, SidePolicy


async def test_a_full_buffer_drops_its_oldest_item_and_never_waits():
    buffer: DropOldestBuffer[int] = DropOldestBuffer(3)
    kept = [buffer.push(item) for item in range(5)]
    assert kept == [True, True, True, False, False]
    assert [await buffer.pop() for _ in range(3)] == [2, 3, 4]


async def test_pop_waits_for_an_item_and_ends_after_close():
    buffer: DropOldestBuffer[str] = DropOldestBuffer(2)
    waiting = asyncio.ensure_future(buffer.pop())
    await asyncio.sleep(0.01)
    assert not waiting.done()
    buffer.push("frame")
    assert await asyncio.wait_for(waiting, 1) == "frame"
    buffer.push("last")
    buffer.close()
    assert await buffer.pop() == "last"  # what was queued still goes out
    assert await buffer.pop() is None


def test_backoff_doubles_up_to_its_cap_with_jitter():
    policy = SidePolicy(buffer_size=1, timeout_s=2.0, backoff_s=0.5, backoff_max_s=4.0)
    for failures, nominal in ((1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (5, 4.0), (12, 4.0)):
        delays = [policy.backoff(failures) for _ in range(50)]
        assert all(0.8 * nominal <= d <= 1.2 * nominal for d in delays), (failures, delays)
        assert len(set(delays)) > 1  # jittered: reopenings of many sessions spread out


@pytest.mark.parametrize("size", [0, -1])
def test_a_buffer_holds_at_least_one_item(size):
    buffer: DropOldestBuffer[int] = DropOldestBuffer(size)
    assert buffer.push(1) and not buffer.push(2) and len(buffer) == 1
