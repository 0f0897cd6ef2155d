"""One oracle session: transcript events in, oracle updates and timing events out.

The session keeps the conversation (history from Redis, agent words spoken
but not yet saved, the caller's current partial), asks the restart policy
every `poll_interval_s` (and at once when a final lands) whether to start a
new LLM stream, and runs at most one LLM stream at a time:

- a start cancels the previous stream (CANCELLED event for its generation),
  bumps the generation id and sends REQUEST_START. The new generation's
  source is the caller's latest utterance as it is now: the utterance of the
  most recent transcript event, with its latest hypothesis (partial or final);
- the stream's first non-blank chunk sends FIRST_TOKEN; its first whole words
  send RESET, carrying those words and the source in one update, so a
  front-end never anchors a candidate whose first word has not arrived (a
  stream that ends without a word sends no RESET at all). Until then the
  front-end keeps steering by the previous candidate;
- then APPENDs carry the following whole words (text is cut at whitespace and
  a trailing partial word is held back until the next space or the end), so
  consecutive update texts join with one space; every APPEND carries its
  RESET's generation;
- DONE when the stream ends, ERROR when it fails (with a message safe for
  callers: no URL, no key): the session goes on, and the next start tries again.
  A final's candidate that could not reach the LLM server (it is restarting:
  the connection failed, or HTTP 503 while it loads its model) is started
  again every RETRY_UNREACHABLE_S while the final is still the caller's
  latest utterance, for RETRY_UNREACHABLE_FOR_S: the question is answered
  once the server is back, not only the next one.

With the operator's tools (services/oracle/tools), a candidate may call them
between LLM rounds (services/oracle/candidate.py): read-only tools already on
partial transcripts, tools with side effects only on the final, once per
caller turn. The calls a final's candidate used join the conversation as
`tool` turns, after the user turn they answer. The client's own functions
(OracleConfig.client_functions) are tools too: a call goes out as a
function_call and the client's function_result answers it
(tools/client_functions.py); every tool run is shown to the client as
ToolActivity (GuideResponse.tool).

With client delegation (services/oracle/delegation.py) there is no LLM: each
candidate is a Delegation the client's back-end answers with commentary. The
client's context (GuideRequest.context) works either way: THINKING, and
COMMENTARY that names no delegation, join the conversation as `context` turns
the next prompts show; INSTRUCTIONS extend the system prompt.

With heartbeat_interval_s set, a HEARTBEAT event goes out that often, whatever
else happens: the client's sign that the session is alive.

A final whose words equal the source of the generation in flight, or of the
one that just finished with words, does not restart: that candidate already
answers it (the front-end finds its source fresh). Any other final restarts
at once, without waiting for the next poll tick, and so does (in tandem) a
settled partial, one whose every word stt marks stable: stt sends the early
final's words so as soon as the caller pauses, and the final that follows
says the same words, so the candidate started on them is kept. Other
partials wait for the tick, and none starts a stream while stt decodes a
final (SpeechActivity FINAL_DECODE, the policy's `final_priority`): the
stream in flight, if an ordinary partial started it, is cancelled then.

The oracle writes the conversation log in Redis: each user final is a user
turn; agent words (AgentText, word by word) wait and are written as one agent
turn. Agent and caller audio share one time base (one agent frame per caller
frame), so a user final first saves the agent words that started before its
utterance began (AgentText.start_s < span.start_s), then the user turn; agent
words that started later answer this user turn and wait for the next final
or the session's end. In tandem the agent starts answering before the
caller's final arrives, and its answer is stored after the question. Writes
go through one writer task, in order, so a slow Redis never stalls the oracle.
A backchannel ("uh-huh", "okay": only phrases of the `backchannel_phrases`
setting) whose audio starts while the agent speaks (its last word ended less
than AGENT_SPEAKING_GAP_S before) is not a question: its partials count no
new words and its final starts nothing; the final joins the conversation as
the caller's turn (context for the next answer), and the generation in
flight goes on, so the frontend's answer finishes.
A session whose loaded history ends with a caller's turn does not save that
turn again when its first final has the same words: that is the gateway
asking a reopened stream to answer the turn a failed one left unanswered.
Keys the caller presses in a row are one user turn (a flood stays one short
turn), in the prompt at once and written when the run ends; it names the
digits only with the service's `dtmf_to_llm` (they may be a PIN, and the
prompt goes to the LLM's vendor). The history in memory keeps the turns a
prompt uses (`history_turns`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from opentelemetry import trace
from prometheus_client import Counter, Histogram
from redis.exceptions import RedisError

from kame_common.aio import abandon, cancel_and_wait
from kame_common.capacity import LoadMeter
from kame_common.metrics import TURN_BUCKETS
from kame_common.store import KeyRun, SessionStore
from kame_common.tracing import TRANSCRIPTS_IN_SPANS, tracer
from kame_common.words import is_backchannel, normalize_words
from kamepb import common_pb2, oracle_pb2
from services.oracle.backends import BackendError, LLMBackend, describe
from services.oracle.budget import BudgetSpent, TokenBudget
from services.oracle.candidate import Candidate, Generation
from services.oracle.config import SessionSettings
from services.oracle.delegation import ClientDelegate, DelegatedCandidate
from services.oracle.policy import FinalRetry, RestartPolicy, StartReason
from services.oracle.prompts import AGENT, CONTEXT, TOOL, USER, Turn, build_turns
from services.oracle.tools.client_functions import ClientFunctions
from services.oracle.tools.sources import ToolSources
from services.oracle.tools.spec import ToolCall, ToolResult
from services.oracle.tools.turn import SessionTools, Toolbox, tool_turn_text

log = logging.getLogger(__name__)
_tracer = tracer("kame.oracle")

Event = oracle_pb2.OracleEvent
Update = common_pb2.OracleUpdate

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
FINALS_KEPT = Counter(
    "kame_oracle_finals_kept",
    "Finals that started no stream: the generation in flight (or just finished) was "
    "started from the same words",
)
SPECULATION_YIELDS = Counter(
    "kame_oracle_speculation_yields",
    "LLM streams started on ordinary partials, cancelled because stt began decoding the final",
)

# On close, how long pending Redis writes may take before they are dropped.
_HISTORY_FLUSH_S = 5.0
# A final's candidate that could not reach the LLM server is started again this
# often, for this long (the module doc): `kame up` restarts the server in seconds.
RETRY_UNREACHABLE_S = 1.0
RETRY_UNREACHABLE_FOR_S = 30.0


def _now_us() -> int:
    return time.time_ns() // 1000


# The agent is speaking at a caller's utterance whose audio starts less than this
# after the agent's last word ended (a phrase's pause is at most 0.25 s; the
# frontend pauses the agent on the caller's second voiced frame).
AGENT_SPEAKING_GAP_S = 0.5


@dataclass(frozen=True)
class SpokenWord:
    """Agent text actually spoken, not yet saved to the conversation."""

    start_s: float  # agent stream seconds (the caller stream's time base)
    text: str


class OracleSession:
    def __init__(
        self,
        settings: SessionSettings,
        backend: LLMBackend | ClientDelegate,
        history: list[Turn],
        store: SessionStore | None,
        llm_load: LoadMeter | None = None,
        toolbox: Toolbox | None = None,
        budget: TokenBudget | None = None,
    ) -> None:
        self.settings = settings
        self.backend = backend
        self.budget = budget
        # Why the session ends before its client is done (a token budget spent), if it does.
        self.refusal: BudgetSpent | None = None
        self._outbox: asyncio.Queue[oracle_pb2.GuideResponse | None] = asyncio.Queue()
        respond = self._outbox.put_nowait
        # The client's functions: their calls go out on the response stream.
        self._client_functions = ClientFunctions(
            settings.client_functions,
            lambda call: respond(oracle_pb2.GuideResponse(function_call=call)),
            settings.session_id,
        )
        # The operator's tools and the client's, and the calls of the caller's current
        # turn (None: no tools); what the tools do goes out as ToolActivity.
        sources = ToolSources(toolbox, self._client_functions)
        self._tools = (
            SessionTools(
                sources,
                settings.tool_budget,
                settings.session_id,
                self._record_tool,
                lambda activity: respond(oracle_pb2.GuideResponse(tool=activity)),
            )
            if sources.specs
            else None
        )
        # The service's own LLM, busy while this session streams from it (its capacity);
        # None when the session uses another back-end.
        self._llm_load = llm_load
        self.policy = RestartPolicy(settings.policy)
        self._retry = FinalRetry(RETRY_UNREACHABLE_FOR_S)
        self.generation = 0
        self._store = store
        self._history = history
        # A reopened session's history may end with the caller's turn that the failed
        # session (or the gateway, while no oracle was open) saved but did not answer:
        # the gateway sends it again first, to be answered, not saved twice.
        self._saved_question = history[-1].text if history and history[-1].role == USER else ""
        self._keys: KeyRun | None = None  # keys pressed in a row: the last history turn
        self._agent_words: list[SpokenWord] = []  # spoken, not yet saved
        self._agent_spoke_until_s = -math.inf  # where the agent's last word ended
        self._partials: dict[str, str] = {}  # open utterance id -> latest hypothesis
        # The caller's latest utterance (of the most recent non-blank transcript event).
        self._latest = common_pb2.CandidateSource()
        self._last_event_at: float | None = None  # monotonic arrival of the latest user event
        self._current: Generation | None = None  # the latest LLM stream started
        self._streams: set[asyncio.Task[None]] = set()  # the running LLM stream (at most one)
        self._start_wanted = asyncio.Event()  # wakes the policy loop before its tick
        self._poll_task: asyncio.Task[None] | None = None
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._writer_task: asyncio.Task[None] | None = None
        self._writes: asyncio.Queue[Turn | None] = asyncio.Queue()
        self._closing: asyncio.Future[None] | None = None

    # -- inputs ---------------------------------------------------------------

    def start(self) -> None:
        self._poll_task = asyncio.create_task(self._poll_forever())
        if self.settings.heartbeat_interval_s:
            self._heartbeat_task = asyncio.create_task(self._beat_forever())
        if self._store is not None:
            self._writer_task = asyncio.create_task(self._write_history_forever())

    def user_transcript(self, event: common_pb2.TranscriptEvent) -> None:
        self._last_event_at = time.monotonic()
        text = " ".join(event.text.split())
        if self._is_backchannel(event, text):
            if event.is_final:
                self._save_agent_words(spoken_before_s=event.span.start_s)
                self._commit(Turn(USER, text))
            return
        if text and self._tools is not None:
            self._tools.on_user_utterance(event.utterance_id)
        if text:
            self._latest = common_pb2.CandidateSource(
                utterance_id=event.utterance_id, is_final=event.is_final, text=text
            )
        if not event.is_final:
            self._partials[event.utterance_id] = text
            self._on_partial(event, text)
            return
        self._partials.pop(event.utterance_id, None)
        if not text:  # a blank final (nothing was said after all) commits nothing
            self.policy.on_final(event.utterance_id, text)
            return
        answered = self._current is not None and self._current.answers(event.utterance_id, text)
        self.policy.on_final(event.utterance_id, text, answered=answered)
        if answered:
            FINALS_KEPT.inc()
        else:
            self._start_wanted.set()
        # Without a span (no audio position) the arrival order is all there is.
        began_s = event.span.start_s if event.HasField("span") else math.inf
        self._save_agent_words(spoken_before_s=began_s)
        saved, self._saved_question = self._saved_question, ""
        if normalize_words(saved) != normalize_words(text):
            self._commit(Turn(USER, text))

    def _is_backchannel(self, event: common_pb2.TranscriptEvent, text: str) -> bool:
        """Only backchannel phrases, said while the agent spoke (module doc)."""
        return (
            event.HasField("span")
            and event.span.start_s - self._agent_spoke_until_s < AGENT_SPEAKING_GAP_S
            and is_backchannel(text, self.settings.backchannels)
        )

    def _on_partial(self, event: common_pb2.TranscriptEvent, text: str) -> None:
        """A settled partial (every word stable: stt's early final) wakes the policy
        at once, unless the candidate in flight was started from the same words."""
        settled = bool(text) and normalize_words(event.stable_text) == normalize_words(text)
        answered = (
            settled
            and self._current is not None
            and self._current.answers(event.utterance_id, text)
        )
        end_s = event.span.end_s if event.HasField("span") else math.inf
        self.policy.on_partial(
            event.utterance_id, text, settled=settled, answered=answered, end_s=end_s
        )
        if settled and not answered:
            self._start_wanted.set()

    def speech_activity(self, activity: common_pb2.SpeechActivity) -> None:
        """stt began decoding a final (FINAL_DECODE): with the policy's final_priority,
        the stream a partial started is cancelled and speculation waits for the
        final's words, so the decode the turn waits for does not share the CPU."""
        if activity.kind != common_pb2.SpeechActivity.FINAL_DECODE:
            return
        if not self.policy.on_final_decode(activity.at_s):
            return
        current = self._current
        if current is not None and current.running and current.speculative:
            SPECULATION_YIELDS.inc()
            for task in self._streams:
                task.cancel()

    def keypress(self, digit: str) -> None:
        """A key the caller pressed joins the caller's side of the conversation, so
        the next answer can take it into account ("press 1 for ..."): the run of
        keys pressed in a row is the last turn of the history."""
        self._save_agent_words()
        if self._keys is None:
            self._keys = KeyRun()
            self._history.append(Turn(USER, ""))
        self._keys.add(digit)
        self._history[-1] = Turn(USER, self._keys.text(self.settings.dtmf_to_llm))

    def agent_text(self, event: common_pb2.AgentText) -> None:
        """Words the agent said. A hold phrase or repair ("Hmm,", "Sorry,") stays out
        of the conversation: in the prompt, "Assistant: Hmm," before the answer slot
        would make the model continue the filler instead of answering."""
        text = " ".join(event.text.split())
        if text:
            self._agent_spoke_until_s = max(self._agent_spoke_until_s, event.end_s)
        if text and not event.filler:
            self._agent_words.append(SpokenWord(event.start_s, text))
            if self._tools is not None:
                self._tools.on_agent_words()

    def context(self, context: common_pb2.AgentContext) -> None:
        """The client's commentary, thinking or instructions (the module doc)."""
        text = " ".join(context.text.split())
        if not text:
            return
        if context.kind == common_pb2.AgentContext.INSTRUCTIONS:
            self.backend.add_instructions(text)
            return
        named = bool(context.delegation_id)
        if named and isinstance(self.backend, ClientDelegate):
            self.backend.deliver(context)
        if context.kind == common_pb2.AgentContext.THINKING or not named:
            self._commit(Turn(CONTEXT, text))

    def function_result(self, result: common_pb2.FunctionResult) -> None:
        """The client's answer to a function_call (ignored unless a call waits for it)."""
        self._client_functions.deliver(result)

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
        for task in (self._heartbeat_task, self._poll_task):
            if task is not None:
                await cancel_and_wait(task)
        await self._cancel_stream()
        if self._tools is not None:
            await self._tools.close()
        self._save_agent_words()
        self._end_key_run()
        if self._writer_task is not None:
            self._writes.put_nowait(None)
            await asyncio.wait([self._writer_task], timeout=_HISTORY_FLUSH_S)
            if not self._writer_task.done():
                log.warning(
                    "session %s: history writes still pending at close, dropped",
                    self.settings.session_id,
                )
            abandon(self._writer_task)  # not waited for: it may be stuck on a hung Redis
        await self.backend.aclose()
        if self.budget is not None:
            await self.budget.aclose()
        self._outbox.put_nowait(None)

    # -- conversation ---------------------------------------------------------

    def _commit(self, turn: Turn) -> None:
        self._end_key_run()
        self._history.append(turn)
        if self.settings.history_turns > 0:
            del self._history[: -self.settings.history_turns]
        if self._store is not None:
            self._writes.put_nowait(turn)

    def _record_tool(self, call: ToolCall, result: ToolResult) -> None:
        """A tool call a final's candidate used joins the conversation (history and log)."""
        self._commit(Turn(TOOL, tool_turn_text(call, result)))

    def _end_key_run(self) -> None:
        """Write the run of keys pressed (the last history turn) as its one turn."""
        if self._keys is not None:
            self._keys = None
            if self._store is not None:
                self._writes.put_nowait(self._history[-1])

    def _save_agent_words(self, spoken_before_s: float = math.inf) -> None:
        """Commit, as one agent turn, the waiting agent words that started before
        `spoken_before_s`; later ones keep waiting."""
        said = [w.text for w in self._agent_words if w.start_s < spoken_before_s]
        self._agent_words = [w for w in self._agent_words if w.start_s >= spoken_before_s]
        if said:
            self._commit(Turn(AGENT, " ".join(said)))

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
        """Ask the policy every poll tick, and at once when a final or settled partial lands."""
        loop = asyncio.get_running_loop()
        interval = self.settings.policy.poll_interval_s
        next_tick = loop.time() + interval
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(next_tick):
                    await self._start_wanted.wait()
            self._start_wanted.clear()
            while next_tick <= loop.time():
                next_tick += interval
            reason = self.policy.decide()
            if reason is not None:
                await self._restart(reason)

    async def _beat_forever(self) -> None:
        """HEARTBEAT every heartbeat_interval_s: the client's sign that this session
        (and its event loop) is alive while no transcript asks for anything."""
        while True:
            await asyncio.sleep(self.settings.heartbeat_interval_s)
            self._emit_event(Event.HEARTBEAT, self.generation)

    async def _cancel_stream(self) -> None:
        """Cancel the running stream and wait until its HTTP stream is closed."""
        await cancel_and_wait(list(self._streams))

    async def _restart(self, reason: StartReason) -> None:
        await self._cancel_stream()
        # The new stream starts from the transcript as it is now, with what arrived
        # while the old one closed: that is covered, not pending (RestartPolicy).
        self.policy.started_from_now()
        self.generation += 1
        source = common_pb2.CandidateSource()
        source.CopyFrom(self._latest)
        speculative = reason in (StartReason.FIRST_TEXT, StartReason.NEW_WORDS)
        self._current = Generation(self.generation, source, speculative=speculative)
        turns = build_turns(
            self._history,
            " ".join(w.text for w in self._agent_words),
            " ".join(self._partials.values()),
            self.settings.history_turns,
        )
        user_text = turns[-1].text if turns and turns[-1].role == USER else ""
        RESTARTS.labels(reason=reason.value).inc()
        self._emit_event(Event.REQUEST_START, self.generation, user_text)
        task = asyncio.create_task(
            self._run_stream(self._current, turns, reason, self._last_event_at)
        )
        self._streams.add(task)
        task.add_done_callback(self._streams.discard)
        task.add_done_callback(functools.partial(self._announce_cancelled, self.generation))

    def _announce_cancelled(self, number: int, task: asyncio.Task[None]) -> None:
        """CANCELLED for a stream that was cancelled, also one cancelled before it ran
        (a start right after its own): a client waits for every REQUEST_START's end."""
        if task.cancelled():
            CANCELLATIONS.inc()
            self._emit_event(Event.CANCELLED, number)

    async def _run_stream(
        self,
        generation: Generation,
        turns: list[Turn],
        reason: StartReason,
        trigger_at: float | None,
    ) -> None:
        backend = self.backend.name
        number = generation.number
        attributes: dict[str, str | int] = {
            "kame.session_id": self.settings.session_id,
            "kame.generation": number,
            "kame.reason": reason.value,
            "llm.backend": backend,
            "llm.model": self.backend.model,
        }
        if TRANSCRIPTS_IN_SPANS and turns:
            attributes["kame.user_text"] = turns[-1].text
        with _tracer.start_as_current_span("oracle.llm_stream", attributes=attributes) as span:
            try:
                await self._candidate(generation, trigger_at).run(turns)
            except asyncio.CancelledError:
                span.set_attribute("kame.cancelled", True)  # CANCELLED: _announce_cancelled
                raise
            except BudgetSpent as exc:
                generation.failed = True
                ERRORS.labels(backend=backend, kind="budget").inc()
                log.warning("session %s gen %d: %s", self.settings.session_id, number, exc)
                self._end_refused(exc)
            except BackendError as exc:
                generation.failed = True
                ERRORS.labels(backend=backend, kind=exc.kind).inc()
                span.set_status(trace.Status(trace.StatusCode.ERROR, str(exc)))
                log.warning(
                    "session %s gen %d: %s; at %s: %s",
                    self.settings.session_id,
                    number,
                    exc,
                    self.backend.where,
                    describe(exc.__cause__) if exc.__cause__ else "",
                )
                self._emit_event(Event.ERROR, number, str(exc))
                if exc.server_unavailable:
                    self._retry_unreachable(generation)
            except Exception:  # a bug or an unexpected answer must not end the session
                generation.failed = True
                ERRORS.labels(backend=backend, kind="internal").inc()
                log.exception("session %s gen %d failed", self.settings.session_id, number)
                self._emit_event(Event.ERROR, number, f"{backend}: internal error in the oracle")
            finally:
                generation.running = False
                if generation.deferred:
                    # A final with its words may have been kept for it, but it stopped
                    # short of a side-effect tool: the final needs a candidate of its own.
                    self._start_for_final(generation)

    def _end_refused(self, refusal: BudgetSpent) -> None:
        """End the response stream: the service ends the session with `refusal`."""
        if self.refusal is None:
            self.refusal = refusal
            self._outbox.put_nowait(None)

    def _retry_unreachable(self, generation: Generation) -> None:
        """The LLM server was unavailable: if the candidate answers a final, start
        another for it later (FinalRetry), unless a newer one has started by then."""
        source = generation.source
        if source.is_final and self._retry.failed(source.utterance_id):
            asyncio.get_running_loop().call_later(
                RETRY_UNREACHABLE_S, self._start_for_final, generation
            )

    def _start_for_final(self, generation: Generation) -> None:
        """Start a candidate of its own for the final `generation` answered (or was
        kept for), if it is still the latest one and the caller's latest utterance."""
        latest = self._latest
        if (
            generation is self._current
            and self._closing is None
            and latest.is_final
            and latest.utterance_id == generation.source.utterance_id
        ):
            self.policy.on_answer_deferred()
            self._start_wanted.set()

    def _candidate(
        self, generation: Generation, trigger_at: float | None
    ) -> Candidate | DelegatedCandidate:
        def send_words(generation: Generation, words: str) -> None:
            self._send_words(generation, words, trigger_at)

        if isinstance(self.backend, ClientDelegate):
            return self.backend.candidate(
                generation,
                self._emit_event,
                send_words,
                lambda d: self._outbox.put_nowait(oracle_pb2.GuideResponse(delegation=d)),
            )
        return Candidate(
            generation,
            self.backend,
            self._tools.turn if self._tools is not None else None,
            self._tools.specs if self._tools is not None else (),
            self._emit_event,
            send_words,
            self._llm_load,
            self.budget,
        )

    def _send_words(self, generation: Generation, words: str, trigger_at: float | None) -> None:
        """The candidate's first words go out in its RESET (with its source), the rest
        in APPENDs."""
        if not words:
            return
        if generation.words_sent:
            self._emit_update(Update(op=Update.APPEND, generation=generation.number, text=words))
            return
        generation.words_sent = True
        if trigger_at is not None:
            UPDATE_LAG.observe(time.monotonic() - trigger_at)
        self._emit_update(
            Update(
                op=Update.RESET,
                generation=generation.number,
                text=words,
                source=generation.source,
            )
        )

    def _emit_event(
        self, kind: oracle_pb2.OracleEvent.Kind.ValueType, generation: int, detail: str = ""
    ) -> None:
        self._outbox.put_nowait(
            oracle_pb2.GuideResponse(
                event=Event(kind=kind, generation=generation, time_us=_now_us(), detail=detail)
            )
        )

    def _emit_update(self, update: common_pb2.OracleUpdate) -> None:
        update.created_time_us = _now_us()
        self._outbox.put_nowait(oracle_pb2.GuideResponse(update=update))
