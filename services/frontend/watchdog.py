"""The engine watchdog: a replica whose engine stopped ticking says so in its health.

Every caller frame is one engine step (one model tick for a batched engine).
A step that has not come back after `stall_s` means the engine is wedged (a
hung model thread or device, a ticker that died): the replica turns
NOT_SERVING, so that probes and load balancers take it out of rotation,
and back to SERVING once steps complete again. With no session open no step
is owed, so an idle replica is never a stalled one. The watchdog runs on the
event loop: an engine that blocks the loop itself blocks the health service
too, which probes see as a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Iterator

from kame_common.aio import cancel_and_wait
from kame_common.server import ServiceRuntime
from services.frontend import metrics

log = logging.getLogger(__name__)


class EngineWatchdog:
    def __init__(self, runtime: ServiceRuntime, stall_s: float) -> None:
        self._runtime = runtime
        self.stall_s = stall_s
        self._pending: dict[int, float] = {}  # step id -> when it started (monotonic)
        self._ids = itertools.count()
        self.stalled = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Watch until the runtime closes (no-op when stall_s is 0)."""
        if self.stall_s > 0:
            self._task = asyncio.get_running_loop().create_task(self._watch(), name="watchdog")
            self._runtime.on_close(self.stop)

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """Around one engine step."""
        step_id = next(self._ids)
        self._pending[step_id] = time.monotonic()
        try:
            yield
        finally:
            del self._pending[step_id]

    def oldest_step_s(self) -> float:
        """How long the oldest step in the engine has been waiting (0: none)."""
        if not self._pending:
            return 0.0
        return time.monotonic() - min(self._pending.values())

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.stall_s / 4)
            stalled = self.oldest_step_s() > self.stall_s
            if stalled == self.stalled:
                continue
            self.stalled = stalled
            metrics.ENGINE_STALLED.set(int(stalled))
            if stalled:
                log.error("engine step waiting for over %g s: NOT_SERVING", self.stall_s)
            else:
                log.warning("engine steps complete again: SERVING")
            await self._runtime.set_serving(not stalled)
