"""Opening a session's upstream calls: the frontend's once, at the start;
stt's and the oracle's each time their side stream opens a call.

- The frontend (`open_frontend`): the config goes to the chosen replica, then
  to the next candidate if it refuses or sends no FrontendReady within
  `connect_timeout_s` (one deadline for the whole set-up). A refusal of the
  session's config itself (INVALID_ARGUMENT) ends the session at once.
- stt and the oracle (`SideOpeners`): a side stream opens its calls itself
  (sidestream.py), so a service that is down shows up as a side failure, not
  as a session error. A reopened call is first sent what it must not miss
  (replay.py): stt the caller's frames of the utterances the failed stream
  had not finalized, the oracle the caller's final transcript that no
  candidate answered.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from kame_common.audio import FRAME_SECONDS
from kame_common.store import Replica
from kamepb import (
    frontend_pb2,
    frontend_pb2_grpc,
    gateway_pb2,
    oracle_pb2,
    oracle_pb2_grpc,
    stt_pb2,
    stt_pb2_grpc,
)
from services.gateway import metrics
from services.gateway.config import GatewaySettings
from services.gateway.connections import Connections
from services.gateway.plan import Mode, SessionError, SessionPlan
from services.gateway.replay import OracleReplay, SttReplay
from services.gateway.sidestream import SidePolicy
from services.gateway.upstream import StreamCall, Upstream, describe_failure

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OpenedFrontend:
    upstream: Upstream[frontend_pb2.FrontendRequest]
    replica: Replica  # the replica serving the session
    ready: frontend_pb2.FrontendReady


def _frontend_config(
    settings: GatewaySettings, plan: SessionPlan, session_id: str
) -> frontend_pb2.FrontendRequest:
    s2s = plan.mode is Mode.S2S
    return frontend_pb2.FrontendRequest(
        config=frontend_pb2.FrontendConfig(
            session_id=session_id,
            engine=settings.s2s_engine if s2s else "",
            voice=plan.voice,
            turn_end_silence_s=settings.turn_end_silence_s,
            hold_phrases=plan.hold_phrases,
            hold_max_s=plan.hold_max_s,
            hold_delay_s=plan.hold_delay_s,
            manual_turns=plan.manual_turns,
        )
    )


async def open_frontend(
    connections: Connections, plan: SessionPlan, session_id: str
) -> OpenedFrontend:
    """Send the config to the chosen replica and wait for FrontendReady; on a
    refusal, try the next candidate."""
    settings = connections.settings
    config = _frontend_config(settings, plan, session_id)
    error = SessionError(grpc.StatusCode.UNAVAILABLE, "no frontend is available")
    for replica in await connections.frontend_candidates():
        channel = connections.channel(replica.address)
        call = frontend_pb2_grpc.FrontendStub(channel).Stream()
        try:
            # One deadline for the whole set-up: a replica that accepts the
            # connection but never reads or answers cannot hold the call.
            first = await asyncio.wait_for(
                _start_frontend_call(call, config), settings.connect_timeout_s
            )
        except TimeoutError:
            call.cancel()
            log.warning("session %s: frontend %s sent no ready", session_id, replica.address)
            error = SessionError(
                grpc.StatusCode.UNAVAILABLE,
                f"the frontend did not start the session within {settings.connect_timeout_s:g} s",
            )
            continue
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as exc:
            # InvalidStateError: the write found the call already ended (refused).
            call.cancel()
            log.warning(
                "session %s: frontend %s refused: %s",
                session_id,
                replica.address,
                describe_failure(exc),
            )
            error = _frontend_open_error(exc)
            if error.code == grpc.StatusCode.INVALID_ARGUMENT:
                raise error from None
            continue
        if not isinstance(first, frontend_pb2.FrontendResponse) or not first.HasField("ready"):
            call.cancel()
            error = SessionError(grpc.StatusCode.UNAVAILABLE, "the frontend did not start")
            continue
        upstream = Upstream("frontend", call, settings.queue_frames)
        return OpenedFrontend(upstream, replica, first.ready)
    raise error


async def _start_frontend_call(call: Any, config: frontend_pb2.FrontendRequest) -> Any:
    """Send the config; the frontend's first answer (FrontendReady or EOF)."""
    await call.write(config)
    return await call.read()


def _frontend_open_error(exc: grpc.aio.AioRpcError | asyncio.InvalidStateError) -> SessionError:
    """What the client hears when a frontend refused: its reason, never its address."""
    if not isinstance(exc, grpc.aio.AioRpcError):
        return SessionError(grpc.StatusCode.UNAVAILABLE, "the frontend is unavailable")
    code = exc.code()
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return SessionError(code, "no frontend slot is free; try again shortly")
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return SessionError(code, f"the frontend rejected the session config: {exc.details()}")
    return SessionError(grpc.StatusCode.UNAVAILABLE, f"the frontend is unavailable ({code.name})")


def side_policy(settings: GatewaySettings, depth: int) -> SidePolicy:
    """How a side stream whose buffer holds `depth` times queue_frames messages
    is fed, watched and reopened."""
    return SidePolicy(
        buffer_size=settings.queue_frames * depth,
        timeout_s=settings.side_timeout_s,
        backoff_s=settings.side_backoff_s,
        backoff_max_s=settings.side_backoff_max_s,
    )


# The frontend engine whose turn detector reports the caller's turn ends
# (frontend.proto TurnEnd); the kame and moshi engines take turns in the model.
TURN_TAKING_ENGINE = "tts"


class SideOpeners:
    """The openers of one session's stt and oracle calls (sidestream.Opener)."""

    def __init__(
        self,
        connections: Connections,
        plan: SessionPlan,
        session_id: str,
        stt_replay: SttReplay,
        oracle_replay: OracleReplay,
        heard_s: Callable[[], float],
        forget_utterances: Callable[[list[str]], None],
    ) -> None:
        self._connections = connections
        self._settings = connections.settings
        self._plan = plan
        self._session_id = session_id
        self._stt_replay = stt_replay
        self._oracle_replay = oracle_replay
        self._heard_s = heard_s  # seconds of caller audio so far
        self._forget_utterances = forget_utterances  # tells the oracle to drop them
        self.stt_start_s = 0.0  # where the current stt stream began in the session's audio
        # The frontend reports the caller's turn ends (the tts engine), so stt's
        # own pause timer may wait for them (a cascade's final at the turn end).
        self.frontend_ends_turns = False
        # The caller's instructions: the config's, and those it added since
        # (AgentContext INSTRUCTIONS), so that a reopened oracle call has them all.
        self.instructions = plan.instructions

    def add_instructions(self, text: str) -> None:
        self.instructions = f"{self.instructions}\n{text}".strip()

    def stt(
        self, attempt: int
    ) -> tuple[StreamCall[stt_pb2.TranscribeRequest], list[stt_pb2.TranscribeRequest]]:
        """A stt call. The first gets every caller frame; a reopened one first gets
        the frames of the utterances the failed one had not finalized (replay.py),
        and its own session id, so its utterance ids differ from the earlier ones.
        The oracle forgets the failed stream's unfinished utterances (a blank final
        each): their words come again under the new ids."""
        session_id = self._session_id
        channel = self._connections.channel(self._settings.stt_address)
        config = stt_pb2.SttConfig(
            session_id=session_id if attempt == 0 else f"{session_id}.{attempt}",
            language=self._plan.language,
            progress_interval_s=self._settings.side_heartbeat_s,
            endpoint_silence_s=self._endpoint_silence_s(),
        )
        opening = [stt_pb2.TranscribeRequest(config=config)]
        call = stt_pb2_grpc.SttStub(channel).Transcribe()
        if attempt == 0:
            return call, opening
        replay = self._stt_replay.restart()
        self._forget_utterances(replay.unfinished)
        frames = replay.frames
        self.stt_start_s = frames[0].seq * FRAME_SECONDS if frames else self._heard_s()
        opening += [stt_pb2.TranscribeRequest(audio=frame) for frame in frames]
        if frames and replay.turn_end_s is not None:
            speech_end_s = max(replay.turn_end_s - self.stt_start_s, 0.0)
            end_of_turn = stt_pb2.EndOfTurn(speech_end_s=speech_end_s)
            opening.append(stt_pb2.TranscribeRequest(end_of_turn=end_of_turn))
        metrics.REPLAYED_SECONDS.observe(len(frames) * FRAME_SECONDS)
        return call, opening

    def _endpoint_silence_s(self) -> float:
        """stt's pause that ends an utterance (0: stt's default). A cascade on a
        frontend that ends turns waits for its turn end (EndOfTurn finalizes at
        once), so its LLM starts only once the caller's turn is over: a true
        cascade, judged by the same turn detector as tandem, whose stt ends
        utterances by its own short pause to speculate on them."""
        if self._plan.mode is Mode.CASCADE and self.frontend_ends_turns:
            return self._settings.cascade_stt_endpoint_s
        return 0.0

    def oracle(
        self, attempt: int
    ) -> tuple[StreamCall[oracle_pb2.GuideRequest], list[oracle_pb2.GuideRequest]]:
        """Every oracle call has the session's id, the caller's functions and
        instructions and its delegation: a
        reopened one loads the conversation so far from Redis, and first gets the
        caller's final transcript that no candidate has answered yet, so it
        answers that turn."""
        channel = self._connections.channel(self._settings.oracle_address)
        llm = self._plan.llm or gateway_pb2.LlmOverride()
        config = oracle_pb2.OracleConfig(
            session_id=self._session_id,
            backend=llm.backend,
            model=llm.model,
            base_url=llm.base_url,
            api_key=llm.api_key,
            policy=oracle_pb2.OraclePolicy(name=self._plan.mode.value),
            heartbeat_interval_s=self._settings.side_heartbeat_s,
            instructions=self.instructions,
            client_functions=self._plan.functions,
            frontend_ends_turns=self.frontend_ends_turns,
            caller=self._plan.caller,
            client_delegation=self._plan.client_delegation,
            delegation_timeout_s=self._plan.delegation_timeout_s,
        )
        call = oracle_pb2_grpc.OracleStub(channel).Guide()
        opening = [oracle_pb2.GuideRequest(config=config)]
        if attempt and (final := self._oracle_replay.unanswered) is not None:
            opening.append(oracle_pb2.GuideRequest(user_transcript=final))
            metrics.REPLAYED_TURNS.inc()
        return call, opening
