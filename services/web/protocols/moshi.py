"""The Moshi protocol (WS /api/chat) as an adapter of the web service's bridge
(services/web/bridge.py), so that the clients of kyutai's moshi server
(moshi/server.py) talk to the stack: moshi's own client, and LiveKit's NVIDIA
PersonaPlex plugin. The call opens at once, in the mode `?model=` names.

Every message is binary, its first byte the kind:

- 0x00 handshake, server -> client, once the agent is on the line (the
  gateway's session started). PersonaPlex waits for it before it sends audio;
  moshi's client sends from the start, and that audio waits for the call: the
  client's messages are read only once the gateway took it, so a caller it
  refuses (a wrong token) has nothing decoded.
- 0x01 audio, both ways: pages of one Ogg Opus stream per direction, 24 kHz
  mono. The caller's is decoded to PCM16 for the gateway (which takes PCM16
  at 24 kHz both ways), never sent ahead of real time (services/web/pacer.py),
  and, as moshi's server steps once per frame it receives, with no silence of
  ours standing in for a client that sends late: the gateway answers one agent
  frame per caller frame, so the agent's answer to the client's sample k is
  its output sample k whatever pace the client keeps (a client that lines up
  the streams by sample count, as Full-Duplex-Bench does, finds no drift). A
  client that sends nothing for the gateway's idle_timeout_s (10 s) ends the
  call. The agent's audio is coded in 80 ms frames, the frame moshi codes,
  silence included (moshi_audio.py).
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
for 120 ms), audio beyond the backlog, MAX_BACKLOG_S (1008), no audio within
`start_timeout_s` of the handshake (1008), and no sound from the caller for
`realtime_idle_timeout_s` once the chat began (1008). The gateway ending the
call closes the socket as kame_client/status.py maps its status (1000 for OK).

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

import logging
from collections.abc import Mapping
from enum import IntEnum

from kame_client.events import AgentAudio, AgentText, BargeIn, ConverseEvent, Started
from kame_client.status import CallEnd, CloseCode
from kamepb import gateway_pb2
from services.web.config import WebSettings
from services.web.pacer import MAX_BACKLOG_S
from services.web.protocols.adapter import Actions, Close, OpenCall, Timer, no_call
from services.web.protocols.moshi_audio import (
    MAX_AUDIO_MESSAGE_S,
    PCM,
    AgentOpus,
    AgentWords,
    CallerAudio,
)
from services.web.protocols.ogg_opus import AudioTooLong
from services.web.protocols.realtime_config import mode_of_model

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
# The most one audio message may carry. moshi's clients send a page of 80 ms
# (a few hundred bytes) at a time; this lets a client send several.
MAX_AUDIO_MESSAGE_BYTES = 64 << 10


def chat_mode(model: str | None, offered: list[str]) -> str:
    """The gateway mode `?model=` names (ClientError if not offered); without one,
    tandem if offered, else the first the web service offers."""
    if model is None:
        return "tandem" if "tandem" in offered else offered[0]
    return mode_of_model(model, offered)


def message(kind: Kind, payload: bytes = b"") -> bytes:
    return bytes((kind,)) + payload


def refusal(close: Close) -> bytes:
    """The error message that tells the client why its socket closes with `close`."""
    return message(Kind.ERROR, close.reason.encode())


def closing(code: int, reason: str) -> Actions:
    """The session ends, the client told why first (unless it ends normally)."""
    close = Close(code, reason)
    said: list[str | bytes] = [] if code == CloseCode.NORMAL_CLOSURE else [refusal(close)]
    return Actions(send=said, close=close)


class MoshiSession:
    """One Moshi socket: its chat in one mode."""

    name = "moshi chat"

    def __init__(self, mode: str, settings: WebSettings) -> None:
        self.mode = mode
        self.idle_timeout_s = settings.realtime_idle_timeout_s
        self.start_timeout_s = settings.start_timeout_s
        self.caller_audio = CallerAudio()
        self.agent_audio = AgentOpus()
        self.words = AgentWords()
        self.heard_audio = False  # the client sent audio

    @classmethod
    def for_query(cls, params: Mapping[str, str], settings: WebSettings) -> MoshiSession:
        """The chat the query asks for (ClientError for a mode not offered)."""
        mode = chat_mode(params.get("model"), settings.mode_choices)
        ignored = sorted(name for name in params if name != "model")
        if ignored:
            log.info("moshi chat: ignoring query parameters %s", ", ".join(ignored))
        return cls(mode, settings)

    def opening(self) -> Actions:
        config = gateway_pb2.ConverseConfig(
            mode=gateway_pb2.ConverseConfig.Mode.Value(self.mode.upper()),
            input_format=PCM.gateway_format(),
            output_format=PCM.gateway_format(),
        )
        return Actions(open_call=OpenCall(config, paced=PCM, fill_silence=False))

    def on_client(self, raw: str | bytes) -> Actions:
        if isinstance(raw, str):
            return closing(
                CloseCode.UNSUPPORTED_DATA, "text frames are not Moshi messages: send binary"
            )
        if not raw:
            return Actions()  # moshi's server skips empty messages too
        kind, payload = raw[0], raw[1:]
        if kind == Kind.AUDIO:
            return self._audio(payload)
        if kind in IGNORED_KINDS:
            return Actions()
        return closing(CloseCode.UNSUPPORTED_DATA, f"unknown message kind {kind}")

    def _audio(self, data: bytes) -> Actions:
        """The caller's audio of one message, decoded, unless it is too much
        (counted before decoding); the first audio disarms the start timer."""
        first, self.heard_audio = not self.heard_audio, True
        if len(data) > MAX_AUDIO_MESSAGE_BYTES:
            return closing(
                CloseCode.MESSAGE_TOO_BIG,
                f"an audio message of more than {MAX_AUDIO_MESSAGE_BYTES} bytes: send pages as "
                "they are recorded",
            )
        try:
            pages, _ = self.caller_audio.whole_pages(data)
            pcm = self.caller_audio.pcm16(pages)
        except AudioTooLong:
            return closing(
                CloseCode.POLICY_VIOLATION,
                f"more than {MAX_AUDIO_MESSAGE_S:g} s of audio in one message: send pages as "
                "they are recorded",
            )
        except ValueError as exc:
            return closing(CloseCode.INVALID_PAYLOAD, str(exc))
        return Actions(audio=pcm, disarm=first)

    def on_event(self, event: ConverseEvent) -> Actions:
        """One gateway event as the client's messages (most have none)."""
        actions, words = Actions(), []
        match event:
            case Started():
                actions.send.append(message(Kind.HANDSHAKE))
                if not self.heard_audio:  # a socket that sends no audio holds no call long
                    timeout_s = self.start_timeout_s
                    why = f"no audio within {timeout_s:g} s of the handshake"
                    actions.timer = Timer(timeout_s, closing(CloseCode.POLICY_VIOLATION, why))
            case AgentAudio(data=data):
                pages = self.agent_audio.pages(data)
                if pages:
                    actions.send.append(message(Kind.AUDIO, pages))
                words = self.words.advanced(PCM.seconds(data))
            case AgentText(text=text, start_s=start_s):
                words = self.words.heard(text, start_s)
            case BargeIn():
                self.words.cut()
        actions.send += [message(Kind.TEXT, text.encode()) for text in words]
        return actions

    def on_call_end(self, end: CallEnd | None) -> Actions:
        if end is None:
            return closing(CloseCode.NORMAL_CLOSURE, "the call ended")
        return closing(end.close_code, end.message())

    def on_backlog_full(self) -> Actions:
        return closing(
            CloseCode.POLICY_VIOLATION,
            f"more than {MAX_BACKLOG_S:g} s of audio waits to be sent: send it at real time",
        )

    def on_idle(self) -> Actions:
        why = f"no sound from the caller for {self.idle_timeout_s:g} s: the chat ends"
        return closing(CloseCode.POLICY_VIOLATION, why)

    def on_start_timeout(self, timeout_s: float) -> Actions:
        close = no_call(timeout_s)  # the call opens at once: never
        return closing(close.code, close.reason)

    def on_fault(self) -> Actions:
        return closing(CloseCode.INTERNAL_ERROR, "the web service failed: its log says why")
