"""A session's side streams (stt and oracle): fed without waiting, watched, reopened.

The voice path (caller -> frontend -> caller) never waits on a side stream:

- Requests go into a `DropOldestBuffer`. When it is full the oldest request
  is dropped (counted in kame_gateway_dropped_messages_total{queue=<stream>}):
  for a stream that lags, the newest audio and text are worth the most.
- While caller audio flows, a side stream must answer something within
  `timeout_s` of the first caller frame since its last answer. Anything
  counts; the stt's SttProgress and the oracle's HEARTBEAT come regularly
  even while nobody speaks. A stream that sends nothing for that long has
  failed, even when its connection stays open (a stopped or wedged process).
- A failed stream (an error, an early end, a stall) is cancelled and, after a
  backoff that doubles from `backoff_s` up to `backoff_max_s` (with jitter, so
  that the sessions of a restarted service do not all call back at once),
  opened again: a fresh call with a fresh config. Requests that waited for
  the failed call are dropped with it, and requests made while no call is
  open are discarded; what the new call must not miss, the session hands
  the opener to send first, after the config (replay.py). The backoff
  starts over once a reopened stream answers.
- The session hears of every change (`on_down` after a failure, which may
  refuse the reopening; `on_up` when a reopened stream first answers), so it
  can tell the client.

Once the caller is done (`close_input`), a stream that fails is not reopened:
there is nothing left to send it.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import random
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import grpc

from kame_common.aio import cancel_and_wait
from services.gateway import metrics
from services.gateway.upstream import StreamCall

log = logging.getLogger(__name__)

T = TypeVar("T")
RequestT = TypeVar("RequestT")


class DropOldestBuffer(Generic[T]):
    """A bounded FIFO whose `push` never waits: when full, the oldest item goes."""

    def __init__(self, size: int) -> None:
        self._items: collections.deque[T] = collections.deque()
        self._size = max(1, size)
        self._changed = asyncio.Event()
        self.closed = False

    def __len__(self) -> int:
        return len(self._items)

    def push(self, item: T) -> bool:
        """Add `item`; False if the oldest item had to be dropped for it."""
        kept_all = len(self._items) < self._size
        if not kept_all:
            self._items.popleft()
        self._items.append(item)
        self._changed.set()
        return kept_all

    def clear(self) -> None:
        self._items.clear()

    def close(self) -> None:
        """No more items: `pop` returns None once the buffer is empty."""
        self.closed = True
        self._changed.set()

    async def pop(self) -> T | None:
        """The oldest item, waiting for one; None once closed and empty."""
        while not self._items:
            if self.closed:
                return None
            self._changed.clear()
            await self._changed.wait()
        return self._items.popleft()


@dataclass(frozen=True)
class SidePolicy:
    """How a side stream is fed, watched and reopened."""

    buffer_size: int  # requests waiting for the call, at most
    timeout_s: float  # no answer this long while caller audio flows = failed (0: unwatched)
    backoff_s: float  # wait before the first reopening
    backoff_max_s: float  # the longest wait between reopenings

    def backoff(self, failures: int) -> float:
        """Seconds to wait before reopening after `failures` failures in a row."""
        delay: float = min(self.backoff_s * 2.0 ** max(failures - 1, 0), self.backoff_max_s)
        return delay * random.uniform(0.8, 1.2)


class SideStreamStalled(RuntimeError):
    """The stream sent nothing for timeout_s while caller audio flowed."""


class SideStreamEnded(RuntimeError):
    """The upstream ended its stream before the caller was done."""


# A fresh call of the upstream and what opens it, for attempt n (0 first): the
# config, then whatever the call must see before the requests pushed from now on.
Opener = Callable[[int], tuple[StreamCall[RequestT], list[RequestT]]]
Spawn = Callable[[str, Coroutine[Any, Any, None]], asyncio.Task[None]]


class SideStream(Generic[RequestT]):
    def __init__(
        self,
        name: str,
        policy: SidePolicy,
        open_call: Opener[RequestT],
        handle: Callable[[Any], Awaitable[None]],
        on_down: Callable[[SideStream[RequestT], Exception], Awaitable[bool]],
        on_up: Callable[[SideStream[RequestT]], Awaitable[None]],
    ) -> None:
        self.name = name
        self.policy = policy
        self._open_call = open_call
        self._handle = handle
        self._on_down = on_down
        self._on_up = on_up
        self._buffer: DropOldestBuffer[RequestT] = DropOldestBuffer(policy.buffer_size)
        self.up = True  # answering (or not failed yet): the session counts on it
        self._accepting = False  # a call is open (or opening): requests are kept
        self._waiting_since: float | None = None  # first caller frame since the last answer
        self._spawn: Spawn | None = None
        self.task: asyncio.Task[None] | None = None

    # ---- what the session calls ------------------------------------------------

    def start(self, spawn: Spawn) -> None:
        self._spawn = spawn
        self._accepting = True  # the first call opens as soon as the task runs
        self.task = spawn(self.name, self._run())

    def push(self, request: RequestT) -> bool:
        """Queue a request without waiting (dropping the oldest when full); False
        when it was discarded because no call is open (or after close_input)."""
        if not self._accepting or self._buffer.closed:
            return False
        if not self._buffer.push(request):
            metrics.DROPPED_MESSAGES.labels(self.name).inc()
        return True

    def audio_flowing(self) -> None:
        """A caller frame arrived: from now on the stream owes an answer."""
        if self._accepting and self._waiting_since is None:
            self._waiting_since = time.monotonic()

    def close_input(self) -> None:
        """The caller is done: the call is half-closed after the queued requests."""
        self._buffer.close()

    @property
    def input_closed(self) -> bool:
        return self._buffer.closed

    async def wait_finished(self, timeout_s: float) -> None:
        """Wait (at most timeout_s) until the stream has ended."""
        if self.task is not None:
            await asyncio.wait({self.task}, timeout=timeout_s)

    # ---- the stream's life -----------------------------------------------------

    async def _run(self) -> None:
        """Serve calls until one ends normally; reopen failed ones with backoff."""
        attempt, failures = 0, 0
        while True:
            call, opening = self._open_call(attempt)
            self._accepting = True  # with no await since the call was made
            self._waiting_since = None
            try:
                await self._serve(call, opening)
                return
            except Exception as exc:  # any failure of the call or of our handling of it
                failure = exc
            finally:
                self._accepting = False
                self._buffer.clear()
                call.cancel()
            if self.up:
                failures = 0
            self.up = False
            failures += 1
            metrics.UPSTREAM_FAILURES.labels(self.name).inc()
            if not await self._on_down(self, failure) or self.input_closed:
                return
            await asyncio.sleep(self.policy.backoff(failures))
            if self.input_closed:
                return
            attempt += 1

    async def _serve(self, call: StreamCall[RequestT], opening: list[RequestT]) -> None:
        """Run one call: writer, reader and watchdog, until the reader reaches the
        end of the stream; raises the first failure."""
        assert self._spawn is not None
        reader = self._spawn(f"{self.name}-out", self._read(call))
        tasks = {
            reader,
            self._spawn(f"{self.name}-in", self._write(call, opening)),
            self._spawn(f"{self.name}-watch", self._watch()),
        }
        try:
            while not reader.done():
                done, tasks = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                # Every finished task's error is taken (asyncio logs one never taken as
                # "Task exception was never retrieved"); the first is the failure.
                errors = [error for task in done if (error := task.exception()) is not None]
                if errors:
                    raise errors[0]
        finally:
            await cancel_and_wait(list(tasks))

    async def _write(self, call: StreamCall[RequestT], opening: list[RequestT]) -> None:
        for first in opening:
            await call.write(first)
        while (request := await self._buffer.pop()) is not None:
            await call.write(request)
        await call.done_writing()

    async def _read(self, call: StreamCall[RequestT]) -> None:
        while (response := await call.read()) is not grpc.aio.EOF:
            self._waiting_since = None
            if not self.up:
                self.up = True
                metrics.SIDE_RECONNECTS.labels(self.name).inc()
                await self._on_up(self)
            await self._handle(response)
        if not self.input_closed:
            raise SideStreamEnded(f"{self.name} ended its stream before the caller finished")

    async def _watch(self) -> None:
        timeout_s = self.policy.timeout_s
        if timeout_s <= 0:
            return
        while True:
            await asyncio.sleep(timeout_s / 4)
            since = self._waiting_since
            if since is not None and not self.input_closed:
                if time.monotonic() - since > timeout_s:
                    raise SideStreamStalled(
                        f"{self.name} sent nothing for {timeout_s:g} s while caller audio flowed"
                    )
