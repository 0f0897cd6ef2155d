"""What a protocol adapter gives the bridge (services/web/bridge.py): the
contract every protocol of the web service keeps (services/web/protocols/
__init__.py says it in words)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from kame_client.client import CallerRequest
from kame_client.events import ConverseEvent
from kame_client.status import CallEnd, CloseCode
from kamepb import gateway_pb2
from services.web.protocols.realtime_config import AudioCoding

MAX_REASON_BYTES = 123  # what a WebSocket close frame carries of its reason


@dataclass(frozen=True)
class Close:
    """How a session ends: the socket's close code and, in words, why."""

    code: int = CloseCode.NORMAL_CLOSURE
    reason: str = ""

    @property
    def short_reason(self) -> str:
        """The reason as a close frame carries it (at most 123 bytes of UTF-8)."""
        return self.reason.encode()[:MAX_REASON_BYTES].decode(errors="ignore")


@dataclass(frozen=True)
class OpenCall:
    """Open the session's gateway call with `config`. `paced`: the coding of the
    caller's audio, which the bridge then sends at real time whatever pace the
    client sends it at (services/web/pacer.py); None: as it comes (a
    microphone already paces it). `fill_silence`: whether silence stands in
    for a paced client that sends nothing (pacer.py); off, the client's own
    audio is the call's time (the Moshi protocol)."""

    config: gateway_pb2.ConverseConfig
    paced: AudioCoding | None = None
    fill_silence: bool = True


@dataclass
class Actions:
    """What the bridge does for one input, in this order: send the messages,
    open the call, clear the audio waiting, take the audio and the requests,
    (dis)arm the timer, end the session."""

    send: list[str | bytes] = field(default_factory=list)  # str: a text frame
    open_call: OpenCall | None = None  # ignored once a call is open
    clear_audio: bool = False  # drop caller audio not sent to the gateway yet
    audio: bytes = b""  # caller audio for the call
    requests: list[CallerRequest] = field(default_factory=list)
    timer: Timer | None = None
    disarm: bool = False  # the timer armed before is off
    close: Close | None = None  # the session ends


@dataclass(frozen=True)
class Timer:
    """`then` (its Close ending the session) unless disarmed within `seconds`."""

    seconds: float
    then: Actions


def no_call(timeout_s: float) -> Close:
    """How a socket without a call by its start deadline is closed."""
    return Close(CloseCode.POLICY_VIOLATION, f"no call within {timeout_s:g} s of the handshake")


def text(*events: Mapping[str, Any]) -> list[str | bytes]:
    """JSON events as text frames."""
    return [json.dumps(event) for event in events]


class Adapter(Protocol):
    """One protocol session, without a network (see the package's docstring)."""

    @property
    def name(self) -> str:
        """The session as the log names it ("realtime session sess_...")."""

    @property
    def idle_timeout_s(self) -> float | None:
        """How long the client may send nothing before `on_idle` (None: forever)."""

    def opening(self) -> Actions:
        """What the session does before the client's first message."""

    def on_client(self, message: str | bytes) -> Actions:
        """One message from the client."""

    def on_event(self, event: ConverseEvent) -> Actions:
        """One event of the gateway's (kame_client.events)."""

    def on_call_end(self, end: CallEnd | None) -> Actions:
        """The gateway ended the call (None: OK, else how: kame_client.status);
        the session ends after these actions."""

    def on_backlog_full(self) -> Actions:
        """Audio the client sent does not fit the paced backlog (pacer.MAX_BACKLOG_S)."""

    def on_idle(self) -> Actions:
        """The caller was idle (no audio with sound, no text) for `idle_timeout_s`
        once the call was open (services/web/activity.py)."""

    def on_start_timeout(self, timeout_s: float) -> Actions:
        """The socket has had no call for `timeout_s` since its handshake (the web
        service's start_timeout_s): the session ends."""

    def on_fault(self) -> Actions:
        """A fault of ours (a bug, logged): what the client is told before the end."""
