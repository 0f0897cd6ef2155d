"""The shared asyncio helpers: cancel_and_wait and wait_first."""

from __future__ import annotations

import asyncio

from kame_common.aio import cancel_and_wait, wait_first


async def test_wait_first_returns_on_an_event_and_leaves_the_futures_running():
    event = asyncio.Event()
    other = asyncio.ensure_future(asyncio.sleep(10))
    waiting = asyncio.ensure_future(wait_first(event, other))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    event.set()
    await asyncio.wait_for(waiting, 1)
    assert not other.done()  # watched, not cancelled
    await cancel_and_wait(other)


async def test_wait_first_returns_when_a_future_is_done_and_stops_watching_events():
    event = asyncio.Event()
    done = asyncio.ensure_future(asyncio.sleep(0))
    before = len(asyncio.all_tasks())
    await asyncio.wait_for(wait_first(event, done), 1)
    assert done.done() and not event.is_set()
    assert len(asyncio.all_tasks()) <= before  # no watcher of the event left behind
