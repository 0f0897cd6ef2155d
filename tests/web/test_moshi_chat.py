"""The Moshi protocol at /api/chat, against the web service and a real gateway in
front of the scripted fake upstreams (tests/gateway/fakes.py).

The conversation is held by kyutai's own client, `moshi.client` (the `moshi`
package's `python -m moshi.client`), unchanged but for its sound card: it
plays and records through the `sounddevice` module (PortAudio), which is not
installed here, so `SoundCard` stands in for that module, with a microphone
that plays a prepared signal and a speaker that keeps what it is given, both
ticking at real time on threads of their own as PortAudio's callbacks do. The
protocol's edges (bad messages, refusals) are driven as moshi/client.py
drives the socket: aiohttp and sphn's Ogg Opus."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import io
import sys
import threading
import time
import types
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import numpy as np
import pytest
import sphn

from services.web.config import WebSettings
from services.web.protocols.adapter import Close
from services.web.protocols.moshi import chat_mode
from services.web.protocols.moshi_audio import MAX_WORD_LEAD_S, AgentWords
from services.web.protocols.realtime_config import ClientError
from services.web.server import serve
from tests.support.web import web_before

RATE = 24000
FRAME = 1920  # 80 ms: the block moshi's client records and plays
TOKEN = "moshi-test-token-0123456789abc"


class _Stream:
    """One sounddevice stream: calls `callback` with a block every block's time."""

    def __init__(self, tick: Callable[[Callable[..., None], int, int], None], **options: Any):
        self.tick = tick
        self.callback = options["callback"]
        self.blocksize = options["blocksize"]
        self.channels = options["channels"]
        self.period_s = self.blocksize / options["samplerate"]
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _Stream:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stopped.set()
        self.thread.join()

    def _run(self) -> None:
        due = time.monotonic()
        while not self.stopped.is_set():
            self.tick(self.callback, self.blocksize, self.channels)
            due += self.period_s
            self.stopped.wait(max(0.0, due - time.monotonic()))


class SoundCard:
    """Stands in for the `sounddevice` module: its microphone says `said` (float32
    at 24 kHz) and then silence; its speaker keeps what it plays (`played`)."""

    def __init__(self, said: np.ndarray) -> None:
        self.said = np.asarray(said, dtype=np.float32)
        self.position = 0
        self.played: list[np.ndarray] = []

    def module(self) -> types.ModuleType:
        module = types.ModuleType("sounddevice")
        module.InputStream = lambda **options: _Stream(self._record, **options)  # type: ignore[attr-defined]
        module.OutputStream = lambda **options: _Stream(self._play, **options)  # type: ignore[attr-defined]
        return module

    def _record(self, callback: Callable[..., None], frames: int, channels: int) -> None:
        block = np.zeros((frames, channels), dtype=np.float32)
        said = self.said[self.position : self.position + frames]
        block[: len(said), 0] = said
        self.position += frames
        callback(block, frames, None, None)

    def _play(self, callback: Callable[..., None], frames: int, channels: int) -> None:
        block = np.zeros((frames, channels), dtype=np.float32)
        callback(block, frames, None, None)
        self.played.append(block[:, 0].copy())

    def heard(self) -> np.ndarray:
        return np.concatenate(self.played) if self.played else np.zeros(0, np.float32)


def moshi_client(monkeypatch: pytest.MonkeyPatch, card: SoundCard) -> types.ModuleType:
    """kyutai's `moshi.client`, its sound card `card`."""
    monkeypatch.setitem(sys.modules, "sounddevice", card.module())
    module = importlib.import_module("moshi.client")
    monkeypatch.setattr(module, "sd", card.module())
    return module


class Transcript(io.StringIO):
    """What moshi's client prints of the agent's words; `done` is set once
    `until(the words so far)`."""

    def __init__(self, until: Callable[[str], bool]) -> None:
        super().__init__()
        self.until = until
        self.done = asyncio.Event()

    def write(self, text: str) -> int:
        written = super().write(text)
        if self.until(self.getvalue()):
            self.done.set()
        return written


async def run_moshi_client(
    client: types.ModuleType,
    port: int,
    until: Callable[[str], bool],
    timeout_s: float,
    tail_s: float = 1.0,
) -> str:
    """`python -m moshi.client --host 127.0.0.1 --port PORT` until `until(the words
    it printed)` and `tail_s` more (their audio), or `timeout_s`: the words."""
    printed, logs = Transcript(until), io.StringIO()
    printer = client.RawPrinter(stream=printed, err_stream=logs)
    args = argparse.Namespace(host="127.0.0.1", port=port, https=False, url=None)
    running = asyncio.ensure_future(client.run(printer, args))
    heard = asyncio.ensure_future(printed.done.wait())
    try:
        await asyncio.wait({running, heard}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        if heard.done() and not running.done():
            await asyncio.sleep(tail_s)
    finally:
        for task in (running, heard):
            task.cancel()
        await asyncio.gather(running, heard, return_exceptions=True)
    assert "Lost connection" not in logs.getvalue(), logs.getvalue()
    return printed.getvalue()


def tone(seconds: float, hz: float = 440.0) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    return (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def opus_pages(samples: np.ndarray) -> list[bytes]:
    """`samples` as moshi's client sends them: an Ogg Opus stream, page by page."""
    writer = sphn.OpusStreamWriter(RATE)
    whole = len(samples) // FRAME * FRAME
    pages = [writer.append_pcm(samples[i : i + FRAME]) for i in range(0, whole, FRAME)]
    return [page for page in pages if page]


@pytest.fixture
async def web(fakes):
    """The web service in front of a gateway that wants a token, which the web
    service relays (its operator's login guards it): Moshi's clients send none."""
    gateway = await fakes.gateway(auth_tokens=TOKEN)
    async with web_before(
        gateway.address,
        gateway_auth_token=TOKEN,
        relay_token_behind_login=True,
        start_timeout_s=1.0,
    ) as server:
        yield server


@contextlib.asynccontextmanager
async def chat(
    web, query: str = "", **options: Any
) -> AsyncIterator[aiohttp.ClientWebSocketResponse]:
    async with aiohttp.ClientSession() as session:
        url = f"ws://127.0.0.1:{web.port}/api/chat{query}"
        async with session.ws_connect(url, **options) as ws:
            yield ws


async def closing(ws: aiohttp.ClientWebSocketResponse, timeout_s: float = 10.0) -> list[bytes]:
    """The messages until the server closes the socket."""
    received = []
    async with asyncio.timeout(timeout_s):
        async for message in ws:
            assert message.type == aiohttp.WSMsgType.BINARY, message
            received.append(message.data)
    return received


async def test_moshis_own_client_hears_the_agent_and_its_words(web, fakes, monkeypatch):
    fakes.frontend.speak_at = 0  # the fake agent says back what it hears
    fakes.frontend.words = {10: ("Paris", 1), 12: ("is", 1)}
    card = SoundCard(tone(1.5))
    client = moshi_client(monkeypatch, card)

    printed = await run_moshi_client(client, web.port, lambda text: "is" in text, 15.0)

    assert printed == " Paris is"  # the words as moshi's word pieces come: each after a space
    heard = card.heard()
    spectrum = np.abs(np.fft.rfft(heard))
    peak_hz = np.argmax(spectrum) * RATE / len(heard)
    assert abs(peak_hz - 440) < 10, peak_hz  # the caller's tone, through Opus both ways
    assert np.sqrt(np.mean(heard**2)) > 0.05


async def test_the_handshake_comes_first_and_audio_follows(web, fakes):
    fakes.frontend.speak_at = 0
    async with chat(web, "?model=kame-tandem&text_temperature=0.7&voice_prompt=NATF2.pt") as ws:
        first = await ws.receive_bytes(timeout=10)
        for page in opus_pages(tone(0.5)):
            await ws.send_bytes(b"\x01" + page)
        reader = sphn.OpusStreamReader(RATE)
        agent = []
        async with asyncio.timeout(10):
            while sum(map(len, agent)) < RATE // 4:
                message = await ws.receive_bytes()
                assert message[0] == 1, message[:1]
                agent.append(reader.append_bytes(message[1:]))
    assert first == b"\x00"
    assert np.sqrt(np.mean(np.concatenate(agent) ** 2)) > 0.05


@pytest.mark.parametrize(
    ("bad", "code", "why"),
    [
        ("a text frame", 1003, b"text frames are not Moshi messages"),
        (b"\x09hello", 1003, b"unknown message kind 9"),
        (b"\x01" + b"not an ogg stream" * 4, 1007, b"audio is not an Ogg Opus stream"),
    ],
)
async def test_bad_input_closes_the_socket_cleanly_and_the_service_goes_on(
    web, fakes, bad, code, why
):
    async with chat(web) as ws:
        assert await ws.receive_bytes(timeout=10) == b"\x00"
        await ws.send_bytes(b"\x06")  # a ping: a kind of the protocol, ignored
        await (ws.send_str(bad) if isinstance(bad, str) else ws.send_bytes(bad))
        received = await closing(ws)
    assert ws.close_code == code
    assert received[-1].startswith(b"\x05" + why), received[-1:]

    fakes.frontend.speak_at = 0
    async with chat(web) as ws:  # the next chat is served
        assert await ws.receive_bytes(timeout=10) == b"\x00"
        for page in opus_pages(tone(0.3)):
            await ws.send_bytes(b"\x01" + page)
        assert (await ws.receive_bytes(timeout=10))[0] == 1


async def test_a_socket_that_sends_no_audio_is_closed(web):
    async with chat(web) as ws:
        received = await closing(ws)
    assert received[0] == b"\x00"
    assert ws.close_code == 1008
    assert received[-1] == b"\x05no audio within 1 s of the handshake"


async def test_refusals_say_why(web):
    async with chat(web, "?model=gpt-realtime") as ws:  # a mode not offered
        received = await closing(ws)
    assert ws.close_code == 1008 and received[0].startswith(b"\x05model 'gpt-realtime'")

    # A caller's own token goes before the relayed one, and the gateway checks it.
    async with chat(web, headers={"Authorization": "Bearer wrong-token"}) as ws:
        received = await closing(ws)
    assert ws.close_code == 1008
    assert len(received) == 1 and received[0].startswith(b"\x05auth refused")  # no handshake

    # A browser page of another site, and a name not the service's (DNS rebinding).
    for options in ({"origin": "https://evil.example"}, {"headers": {"Host": "evil.example"}}):
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            async with chat(web, **options):
                pass
        assert refused.value.status == 403


async def test_a_full_stack_says_when_to_try_again(busy_gateway):
    settings = WebSettings(host="127.0.0.1", port=0, metrics_port=0, gateway_address=busy_gateway)
    server = await serve(settings)
    try:
        async with chat(server) as ws:
            received = await closing(ws)
    finally:
        await server.stop()
    assert ws.close_code == 1013  # try again later
    assert len(received) == 1 and received[0].startswith(b"\x05the agent is busy: try again in")


def test_words_go_out_with_the_audio_they_start_in():
    words = AgentWords()
    assert words.heard("Paris", start_s=0.5) == []  # its audio is still to come
    assert words.heard(" is", start_s=0.7) == []
    assert words.advanced(0.48) == []
    assert words.advanced(0.08) == [" Paris"]  # a leading space, as moshi's pieces have
    assert words.advanced(0.16) == [" is"]
    assert words.heard("said", start_s=0.1) == [" said"]  # already reached: at once
    # A start far ahead of the audio is on another clock: not held for good.
    assert words.heard("far", start_s=words.position_s + MAX_WORD_LEAD_S + 1) == [" far"]
    words.heard("cut", start_s=words.position_s + 0.5)
    words.cut()  # a barge-in: the rest of that speech is never heard
    assert words.advanced(1.0) == []


def test_the_mode_and_the_close_reason():
    assert chat_mode(None, ["cascade", "tandem"]) == "tandem"
    assert chat_mode(None, ["s2s", "cascade"]) == "s2s"
    assert chat_mode("kame-cascade", ["tandem", "cascade"]) == "cascade"
    with pytest.raises(ClientError):
        chat_mode("kame-s2s", ["tandem"])
    reason = Close(1008, "é" * 100).short_reason  # a close frame carries 123 bytes
    assert len(reason.encode()) <= 123 and reason == "é" * 61


def pulses(seconds: float) -> tuple[np.ndarray, list[int]]:
    """`seconds` of silence with a 240 ms tone every 1.2-2.0 s (irregularly, so
    that no pulse stands for another): the signal and each pulse's first sample."""
    signal, starts, frame = np.zeros(int(seconds * RATE), np.float32), [], 10
    pulse = tone(3 * FRAME / RATE)
    while (frame + 3) * FRAME < len(signal):
        starts.append(frame * FRAME)
        signal[frame * FRAME : frame * FRAME + len(pulse)] = pulse
        frame += 15 + (len(starts) * 7) % 11
    return signal, starts


def onsets(samples: np.ndarray, window: int = 240) -> list[int]:
    """Where tones start in `samples`: the first window of each loud run."""
    loud = np.sqrt(np.mean(samples[: len(samples) // window * window].reshape(-1, window) ** 2, 1))
    on = loud > 0.05
    return [i * window for i in np.flatnonzero(on[1:] & ~on[:-1]) + 1]


async def send_in_moshis_pattern(ws: aiohttp.ClientWebSocketResponse, pages: list[bytes]) -> None:
    """Page by page as moshi's client sends them (`\\x01` + the page, from the
    start, not waiting for the handshake), at an uneven pace: the first 40 %
    slower than real time, in bursts of 5 frames with a stall after each, the
    rest twice as fast as real time."""
    slow = len(pages) * 2 // 5
    for i, page in enumerate(pages):
        await ws.send_bytes(b"\x01" + page)
        if i < slow and i % 5 == 4:
            await asyncio.sleep(0.55)  # 0.4 s of audio a 0.55 s
        elif i >= slow:
            await asyncio.sleep(FRAME / RATE / 2)


async def test_a_minute_of_audio_comes_back_in_the_callers_time(web, fakes):
    """moshi's server steps once per input frame, so its reply to input sample k
    is output sample k; a client that lines the streams up by sample count (as
    Full-Duplex-Bench does) relies on it. With an agent that says back what it
    hears at once, each tone of the caller's comes back where it was sent,
    however unevenly the client sends, within one frame: pacing at the
    server's clock (silence standing in while the client is late) put them
    ever later."""
    fakes.frontend.speak_at = 0
    said, starts = pulses(60.0)
    pages = opus_pages(said)
    reader, heard = sphn.OpusStreamReader(RATE), []
    async with chat(web) as ws:
        sending = asyncio.ensure_future(send_in_moshis_pattern(ws, pages))
        try:
            async with asyncio.timeout(150):
                assert await ws.receive_bytes() == b"\x00"
                while sum(map(len, heard)) < len(said) - 2 * FRAME:
                    message = await ws.receive_bytes()
                    if message[0] == 1:
                        heard.append(reader.append_bytes(message[1:]))
            await sending
        finally:
            sending.cancel()
    back = onsets(np.concatenate(heard))
    assert len(back) == len(starts) >= 30, (len(back), len(starts))
    late = [(sent, got) for sent, got in zip(starts, back, strict=True) if abs(got - sent) > FRAME]
    assert not late, late[:5]
