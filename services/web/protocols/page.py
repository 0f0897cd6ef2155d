"""The page's protocol (WS /converse): the browser page's small one
(services/web/README.md has it in full), as an adapter of the web service's
bridge (services/web/bridge.py).

- page -> bridge: a JSON `start` message (mode, LLM, audio rate, token), then
  binary messages of PCM16 mono at that rate, then optionally `{"type":
  "stop"}` (the caller is done: half-close). Closing the socket cancels the call.
- bridge -> page: the gateway's events as JSON, named as everywhere else
  (kame_client/events.py: started, user_partial, user_final, oracle_reset,
  oracle_append, agent_text, turn, notice, barge_in, dtmf), the bridge's own
  `error` and `end`, and binary agent audio: one flag byte (1 = the agent is
  speaking) followed by PCM16 at the same rate. The gateway resamples both
  ways, so the page needs no resampler.

The call opens with the start message's config; the page's audio goes as it
comes (its microphone paces it). What the page hears of an error is
kame_client/status.py's words for it, which never name an internal address.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import grpc

from kame_client.client import HalfClose
from kame_client.codecs import PCM_MAX_RATE, PCM_MIN_RATE
from kame_client.events import AgentAudio, ConverseEvent, event_json
from kame_client.status import CallEnd
from kamepb import gateway_pb2
from services.web.config import WebSettings
from services.web.protocols.adapter import Actions, OpenCall, no_call, text

SPEAKING, SILENT = b"\x01", b"\x00"


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
    if not isinstance(rate, int) or not PCM_MIN_RATE <= rate <= PCM_MAX_RATE:
        raise StartError(f"rate: PCM16 needs {PCM_MIN_RATE}..{PCM_MAX_RATE} Hz, got {rate!r}")
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


def page_event(event: ConverseEvent) -> str | bytes:
    """What the page receives for one gateway event (kame_client.events): agent
    audio as bytes (flag byte + PCM16), every other event as its JSON."""
    match event:
        case AgentAudio(speaking=speaking, data=data):
            return (SPEAKING if speaking else SILENT) + data
    return json.dumps(event_json(event))


def error_event(end: CallEnd) -> dict[str, Any]:
    """An error the page shows as is (kame_client.status's words); with the
    gateway's hint of when to try again, also as `retry_after_s` for the page's
    countdown."""
    error: dict[str, Any] = {"type": "error", "code": end.name, "message": end.message()}
    if end.retry_after_s is not None:
        error["retry_after_s"] = end.retry_after_s
    return error


def is_stop(message: str) -> bool:
    try:
        return bool(json.loads(message).get("type") == "stop")
    except (json.JSONDecodeError, AttributeError):
        return False


class PageSession:
    """One page's conversation, begun by its start message."""

    name = "page conversation"

    def __init__(self, start: Start, idle_timeout_s: float) -> None:
        self.start = start
        # The page streams its microphone, silence included: idle is no sound (activity.py).
        self.idle_timeout_s = idle_timeout_s

    def opening(self) -> Actions:
        return Actions(open_call=OpenCall(self.start.config))

    def on_client(self, message: str | bytes) -> Actions:
        if isinstance(message, bytes):
            return Actions(audio=message)
        return Actions(requests=[HalfClose()] if is_stop(message) else [])

    def on_event(self, event: ConverseEvent) -> Actions:
        return Actions(send=[page_event(event)])

    def on_call_end(self, end: CallEnd | None) -> Actions:
        return Actions(send=text(error_event(end) if end else {"type": "end"}))

    def on_backlog_full(self) -> Actions:
        return Actions()  # not paced: no backlog

    def on_idle(self) -> Actions:
        why = f"no sound from the caller for {self.idle_timeout_s:g} s: the call ends"
        return Actions(send=text(error_event(CallEnd(grpc.StatusCode.DEADLINE_EXCEEDED, why))))

    def on_start_timeout(self, timeout_s: float) -> Actions:
        return Actions(close=no_call(timeout_s))  # the call opens at once: never

    def on_fault(self) -> Actions:
        fault = CallEnd(grpc.StatusCode.INTERNAL, "the web service failed: its log says why")
        return Actions(send=text(error_event(fault)))
