"""Fixtures for the STT tests: one shared engine (the real tiny.en model and Silero VAD),
a real STT server on a loopback port, a client that streams 80 ms frames into it
(as fast as the server takes them, or paced at real time) and records what comes
back, and a text normalizer + word error rate for judging transcripts."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import grpc
import numpy as np
import pytest

from kame_cli.wer import normalize, word_error_rate
from kame_common.audio import FRAME_BYTES, FRAME_SECONDS, SAMPLE_RATE, float_to_pcm16
from kamepb import common_pb2, stt_pb2, stt_pb2_grpc
from services.stt.config import SttSettings
from services.stt.engine import SttEngine
from services.stt.server import serve

# --- text normalization and word error rate (kame_cli.wer: the bench and kame demo judge by it) ---


@pytest.fixture(scope="session")
def text_metrics() -> SimpleNamespace:
    return SimpleNamespace(normalize=normalize, wer=word_error_rate)


# --- the service ---


@pytest.fixture(scope="session")
def stt_engine() -> SttEngine:
    engine = SttEngine(SttSettings())
    yield engine
    engine.close()


def loopback_settings(**overrides) -> SttSettings:
    return SttSettings(host="127.0.0.1", port=0, metrics_port=0, **overrides)


@pytest.fixture
async def stt_server(stt_engine):
    runtime = await serve(loopback_settings(), stt_engine)
    yield runtime
    await runtime.stop()


@pytest.fixture
async def stt_stub(stt_server):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{stt_server.port}") as channel:
        yield stt_pb2_grpc.SttStub(channel)


# --- a client that streams audio and records the answer ---


@dataclass
class Received:
    at: float  # client monotonic time
    response: stt_pb2.TranscribeResponse


@dataclass
class StreamResult:
    responses: list[Received] = field(default_factory=list)
    frame_sent_at: list[float] = field(default_factory=list)  # per frame, monotonic

    @property
    def transcripts(self) -> list[common_pb2.TranscriptEvent]:
        return [r.response.transcript for r in self.responses if r.response.HasField("transcript")]

    @property
    def activities(self) -> list[common_pb2.SpeechActivity]:
        return [r.response.activity for r in self.responses if r.response.HasField("activity")]

    def finals(self) -> list[common_pb2.TranscriptEvent]:
        return [t for t in self.transcripts if t.is_final]

    def final_text(self) -> str:
        return " ".join(t.text for t in self.finals())

    def utterance_ids(self) -> list[str]:
        return list(dict.fromkeys(t.utterance_id for t in self.transcripts))

    def events_of(self, utterance_id: str) -> list:
        """Activity and transcript messages of one utterance, in arrival order."""
        return [
            getattr(r.response, r.response.WhichOneof("msg"))
            for r in self.responses
            if getattr(r.response, r.response.WhichOneof("msg")).utterance_id == utterance_id
        ]

    def sent_at(self, stream_s: float) -> float:
        """When the client sent the frame holding stream second `stream_s`."""
        index = min(int(stream_s / FRAME_SECONDS), len(self.frame_sent_at) - 1)
        return self.frame_sent_at[index]

    def received_at(self, message) -> float:
        return next(
            r.at
            for r in self.responses
            if getattr(r.response, r.response.WhichOneof("msg")) is message
        )


def audio_frames(samples: np.ndarray) -> list[bytes]:
    """PCM16 frames of 80 ms; the last one is padded with silence."""
    pcm = float_to_pcm16(samples)
    pcm += b"\0" * (-len(pcm) % FRAME_BYTES)
    return [pcm[i : i + FRAME_BYTES] for i in range(0, len(pcm), FRAME_BYTES)]


def frame_request(pcm: bytes, seq: int, rate: int = SAMPLE_RATE) -> stt_pb2.TranscribeRequest:
    return stt_pb2.TranscribeRequest(
        audio=common_pb2.AudioFrame(
            pcm=pcm, sample_rate_hz=rate, seq=seq, capture_time_us=time.time_ns() // 1000
        )
    )


async def stream_audio(
    stub: stt_pb2_grpc.SttStub,
    samples: np.ndarray,
    config: stt_pb2.SttConfig,
    realtime: bool = False,
) -> StreamResult:
    """Stream `samples` (float32, 24 kHz) as frames, then half-close, and collect every
    response until the server ends the stream. Unpaced, frames go as fast as gRPC flow
    control and the server take them."""
    result = StreamResult()
    frames = audio_frames(samples)

    async def requests():
        yield stt_pb2.TranscribeRequest(config=config)
        start = time.monotonic()
        for seq, pcm in enumerate(frames):
            if realtime:
                await asyncio.sleep(max(0.0, start + seq * FRAME_SECONDS - time.monotonic()))
            result.frame_sent_at.append(time.monotonic())
            yield frame_request(pcm, seq)

    async for response in stub.Transcribe(requests()):
        result.responses.append(Received(time.monotonic(), response))
    return result


@dataclass(frozen=True)
class Script:
    """Sentences spoken one after another with silence between them."""

    audio: np.ndarray
    texts: list[str]
    spans: list[tuple[float, float]]  # where each sentence's audio lies, stream seconds


def speech_bounds(samples: np.ndarray, threshold: float = 0.01) -> tuple[int, int]:
    """First and last sample louder than `threshold` (piper pads with near-silence)."""
    loud = np.flatnonzero(np.abs(samples) > threshold)
    return int(loud[0]), int(loud[-1]) + 1


def build_script(speak, texts: list[str], gap_s: float, lead_s: float = 0.5) -> Script:
    parts = [np.zeros(int(lead_s * SAMPLE_RATE), dtype=np.float32)]
    spans, position = [], len(parts[0])
    for text in texts:
        speech = speak(text)
        first, last = speech_bounds(speech)
        spans.append(((position + first) / SAMPLE_RATE, (position + last) / SAMPLE_RATE))
        parts += [speech, np.zeros(int(gap_s * SAMPLE_RATE), dtype=np.float32)]
        position += len(speech) + int(gap_s * SAMPLE_RATE)
    return Script(np.concatenate(parts), texts, spans)


@pytest.fixture(scope="session")
def stream_helpers() -> SimpleNamespace:
    return SimpleNamespace(
        stream_audio=stream_audio,
        frame_request=frame_request,
        audio_frames=audio_frames,
        build_script=build_script,
        speech_bounds=speech_bounds,
        loopback_settings=loopback_settings,
    )
