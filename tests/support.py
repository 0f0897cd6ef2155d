"""Helpers every test module may use."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable


async def wait_until(
    condition: Callable[[], bool | Awaitable[bool]],
    what: str,
    timeout_s: float = 10.0,
    interval_s: float = 0.02,
) -> None:
    """Poll `condition` (plain or async) until it is true; AssertionError naming
    `what` if it is still false after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = condition()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        await asyncio.sleep(interval_s)
