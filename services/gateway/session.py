"""One Converse session: the pumps between the caller and the three upstreams.

Per session the gateway opens one bidirectional stream to each of frontend,
stt and oracle (no oracle in s2s mode; opening.py): the frontend's is an
`Upstream` (upstream.py), stt's and the oracle's are `SideStream`s
(sidestream.py). It runs these tasks:

    caller ──► _read_caller ──► frontend.send ──► frontend writer
                     ├────────► stt.push ─────► stt writer
                     ├─ keys, function results (client_functions.py) ─► oracle.push
                     ├─ commentary, thinking, instructions (delegation.py) ─► oracle.push
                     └─ turn controls, typed text (turn_control.py) ─► stt, frontend,
                        and typed text down the transcripts' path below
               (caller_input.py: the caller's audio as frames, the requests routed)
    frontend ─► _read_frontend: AgentAudio ─► client codec ─► client queue
                                AgentText ──► client queue, oracle.push
                                TurnEnd ────► stt.push (EndOfTurn: finalize now)
    stt ──────► _on_stt_response: transcripts ─► client queue, frontend.send, oracle.push
                                  SPEECH_START/END ─► turn tracker (latencies)
                                  FINAL_DECODE ─► oracle.push (speculation yields)
    oracle ───► _on_oracle_response: updates ─► frontend.send (and client queue if opted in)
                                     function calls, tool activity ─► client queue
                                     delegations (client delegation) ─► client queue
    client queue ─► responses() ─► the caller (the servicer yields what it yields;
                                   client_output.py)

The voice path (caller -> frontend -> caller) never waits on stt, oracle or
Redis. Its queues are bounded and producers await `send`, so a slow frontend
or client pushes back up to the caller's stream (gRPC flow control). Whatever
goes to a side stream (caller frames and end-of-turn for stt, transcripts and
agent text for the oracle) is pushed without waiting into a bounded buffer
that drops its oldest message when full (counted per stream), and Redis
writes go through their own queue (records.py). Only the side streams' own
readers wait on the voice path, never the other way round.

Failures: the frontend is essential, so its failure ends the session with
UNAVAILABLE, and so does a frontend stream that ends before the caller is
done or with caller frames it never answered. stt and oracle are side streams, watched and reopened
(sidestream.py): one that fails, ends early or sends nothing for
side_timeout_s while caller audio flows is cancelled and reopened with
backoff. While either is down the call goes on without oracle; the client
gets Notice ORACLE_UNAVAILABLE when the oracle is lost and ORACLE_RESTORED
when both answer again (oracle_health.py). A reopened oracle stream carries the same session id,
so the oracle picks the conversation up from Redis (while no oracle call is
open, the gateway logs the turns itself, as in s2s; the lost stream's function
calls go unanswered); a reopened stt stream
starts at the caller's next frame, and the gateway shifts its audio times by
where that stream began, so every time downstream stays on the session's
clock (a dropped frame, though, shifts the stt's clock until it reopens). An
oracle that rejects the client's llm override or functions ends the session
with INVALID_ARGUMENT; one whose token budget is spent (RESOURCE_EXHAUSTED,
services/oracle/budget.py) ends it with its message. Messages to the client
never name internal addresses; the
log has them. A teardown that runs however the session ends (caller done,
caller gone, error) cancels every task and every upstream call, so the
upstream services see their sessions end.

End of input: the caller half-closes -> the last frames go out and the
frontend and stt streams are half-closed -> the frontend answers the last
frame and ends -> stt finalizes its open utterance and ends -> the oracle is
half-closed (it writes the last agent turn to Redis) and ends -> done.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import grpc
from opentelemetry import trace

from kame_client.codecs import Encoder, coded
from kame_common import tracing
from kame_common.aio import cancel_and_wait
from kame_common.answer_time import AnswerTimes
from kame_common.audio import pcm16_to_float
from kame_common.llm import BUDGET_SPENT_METADATA
from kame_common.store import Replica
from kame_common.streams import StreamError
from kamepb import common_pb2, frontend_pb2, gateway_pb2, oracle_pb2, stt_pb2
from services.gateway import metrics
from services.gateway.caller_input import CallerAudio, CallerKeys, now_us, read_requests
from services.gateway.client_functions import FunctionRouter
from services.gateway.client_output import AgentFrameOut, ClientOutput, EndOfSession
from services.gateway.connections import Connections
from services.gateway.delegation import CallerContext
from services.gateway.opening import (
    TURN_TAKING_ENGINE,
    SideOpeners,
    open_frontend,
    side_policy,
)
from services.gateway.oracle_health import OracleHealth, notice
from services.gateway.plan import CALL_INFO_FIELDS, Mode, SessionError, SessionPlan
from services.gateway.records import SessionRecords
from services.gateway.replay import OracleReplay, SttReplay, shift_transcript
from services.gateway.reporting import TurnReporter
from services.gateway.sidestream import SideStream
from services.gateway.turn_control import CallerTurns, TurnRoutes
from services.gateway.turns import TurnTracker
from services.gateway.upstream import Upstream, describe_failure

log = logging.getLogger(__name__)
_tracer = tracing.tracer("kame.gateway")

Notice = gateway_pb2.Notice
INVALID = grpc.StatusCode.INVALID_ARGUMENT


def budget_spent(exc: grpc.aio.AioRpcError) -> bool:
    """Whether the oracle ended its stream because a token budget is spent."""
    return exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and BUDGET_SPENT_METADATA in tuple(
        exc.trailing_metadata() or ()
    )


class GatewaySession:
    def __init__(
        self,
        connections: Connections,
        plan: SessionPlan,
        session_id: str = "",
        resume_token: str = "",
        resumed: bool = False,
        answers: AnswerTimes | None = None,
    ) -> None:
        self.connections = connections
        self.settings = connections.settings
        self.plan = plan
        self.id = session_id or uuid.uuid4().hex
        self.resume_token = resume_token  # what continues the session ("" = nothing)
        self.resumed = resumed  # continues the session of an earlier call
        self.frontend: Upstream[frontend_pb2.FrontendRequest] | None = None
        self.stt: SideStream[stt_pb2.TranscribeRequest] | None = None
        self.oracle: SideStream[oracle_pb2.GuideRequest] | None = None
        self._stt_replay = SttReplay(self.settings.stt_replay_s)
        self._oracle_replay = OracleReplay()
        self._records = SessionRecords(connections.store, self.id)
        self._audio = CallerAudio(
            self.settings, plan.input_format, self._records, self._send_caller_frame
        )
        self._openers = SideOpeners(
            connections,
            plan,
            self.id,
            self._stt_replay,
            self._oracle_replay,
            heard_s=self._audio.heard_s,
            forget_utterances=self._forget_utterances,
        )
        self.replica = Replica("", "", 0, 0)  # the frontend replica serving the session
        self.ready = frontend_pb2.FrontendReady()
        self._tasks: list[asyncio.Task[None]] = []  # the caller reader and the supervisor
        self._abort: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._tracker = TurnTracker()
        self._encoder = Encoder(plan.output_format)
        self._span = _tracer.start_span(
            "session", attributes={"kame.session_id": self.id, "kame.mode": plan.mode.value}
        )
        self._reporter = TurnReporter(plan.mode, self._span, answers)
        self._functions = FunctionRouter(self.id, self._records)
        self._output = ClientOutput(
            self.settings.queue_frames, plan.mode, self._tracker, self._reporter
        )
        self._oracle_health = OracleHealth(self.id, self._sides, self._output.put)
        self._context: CallerContext  # made once the oracle's side stream is (_open)

    # ---- public -------------------------------------------------------------

    async def responses(
        self, requests: AsyncIterator[gateway_pb2.ConverseRequest]
    ) -> AsyncIterator[gateway_pb2.ConverseResponse]:
        """The session's output to the caller, until the caller is done and every
        upstream has finished; raises SessionError for a status the caller
        should get. Closing the generator (the caller went away) tears down."""
        outcome = "cancelled"
        try:
            await self._open()
            yield gateway_pb2.ConverseResponse(
                started=gateway_pb2.SessionStarted(
                    session_id=self.id,
                    frontend_replica=self.ready.replica_id,
                    engine=self.ready.engine,
                    resume_token=self.resume_token,
                    resumed=self.resumed,
                )
            )
            supervisor = self._start_pumps(requests)
            while not isinstance(item := await self._output.next_item(supervisor), EndOfSession):
                for response in self._output.responses_for(item):
                    yield response
            outcome = "ok"
        except StreamError as exc:
            outcome = exc.code.name
            self._span.set_status(trace.StatusCode.ERROR, exc.message)
            raise
        except Exception as exc:
            outcome = "INTERNAL"
            self._span.record_exception(exc)
            raise
        finally:
            await self._teardown(outcome)

    def ask_to_reconnect(self) -> None:
        """The gateway is shutting down: tell the caller to continue on another one."""
        message = (
            "the gateway is shutting down: reconnect with your resume token to continue"
            if self.settings.resume_secret
            else "the gateway is shutting down: reconnect to start a new call"
        )
        # Not waiting: with the queue full the call is ending anyway.
        self._output.offer(notice(Notice.RECONNECT, message))

    # ---- opening --------------------------------------------------------------

    async def _open(self) -> None:
        with trace.use_span(self._span, end_on_exit=False):
            opened = await open_frontend(self.connections, self.plan, self.id)
            self.frontend, self.replica, self.ready = opened.upstream, opened.replica, opened.ready
            self._openers.frontend_ends_turns = self.ready.engine == TURN_TAKING_ENGINE
            self._span.set_attribute("kame.frontend", self.replica.address)
            self.stt = self._side_stream("stt", 1, self._openers.stt, self._on_stt_response)
            if self.plan.mode.uses_oracle:
                # Transcripts and agent words come in bursts: the oracle's buffer is deeper.
                self.oracle = self._side_stream(
                    "oracle", 4, self._openers.oracle, self._on_oracle_response
                )
        self._context = CallerContext(
            self.settings, self.plan, self._output, self.oracle, self._openers.add_instructions
        )
        self._records.start()
        now = time.time()
        self._records.update_session(
            {
                "mode": self.plan.mode.value,
                "replica": self.replica.address,
                "replica_id": self.ready.replica_id,
                "engine": self.ready.engine,
                "input_codec": self.plan.input_format.codec,
                "output_codec": self.plan.output_format.codec,
                "delegation": "client" if self.plan.client_delegation else "oracle",
                # a resumed session keeps the time it first started
                ("resumed_at" if self.resumed else "started_at"): now,
                "alive_at": now,
                "state": "active",
                **{
                    f"call_{name}": value
                    for name in CALL_INFO_FIELDS
                    if (value := getattr(self.plan.call, name))
                },
            }
        )

    def _side_stream(self, name: str, depth: int, open_call: Any, handle: Any) -> SideStream[Any]:
        """A side stream whose buffer holds `depth` times queue_frames messages. It
        opens its calls itself: a service that is down shows up as a side
        failure, not as a session error."""
        policy = side_policy(self.settings, depth)
        return SideStream(name, policy, open_call, handle, self._side_down, self._side_up)

    def _forget_utterances(self, utterance_ids: list[str]) -> None:
        """The oracle forgets utterances of a failed stt stream (a blank final each)."""
        if self.oracle is None:
            return
        for utterance_id in utterance_ids:
            blank = common_pb2.TranscriptEvent(utterance_id=utterance_id, is_final=True)
            self.oracle.push(oracle_pb2.GuideRequest(user_transcript=blank))

    # ---- pumps -----------------------------------------------------------------

    def _spawn(self, role: str, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        return asyncio.get_running_loop().create_task(coro, name=f"gateway-{self.id}-{role}")

    def _start_pumps(
        self, requests: AsyncIterator[gateway_pb2.ConverseRequest]
    ) -> asyncio.Task[None]:
        """Start every pump; returns the supervisor task."""
        assert self.frontend is not None
        caller = self._spawn("caller", self._read_caller(requests))
        self.frontend.start(self._read_frontend, self._frontend_guard, self._spawn)
        for side in self._sides():
            side.start(self._spawn)
        supervisor = self._spawn("supervisor", self._supervise(caller))
        self._tasks = [caller, supervisor]
        return supervisor

    async def _supervise(self, caller: asyncio.Task[None]) -> None:
        """Wait until the frontend's output ends, then finish; re-raise the first
        failure of an essential task (caller input, frontend) or an abort."""
        assert self.frontend is not None
        frontend_out = self.frontend.tasks[1]
        watched: set[asyncio.Future[None]] = {caller, *self.frontend.tasks, self._abort}
        while frontend_out in watched:
            done, _ = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
            for future in done:
                if (error := future.exception()) is not None:
                    raise error
                watched.discard(future)
        await self._finish()

    async def _finish(self) -> None:
        """The frontend answered every caller frame: let stt finalize, then close
        the oracle, then end the output."""
        drain_s = self.settings.drain_timeout_s
        if self.stt is not None:
            await self.stt.wait_finished(drain_s)
        if self.oracle is not None:
            self.oracle.close_input()  # it logs the last agent turn, then ends
            await self.oracle.wait_finished(drain_s)
        self._records.flush_agent_words()
        self._tracker.close()
        await self._output.report_ready_turns()
        await self._output.put(EndOfSession())

    async def _read_caller(self, requests: AsyncIterator[gateway_pb2.ConverseRequest]) -> None:
        assert self.frontend is not None and self.stt is not None
        routes = TurnRoutes(self.frontend.send, self._end_stt_turn, self._output.put, self._typed)
        caller_turns = CallerTurns(
            self.id,
            self.settings,
            self.plan.manual_turns,
            routes,
            self._audio.heard_s,
            self._tracker,
        )
        keys = CallerKeys(self.settings, self._records, self._output, self.oracle)
        await read_requests(
            requests,
            self._audio,
            keys,
            caller_turns,
            lambda result: self._functions.answer(result, self.oracle),
            self._context,
        )
        await self.frontend.close_input()
        self.stt.close_input()

    async def _send_caller_frame(self, frame: common_pb2.AudioFrame) -> None:
        assert self.frontend is not None and self.stt is not None
        await self.frontend.send(frontend_pb2.FrontendRequest(audio=frame))
        self._stt_replay.add(frame)
        self.stt.push(stt_pb2.TranscribeRequest(audio=frame))
        for side in self._sides():
            side.audio_flowing()

    async def _read_frontend(self) -> None:
        """The frontend's answers until it ends its stream, which it may do only
        once the caller is done and every caller frame has its agent frame."""
        assert self.frontend is not None
        answered = 0
        while (response := await self.frontend.call.read()) is not grpc.aio.EOF:
            kind = response.WhichOneof("msg")
            if kind == "audio":
                answered += 1
                await self._on_agent_audio(response.audio)
            elif kind == "text":
                await self._on_agent_text(response.text)
            elif kind == "turn_end":
                self._on_turn_end(response.turn_end)
            elif kind == "barge_in":
                if not response.barge_in.cancelled:
                    metrics.BARGE_INS.inc()
                barge_in = gateway_pb2.ConverseResponse(barge_in=response.barge_in)
                await self._output.put(barge_in)
        if not self.frontend.input_closed:
            raise SessionError(
                grpc.StatusCode.UNAVAILABLE,
                "the frontend ended the stream before the caller finished",
            )
        if (unanswered := self._audio.frames - answered) > 0:
            raise SessionError(
                grpc.StatusCode.UNAVAILABLE,
                f"the frontend ended the stream with {unanswered} caller frames unanswered",
            )

    async def _on_agent_audio(self, audio: frontend_pb2.AgentAudio) -> None:
        frame = audio.frame
        round_trip = (now_us() - frame.capture_time_us) / 1e6
        mode = self.plan.mode.value
        metrics.FRAME_ROUND_TRIP.labels(mode).observe(round_trip)
        metrics.FRAME_TRANSPORT.labels(mode).observe(max(0.0, round_trip - audio.step_s))
        samples = pcm16_to_float(frame.pcm)
        chunks = await coded(self.plan.output_format, self._encoder.encode, samples)
        await self._output.put(AgentFrameOut(frame.seq, audio.speaking, chunks, audio.held))

    async def _on_agent_text(self, text: common_pb2.AgentText) -> None:
        await self._output.put(gateway_pb2.ConverseResponse(agent_text=text))
        if self.oracle is None or not self.oracle.push(oracle_pb2.GuideRequest(agent_text=text)):
            # No oracle to keep the conversation. Standing in for one that is down, the
            # gateway keeps a hold phrase out of it, as the oracle does
            # (services/oracle/session.py: agent_text); in s2s it keeps every word.
            if not text.filler or self.plan.mode is Mode.S2S:
                self._records.agent_word(text.text)

    def _on_turn_end(self, turn_end: frontend_pb2.TurnEnd) -> None:
        """The frontend heard the caller's turn end: stt finalizes at once."""
        if self.stt is None:
            return
        self._stt_replay.turn_end_s = turn_end.speech_end_s
        speech_end_s = max(turn_end.speech_end_s - self._openers.stt_start_s, 0.0)
        end_of_turn = stt_pb2.EndOfTurn(speech_end_s=speech_end_s)
        self.stt.push(stt_pb2.TranscribeRequest(end_of_turn=end_of_turn))

    async def _on_stt_response(self, response: stt_pb2.TranscribeResponse) -> None:
        """SttProgress only tells the watchdog that stt is alive."""
        kind = response.WhichOneof("msg")
        if kind == "transcript":
            await self._on_transcript(
                shift_transcript(response.transcript, self._openers.stt_start_s)
            )
        elif kind == "activity":
            activity = response.activity
            activity.at_s += self._openers.stt_start_s
            await self._on_activity(activity)

    def _end_stt_turn(self) -> None:
        """The caller ended its turn: stt finalizes at what it has heard so far."""
        self._on_turn_end(frontend_pb2.TurnEnd(speech_end_s=self._audio.heard_s()))

    async def _typed(self, event: common_pb2.TranscriptEvent) -> None:
        """A typed message: a turn that ends as it arrives, on the transcript path."""
        self._tracker.on_speech_end(event.utterance_id, time.time())
        await self._on_transcript(event, typed=True)

    async def _on_transcript(self, event: common_pb2.TranscriptEvent, typed: bool = False) -> None:
        assert self.frontend is not None
        self._stt_replay.heard(event)
        self._oracle_replay.final(event)
        turn = self._tracker.on_transcript(event, time.time())
        if event.is_final and turn.summarized:
            self._reporter.trace(turn)  # the final came after the answer started
        await self._output.put(gateway_pb2.ConverseResponse(user_transcript=event))
        if typed:
            await self.frontend.send(frontend_pb2.FrontendRequest(user_text=event))
        else:
            await self.frontend.send(frontend_pb2.FrontendRequest(user_transcript=event))
        request = oracle_pb2.GuideRequest(user_transcript=event)
        oracle_took_it = self.oracle is not None and self.oracle.push(request)
        if not oracle_took_it and event.is_final and event.text.strip():
            self._records.user_turn(event.text.strip(), started_wall=turn.started_wall)
        await self._output.report_ready_turns()

    async def _on_activity(self, activity: common_pb2.SpeechActivity) -> None:
        wall = self._audio.wall_at(activity.at_s)
        if activity.kind == common_pb2.SpeechActivity.SPEECH_START:
            self._stt_replay.speech_started(activity.utterance_id, activity.at_s)
            self._tracker.on_speech_start(activity.utterance_id, wall)
        elif activity.kind == common_pb2.SpeechActivity.SPEECH_END:
            self._tracker.on_speech_end(activity.utterance_id, wall)
        elif activity.kind == common_pb2.SpeechActivity.FINAL_DECODE:
            if self.oracle is not None:  # its speculative LLM work yields to the decode
                self.oracle.push(oracle_pb2.GuideRequest(speech_activity=activity))
            return
        await self._output.report_ready_turns()

    async def _on_oracle_response(self, response: oracle_pb2.GuideResponse) -> None:
        """A HEARTBEAT only tells the watchdog that the oracle is alive."""
        kind = response.WhichOneof("msg")
        if kind == "update":
            await self._on_oracle_update(response.update)
        elif kind in ("function_call", "tool"):
            await self._output.put(self._functions.from_oracle(response))
        elif kind == "delegation":
            offset_s = self._audio.heard_s()
            await self._output.put(self._context.delegated(response.delegation, offset_s))
        elif response.event.kind == oracle_pb2.OracleEvent.ERROR:
            await self._oracle_health.llm_error(response.event.detail)

    async def _on_oracle_update(self, update: common_pb2.OracleUpdate) -> None:
        assert self.frontend is not None
        self._oracle_replay.update(update)
        self._tracker.on_oracle_update(time.time())
        await self.frontend.send(frontend_pb2.FrontendRequest(oracle=update))
        if self.plan.include_oracle_updates:
            await self._output.put(gateway_pb2.ConverseResponse(oracle_update=update))

    # ---- failures ----------------------------------------------------------------

    async def _frontend_guard(self, coro: Coroutine[Any, Any, None]) -> None:
        try:
            await coro
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as exc:
            # InvalidStateError: a write to a call that the frontend already ended.
            log.warning(
                "session %s: frontend %s failed: %s",
                self.id,
                self.replica.address,
                describe_failure(exc),
            )
            metrics.UPSTREAM_FAILURES.labels("frontend").inc()
            raise SessionError(grpc.StatusCode.UNAVAILABLE, "the frontend failed") from None

    def _sides(self) -> list[SideStream[Any]]:
        return [side for side in (self.stt, self.oracle) if side is not None]

    async def _side_down(self, side: SideStream[Any], exc: Exception) -> bool:
        """A side stream failed: tell the client if that lost the oracle; whether to
        reopen it (not when the oracle refused the client's own llm override or
        functions, nor when the call's token budget is spent)."""
        if side is self.oracle:
            self._functions.oracle_lost()
            refusable = self.plan.oracle_may_refuse
            if refusable and isinstance(exc, grpc.aio.AioRpcError) and exc.code() == INVALID:
                self._fail(
                    SessionError(INVALID, f"the oracle rejected the {refusable}: {exc.details()}")
                )
                return False
            if isinstance(exc, grpc.aio.AioRpcError) and budget_spent(exc):
                exhausted = grpc.StatusCode.RESOURCE_EXHAUSTED
                self._fail(SessionError(exhausted, f"oracle: {exc.details()}"))
                return False
        await self._oracle_health.side_down(side, exc)
        return True

    async def _side_up(self, side: SideStream[Any]) -> None:
        if side is self.stt:
            self._stt_replay.answered()
        if side is self.oracle:  # the oracle keeps the conversation again
            self._records.flush_agent_words()
        await self._oracle_health.side_up(side)

    def _fail(self, error: SessionError) -> None:
        if not self._abort.done():
            self._abort.set_exception(error)

    # ---- teardown ------------------------------------------------------------------

    async def _teardown(self, outcome: str) -> None:
        for turn in self._tracker.turns:
            if turn.summarized:
                self._reporter.trace(turn)
        if self.frontend is not None:
            self.frontend.call.cancel()
        await cancel_and_wait(
            [
                *self._tasks,
                *(self.frontend.tasks if self.frontend else []),
                *(side.task for side in self._sides() if side.task is not None),
            ]
        )
        if self._abort.done() and not self._abort.cancelled():
            self._abort.exception()  # retrieved: it was raised already or lost to an earlier one
        self._records.update_session(
            {
                "state": "ended" if outcome == "ok" else "failed",
                "outcome": outcome,
                "ended_at": time.time(),
                "turns": len(self._tracker.turns),
            }
        )
        await self._records.close()
        metrics.SESSIONS.labels(self.plan.mode.value, outcome).inc()
        self._span.set_attribute("kame.outcome", outcome)
        self._span.end()
