"""The page's WebSocket, bridged to one `kame.v1.Gateway/Converse` call.

No conversation state lives here: the bridge translates. The page speaks a
small protocol (services/web/README.md has it in full):

- page -> bridge: a JSON `start` message (mode, LLM, audio rate, token), then
  binary messages of PCM16 mono at that rate, then optionally `{"type":
  "stop"}` (the caller is done: half-close). Closing the socket cancels the call.
- bridge -> page: the gateway's events as JSON, named as everywhere else
  (kame_common/converse.py: started, user_partial, user_final, oracle_reset,
  oracle_append, agent_text, turn, notice, barge_in, dtmf), the bridge's own
  `error` and `end`, and binary agent audio: one flag byte (1 = the agent is
  speaking) followed by PCM16 at the same rate. The gateway resamples both
  ways, so the page needs no resampler.

`Bridge.run` works on any `PageSocket`, which is how the tests drive it
without a browser or an HTTP server.

What the page hears of an error never names an internal address: a gateway the
bridge could not reach is said in words only, and every other status's details
pass through `redact_addresses` (the gateway redacts its own already; this also
covers what gRPC itself writes, "ipv4:10.0.0.5:50051: Connection refused").
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import grpc

from kame_common import converse
from kame_common.aio import cancel_and_wait
from kame_common.converse import ConverseClient, ConverseEvent
from kame_common.redact import redact_addresses
from kamepb import gateway_pb2
from services.web.config import WebSettings

log = logging.getLogger(__name__)

# PCM16 rates the gateway accepts (services/gateway/codecs.py).
MIN_RATE, MAX_RATE = 8000, 192000
SPEAKING, SILENT = b"\x01", b"\x00"

# What the page tells the person for each way the gateway can end a call.
ERROR_HINTS = {
    "UNAUTHENTICATED": "auth refused: the gateway wants a valid access token",
    "UNAVAILABLE": "the call broke off (the gateway is draining, or a service behind it failed)",
    "RESOURCE_EXHAUSTED": "the agent is busy",
    "INVALID_ARGUMENT": "the gateway refused the settings",
    "OUT_OF_RANGE": "the conversation reached its length limit",
    "DEADLINE_EXCEEDED": "the gateway timed out",
}
# A refusal the gateway says to retry (`retry-after-s` trailing metadata): the
# stack is still starting (its services do not serve yet), or it is full. The
# gateway's details say which.
RETRY_HINTS = {
    "UNAVAILABLE": "the agent is not ready yet",
    "RESOURCE_EXHAUSTED": "the agent is busy",
}
MAX_RETRY_AFTER_S = 3600.0  # a longer hint is not one a person waits for


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


def page_event(event: ConverseEvent) -> ConverseEvent | bytes:
    """What the page receives for one gateway event (kame_common.converse): agent
    audio as bytes (flag byte + PCM16), every other event as it is."""
    if event["type"] == "agent_audio":
        return (SPEAKING if event["speaking"] else SILENT) + event["data"]
    return event


def error_event(code: str, details: str, retry_after_s: float | None = None) -> dict[str, Any]:
    """An error the page shows as is: what happened in words, then the details
    (addresses redacted). With `retry_after_s` (the gateway's hint), when to try
    again, also as `retry_after_s` for the page's countdown."""
    details = redact_addresses(details)
    if retry_after_s is not None and code in RETRY_HINTS:
        message = f"{RETRY_HINTS[code]}: try again in {retry_after_s:g} s ({details})"
        return {"type": "error", "code": code, "message": message, "retry_after_s": retry_after_s}
    return {"type": "error", "code": code, "message": f"{ERROR_HINTS.get(code, code)}: {details}"}


def unreachable_event() -> dict[str, Any]:
    """The gateway was never reached: gRPC's own details name the addresses it
    tried, which the page must not see (the log has them)."""
    return {
        "type": "error",
        "code": "UNAVAILABLE",
        "message": "gateway down: the web service gets no answer from the gateway",
    }


def retry_after(exc: grpc.aio.AioRpcError) -> float | None:
    """The gateway's `retry-after-s` hint, if it sent one a person waits for."""
    hint = converse.retry_after_s(exc)
    return hint if hint is not None and hint <= MAX_RETRY_AFTER_S else None


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
            await self._report(page, exc, client.channel)
            return
        await send_json(page, {"type": "end"})

    async def _report(
        self, page: PageSocket, exc: grpc.aio.AioRpcError, channel: grpc.aio.Channel
    ) -> None:
        if exc.code() == grpc.StatusCode.CANCELLED:
            return  # the page went away: nobody to tell
        log.info("converse ended: %s: %s", exc.code().name, exc.details())
        # Not connected: the gateway was never reached. Connected (or a hint, which only
        # the gateway sends): the gateway ended the call.
        retry_after_s = retry_after(exc)
        connected = channel.get_state() == grpc.ChannelConnectivity.READY
        if exc.code() == grpc.StatusCode.UNAVAILABLE and not connected and retry_after_s is None:
            await send_json(page, unreachable_event())
            return
        await send_json(page, error_event(exc.code().name, exc.details() or "", retry_after_s))


def is_stop(message: str) -> bool:
    try:
        return bool(json.loads(message).get("type") == "stop")
    except (json.JSONDecodeError, AttributeError):
        return False


async def send_json(page: PageSocket, event: Mapping[str, Any]) -> None:
    await page.send_text(json.dumps(event))
