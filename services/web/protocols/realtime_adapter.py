"""The OpenAI Realtime protocol (WS /v1/realtime, realtime.py's
RealtimeSession) as an adapter of the web service's bridge
(services/web/bridge.py).

The call opens with the first client event that needs it (an append, a
commit, a typed message, response.create), with the formats, voice, turn
detection and instructions the session has then (session.update may set them
before). The caller's audio is paced at real time, whatever pace the client
appends at; its requests (end_turn, respond, send_text, a function's output)
follow the audio appended before them, a cancel goes at once. A client silent
for `realtime_idle_timeout_s` gets an error and the session ends (it would
otherwise hold a web service slot, and once audio flowed a gateway call fed
with silence, for as long as it kept the socket open). A fault of the
endpoint's own is told as the protocol's `server_error`, as OpenAI reports
one of its own, and the session ends.
"""

from __future__ import annotations

from kame_client.events import ConverseEvent
from kame_client.status import CallEnd
from services.web.pacer import MAX_BACKLOG_S
from services.web.protocols.adapter import Actions, Close, OpenCall, no_call, text
from services.web.protocols.realtime import RealtimeSession
from services.web.protocols.realtime_config import Event, error_event


def backlog_full_error() -> Event:
    """Audio beyond the paced backlog: the protocol's error (Realtime's and GPT-Live's)."""
    message = f"more than {MAX_BACKLOG_S:g} s of audio waits to be sent; append at real time"
    return error_event("input_audio_buffer_full", message)


def idle_error(idle_timeout_s: float) -> Event:
    """A caller idle for `idle_timeout_s` (services/web/activity.py): the protocol's
    error before the session ends."""
    return error_event(
        "idle_timeout",
        f"no audio with sound in it and no text from the caller for {idle_timeout_s:g} s: "
        "the session ends",
    )


def start_timeout_error(timeout_s: float) -> Event:
    """A socket that asked for no call within `timeout_s`: the protocol's error before it closes."""
    return error_event(
        "session_start_timeout",
        f"no call within {timeout_s:g} s of connecting (audio, a message or response.create "
        "opens one): the session ends",
    )


def fault_error(session_id: str) -> Event:
    """A fault of the endpoint's own: the protocol's server_error, as OpenAI reports its own."""
    message = (
        "The server had an error while processing your request, and the session ends "
        f"(session {session_id} in the web service's log)."
    )
    return error_event("server_error", message, "server_error")


def call_error(end: CallEnd) -> Event:
    """How the gateway ended the call, as the protocol's error (kame_client.status's words)."""
    return error_event(end.name.lower(), end.message(), end.error_type)


class RealtimeAdapter:
    """One Realtime session's socket."""

    def __init__(self, session: RealtimeSession, idle_timeout_s: float) -> None:
        self.session = session
        self.idle_timeout_s = idle_timeout_s
        self.call_open = False

    @property
    def name(self) -> str:
        return f"realtime session {self.session.id}"

    def _sent(self, events: list[Event]) -> Actions:
        return Actions(send=text(*events))

    def opening(self) -> Actions:
        return self._sent(self.session.opening())

    def on_client(self, message: str | bytes) -> Actions:
        reply = self.session.on_client(message)
        actions = self._sent(reply.events)
        if reply.needs_call and not self.call_open:
            self.call_open = True
            config = self.session.config
            actions.open_call = OpenCall(config.converse_config(self.session.mode), config.input)
        actions.clear_audio = reply.clear_audio
        actions.audio = reply.audio
        actions.requests = reply.requests
        return actions

    def on_event(self, event: ConverseEvent) -> Actions:
        return self._sent(self.session.on_converse(event))

    def on_call_end(self, end: CallEnd | None) -> Actions:
        error = None if end is None else call_error(end)
        return Actions(send=text(*self.session.on_call_end(error)), close=Close())

    def on_backlog_full(self) -> Actions:
        return self._sent(self.session.stamp([backlog_full_error()]))

    def on_idle(self) -> Actions:
        idle = self.session.stamp([idle_error(self.idle_timeout_s)])
        return Actions(send=text(*idle), close=Close())

    def on_start_timeout(self, timeout_s: float) -> Actions:
        late = self.session.stamp([start_timeout_error(timeout_s)])
        return Actions(send=text(*late), close=no_call(timeout_s))

    def on_fault(self) -> Actions:
        error = fault_error(self.session.id)
        return Actions(send=text(*self.session.on_call_end(error)), close=Close())
