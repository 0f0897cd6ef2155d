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
