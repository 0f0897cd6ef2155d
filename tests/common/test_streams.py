"""kame_common/streams.py: the config first, then each message to its handler,
as the four servicers read their streams; what breaks that shape is a
StreamError with the status and a message that says what came."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from kame_common.streams import StreamError, dispatch, read_config
from kamepb import common_pb2, stt_pb2

Request = stt_pb2.TranscribeRequest
CONFIG = Request(config=stt_pb2.SttConfig(session_id="s"))
AUDIO = Request(audio=common_pb2.AudioFrame(seq=1))
END = Request(end_of_turn=stt_pb2.EndOfTurn(speech_end_s=1.5))


async def stream(*requests: Request) -> AsyncIterator[Request]:
    for request in requests:
        yield request


async def test_the_config_first_then_every_message_to_its_handler_in_order():
    requests = stream(CONFIG, AUDIO, END, AUDIO)
    first = await read_config(requests, "SttConfig")
    assert first.config.session_id == "s"
    seen: list[str] = []

    async def audio(request: Request) -> None:
        await asyncio.sleep(0)
        seen.append(f"audio {request.audio.seq}")

    handlers = {
        "audio": audio,
        "end_of_turn": lambda r: seen.append(f"end {r.end_of_turn.speech_end_s}"),
    }
    await dispatch(requests, handlers)
    assert seen == ["audio 1", "end 1.5", "audio 1"]


@pytest.mark.parametrize(
    ("requests", "message"),
    [
        ((), "the stream ended before the config (SttConfig)"),
        ((AUDIO, CONFIG), "the first message must be the config (SttConfig), got audio"),
        ((Request(),), "the first message must be the config (SttConfig), got an empty message"),
    ],
)
async def test_a_stream_without_its_config_first_is_invalid(requests, message):
    with pytest.raises(StreamError) as caught:
        await read_config(stream(*requests), "SttConfig")
    assert (caught.value.code, caught.value.message) == (grpc.StatusCode.INVALID_ARGUMENT, message)


async def test_no_config_within_the_timeout_is_a_deadline():
    async def silent() -> AsyncIterator[Request]:
        await asyncio.Event().wait()
        yield CONFIG

    with pytest.raises(StreamError) as caught:
        await read_config(silent(), "SttConfig", timeout_s=0.01)
    assert caught.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert caught.value.message == "no config within 0.01 s of opening the stream"


@pytest.mark.parametrize(
    ("later", "message"),
    [
        (CONFIG, "a second config arrived: send the config once, first"),
        (Request(), "after the config a stream takes only audio; got an empty message"),
        (END, "after the config a stream takes only audio; got end_of_turn"),
    ],
)
async def test_a_message_no_handler_takes_ends_the_stream_after_the_ones_before(later, message):
    seen: list[Request] = []
    with pytest.raises(StreamError) as caught:
        await dispatch(stream(AUDIO, later, AUDIO), {"audio": seen.append})
    assert (caught.value.code, caught.value.message) == (grpc.StatusCode.INVALID_ARGUMENT, message)
    assert seen == [AUDIO]
