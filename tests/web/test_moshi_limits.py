"""What a Moshi client (/api/chat) may not do, against the web service and a real
gateway in front of the fake upstreams: each abuse closes its socket with the
reason before it costs the service (decoding, a backlog, a slot held), and
the count of a stream's audio that guards the decoder (services/web/protocols/ogg_opus.py)."""

from __future__ import annotations

import asyncio
import contextlib
import struct
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import sphn

from services.web.config import WebSettings
from services.web.pacer import LEAD_S, MAX_BACKLOG_S
from services.web.protocols.moshi import MAX_AUDIO_MESSAGE_BYTES
from services.web.protocols.moshi_audio import MAX_AUDIO_MESSAGE_S
from services.web.protocols.ogg_opus import AudioTooLong, OggOpusPages, packet_samples
from services.web.server import WebServer, serve
from tests.web.test_moshi_chat import RATE, TOKEN, chat, closing, opus_pages, tone

OPUS_HEAD = b"OpusHead" + struct.pack("<BBHIhB", 1, 1, 312, RATE, 0, 0)
OPUS_TAGS = b"OpusTags" + struct.pack("<I", 4) + b"test" + struct.pack("<I", 0)


@contextlib.asynccontextmanager
async def moshi_web(fakes, **settings: Any) -> AsyncIterator[WebServer]:
    """The web service (with `settings`) before a gateway that takes TOKEN, which
    the web service relays (Moshi's clients send none)."""
    gateway = await fakes.gateway(auth_tokens=TOKEN)
    server = await serve(
        WebSettings(
            host="127.0.0.1",
            port=0,
            metrics_port=0,
            gateway_address=gateway.address,
            gateway_auth_token=TOKEN,
            relay_token_behind_login=True,
            **settings,
        )
    )
    try:
        yield server
    finally:
        await server.stop()


def ogg_crc(data: bytes) -> int:
    """Ogg's CRC-32 (polynomial 0x04C11DB7, not reflected, no final xor)."""
    crc = 0
    for byte in data:
        crc ^= byte << 24
        for _ in range(8):
            crc = (crc << 1) ^ 0x04C11DB7 if crc & 0x80000000 else crc << 1
            crc &= 0xFFFFFFFF
    return crc


def ogg_page(packets: list[bytes], sequence: int, flags: int = 0) -> bytes:
    """One Ogg page holding `packets` (each under 255 bytes), its CRC right."""
    lacing = bytes(len(packet) for packet in packets)
    header = b"OggS" + struct.pack("<BBqIII", 0, flags, 0, 7, sequence, 0)
    page = header + bytes((len(lacing),)) + lacing + b"".join(packets)
    return page[:22] + struct.pack("<I", ogg_crc(page)) + page[26:]


def stream_head() -> bytes:
    return ogg_page([OPUS_HEAD], 0, flags=0x02) + ogg_page([OPUS_TAGS], 1)


def test_the_count_is_the_audio_the_codec_decodes():
    stream = b"".join(opus_pages(tone(1.2)))
    reader = sphn.OpusStreamReader(RATE)
    pages, seconds = OggOpusPages().take(stream, 5.0)
    assert pages == stream
    assert seconds == pytest.approx(len(reader.append_bytes(stream)) / RATE)
    assert seconds == pytest.approx(1.2, abs=0.1)

    # A page cut across messages counts once it came whole.
    counter = OggOpusPages()
    first, first_s = counter.take(stream[:60], 5.0)  # the header's page and a piece
    rest, rest_s = counter.take(stream[60:], 5.0)
    assert len(first) < 60 and first + rest == stream
    assert (first_s, rest_s) == (0.0, seconds)


def test_the_toc_byte_says_a_packets_audio():
    assert packet_samples(b"\xf8\x00") == 960  # CELT 20 ms, one frame
    assert packet_samples(b"\x6a\x00") == 2 * 960  # hybrid 20 ms, two frames
    assert packet_samples(b"\x1b\x3f") == 63 * 2880  # SILK 60 ms, code 3: 63 frames in 2 bytes
    with pytest.raises(ValueError, match="an empty Opus packet"):
        packet_samples(b"")
    with pytest.raises(AudioTooLong):  # counting stops there: nothing more is read
        OggOpusPages().take(stream_head() + ogg_page([b"\x1b\x3f"] * 200, 2), 2.0)
    with pytest.raises(ValueError, match="no Ogg page"):
        OggOpusPages().take(b"RIFF" + bytes(40), 2.0)


async def handshake(ws) -> None:
    assert await ws.receive_bytes(timeout=10) == b"\x00"


async def test_packets_that_decode_to_much_audio_are_refused_before_decoding(fakes):
    empty = stream_head() + ogg_page([b""], 2)  # the codec made 5 s of each empty packet
    tiny = stream_head() + ogg_page([b"\x1b\x3f"] * 200, 2)  # 2 bytes, 3.78 s each
    cases = [
        (empty, 1007, b"\x05audio is not an Ogg Opus stream (an empty Opus packet)"),
        (tiny, 1008, b"\x05more than 2 s of audio in one message"),
        (bytes(MAX_AUDIO_MESSAGE_BYTES + 1), 1009, b"\x05an audio message of more than 65536"),
    ]
    async with moshi_web(fakes) as web:
        for data, code, why in cases:
            async with chat(web) as ws:
                await handshake(ws)
                for _ in range(3):  # the old code decoded them and waited for more
                    await ws.send_bytes(b"\x01" + data)
                received = await closing(ws)
            assert ws.close_code == code, (why, received[-1:])
            assert received[-1].startswith(why), received[-1:]


async def test_a_message_of_more_audio_than_allowed_is_refused(fakes):
    pages = opus_pages(tone(MAX_AUDIO_MESSAGE_S + 0.5))  # fine as pages, too much at once
    async with moshi_web(fakes) as web, chat(web) as ws:
        await handshake(ws)
        await ws.send_bytes(b"\x01" + b"".join(pages))
        received = await closing(ws)
    assert ws.close_code == 1008
    assert received[-1].startswith(b"\x05more than 2 s of audio in one message"), received[-1:]


async def test_the_backlog_counts_the_audio_a_message_adds(fakes):
    """31 messages of 2 s at once: the 31st would leave more than 60 s waiting
    (the pacer sent 1 s ahead and little since), so it is refused; the old check,
    which looked before adding it, let it in."""
    pages = opus_pages(tone(62.0))  # 80 ms a page: 25 a message
    messages = [b"\x01" + b"".join(pages[i : i + 25]) for i in range(0, len(pages), 25)]
    assert len(messages) * MAX_AUDIO_MESSAGE_S > MAX_BACKLOG_S + LEAD_S + 0.9
    assert (len(messages) - 1) * MAX_AUDIO_MESSAGE_S - LEAD_S <= MAX_BACKLOG_S
    async with moshi_web(fakes) as web, chat(web) as ws:
        await handshake(ws)
        start = time.monotonic()
        for message in messages:
            await ws.send_bytes(message)
        sent_in_s = time.monotonic() - start
        received = await closing(ws)
    assert ws.close_code == 1008, received[-1:]
    assert received[-1] == b"\x05more than 60 s of audio waits to be sent: send it at real time"
    assert sent_in_s < 0.9  # else the pacer sent enough meanwhile to let the 31st in


async def test_a_silent_socket_is_closed_after_the_idle_timeout(fakes):
    async with moshi_web(fakes, realtime_idle_timeout_s=1.0) as web, chat(web) as ws:
        await handshake(ws)
        for page in opus_pages(tone(0.16)):
            await ws.send_bytes(b"\x01" + page)
        started = time.monotonic()
        received = await closing(ws)  # the agent's audio, then the close
        silent_s = time.monotonic() - started
    assert ws.close_code == 1008
    assert received[-1] == b"\x05no sound from the caller for 1 s: the chat ends"
    assert silent_s >= 0.9


async def test_a_refused_caller_has_nothing_decoded(fakes):
    """The gateway refuses the token: the reason is its refusal, not the bad audio
    sent with the connection (read only once the gateway took the call)."""
    async with moshi_web(fakes) as web:
        async with chat(web, headers={"Authorization": "Bearer wrong-token"}) as ws:
            await ws.send_bytes(b"\x01" + b"not an ogg stream" * 4)
            received = await closing(ws)
    assert ws.close_code == 1008
    assert len(received) == 1 and received[0].startswith(b"\x05auth refused"), received


def test_crafted_pages_carry_oggs_crc():
    """The crafted pages are ones the codec would take: their CRC is Ogg's."""
    pages = opus_pages(tone(0.16))[1]
    real = pages[: 27 + pages[26] + sum(pages[27 : 27 + pages[26]])]  # its first page
    assert ogg_crc(real[:22] + bytes(4) + real[26:]) == struct.unpack("<I", real[22:26])[0]


async def test_a_client_gone_before_the_handshake_frees_its_slot(fakes):
    """Its messages are read only once the call started: the chat still ends
    soon after, and the one slot is free for the next."""
    async with moshi_web(fakes, max_sessions=1) as web:
        async with chat(web) as ws:
            await ws.send_bytes(b"\x01" + b"".join(opus_pages(tone(0.16))))
        first = await answer_within(web, 5.0)
    assert first == b"\x00"


async def answer_within(web, timeout_s: float) -> bytes:
    """The first message of a new chat, once one gets the handshake (or the last
    refusal after `timeout_s`)."""
    deadline = time.monotonic() + timeout_s
    while True:
        async with chat(web) as ws:
            first = await ws.receive_bytes(timeout=10)
        if first == b"\x00" or time.monotonic() > deadline:
            return first
        await asyncio.sleep(0.1)
