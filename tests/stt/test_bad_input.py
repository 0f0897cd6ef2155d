"""Bad input ends a stream with INVALID_ARGUMENT saying what was expected; the service
keeps serving other streams."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from kame_common.audio import FRAME_BYTES, SAMPLE_RATE
from kamepb import stt_pb2

SILENT_FRAME = b"\0" * FRAME_BYTES


def _config(**fields) -> stt_pb2.TranscribeRequest:
    return stt_pb2.TranscribeRequest(config=stt_pb2.SttConfig(session_id="bad-input", **fields))


def _end_of_turn(speech_end_s: float) -> stt_pb2.TranscribeRequest:
    return stt_pb2.TranscribeRequest(end_of_turn=stt_pb2.EndOfTurn(speech_end_s=speech_end_s))


async def _status_of(stub, requests: list[stt_pb2.TranscribeRequest]) -> grpc.aio.AioRpcError:
    async def feed():
        for request in requests:
            yield request

    with pytest.raises(grpc.aio.AioRpcError) as raised:
        async for _ in stub.Transcribe(feed()):
            pass
    return raised.value


@pytest.mark.parametrize(
    ("name", "requests", "expected"),
    [
        (
            "audio before the config",
            lambda f: [f(SILENT_FRAME, 0)],
            "must be the config (SttConfig)",
        ),
        ("no config at all", lambda f: [], "the stream ended before the config (SttConfig)"),
        ("empty message first", lambda f: [stt_pb2.TranscribeRequest()], "an empty message"),
        (
            "wrong frame size",
            lambda f: [_config(), f(b"\0" * 2000, 0)],
            "must be 1920 samples (3840 bytes of PCM s16le at 24000 Hz, 80 ms), got 1000",
        ),
        (
            "odd byte count",
            lambda f: [_config(), f(b"\0" * (FRAME_BYTES - 1), 0)],
            "even byte count, got 3839 bytes",
        ),
        (
            "unsupported sample rate",
            lambda f: [_config(), f(SILENT_FRAME[:2560], 0, 16000)],
            "sample_rate_hz must be 24000, got 16000",
        ),
        (
            "a bad frame after good ones",
            lambda f: [_config(), f(SILENT_FRAME, 0), f(SILENT_FRAME, 1), f(b"\0" * 100, 2)],
            "audio frame seq 2: a frame must be 1920 samples",
        ),
        (
            "a second config",
            lambda f: [_config(), f(SILENT_FRAME, 0), _config()],
            "a second config arrived",
        ),
        (
            "an end of turn before the config",
            lambda f: [_end_of_turn(1.0)],
            "the first message must be the config (SttConfig), got end_of_turn",
        ),
        (
            "a negative speech end",
            lambda f: [_config(), f(SILENT_FRAME, 0), _end_of_turn(-0.5)],
            "end_of_turn.speech_end_s must be seconds into the stream (>= 0), got -0.5",
        ),
        (
            "a speech end that is not a number",
            lambda f: [_config(), _end_of_turn(float("nan"))],
            "end_of_turn.speech_end_s must be seconds into the stream (>= 0), got nan",
        ),
        (
            "negative partial interval",
            lambda f: [_config(partial_interval_s=-1)],
            "partial_interval_s must be between 0.16 and 10",
        ),
        (
            "vad threshold above 1",
            lambda f: [_config(vad_threshold=1.5)],
            "vad_threshold must be between 0.05 and 0.95",
        ),
        (
            "utterances beyond one Whisper window",
            lambda f: [_config(max_utterance_s=60)],
            "max_utterance_s must be between 1 and 30",
        ),
        (
            "progress more often than frames come",
            lambda f: [_config(progress_interval_s=0.01)],
            "progress_interval_s must be between 0.08 and 60 (or 0 for none), got 0.01",
        ),
        (
            "a language the model lacks",
            lambda f: [_config(language="fr")],
            "English-only; use 'en'",
        ),
        (
            "another model",
            lambda f: [_config(model="/models/whisper-large")],
            "leave model empty or name that directory",
        ),
    ],
)
async def test_bad_input_is_invalid_argument(stt_stub, stream_helpers, name, requests, expected):
    error = await _status_of(stt_stub, requests(stream_helpers.frame_request))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (name, error)
    assert expected in error.details(), (name, error.details())


async def test_the_service_keeps_serving_after_bad_streams(stt_stub, stt_server, stream_helpers):
    await _status_of(stt_stub, [_config(), stream_helpers.frame_request(b"\0", 0)])
    result = await stream_helpers.stream_audio(
        stt_stub, np.zeros(SAMPLE_RATE, dtype=np.float32), stt_pb2.SttConfig(session_id="ok")
    )
    assert result.responses == []  # silence: no speech, no transcript, a clean end
    assert stt_server.active_sessions == 0
