"""One oracle session: transcript events in, oracle updates and timing events out.

The session keeps the conversation (history from Redis, agent words spoken
since the last user final, the caller's current partial), runs the restart
policy every `poll_interval_s`, and runs at most one LLM stream at a time:

- a start cancels the previous stream (CANCELLED event for its generation),
  bumps the generation id and sends REQUEST_START;
- the new stream's first non-blank chunk sends FIRST_TOKEN and RESET; until
  then the front-end keeps steering by the previous candidate;
- then APPENDs carry whole words only (text is cut at whitespace and a
  trailing partial word is held back until the next space or the end), so
  consecutive APPEND texts join with one space; every APPEND carries its
  RESET's generation;
- DONE when the stream ends, ERROR (with the message) when it fails: the
  session goes on, and the next policy start tries again.

The oracle writes the conversation log in Redis: each committed user final is
a user turn; agent words (AgentText, word by word) are gathered and written as
one agent turn when the next user final arrives or the session ends. Writes go
through one writer task, in order, so a slow Redis never stalls the oracle.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import AsyncIterator

from opentelemetry import trace
from prometheus_client import Counter, Histogram
from redis.exceptions import RedisError

from kame_common.aio import cancel_and_wait
from kame_common.metrics import TURN_BUCKETS
from kame_common.store import SessionStore
from kame_common.tracing import TRANSCRIPTS_IN_SPANS, tracer
from kamepb import common_pb2, oracle_pb2
from services.oracle.backends import (
    BackendConfigError,
    BackendError,
    LLMBackend,
    StreamStats,
    create_backend,
)
from services.oracle.config import (
    ApiKeys,
    InvalidSessionConfig,
    OracleSettings,
    SessionSettings,
    resolve_session,
)
from services.oracle.policy import RestartPolicy, StartReason
from services.oracle.prompts import AGENT, USER, Turn, build_turns

log = logging.getLogger(__name__)
_tracer = tracer("kame.oracle")

Event = oracle_pb2.OracleEvent
Update = common_pb2.OracleUpdate

TIME_TO_FIRST_TOKEN = Histogram(
    "kame_oracle_time_to_first_token_seconds",
    "LLM stream start -> first non-blank chunk",
    ["backend"],
    buckets=TURN_BUCKETS,
)
TOKENS_PER_SECOND = Histogram(
    "kame_oracle_tokens_per_second",
    "Decode rate of finished LLM streams: tokens after the first, per second after it",
    ["backend"],
    buckets=(5, 10, 20, 30, 50, 75, 100, 150, 250, 500),
)
RESTARTS = Counter(
    "kame_oracle_restarts",
    "LLM streams started by the policy (reason: first_text, new_words, final)",
    ["reason"],
)
CANCELLATIONS = Counter("kame_oracle_cancellations", "LLM streams cancelled before they finished")
UPDATE_LAG = Histogram(
    "kame_oracle_update_lag_seconds",
    "Transcript event that triggered an LLM stream -> that stream's first update (RESET)",
    buckets=TURN_BUCKETS,
)
ERRORS = Counter("kame_oracle_errors", "Failed LLM streams", ["backend", "kind"])
HISTORY_WRITE_ERRORS = Counter(
    "kame_oracle_history_write_errors", "Conversation turns that could not be written to Redis"
)

# The last run of whitespace and the (possibly unfinished) word after it.
_LAST_GAP = re.compile(r"\s+(\S*)$")
# On close, how long pending Redis writes may take before they are dropped.
_HISTORY_FLUSH_S = 5.0


def _now_us() -> int:
    return time.time_ns() // 1000


class WordCutter:
    """Cuts streamed text into whole words: everything up to the last whitespace
    goes out, the piece after it waits (it may be half a word)."""

    def __init__(self) -> None:
        self._pending = ""

    def feed(self, chunk: str) -> str:
        """Whole words completed by `chunk`, single-spaced ("" if none yet)."""
        self._pending += chunk
        last_gap = _LAST_GAP.search(self._pending)
        if last_gap is None:
            return ""
        ready, self._pending = self._pending[: last_gap.start()], last_gap.group(1)
        return " ".join(ready.split())

    def flush(self) -> str:
        """The held-back rest, at the end of the stream."""
        rest, self._pending = " ".join(self._pending.split()), ""
        return rest


class OracleSession:
    def __init__(
        self,
        settings: SessionSettings,
        backend: LLMBackend,
        history: list[Turn],
        store: SessionStore | None,
    ) -> None:
        self.settings = settings
        self.backend = backend
        self.policy = RestartPolicy(settings.policy)
        self.generation = 0
        self._store = store
        self._history = history
        self._agent_words: list[str] = []
        self._partials: dict[str, str] = {}  # open utterance id -> latest hypothesis
        self._last_event_at: float | None = None  # monotonic arrival of the latest user event
        self._streams: set[asyncio.Task] = set()  # the running LLM stream (at most one)
        self._poll_task: asyncio.Task | None = None
        self._writer_task: asyncio.Task | None = None
        self._writes: asyncio.Queue[Turn | None] = asyncio.Queue()
        self._outbox: asyncio.Queue[oracle_pb2.GuideResponse | None] = asyncio.Queue()
        self._closing: asyncio.Future | None = None

    # -- inputs ---------------------------------------------------------------

    def start(self) -> None:
        self._poll_task = asyncio.create_task(self._poll_forever())
        if self._store is not None:
            self._writer_task = asyncio.create_task(self._write_history_forever())

    def user_transcript(self, event: common_pb2.TranscriptEvent) -> None:
        self._last_event_at = time.monotonic()
        text = " ".join(event.text.split())
        if not event.is_final:
            self._partials[event.utterance_id] = text
            self.policy.on_partial(event.utterance_id, text)
            return
        self._partials.pop(event.utterance_id, None)
        self.policy.on_final(event.utterance_id, text)
        if text:  # a blank final (nothing was said after all) commits nothing
            self._flush_agent_turn()
            self._commit(Turn(USER, text))

    def agent_text(self, event: common_pb2.AgentText) -> None:
        if event.text.strip():
            self._agent_words.append(event.text.strip())

    # -- outputs --------------------------------------------------------------

    async def responses(self) -> AsyncIterator[oracle_pb2.GuideResponse]:
        """Updates and events in order, until the session is closed."""
        while (item := await self._outbox.get()) is not None:
            yield item

    async def close(self) -> None:
        """Cancel the LLM stream, save the agent's last words, release the back-end.
        Idempotent; shielded, so a caller cancelled meanwhile cannot leave it half done."""
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._close())
        await asyncio.shield(self._closing)

    async def _close(self) -> None:
        if self._poll_task is not None:
            await cancel_and_wait(self._poll_task)
        await self._cancel_stream()
        self._flush_agent_turn()
        if self._writer_task is not None:
            self._writes.put_nowait(None)
            try:
                await asyncio.wait_for(self._writer_task, _HISTORY_FLUSH_S)
            except TimeoutError:
                log.warning(
                    "session %s: history writes still pending at close, dropped",
                    self.settings.session_id,
                )
        await self.backend.aclose()
        self._outbox.put_nowait(None)

    # -- conversation ---------------------------------------------------------

    def _commit(self, turn: Turn) -> None:
        self._history.append(turn)
        if self._store is not None:
            self._writes.put_nowait(turn)

    def _flush_agent_turn(self) -> None:
        if self._agent_words:
            self._commit(Turn(AGENT, " ".join(self._agent_words)))
            self._agent_words.clear()

    async def _write_history_forever(self) -> None:
        assert self._store is not None
        while (turn := await self._writes.get()) is not None:
            try:
                await self._store.append_turn(self.settings.session_id, turn.role, turn.text)
            except (RedisError, OSError) as exc:
                HISTORY_WRITE_ERRORS.inc()
                log.warning(
                    "session %s: could not save a %s turn: %s",
                    self.settings.session_id,
                    turn.role,
                    exc,
                )

    # -- LLM streams ----------------------------------------------------------

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.policy.poll_interval_s)
            reason = self.policy.decide()
            if reason is not None:
                await self._restart(reason)

    async def _cancel_stream(self) -> None:
        """Cancel the running stream and wait until its HTTP stream is closed."""
        await cancel_and_wait(list(self._streams))

    async def _restart(self, reason: StartReason) -> None:
        await self._cancel_stream()
        self.generation += 1
        turns = build_turns(
            self._history,
            " ".join(self._agent_words),
            " ".join(self._partials.values()),
            self.settings.history_turns,
        )
        user_text = turns[-1].text if turns and turns[-1].role == USER else ""
        RESTARTS.labels(reason=reason.value).inc()
        self._emit_event(Event.REQUEST_START, self.generation, user_text)
        task = asyncio.create_task(
            self._run_stream(self.generation, turns, reason, self._last_event_at)
        )
        self._streams.add(task)
        task.add_done_callback(self._streams.discard)

    async def _run_stream(
        self, generation: int, turns: list[Turn], reason: StartReason, trigger_at: float | None
    ) -> None:
        backend = self.backend.name
        attributes = {
            "kame.session_id": self.settings.session_id,
            "kame.generation": generation,
            "kame.reason": reason.value,
            "llm.backend": backend,
            "llm.model": self.backend.settings.model,
        }
        if TRANSCRIPTS_IN_SPANS and turns:
            attributes["kame.user_text"] = turns[-1].text
        with _tracer.start_as_current_span("oracle.llm_stream", attributes=attributes) as span:
            try:
                await self._stream_updates(generation, turns, trigger_at)
            except asyncio.CancelledError:
                CANCELLATIONS.inc()
                span.set_attribute("kame.cancelled", True)
                self._emit_event(Event.CANCELLED, generation)
                raise
            except BackendError as exc:
                ERRORS.labels(backend=backend, kind=exc.kind).inc()
                span.set_status(trace.Status(trace.StatusCode.ERROR, str(exc)))
                log.warning("session %s gen %d: %s", self.settings.session_id, generation, exc)
                self._emit_event(Event.ERROR, generation, str(exc))
            except Exception as exc:  # a bug or an unexpected answer must not end the session
                ERRORS.labels(backend=backend, kind="internal").inc()
                log.exception("session %s gen %d failed", self.settings.session_id, generation)
                self._emit_event(Event.ERROR, generation, f"{type(exc).__name__}: {exc}")

    async def _stream_updates(
        self, generation: int, turns: list[Turn], trigger_at: float | None
    ) -> None:
        stats = StreamStats()
        cutter = WordCutter()
        started_at = time.monotonic()
        first_at: float | None = None
        async with contextlib.aclosing(self.backend.stream(turns, stats)) as chunks:
            async for chunk in chunks:
                if first_at is None:
                    if not chunk.strip():
                        continue
                    first_at = time.monotonic()
                    TIME_TO_FIRST_TOKEN.labels(backend=self.backend.name).observe(
                        first_at - started_at
                    )
                    if trigger_at is not None:
                        UPDATE_LAG.observe(first_at - trigger_at)
                    self._emit_event(Event.FIRST_TOKEN, generation)
                    self._emit_update(Update.RESET, generation)
                if words := cutter.feed(chunk):
                    self._emit_update(Update.APPEND, generation, words)
        if words := cutter.flush():
            self._emit_update(Update.APPEND, generation, words)
        if first_at is not None and stats.output_tokens > 1:
            elapsed = time.monotonic() - first_at
            if elapsed > 0:
                TOKENS_PER_SECOND.labels(backend=self.backend.name).observe(
                    (stats.output_tokens - 1) / elapsed
                )
        self._emit_event(Event.DONE, generation)

    def _emit_event(self, kind: int, generation: int, detail: str = "") -> None:
        self._outbox.put_nowait(
            oracle_pb2.GuideResponse(
                event=Event(kind=kind, generation=generation, time_us=_now_us(), detail=detail)
            )
        )

    def _emit_update(self, op: int, generation: int, text: str = "") -> None:
        self._outbox.put_nowait(
            oracle_pb2.GuideResponse(
                update=Update(op=op, generation=generation, text=text, created_time_us=_now_us())
            )
        )


class SessionFactory:
    """Opens sessions: resolves the OracleConfig (refusing, before any request,
    what the operator does not allow), checks the back-end, loads history."""

    def __init__(self, service: OracleSettings, keys: ApiKeys, store: SessionStore | None) -> None:
        self.service = service
        self.keys = keys
        self.store = store

    async def open(self, config: oracle_pb2.OracleConfig) -> OracleSession:
        """A started session; raises InvalidSessionConfig (-> INVALID_ARGUMENT)."""
        settings = resolve_session(config, self.service, self.keys)
        try:
            backend = create_backend(settings.backend)
        except BackendConfigError as exc:
            raise InvalidSessionConfig(str(exc)) from None
        try:
            history, _ = await asyncio.gather(
                self._load_history(settings.session_id), backend.check(self.service.check_timeout_s)
            )
        except BaseException as exc:
            await backend.aclose()
            if isinstance(exc, BackendConfigError):
                raise InvalidSessionConfig(self._callers_view(str(exc))) from None
            raise
        session = OracleSession(settings, backend, history, self.store)
        session.start()
        return session

    def _callers_view(self, message: str) -> str:
        """`message` for the caller: the operator's base URL (an internal address,
        often) stays in the log and is replaced by words."""
        internal = f"base URL {self.service.base_url}"
        if internal not in message:
            return message
        log.warning("the configured back-end failed its check: %s", message)
        return message.replace(internal, "configured base URL")

    async def _load_history(self, session_id: str) -> list[Turn]:
        """The conversation so far (another replica may have started it). Without
        Redis the session still runs, only without history."""
        if self.store is None:
            return []
        try:
            turns = await self.store.conversation(session_id)
        except (RedisError, OSError) as exc:
            log.warning("session %s: no history, Redis failed: %s", session_id, exc)
            return []
        return [Turn(t["role"], t["text"]) for t in turns if t.get("role") in (USER, AGENT)]
