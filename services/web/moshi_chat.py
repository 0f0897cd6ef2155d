"""The Moshi protocol (WS /api/chat) carried over one Gateway.Converse call
(kame_client/client.py), so that the clients of kyutai's moshi
server (moshi/server.py) talk to the stack: moshi's own client, and LiveKit's
NVIDIA PersonaPlex plugin.

Every message is binary, its first byte the kind:

- 0x00 handshake, server -> client, once the agent is on the line (the
  gateway's session started). PersonaPlex waits for it before it sends audio;
  moshi's client sends from the start, and that audio waits for the call: the
  client's messages are read only once the gateway took it, so a caller it
  refuses (a wrong token) has nothing decoded.
- 0x01 audio, both ways: pages of one Ogg Opus stream per direction, 24 kHz
  mono. The caller's is decoded to PCM16 for the gateway (which takes PCM16
  at 24 kHz both ways) and paced at real time as the Realtime endpoint paces
  it (services/web/pacer.py); the agent's is coded in 80 ms frames, the frame
  moshi codes, silence included, so the stream keeps the call's time.
- 0x02 text, server -> client: the agent's words, each sent with the audio it
  starts in (the gateway's `start_s`), with a leading space as moshi's word
  pieces have, so a client that joins them gets the sentence.
- 0x05 error, server -> client: why the server is about to close the socket
  (the kind moshi's Rust server and web client use for it). moshi's Python
  client and PersonaPlex log it as an unknown kind; the close reason says the
  same, cut to the 123 bytes a close frame carries.

Limits, each closing the socket with the reason: an audio message of more
than MAX_AUDIO_MESSAGE_BYTES (1009) or MAX_AUDIO_MESSAGE_S of audio (counted
from the packets before decoding, ogg_opus.py: a few bytes of Opus may stand
for 120 ms), audio beyond the backlog, MAX_BACKLOG_S (1008), and no message for
`realtime_idle_timeout_s` once the chat began (1008).

What a client sends besides audio: the protocol's other kinds (handshake,
text, control, metadata, ping) are ignored, as moshi's server ignores them; a
text frame, an unknown kind or audio that is no Ogg Opus stream closes the
socket (1003, 1003, 1007). Query parameters: `model=kame-<mode>` picks the
mode among those the web service offers (without it: tandem, or the first of
the operator's `modes` if tandem is not among them); the sampling ones moshi's
web client sends and the persona PersonaPlex sends (IGNORED_PARAMS) are
accepted and ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum

import grpc
import sphn

from kame_client.client import ConverseClient
from kame_client.events import AgentAudio, AgentText, BargeIn, ConverseEvent, Started
from kame_client.status import CallEnd, CloseCode
from kame_common.aio import cancel_and_wait
from kame_common.audio import float_to_pcm16, pcm16_to_float
from kamepb import gateway_pb2
from services.web.bridge import PageSocket
from services.web.config import WebSettings
from services.web.ogg_opus import AudioTooLong, OggOpusPages
from services.web.pacer import MAX_BACKLOG_S, Pacer
from services.web.realtime_config import CODINGS, ClientError, mode_of_model

log = logging.getLogger(__name__)


class Kind(IntEnum):
    """A message's first byte (moshi's protocol: its Rust server names them all)."""

    HANDSHAKE = 0
    AUDIO = 1
    TEXT = 2
    CONTROL = 3
    METADATA = 4
    ERROR = 5
    PING = 6


# What a client may send and this server has nothing to do with.
IGNORED_KINDS = frozenset(kind for kind in Kind if kind != Kind.AUDIO)
# Query parameters moshi's clients send that mean nothing to this agent: the
# sampling of moshi's web client and the PersonaPlex plugin's voice, persona
# and seed. Others are ignored as well (moshi's own server reads none).
IGNORED_PARAMS = (
    "text_temperature",
    "text_topk",
    "audio_temperature",
    "audio_topk",
    "pad_mult",
    "text_seed",
    "audio_seed",
    "repetition_penalty",
    "repetition_penalty_context",
    "image_url",
    "image_resolution",
    "worker_auth_id",
    "email",
    "voice_prompt",
    "text_prompt",
    "seed",
)
PCM = CODINGS["audio/pcm"]  # PCM16 at 24 kHz: Moshi's rate, which the gateway takes as is
FRAME_BYTES = 1920 * PCM.bytes_per_sample  # 80 ms, the Opus frame moshi's server codes
# A word whose start is further ahead of the agent's audio than this is sent at
# once: its position is on another clock than the audio's, and waiting for it
# would hold the words back for good.
MAX_WORD_LEAD_S = 3.0

# The most one audio message may carry. moshi's clients send a page of 80 ms
# (a few hundred bytes) at a time; this lets a client send several.
MAX_AUDIO_MESSAGE_BYTES = 64 << 10
MAX_AUDIO_MESSAGE_S = 2.0  # (sphn's decoder itself takes at most 5 s a call)

NORMAL_CLOSURE = CloseCode.NORMAL_CLOSURE
UNSUPPORTED_DATA = CloseCode.UNSUPPORTED_DATA
INVALID_PAYLOAD = CloseCode.INVALID_PAYLOAD
POLICY_VIOLATION = CloseCode.POLICY_VIOLATION
MESSAGE_TOO_BIG = CloseCode.MESSAGE_TOO_BIG
TRY_AGAIN_LATER = CloseCode.TRY_AGAIN_LATER
MAX_REASON_BYTES = 123


@dataclass(frozen=True)
class Close:
    """How a chat ends: the socket's close code and, in words, why."""

    code: int
    reason: str = ""

    @property
    def short_reason(self) -> str:
        """The reason as a close frame carries it (at most 123 bytes of UTF-8)."""
        return self.reason.encode()[:MAX_REASON_BYTES].decode(errors="ignore")


def chat_mode(model: str | None, offered: list[str]) -> str:
    """The gateway mode `?model=` names (ClientError if not offered); without one,
    tandem if offered, else the first the web service offers."""
    if model is None:
        return "tandem" if "tandem" in offered else offered[0]
    return mode_of_model(model, offered)


class CallerAudio:
    """The caller's Ogg Opus stream -> PCM16 at 24 kHz, a message's audio counted
    before it is decoded."""

    def __init__(self) -> None:
        self.pages = OggOpusPages()
        self.reader = sphn.OpusStreamReader(PCM.rate)

    def whole_pages(self, data: bytes) -> tuple[bytes, float]:
        """The whole pages `data` completes and their seconds of audio; ValueError
        if it is no Ogg Opus stream, AudioTooLong past MAX_AUDIO_MESSAGE_S."""
        try:
            return self.pages.take(data, MAX_AUDIO_MESSAGE_S)
        except AudioTooLong:
            raise
        except ValueError as exc:
            raise ValueError(f"audio is not an Ogg Opus stream ({exc})") from None

    def pcm16(self, pages: bytes) -> bytes:
        """The PCM16 these whole pages hold; ValueError if the codec refuses them."""
        try:
            samples = self.reader.append_bytes(pages)
        except Exception as exc:  # the codec's own errors, of its own types
            raise ValueError(f"audio is not an Ogg Opus stream ({exc})") from None
        return float_to_pcm16(samples)


class AgentOpus:
    """The agent's PCM16 at 24 kHz -> Ogg Opus pages, in 80 ms frames."""

    def __init__(self) -> None:
        self.writer = sphn.OpusStreamWriter(PCM.rate)
        self.pending = bytearray()

    def pages(self, pcm: bytes) -> bytes:
        """The pages `pcm` completes (b"" while less than a frame waits)."""
        self.pending += pcm
        pages = []
        while len(self.pending) >= FRAME_BYTES:
            frame = bytes(self.pending[:FRAME_BYTES])
            del self.pending[:FRAME_BYTES]
            pages.append(self.writer.append_pcm(pcm16_to_float(frame)))
        return b"".join(pages)


class AgentWords:
    """The agent's words, each let out once the agent's audio reaches its start
    (the gateway may send words ahead of their audio), spaced as moshi's are."""

    def __init__(self) -> None:
        self.position_s = 0.0  # how much agent audio came
        self.waiting: deque[tuple[float, str]] = deque()

    def heard(self, text: str, start_s: float) -> list[str]:
        """`text` starts `start_s` into the agent's audio: the words due now."""
        if text.strip():
            self.waiting.append((start_s, text if text[0].isspace() else " " + text))
        return self._due()

    def advanced(self, seconds: float) -> list[str]:
        """`seconds` more of the agent's audio came: the words due now."""
        self.position_s += seconds
        return self._due()

    def cut(self) -> None:
        """A barge-in: the words not yet reached will not be spoken."""
        self.waiting.clear()

    def _due(self) -> list[str]:
        due = []
        while self.waiting:
            start_s, text = self.waiting[0]
            if self.position_s < start_s <= self.position_s + MAX_WORD_LEAD_S:
                break
            due.append(text)
            self.waiting.popleft()
        return due


def message(kind: Kind, payload: bytes = b"") -> bytes:
    return bytes((kind,)) + payload


async def refuse(socket: PageSocket, close: Close) -> Close:
    """Tell the client why (an error message) before its socket closes with `close`."""
    await socket.send_bytes(message(Kind.ERROR, close.reason.encode()))
    return close


class MoshiBridge:
    """Carries Moshi sockets over calls to the gateway named in the settings."""

    def __init__(self, settings: WebSettings) -> None:
        self.settings = settings

    async def run(self, socket: PageSocket, params: Mapping[str, str], token: str) -> Close:
        """One chat, until the client goes or the call ends: how to close its socket."""
        try:
            mode = chat_mode(params.get("model"), self.settings.mode_choices)
        except ClientError as exc:
            return await refuse(socket, Close(POLICY_VIOLATION, exc.message))
        ignored = sorted(name for name in params if name != "model")
        if ignored:
            log.info("moshi chat: ignoring query parameters %s", ", ".join(ignored))
        chat = MoshiChat(self.settings, socket, token)
        try:
            close = await chat.run(mode)
        finally:
            await chat.client.close()
        if close.code != NORMAL_CLOSURE:
            with contextlib.suppress(Exception):  # the client may be gone already
                await refuse(socket, close)
        return close


class MoshiChat:
    """One Moshi socket and its gateway call."""

    def __init__(self, settings: WebSettings, socket: PageSocket, token: str) -> None:
        self.settings = settings
        self.socket = socket
        channel = settings.gateway_channel(settings.connection_policy())
        self.client = ConverseClient(channel, token, own_channel=True)
        self.pacer = Pacer(PCM, self.client.send_audio)
        self.caller_audio = CallerAudio()
        self.agent_audio = AgentOpus()
        self.words = AgentWords()
        self.first_audio = asyncio.Event()

    async def run(self, mode: str) -> Close:
        """The call in `mode`, the client's audio to it and its answers back, until
        either side ends (or the client sends no audio within the start timeout)."""
        config = gateway_pb2.ConverseConfig(
            mode=gateway_pb2.ConverseConfig.Mode.Value(mode.upper()),
            input_format=PCM.gateway_format(),
            output_format=PCM.gateway_format(),
        )
        downlink = asyncio.ensure_future(self._downlink())
        tasks = [downlink]
        try:
            await self.client.start(config)
            # The client's messages only once started: a caller the gateway refuses
            # hears why, and has nothing of theirs decoded.
            await self.client.wait_started(downlink)
            ending = [downlink]  # the pacer ends with the call: the downlink says how
            if self.client.started.is_set():
                ending += [
                    asyncio.ensure_future(self._uplink()),
                    asyncio.ensure_future(self._first_audio_due()),
                ]
                tasks += [*ending[1:], asyncio.ensure_future(self.pacer.run())]
            done, _ = await asyncio.wait(ending, return_when=asyncio.FIRST_COMPLETED)
            close: Close | None = next(iter(done)).result()
        finally:
            # The call first: a pacer whose cancel Python 3.11's wait_for dropped (it
            # comes as audio arrives) then stops at its next send.
            self.client.cancel()
            await cancel_and_wait(tasks)
        return close or Close(NORMAL_CLOSURE)  # None: the client went, nobody to tell

    async def _uplink(self) -> Close | None:
        """The client's messages: its audio to the pacer. None once the client went.
        A client silent for `realtime_idle_timeout_s` is gone as far as the chat
        goes: it would otherwise hold a slot, and a call fed with silence, for good."""
        idle_s = self.settings.realtime_idle_timeout_s
        while True:
            try:
                async with asyncio.timeout(idle_s):
                    raw = await self.socket.receive()
            except TimeoutError:
                return Close(POLICY_VIOLATION, f"no message for {idle_s:g} s: the chat ends")
            if raw is None:
                return None
            if isinstance(raw, str):
                return Close(UNSUPPORTED_DATA, "text frames are not Moshi messages: send binary")
            if not raw:
                continue  # moshi's server skips empty messages too
            kind, payload = raw[0], raw[1:]
            if kind == Kind.AUDIO:
                if refusal := self._take_audio(payload):
                    return refusal
            elif kind not in IGNORED_KINDS:
                return Close(UNSUPPORTED_DATA, f"unknown message kind {kind}")

    def _take_audio(self, data: bytes) -> Close | None:
        """The audio of one message to the pacer, unless it is too much (counted
        before decoding); how to close the socket if so."""
        self.first_audio.set()
        if len(data) > MAX_AUDIO_MESSAGE_BYTES:
            return Close(
                MESSAGE_TOO_BIG,
                f"an audio message of more than {MAX_AUDIO_MESSAGE_BYTES} bytes: send pages as "
                "they are recorded",
            )
        try:
            pages, seconds = self.caller_audio.whole_pages(data)
        except AudioTooLong:
            return Close(
                POLICY_VIOLATION,
                f"more than {MAX_AUDIO_MESSAGE_S:g} s of audio in one message: send pages as "
                "they are recorded",
            )
        except ValueError as exc:
            return Close(INVALID_PAYLOAD, str(exc))
        if not self.pacer.has_room(seconds):
            return Close(
                POLICY_VIOLATION,
                f"more than {MAX_BACKLOG_S:g} s of audio waits to be sent: send it at real time",
            )
        try:
            self.pacer.push(self.caller_audio.pcm16(pages))
        except ValueError as exc:
            return Close(INVALID_PAYLOAD, str(exc))
        return None

    async def _first_audio_due(self) -> Close:
        """A socket that sends no audio holds no call for long; once it has, this
        waits until the chat is over (and is cancelled)."""
        timeout = self.settings.start_timeout_s
        try:
            # Not wait_for: Python 3.11's drops a cancel that comes as the event is set.
            async with asyncio.timeout(timeout):
                await self.first_audio.wait()
        except TimeoutError:
            return Close(POLICY_VIOLATION, f"no audio within {timeout:g} s of the handshake")
        await asyncio.Event().wait()  # the chat goes on: nothing more to watch
        return Close(NORMAL_CLOSURE)  # not reached: cancelled with the chat

    async def _downlink(self) -> Close | None:
        """The gateway's events to the client until the call ends: how it ended."""
        try:
            async for event in self.client.events():
                await self._forward(event)
        except grpc.aio.AioRpcError as exc:
            end = CallEnd.of(exc, self.client.channel)
            if end.cancelled:
                return None  # the client went away: nobody to tell
            log.info("moshi chat ended: %s", end.summary())
            return Close(end.close_code, end.message())
        return Close(NORMAL_CLOSURE, "the call ended")

    async def _forward(self, event: ConverseEvent) -> None:
        """One gateway event as the client's messages (most have none)."""
        words: list[str] = []
        match event:
            case Started():
                await self.socket.send_bytes(message(Kind.HANDSHAKE))
            case AgentAudio(data=data):
                pages = self.agent_audio.pages(data)
                if pages:
                    await self.socket.send_bytes(message(Kind.AUDIO, pages))
                words = self.words.advanced(PCM.seconds(data))
            case AgentText(text=text, start_s=start_s):
                words = self.words.heard(text, start_s)
            case BargeIn():
                self.words.cut()
        for text in words:
            await self.socket.send_bytes(message(Kind.TEXT, text.encode()))
