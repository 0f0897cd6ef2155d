"""Helpers for frontend tests: caller audio as frames, oracle updates and caller
transcripts, and a client that plays a scripted call into a frontend at real time."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from kame_common.audio import (
    FRAME_SAMPLES,
    FRAME_SECONDS,
    SAMPLE_RATE,
    float_to_pcm16,
    pcm16_to_float,
    rms_dbfs,
)
from kamepb import common_pb2, frontend_pb2, frontend_pb2_grpc

# A frame quieter than this holds no speech (used to find where speech starts and ends).
SILENT_DB = -60.0


def frames_of(signal: np.ndarray) -> list[np.ndarray]:
    """Split a signal into 80 ms frames, zero-padding the last one."""
    count = -(-len(signal) // FRAME_SAMPLES)
    padded = np.zeros(count * FRAME_SAMPLES, dtype=np.float32)
    padded[: len(signal)] = signal
    return list(padded.reshape(count, FRAME_SAMPLES))


def silence(seconds: float) -> np.ndarray:
    return np.zeros(round(seconds / FRAME_SECONDS) * FRAME_SAMPLES, dtype=np.float32)


def speech_frames(frames: list[np.ndarray]) -> list[int]:
    """Indices of the frames that hold sound."""
    return [i for i, frame in enumerate(frames) if rms_dbfs(frame) > SILENT_DB]


def reset(
    generation: int, text: str = "", answers: common_pb2.TranscriptEvent | None = None
) -> common_pb2.OracleUpdate:
    """A RESET with the candidate's first words; `answers` is the transcript event
    the candidate was started from (its source)."""
    update = common_pb2.OracleUpdate(
        op=common_pb2.OracleUpdate.RESET, generation=generation, text=text
    )
    if answers is not None:
        update.source.CopyFrom(
            common_pb2.CandidateSource(
                utterance_id=answers.utterance_id, is_final=answers.is_final, text=answers.text
            )
        )
    return update


def append(generation: int, text: str) -> common_pb2.OracleUpdate:
    return common_pb2.OracleUpdate(
        op=common_pb2.OracleUpdate.APPEND, generation=generation, text=text
    )


def transcript(
    text: str, end_s: float, final: bool = True, utterance_id: str = "u1"
) -> common_pb2.TranscriptEvent:
    """stt's hypothesis of the caller's utterance, covering audio up to `end_s`
    (a partial's words all stable: stt expects none of them to change)."""
    return common_pb2.TranscriptEvent(
        utterance_id=utterance_id,
        is_final=final,
        text=text,
        stable_text=text,
        span=common_pb2.AudioSpan(start_s=0.0, end_s=end_s),
    )


@dataclass(frozen=True)
class Typed:
    """A message the caller typed (FrontendRequest.user_text)."""

    event: common_pb2.TranscriptEvent


Message = common_pb2.OracleUpdate | common_pb2.TranscriptEvent | common_pb2.TurnControl | Typed


def request_of(message: Message) -> frontend_pb2.FrontendRequest:
    if isinstance(message, common_pb2.TranscriptEvent):
        return frontend_pb2.FrontendRequest(user_transcript=message)
    if isinstance(message, common_pb2.TurnControl):
        return frontend_pb2.FrontendRequest(turn_control=message)
    if isinstance(message, Typed):
        return frontend_pb2.FrontendRequest(user_text=message.event)
    return frontend_pb2.FrontendRequest(oracle=message)


@dataclass
class Call:
    """What came back from one Frontend.Stream."""

    ready: frontend_pb2.FrontendReady | None = None
    audio: list[frontend_pb2.AgentAudio] = field(default_factory=list)
    words: list[common_pb2.AgentText] = field(default_factory=list)
    turn_ends: list[frontend_pb2.TurnEnd] = field(default_factory=list)
    barge_ins: list[common_pb2.BargeIn] = field(default_factory=list)
    responses: list[frontend_pb2.FrontendResponse] = field(default_factory=list)  # in order
    # Messages sent in reaction to the agent's words, by the frame they preceded.
    reactions: dict[int, list[Message]] = field(default_factory=dict)

    def agent_frames(self) -> list[np.ndarray]:
        return [pcm16_to_float(a.frame.pcm) for a in self.audio]

    def agent_signal(self, from_frame: int = 0) -> np.ndarray:
        frames = self.agent_frames()[from_frame:]
        return np.concatenate(frames) if frames else np.zeros(0, dtype=np.float32)

    def sounding_frames(self) -> list[int]:
        """Indices of agent frames that carry sound (not just the speaking flag)."""
        return speech_frames(self.agent_frames())

    def words_of(self, generation: int) -> list[common_pb2.AgentText]:
        return [w for w in self.words if w.generation == generation]


React = Callable[[common_pb2.AgentText], list[Message]]


async def play_call(
    stub: frontend_pb2_grpc.FrontendStub,
    caller: list[np.ndarray],
    oracle: dict[int, list[Message]] | None = None,
    config: frontend_pb2.FrontendConfig | None = None,
    pace_s: float = FRAME_SECONDS,
    react: React | None = None,
) -> Call:
    """Send the config, then caller frame i every `pace_s` (real time by default,
    so synthesis gets the wall time it would get in a call), each preceded by the
    oracle updates and transcripts scheduled for it and by those `react(word)`
    returned for the agent words received since; collect everything the
    frontend answers."""
    oracle = oracle or {}
    config = config or frontend_pb2.FrontendConfig(session_id=f"test-{uuid.uuid4().hex[:8]}")
    call = Call()
    reactions: list[Message] = []

    async def requests():
        yield frontend_pb2.FrontendRequest(config=config)
        started = time.monotonic()
        for i, frame in enumerate(caller):
            if reactions:
                call.reactions[i] = reactions[:]
                reactions.clear()
            for message in oracle.get(i, []) + call.reactions.get(i, []):
                yield request_of(message)
            yield frontend_pb2.FrontendRequest(
                audio=common_pb2.AudioFrame(
                    pcm=float_to_pcm16(frame),
                    sample_rate_hz=SAMPLE_RATE,
                    seq=i,
                    capture_time_us=time.time_ns() // 1000,
                )
            )
            await asyncio.sleep(max(0.0, started + (i + 1) * pace_s - time.monotonic()))

    async for response in stub.Stream(requests()):
        call.responses.append(response)
        kind = response.WhichOneof("msg")
        if kind == "ready":
            call.ready = response.ready
        elif kind == "audio":
            call.audio.append(response.audio)
        elif kind == "turn_end":
            call.turn_ends.append(response.turn_end)
        elif kind == "barge_in":
            call.barge_ins.append(response.barge_in)
        else:
            call.words.append(response.text)
            if react is not None:
                reactions.extend(react(response.text))
    return call


def words_in(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())
