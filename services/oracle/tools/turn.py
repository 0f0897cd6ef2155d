"""KAME's timing rules for tools, per caller turn.

The oracle starts candidate answers on partial transcripts, so a model may ask
for the same tool many times while the caller is still speaking. Within one
caller turn (from the caller's first words until they speak again after the
agent has spoken):

- a READ-ONLY tool runs on a partial transcript; its call is kept for the
  turn, and a later candidate (the final's) asking for the same tool with the
  same arguments gets the same result (awaiting it if it is still running)
  instead of a second call;
- a tool with SIDE EFFECTS runs only for a candidate started from the final
  transcript, at most once per turn for the same arguments (a candidate
  restarted on the same final reuses the first call's result). On a partial
  transcript it is not run: the candidate ends there and the final's
  candidate asks again;
- at most `budget` calls start per turn; beyond it the model reads an error
  result and answers with what it has.

Calls run in tasks of their own, shielded from the candidate that asked: a
candidate cancelled by a restart does not cancel a call another candidate
will want. Each call is timed into a histogram and an OpenTelemetry span; the
calls a final's candidate used go into the conversation as `tool` turns. A
failed call's span says only that it failed: its text (a client's or a
server's words) goes into the span only with KAME_TRACE_TRANSCRIPTS.

The client sees tools work through ToolActivity (GuideResponse.tool): each
run of a tool is a STARTED when it starts and a FINISHED (is_error,
elapsed_s) when it ends, under a call_id of its own (a client function's
FunctionCall has the same). When a final's candidate first uses a result a
partial's candidate started, that use is a pair of its own (a new call_id,
FINISHED `reused`, elapsed_s the run's), at once if the result is in, else
when it comes. A call refused before it runs (no such tool, arguments that
are not an object, the budget spent) and a side effect held back on a
partial have no activity: nothing ran.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from opentelemetry import trace
from prometheus_client import Histogram

from kame_common.aio import cancel_and_wait
from kame_common.metrics import TURN_BUCKETS
from kame_common.tracing import TRANSCRIPTS_IN_SPANS, tracer
from kamepb import common_pb2
from services.oracle.tools.spec import (
    CLIENT_SOURCE,
    ToolCall,
    ToolResult,
    ToolSpec,
    canonical_arguments,
)

log = logging.getLogger(__name__)
_tracer = tracer("kame.oracle")

TOOL_SECONDS = Histogram(
    "kame_oracle_tool_seconds",
    "Tool calls, from start to result (tool: the operator's tool's name, or 'client' for "
    "every client function; outcome: ok, error)",
    ["tool", "outcome"],
    buckets=TURN_BUCKETS,
)


def metric_label(spec: ToolSpec) -> str:
    """The `tool` label of a call: an operator's tool by name (the operator bounds
    them); every client function as one "client" (callers choose those names, and
    a label per name would let them grow the series without limit)."""
    return CLIENT_SOURCE if spec.server == CLIENT_SOURCE else spec.name


class Toolbox(Protocol):
    @property
    def specs(self) -> list[ToolSpec]: ...

    def spec(self, name: str) -> ToolSpec | None: ...

    async def call(self, spec: ToolSpec, arguments: dict[str, Any], call_id: str) -> ToolResult: ...


Activity = common_pb2.ToolActivity
# Where a session sends its ToolActivity (its response stream).
ShowActivity = Callable[[common_pb2.ToolActivity], None]


def new_call_id() -> str:
    """An id unique within the session (and beyond: a reopened session starts anew)."""
    return f"call_{uuid.uuid4().hex[:16]}"


def _started(call_id: str, spec: ToolSpec) -> common_pb2.ToolActivity:
    return Activity(
        phase=Activity.STARTED,
        call_id=call_id,
        name=spec.name,
        source=spec.server,
        read_only=spec.read_only,
    )


def _finished(
    call_id: str, spec: ToolSpec, result: ToolResult, reused: bool = False
) -> common_pb2.ToolActivity:
    activity = _started(call_id, spec)
    activity.phase = Activity.FINISHED
    activity.is_error = result.is_error
    activity.elapsed_s = result.elapsed_s
    activity.reused = reused
    return activity


def tool_turn_text(call: ToolCall, result: ToolResult) -> str:
    """A tool call as the conversation record keeps it: call, result, time."""
    outcome = "failed: " if result.is_error else ""
    return (
        f"{call.name}({call.arguments_json or '{}'}) -> {outcome}{result.text} "
        f"[{result.elapsed_s:.2f} s]"
    )


@dataclass
class _Run:
    """One run of a tool this turn, shared by the candidates asking the same."""

    call_id: str
    spec: ToolSpec
    task: asyncio.Task[ToolResult]
    on_final: bool  # started for a candidate of the final transcript
    reuse_shown: bool = False  # a final's candidate used it: its reused pair went out


class TurnTools:
    """The tool calls of one caller turn (see the module doc)."""

    def __init__(
        self,
        toolbox: Toolbox,
        budget: int,
        session_id: str,
        record: Callable[[ToolCall, ToolResult], None],
        show: ShowActivity | None = None,
    ) -> None:
        self._toolbox = toolbox
        self.budget = budget
        self._session_id = session_id
        self._record = record
        self._show = show or (lambda activity: None)
        self._runs: dict[tuple[str, str], _Run] = {}
        self._recorded: set[tuple[str, str]] = set()

    async def run_all(self, calls: Sequence[ToolCall], final: bool) -> list[ToolResult] | None:
        """The results of one round's calls, in order; None when a call has side
        effects and the transcript is partial (the read-only calls of the round
        are started anyway: the final's candidate will want them)."""
        if not final and any(self._has_side_effects(call) for call in calls):
            for call in calls:
                if not self._has_side_effects(call):
                    self._start(call, final)
            return None
        return list(await asyncio.gather(*(self._result(call, final) for call in calls)))

    def _has_side_effects(self, call: ToolCall) -> bool:
        spec = self._toolbox.spec(call.name)
        return spec is not None and not spec.read_only

    def _start(self, call: ToolCall, final: bool) -> tuple[tuple[str, str], _Run] | ToolResult:
        """The call's key and run (started now, or earlier this turn with the same
        arguments), or an error result when it cannot run."""
        spec = self._toolbox.spec(call.name)
        if spec is None:
            return ToolResult(f"error: there is no tool named {call.name}", True)
        arguments = call.arguments()
        if arguments is None:
            return ToolResult(f"error: the arguments of {call.name} must be a JSON object", True)
        key = (spec.name, canonical_arguments(arguments))
        run = self._runs.get(key)
        if run is None:
            if len(self._runs) >= self.budget:
                return ToolResult(
                    f"error: no more tool calls this turn (at most {self.budget}); "
                    "answer with what you have",
                    True,
                )
            call_id = new_call_id()
            task = asyncio.create_task(self._timed(spec, arguments, call_id))
            run = _Run(call_id, spec, task, on_final=final)
            self._runs[key] = run
        elif final and not run.on_final and not run.reuse_shown:
            run.reuse_shown = True
            self._show_reuse(run)
        return key, run

    def _show_reuse(self, run: _Run) -> None:
        """A final's candidate uses a partial's run: a STARTED now, a FINISHED
        `reused` when the result is in (at once if it is), whoever waits for it."""
        call_id = new_call_id()
        self._show(_started(call_id, run.spec))

        def finished(task: asyncio.Task[ToolResult]) -> None:
            result = _outcome(run.spec, task)
            self._show(_finished(call_id, run.spec, result, reused=True))

        run.task.add_done_callback(finished)

    async def _result(self, call: ToolCall, final: bool) -> ToolResult:
        started = self._start(call, final)
        if isinstance(started, ToolResult):
            return started
        key, run = started
        result = await asyncio.shield(run.task)
        if final and key not in self._recorded:
            self._recorded.add(key)
            self._record(call, result)
        return result

    async def _timed(self, spec: ToolSpec, arguments: dict[str, Any], call_id: str) -> ToolResult:
        """Run the tool: its STARTED and FINISHED activity around it (a FINISHED
        with an error when the session's end cancels it)."""
        self._show(_started(call_id, spec))
        started = time.monotonic()
        try:
            result = await self._traced(spec, arguments, call_id)
        except asyncio.CancelledError:
            elapsed = time.monotonic() - started
            stopped = ToolResult(f"error: {spec.name} was stopped", True, elapsed)
            self._show(_finished(call_id, spec, stopped))
            raise
        self._show(_finished(call_id, spec, result))
        return result

    async def _traced(self, spec: ToolSpec, arguments: dict[str, Any], call_id: str) -> ToolResult:
        """The tool's result with its time, in a span and the histogram."""
        attributes: dict[str, str | bool] = {
            "kame.session_id": self._session_id,
            "tool.name": spec.name,
            "tool.server": spec.server,
            "tool.read_only": spec.read_only,
            "tool.call_id": call_id,
        }
        if TRANSCRIPTS_IN_SPANS:  # arguments may carry what the caller said
            attributes["tool.arguments"] = canonical_arguments(arguments)
        with _tracer.start_as_current_span("oracle.tool_call", attributes=attributes) as span:
            started = time.monotonic()
            try:
                result = await self._toolbox.call(spec, arguments, call_id)
            except Exception:  # a bug must not fail every candidate that reuses this call
                log.exception("session %s: tool %s failed", self._session_id, spec.name)
                result = ToolResult(f"error: {spec.name} failed", True)
            elapsed = time.monotonic() - started
            outcome = "error" if result.is_error else "ok"
            TOOL_SECONDS.labels(tool=metric_label(spec), outcome=outcome).observe(elapsed)
            span.set_attribute("tool.elapsed_s", elapsed)
            if result.is_error:
                # A client's or a server's words may carry what the caller said.
                shown = result.text if TRANSCRIPTS_IN_SPANS else f"{spec.name} answered an error"
                span.set_status(trace.Status(trace.StatusCode.ERROR, shown))
        return ToolResult(result.text, result.is_error, elapsed)

    def running(self) -> bool:
        return any(not run.task.done() for run in self._runs.values())

    async def close(self) -> None:
        """Cancel the calls still running (the session is ending)."""
        await cancel_and_wait([run.task for run in self._runs.values()])


def _outcome(spec: ToolSpec, task: asyncio.Task[ToolResult]) -> ToolResult:
    """A finished run's result; an error result if it was stopped."""
    if task.cancelled() or task.exception() is not None:
        return ToolResult(f"error: {spec.name} was stopped", True)
    return task.result()


class SessionTools:
    """A session's tools: the current turn's calls, and when a new turn begins
    (the caller speaks a new utterance after the agent has spoken). A finished
    turn's calls still running are left to end on their own (within their
    timeout): a side effect half done is not cancelled."""

    def __init__(
        self,
        toolbox: Toolbox,
        budget: int,
        session_id: str,
        record: Callable[[ToolCall, ToolResult], None],
        show: ShowActivity | None = None,
    ) -> None:
        self._toolbox = toolbox
        self._budget = budget
        self._session_id = session_id
        self._record = record
        self._show = show
        self.specs = toolbox.specs
        self.turn = self._new_turn()
        self._earlier: list[TurnTools] = []
        self._utterance_id = ""
        self._agent_spoke = False

    def _new_turn(self) -> TurnTools:
        return TurnTools(self._toolbox, self._budget, self._session_id, self._record, self._show)

    def on_user_utterance(self, utterance_id: str) -> None:
        if utterance_id == self._utterance_id:
            return
        if self._agent_spoke:
            self._earlier = [t for t in [*self._earlier, self.turn] if t.running()]
            self.turn = self._new_turn()
            self._agent_spoke = False
        self._utterance_id = utterance_id

    def on_agent_words(self) -> None:
        self._agent_spoke = True

    async def close(self) -> None:
        for turn in [*self._earlier, self.turn]:
            await turn.close()
