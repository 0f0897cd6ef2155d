"""Small asyncio helpers that every service needs the same way."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any


async def cancel_and_wait(tasks: asyncio.Future[Any] | Iterable[asyncio.Future[Any]]) -> None:
    """Cancel `tasks` and wait until every one has finished, whatever it raises.

    A task that is already done is only awaited. The exceptions of the tasks are
    retrieved (so asyncio does not log them as never retrieved) and dropped: the
    caller is tearing down and has nothing left to do with them. If the caller
    itself is cancelled while waiting, the tasks are still cancelled and it
    re-raises."""
    pending = [tasks] if isinstance(tasks, asyncio.Future) else list(tasks)
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)


async def wait_first(*waitables: asyncio.Event | asyncio.Future[Any]) -> None:
    """Until one of `waitables` is set (an event) or done (a future), whichever
    comes first. The futures are only watched, never cancelled."""
    watchers: set[asyncio.Future[Any]] = {
        asyncio.ensure_future(w.wait()) if isinstance(w, asyncio.Event) else w for w in waitables
    }
    try:
        await asyncio.wait(watchers, return_when=asyncio.FIRST_COMPLETED)
    finally:
        own = [w for w in watchers if w not in waitables]
        await cancel_and_wait(own)


def abandon(task: asyncio.Future[Any]) -> None:
    """Cancel `task` without waiting for it to end.

    For a task that may never honour the cancellation: redis-py (8.1) can swallow
    a CancelledError that lands inside a command, and `cancel_and_wait` on such a
    task can wait forever. Its exception is retrieved when it ends, so asyncio does
    not log it as never retrieved: whoever abandoned it has moved on."""
    task.cancel()
    task.add_done_callback(_retrieve)


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()
