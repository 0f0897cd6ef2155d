"""What a session writes to Redis, off the audio path.

Writes go through one bounded queue and one writer task, in order, so a slow or
absent Redis costs records, never the call: a full queue drops (and counts) the
write, a failed write is logged. In s2s mode no oracle keeps the conversation,
nor while the oracle is down in the other modes, so the session logs it here:
caller finals as user turns, and the agent's words as agent turns placed by
when they were spoken. Keys pressed in a row are one user turn, written when
the run ends (the next turn, or the close); with `dtmf_in_records` off it
names no digit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from redis.exceptions import RedisError

from kame_common.aio import abandon
from kame_common.store import KeyRun, SessionStore
from services.gateway import metrics

log = logging.getLogger(__name__)

QUEUE_SIZE = 256
FLUSH_TIMEOUT_S = 2.0

Write = tuple[Callable[..., Awaitable[None]], tuple[Any, ...]]


class SessionRecords:
    def __init__(self, store: SessionStore, session_id: str) -> None:
        self._store = store
        self._session_id = session_id
        self._queue: asyncio.Queue[Write | None] = asyncio.Queue(QUEUE_SIZE)
        self._writer: asyncio.Task[None] | None = None
        self._agent_words: list[tuple[float, str]] = []  # (wall, word) not yet logged
        self._keys: KeyRun | None = None  # keys pressed in a row, not yet logged
        self._keys_shown = False

    def start(self) -> None:
        self._writer = asyncio.get_running_loop().create_task(
            self._write_forever(), name=f"gateway-{self._session_id}-records"
        )

    def update_session(self, fields: dict[str, str | int | float]) -> None:
        self._enqueue(self._store.put_session, fields)

    def user_turn(self, text: str, started_wall: float) -> None:
        """A caller final (no oracle): the agent's words before the caller's turn began
        are its previous turn, logged first."""
        self.flush_agent_words(before=started_wall)
        self._log_turn("user", text)

    def keypress(self, digit: str, shown: bool) -> None:
        """A key the caller pressed (no oracle): it joins the run of keys pressed in
        a row, logged as one user turn after the agent's words spoken before it."""
        self.flush_agent_words(before=time.time())
        if self._keys is None:
            self._keys = KeyRun()
        self._keys.add(digit)
        self._keys_shown = shown

    def agent_word(self, word: str) -> None:
        self._agent_words.append((time.time(), word))

    def flush_agent_words(self, before: float = float("inf")) -> None:
        """Log the agent's words spoken before `before` as one agent turn; later
        ones answer the caller turn in progress and wait for its final."""
        spoken = [word for wall, word in self._agent_words if wall < before]
        self._agent_words = [(wall, word) for wall, word in self._agent_words if wall >= before]
        if spoken:
            self._log_turn("agent", " ".join(spoken))

    def _log_turn(self, role: str, text: str) -> None:
        """Log a turn, after the run of keys pressed before it."""
        self._end_key_run()
        self._enqueue(self._store.append_turn, role, text)

    def _end_key_run(self) -> None:
        if self._keys is not None:
            keys, self._keys = self._keys, None
            self._enqueue(self._store.append_turn, "user", keys.text(self._keys_shown))

    def _enqueue(self, operation: Callable[..., Awaitable[None]], *args: Any) -> None:
        try:
            self._queue.put_nowait((operation, (self._session_id, *args)))
        except asyncio.QueueFull:
            metrics.DROPPED_MESSAGES.labels("redis").inc()

    async def _write_forever(self) -> None:
        while (write := await self._queue.get()) is not None:
            operation, args = write
            try:
                await operation(*args)
            except (RedisError, OSError) as exc:
                log.warning("session %s: Redis write failed: %s", self._session_id, exc)

    async def close(self) -> None:
        """Write what is queued (at most FLUSH_TIMEOUT_S), then stop; a writer stuck
        on a hung Redis is abandoned (kame_common.aio.abandon), not waited for."""
        if self._writer is None:
            return
        self._end_key_run()
        with contextlib.suppress(asyncio.QueueFull):
            self._queue.put_nowait(None)
        try:
            await asyncio.wait([self._writer], timeout=FLUSH_TIMEOUT_S)
        finally:
            abandon(self._writer)
