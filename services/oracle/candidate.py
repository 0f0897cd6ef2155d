"""One candidate answer: the LLM's stream, and with tools its rounds.

Without tools a candidate is one LLM stream. With tools it is a loop: the
model's answer may end with tool calls; the oracle runs them (under the
timing rules of services/oracle/tools/turn.py) and asks again with the calls
and their results replayed, until an answer asks for nothing more. All the
rounds' words form one candidate, streamed as they come (the front-end may
already speak "Let me check," while a tool runs), cut into whole words.

A side-effect tool asked for on a partial transcript ends the candidate
there, `deferred`: the final's candidate will ask for it again, and a final
with the same words is then not taken as already answered.

Each round starts only while the session's token budgets have tokens left
(services/oracle/budget.py: BudgetSpent otherwise) and counts what it cost,
however it ends.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client import Histogram

from kame_common.capacity import LoadMeter
from kame_common.metrics import TURN_BUCKETS
from kame_common.words import normalize_words
from kamepb import common_pb2, oracle_pb2
from services.oracle.backends import LLMBackend, StreamStats
from services.oracle.budget import TokenBudget
from services.oracle.prompts import Turn
from services.oracle.tools.spec import ToolCall, ToolExchange, ToolSpec
from services.oracle.tools.turn import TurnTools

Event = oracle_pb2.OracleEvent

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

# The last run of whitespace and the (possibly unfinished) word after it.
_LAST_GAP = re.compile(r"\s+(\S*)$")
# LLM rounds of one candidate beyond its turn's tool budget: the model may ask
# again once the budget is spent (it reads an error), then must answer.
_EXTRA_ROUNDS = 2


@dataclass
class Generation:
    """One LLM stream and what it answers."""

    number: int
    source: common_pb2.CandidateSource
    running: bool = True
    failed: bool = False
    words_sent: bool = False  # its RESET went out
    deferred: bool = False  # it stopped at a side-effect tool, to be run on the final
    speculative: bool = False  # an ordinary partial started it (not a settled one or a final)

    def answers(self, utterance_id: str, text: str) -> bool:
        """Whether this candidate already answers a final: it was started from the
        same utterance with the same words, and it is still streaming or ended
        with words (and did not stop short of a side-effect tool)."""
        return (
            not self.failed
            and not self.deferred
            and (self.running or self.words_sent)
            and self.source.utterance_id == utterance_id
            and normalize_words(self.source.text) == normalize_words(text)
        )


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


class Candidate:
    """Streams one generation's answer; `emit_event(kind, generation)` and
    `send_words(generation, words)` are the session's outputs."""

    def __init__(
        self,
        generation: Generation,
        backend: LLMBackend,
        tools: TurnTools | None,
        specs: Sequence[ToolSpec],
        emit_event: Callable[[oracle_pb2.OracleEvent.Kind.ValueType, int], None],
        send_words: Callable[[Generation, str], None],
        llm_load: LoadMeter | None = None,
        budget: TokenBudget | None = None,
    ) -> None:
        self.generation = generation
        self._budget = budget
        self._backend = backend
        # The service's LLM is busy during the rounds, not while a tool runs.
        self._llm_load = llm_load
        self._tools = tools
        self._specs = list(specs) if tools is not None and backend.supports_tools else []
        self._emit_event = emit_event
        self._send_words = send_words
        self._cutter = WordCutter()
        self._first_at: float | None = None

    async def run(self, turns: Sequence[Turn]) -> None:
        stats = StreamStats()
        started_at = time.monotonic()
        exchanges: list[ToolExchange] = []
        budget = self._tools.budget if self._tools is not None else 0
        rounds = budget + _EXTRA_ROUNDS if self._specs else 1
        for round_number in range(1, rounds + 1):
            said, calls = await self._round(turns, stats, exchanges, started_at)
            if not calls or round_number == rounds:
                break  # the answer, or a model that would not stop asking
            assert self._tools is not None  # calls come only when tools are offered
            # The round's text is whole: its last word ("One moment.") is said while the
            # tools run, not after them.
            self._send_words(self.generation, self._cutter.feed(" "))
            results = await self._tools.run_all(calls, final=self.generation.source.is_final)
            if results is None:
                self.generation.deferred = True
                break
            exchanges.append(ToolExchange(said, tuple(calls), tuple(results)))
        self._send_words(self.generation, self._cutter.flush())
        # The decode rate of an answer with tool rounds would count the tools' time.
        if self._first_at is not None and stats.output_tokens > 1 and not exchanges:
            elapsed = time.monotonic() - self._first_at
            if elapsed > 0:
                TOKENS_PER_SECOND.labels(backend=self._backend.name).observe(
                    (stats.output_tokens - 1) / elapsed
                )
        self._emit_event(Event.DONE, self.generation.number)

    async def _round(
        self,
        turns: Sequence[Turn],
        stats: StreamStats,
        exchanges: Sequence[ToolExchange],
        started_at: float,
    ) -> tuple[str, list[ToolCall]]:
        """One LLM request: its text goes out as it comes; (that text, the calls asked for)."""
        said: list[str] = []
        calls: list[ToolCall] = []
        if self._budget is not None:
            self._budget.check()
        cost = StreamStats()  # this round's: an Anthropic stream sets its output count
        stream = self._backend.stream_with_tools(turns, cost, self._specs, exchanges)
        busy = self._llm_load.busy() if self._llm_load else contextlib.nullcontext()
        with busy, self._counted(cost, stats):
            async with contextlib.aclosing(stream) as chunks:
                async for chunk in chunks:
                    if isinstance(chunk, ToolCall):
                        calls.append(chunk)
                        continue
                    said.append(chunk)
                    if self._first_at is None:
                        if not chunk.strip():
                            continue
                        self._first_at = time.monotonic()
                        TIME_TO_FIRST_TOKEN.labels(backend=self._backend.name).observe(
                            self._first_at - started_at
                        )
                        if self._llm_load is not None:  # the oracle's answer time
                            self._llm_load.answered(self._first_at - started_at)
                        self._emit_event(Event.FIRST_TOKEN, self.generation.number)
                    self._send_words(self.generation, self._cutter.feed(chunk))
        return "".join(said), calls

    @contextlib.contextmanager
    def _counted(self, cost: StreamStats, stats: StreamStats) -> Iterator[None]:
        """A round's cost joins the candidate's stats and the budget, however it ends."""
        try:
            yield
        finally:
            stats.input_tokens += cost.input_tokens
            stats.output_tokens += cost.output_tokens
            if self._budget is not None:
                self._budget.spend(cost.input_tokens + cost.output_tokens)
