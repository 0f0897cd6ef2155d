"""The page's WebSocket, bridged to one `kame.v1.Gateway/Converse` call.

No conversation state lives here: the bridge translates. The page speaks a
small protocol (services/web/README.md has it in full):

- page -> bridge: a JSON `start` message (mode, LLM, audio rate, token), then
  binary messages of PCM16 mono at that rate, then optionally `{"type":
  "stop"}` (the caller is done: half-close). Closing the socket cancels the call.
- bridge -> page: the gateway's events as JSON, named as everywhere else
  (kame_client/events.py: started, user_partial, user_final, oracle_reset,
  oracle_append, agent_text, turn, notice, barge_in, dtmf), the bridge's own
  `error` and `end`, and binary agent audio: one flag byte (1 = the agent is
  speaking) followed by PCM16 at the same rate. The gateway resamples both
  ways, so the page needs no resampler.

`Bridge.run` works on any `PageSocket`, which is how the tests drive it
without a browser or an HTTP server.

What the page hears of an error is kame_client/status.py's words for it, which
never name an internal address.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import grpc

from kame_client.client import ConverseClient
from kame_client.codecs import PCM_MAX_RATE, PCM_MIN_RATE
from kame_client.events import AgentAudio, ConverseEvent, event_json
from kame_client.status import CallEnd
from kame_common.aio import cancel_and_wait
from kamepb import gateway_pb2
from services.web.config import WebSettings

log = logging.getLogger(__name__)

# PCM16 rates the gateway accepts (kame_client/codecs.py).
MIN_RATE, MAX_RATE = PCM_MIN_RATE, PCM_MAX_RATE
SPEAKING, SILENT = b"\x01", b"\x00"


class PageSocket(Protocol):
    """The page's end of the bridge: a WebSocket, or a test's stand-in."""

    async def receive(self) -> str | bytes | None:
        """The next message; None once the page has gone."""

    async def send_text(self, text: str) -> None: ...

    async def send_bytes(self, data: bytes) -> None: ...


class StartError(ValueError):
    """The page's start message is not one the bridge can honour."""


@dataclass(frozen=True)
class Start:
    config: gateway_pb2.ConverseConfig
    token: str


def parse_start(raw: str | bytes | None, settings: WebSettings) -> Start:
    """The Converse config and token a `start` message asks for; StartError naming
    the field otherwise."""
    if not isinstance(raw, str):
        raise StartError("the first message must be the JSON start message")
    try:
        message = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise StartError(f"start: not JSON ({exc.msg})") from None
    if not isinstance(message, dict) or message.get("type") != "start":
        raise StartError('the first message must be {"type": "start", ...}')
    mode = message.get("mode") or settings.mode_choices[0]
    if mode not in settings.mode_choices:
        raise StartError(f"mode: {mode!r} is not offered; choose {settings.mode_choices}")
    rate = message.get("rate")
    if not isinstance(rate, int) or not MIN_RATE <= rate <= MAX_RATE:
        raise StartError(f"rate: PCM16 needs {MIN_RATE}..{MAX_RATE} Hz, got {rate!r}")
    audio = gateway_pb2.AudioFormat(codec=gateway_pb2.AudioFormat.PCM16, sample_rate_hz=rate)
    config = gateway_pb2.ConverseConfig(
        mode=gateway_pb2.ConverseConfig.Mode.Value(mode.upper()),
        input_format=audio,
        output_format=audio,
        include_oracle_updates=True,
    )
    llm = message.get("llm") or ""
    if llm:
        if llm not in settings.llm_choices:
            raise StartError(f"llm: {llm!r} is not offered; choose {settings.llm_choices}")
        config.llm.CopyFrom(gateway_pb2.LlmOverride(model=llm))
    token = message.get("token") or settings.relayed_token
    return Start(config, token if isinstance(token, str) else "")


def page_event(event: ConverseEvent) -> dict[str, Any] | bytes:
    """What the page receives for one gateway event (kame_client.events): agent
    audio as bytes (flag byte + PCM16), every other event as its JSON."""
    match event:
        case AgentAudio(speaking=speaking, data=data):
            return (SPEAKING if speaking else SILENT) + data
    return event_json(event)


def error_event(end: CallEnd) -> dict[str, Any]:
    """An error the page shows as is (kame_client.status's words); with the
    gateway's hint of when to try again, also as `retry_after_s` for the page's
    countdown."""
    error: dict[str, Any] = {"type": "error", "code": end.name, "message": end.message()}
    if end.retry_after_s is not None:
        error["retry_after_s"] = end.retry_after_s
    return error


class Bridge:
    """Bridges page sockets to the gateway named in the settings."""

    def __init__(self, settings: WebSettings) -> None:
        self.settings = settings

    async def run(self, page: PageSocket, start: Start) -> None:
        """One conversation the page started: audio both ways until either side ends it."""
        channel = self.settings.gateway_channel(self.settings.connection_policy())
        async with channel:
            client = ConverseClient(channel, start.token)
            # Every way the call ends, a gateway that cannot be reached included, is
            # read from the call's status by the downlink: a write to a call that has
            # already failed only says that it failed, not how.
            downlink = asyncio.ensure_future(self._downlink(page, client))
            uplink = asyncio.ensure_future(self._uplink(page, client, start.config, downlink))
            try:
                await asyncio.wait({downlink, uplink}, return_when=asyncio.FIRST_COMPLETED)
                if uplink.done():
                    return  # the page went away, nobody to tell: the finally cancels the call
                await downlink  # the gateway ends the call (and says how)
            finally:
                await cancel_and_wait([uplink, downlink])
                client.cancel()

    async def _uplink(
        self,
        page: PageSocket,
        client: ConverseClient,
        config: gateway_pb2.ConverseConfig,
        downlink: asyncio.Future[None],
    ) -> None:
        """The config, then the page's audio to the gateway until the page goes;
        `stop` half-closes. The audio waits (in the socket) until the session
        started, so that the page hears the gateway's own refusal, say "auth
        refused" (kame_common.converse)."""
        await client.start(config)
        await client.wait_started(downlink)
        while (message := await page.receive()) is not None:
            if downlink.done():
                continue  # the call is over; the page will hear how
            if isinstance(message, bytes):
                await client.send_audio(message)
            elif is_stop(message):
                await client.done_writing()

    async def _downlink(self, page: PageSocket, client: ConverseClient) -> None:
        """Every gateway event to the page; ends with `end` or, if the gateway
        refused (a bad token fails the first read) or broke off the call, `error`."""
        try:
            async for event in client.events():
                sent = page_event(event)
                if isinstance(sent, bytes):
                    await page.send_bytes(sent)
                else:
                    await send_json(page, sent)
        except grpc.aio.AioRpcError as exc:
            end = CallEnd.of(exc, client.channel)
            if not end.cancelled:  # cancelled: the page went away, nobody to tell
                log.info("converse ended: %s", end.summary())
                await send_json(page, error_event(end))
            return
        await send_json(page, {"type": "end"})


def is_stop(message: str) -> bool:
    try:
        return bool(json.loads(message).get("type") == "stop")
    except (json.JSONDecodeError, AttributeError):
        return False


async def send_json(page: PageSocket, event: Mapping[str, Any]) -> None:
    await page.send_text(json.dumps(event))
