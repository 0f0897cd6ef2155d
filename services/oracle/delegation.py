"""Client delegation: the caller's own back-end answers in the LLM's place.

With OracleConfig.client_delegation a session has no LLM. Where it would
start an LLM stream (the restart policy: for a delegation only settled
partials and finals start one, config.py, since each asks the back-end for a
whole answer), `DelegatedCandidate` sends a Delegation (a fresh delegation_id
and the candidate's source) on the response stream and waits for the
client's AgentContext naming it (`ClientDelegate.deliver`):

- COMMENTARY: the candidate's words, said in the agent's voice: the first
  commentary goes out in the candidate's RESET (with its source), each later
  one in an APPEND; FIRST_TOKEN when the first arrives, as for an LLM.
- THINKING: silent (the session adds it to the conversation); here it only
  says that the back-end is still at work.

A delegation ends (DONE) once it has heard nothing for its timeout, or
(CANCELLED, as an LLM stream is) when a newer candidate replaces it or the
session closes. One that ends without a word of commentary says APOLOGY as
its candidate, so the caller is not left waiting in silence, and the call
goes on. Commentary for a delegation that has ended is dropped and counted:
the candidate it would extend is no longer the one the front-end follows.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Sequence

from prometheus_client import Counter

from kamepb import common_pb2, oracle_pb2
from services.oracle.candidate import Generation
from services.oracle.prompts import Turn

Event = oracle_pb2.OracleEvent
Context = common_pb2.AgentContext

CLIENT_BACKEND = "client"  # the back-end's name in spans, logs and metric labels
APOLOGY = "Sorry, I could not get that answer just now."

DELEGATIONS = Counter(
    "kame_oracle_delegations",
    "Client delegations that ended, by outcome (answered, apologized: no commentary "
    "within the timeout, cancelled: a newer candidate replaced it)",
    ["outcome"],
)
LATE_CONTEXT = Counter(
    "kame_oracle_late_delegation_context",
    "Commentary or thinking for a delegation that had ended (or that this session never sent)",
)


class ClientDelegate:
    """One session's client delegation: the delegations open and their inboxes.
    It stands where the session's LLM back-end would (name, model, where, aclose)."""

    name = CLIENT_BACKEND
    model = ""
    where = "the client's back-end"

    def __init__(self, session_id: str, timeout_s: float) -> None:
        self.session_id = session_id
        self.timeout_s = timeout_s
        self._open: dict[str, asyncio.Queue[Context]] = {}

    def candidate(
        self,
        generation: Generation,
        emit_event: Callable[[oracle_pb2.OracleEvent.Kind.ValueType, int], None],
        send_words: Callable[[Generation, str], None],
        send_delegation: Callable[[common_pb2.Delegation], None],
    ) -> DelegatedCandidate:
        return DelegatedCandidate(self, generation, emit_event, send_words, send_delegation)

    def deliver(self, context: Context) -> bool:
        """Hand the client's context to the open delegation it names; False (counted)
        when that delegation has ended or was never sent."""
        inbox = self._open.get(context.delegation_id)
        if inbox is None:
            LATE_CONTEXT.inc()
            return False
        inbox.put_nowait(context)
        return True

    def add_instructions(self, text: str) -> None:
        """Instructions are the back-end's own business: the client wrote them."""

    async def aclose(self) -> None:
        """Nothing to release: open delegations end with their candidates' tasks."""

    def open_inbox(self, delegation_id: str) -> asyncio.Queue[Context]:
        inbox: asyncio.Queue[Context] = asyncio.Queue()
        self._open[delegation_id] = inbox
        return inbox

    def close_inbox(self, delegation_id: str) -> None:
        self._open.pop(delegation_id, None)


class DelegatedCandidate:
    """One candidate answered by the client's back-end (the module doc); `run`
    takes the place of services/oracle/candidate.py's Candidate.run."""

    def __init__(
        self,
        delegate: ClientDelegate,
        generation: Generation,
        emit_event: Callable[[oracle_pb2.OracleEvent.Kind.ValueType, int], None],
        send_words: Callable[[Generation, str], None],
        send_delegation: Callable[[common_pb2.Delegation], None],
    ) -> None:
        self._delegate = delegate
        self.generation = generation
        self._emit_event = emit_event
        self._send_words = send_words
        self._send_delegation = send_delegation

    async def run(self, turns: Sequence[Turn]) -> None:
        """The back-end builds its own prompt from the transcripts: `turns` go unused."""
        delegation_id = f"delegation-{uuid.uuid4().hex}"
        inbox = self._delegate.open_inbox(delegation_id)
        outcome = "cancelled"
        try:
            self._send_delegation(
                common_pb2.Delegation(delegation_id=delegation_id, source=self.generation.source)
            )
            answered = await self._relay(inbox)
            if not answered:
                self._send_words(self.generation, APOLOGY)
            outcome = "answered" if answered else "apologized"
            self._emit_event(Event.DONE, self.generation.number)
        finally:
            self._delegate.close_inbox(delegation_id)
            DELEGATIONS.labels(outcome).inc()

    async def _relay(self, inbox: asyncio.Queue[Context]) -> bool:
        """The delegation's commentary as the candidate's words, until it hears
        nothing for the timeout; whether any came."""
        answered = False
        while True:
            try:
                async with asyncio.timeout(self._delegate.timeout_s):
                    context = await inbox.get()
            except TimeoutError:
                return answered
            words = " ".join(context.text.split())
            if context.kind != Context.COMMENTARY or not words:
                continue  # thinking: the back-end is still at work
            if not answered:
                answered = True
                self._emit_event(Event.FIRST_TOKEN, self.generation.number)
            self._send_words(self.generation, words)
