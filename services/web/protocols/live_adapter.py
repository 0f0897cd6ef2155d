"""The GPT-Live protocol (WS /v1/live/sessions, live.py's LiveSession) as an
adapter of the web service's bridge (services/web/bridge.py).

The call opens at session.start, with what it chose; the caller's audio is
paced at real time, whatever pace the client appends at. A client silent for
the web service's `realtime_idle_timeout_s` gets an error and the session
ends. How the gateway ends the call is the protocol's error (the one mapping
of kame_client/status.py), then session.closed once the session had started;
the call's length cap is session.closed `expired`. A fault of the endpoint's
own is a `server_error`, and the session ends.
"""

from __future__ import annotations

from kame_client.events import ConverseEvent
from kame_client.status import CallEnd
from services.web.protocols.adapter import Actions, Close, OpenCall, no_call, text
from services.web.protocols.live import LiveSession, Reply
from services.web.protocols.realtime_adapter import (
    backlog_full_error,
    call_error,
    fault_error,
    idle_error,
    start_timeout_error,
)

EXPIRED = "OUT_OF_RANGE"  # the gateway's status for a call at its length cap


class LiveAdapter:
    """One GPT-Live session's socket."""

    def __init__(self, session: LiveSession, idle_timeout_s: float) -> None:
        self.session = session
        self.idle_timeout_s = idle_timeout_s

    @property
    def name(self) -> str:
        return f"live session {self.session.id}"

    def _actions(self, reply: Reply) -> Actions:
        actions = Actions(send=text(*reply.events), audio=reply.audio, requests=reply.requests)
        if reply.open_call is not None:
            assert self.session.config is not None
            actions.open_call = OpenCall(reply.open_call, self.session.config.coding)
        return actions

    def opening(self) -> Actions:
        return Actions()

    def on_client(self, message: str | bytes) -> Actions:
        return self._actions(self.session.on_client(message))

    def on_event(self, event: ConverseEvent) -> Actions:
        return self._actions(self.session.on_converse(event))

    def on_call_end(self, end: CallEnd | None) -> Actions:
        expired = end is not None and end.name == EXPIRED
        error = None if end is None or expired else call_error(end)
        return Actions(send=text(*self.session.on_call_end(error, expired)), close=Close())

    def on_backlog_full(self) -> Actions:
        return Actions(send=text(*self.session.stamp([backlog_full_error()])))

    def on_idle(self) -> Actions:
        idle = self.session.stamp([idle_error(self.idle_timeout_s)])
        return Actions(send=text(*idle), close=Close())

    def on_start_timeout(self, timeout_s: float) -> Actions:
        late = self.session.stamp([start_timeout_error(timeout_s)])
        return Actions(send=text(*late), close=no_call(timeout_s))

    def on_fault(self) -> Actions:
        error = fault_error(self.session.id)
        return Actions(send=text(*self.session.on_call_end(error)), close=Close())
