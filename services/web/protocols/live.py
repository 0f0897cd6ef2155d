"""OpenAI's GPT-Live protocol (WS /v1/live/sessions) spoken over one
Gateway.Converse call, without a network: `LiveSession` turns the client's
events into what to do (the call to open, audio and requests for it, events to
answer) and the gateway's events (kame_client/events.py) into GPT-Live server
events. live_config.py checks what session.start may choose; live_adapter.py
makes it an adapter of the web service's bridge (services/web/bridge.py).

How the stack reads in this protocol:
- session.start opens the call; session.started comes once the gateway has
  started it, before any other server event but the errors of client events
  sent before it. A start the gateway refuses (a model, voice or instructions
  the operator does not allow, no capacity) is the protocol's error, with no
  session.started.
- The session's timeline is the call's caller audio: milliseconds of it since
  the call began (the agent speaks one frame per caller frame, so agent audio
  sits on the same clock). Input and output transcript deltas, delegations,
  usage and the `appended` acknowledgements are placed on it.
- Agent audio is sent as it comes, silence included, at the pace of the
  caller's audio (GPT-Live streams continuously); barge-in is the stack's own
  (its speech stops), as GPT-Live's is the server's.
- The caller's words: the stable words of each partial transcript, then the
  rest of its final, as input_transcript deltas (fragments carry their own
  leading space); a delegation's source words are sent before it, so that a
  back-end reading the transcript has its question.
- Client delegation (live_config.py): each of the gateway's delegations is
  session.delegation.created; commentary for it is the agent's answer, said
  in its voice; thinking is silent context; a delegation_id this session
  never sent is the protocol's error. Responses delegation: the stack's
  oracle answers; the client's function tools are called as a delegated
  response's function_call item (response.event), answered with
  response.item.create (function_call_output); response.create then asks for
  nothing: the agent goes on by itself.
- session.input_audio.mute sends silence in place of the caller's audio
  until unmute; session.close half-closes the call, and session.closed
  follows once the gateway has finished it.
"""

from __future__ import annotations

import base64
import itertools
import json
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kame_client.client import CallerRequest, HalfClose, SendContext, SendFunctionResult
from kame_client.events import (
    AgentAudio,
    AgentText,
    ConverseEvent,
    Delegated,
    FunctionCall,
    Notice,
    Started,
    UserFinal,
    UserTranscript,
)
from kame_common.audio import FRAME_SECONDS
from kamepb import common_pb2, gateway_pb2
from services.web.protocols.live_config import LiveConfig, start_config, updated_config
from services.web.protocols.realtime import decoded_audio, parsed_event
from services.web.protocols.realtime_config import ClientError, Event, error_event, sendable
from services.web.protocols.realtime_items import new_id

Context = common_pb2.AgentContext
# The client's context events: the AgentContext kind each is, and its acknowledgement.
CONTEXT_EVENTS = {
    "session.commentary.append": (Context.COMMENTARY, "session.commentary.appended"),
    "session.thinking.append": (Context.THINKING, "session.thinking.appended"),
    "session.instructions.append": (Context.INSTRUCTIONS, "session.instructions.appended"),
}
# Client events of GPT-Live this endpoint does not serve: an error names them.
NOT_SERVED = frozenset(
    (
        "session.output_audio.fixture.play",
        "decision.create",
        "decision.item.create",
        "decision.item.delete",
    )
)
USAGE_EVERY_S = 60.0  # session.usage.updated, once a minute of the session
# Delegations whose ids the session remembers (the gateway keeps as many).
MAX_DELEGATIONS = 64
# How long a session lasts at most: the gateway's max_session_s default.
SESSION_LIFETIME_S = 3600
HISTORY_LABELS = {"developer": "Instructions", "user": "User", "assistant": "Assistant"}


@dataclass
class Reply:
    """What one input asks for: events to send back, the call to open, audio
    and requests for the gateway."""

    events: list[Event] = field(default_factory=list)
    open_call: gateway_pb2.ConverseConfig | None = None
    audio: bytes = b""
    requests: list[CallerRequest] = field(default_factory=list)


class LiveSession:
    """One GPT-Live session's protocol state (the module doc)."""

    def __init__(
        self,
        offered_modes: list[str],
        offered_models: list[str] | None = None,
        clock: Callable[[], float] = time.time,
        delegation_timeout_s: float = 0.0,
    ) -> None:
        self.offered_modes = list(offered_modes)
        self.offered_models = list(offered_models or [])
        self.delegation_timeout_s = delegation_timeout_s  # client delegation (0: the gateway's)
        self.clock = clock
        self.id = new_id("sess")
        self.config: LiveConfig | None = None  # set by session.start
        self.started = False  # the gateway started the call: session.started went out
        self.closing = False  # the client asked to close
        self.expires_at = 0
        self.muted = False
        self.timeline_s = 0.0  # the session's timeline: caller (and agent) audio so far
        self.usage_told_s = 0.0
        self.delegations: OrderedDict[str, None] = OrderedDict()
        self.waiting_calls: dict[str, None] = {}  # function calls the client is to answer
        self.heard: dict[str, list[str]] = {}  # utterance id -> words sent as input deltas
        self.heard_until_ms: dict[str, int] = {}  # ... and where the last of them ended
        self.said_any = {"input": False, "output": False}  # a first delta has no leading space
        self._event_numbers = itertools.count(1)

    def stamp(self, events: list[Event]) -> list[Event]:
        for event in events:
            event["event_id"] = f"event_{self.id[5:13]}_{next(self._event_numbers)}"
        return events

    @property
    def timeline_ms(self) -> int:
        return round(self.timeline_s * 1000)

    # Client events.

    def on_client(self, raw: str | bytes) -> Reply:
        event_id = ""
        try:
            event = parsed_event(raw)
            event_id = str(event.get("event_id") or "")
            reply = self._handle(event, event_id)
        except ClientError as exc:
            error = error_event(exc.code, exc.message, param=exc.param, client_event_id=event_id)
            reply = Reply([error | _answering(event_id)])
        self.stamp(reply.events)
        return reply

    def _handle(self, event: dict[str, Any], event_id: str) -> Reply:
        kind = event["type"]
        if kind == "session.start":
            return self._start(event.get("session"))
        if self.config is None:
            raise ClientError("session_not_started", f"send session.start before {kind}", "type")
        if kind == "session.input_audio.append":
            return Reply(audio=self._appended(event.get("audio")))
        if kind in ("session.input_audio.mute", "session.input_audio.unmute"):
            self.muted = kind.endswith(".mute")
            acknowledged = (
                "session.input_audio.muted" if self.muted else "session.input_audio.unmuted"
            )
            return Reply([_reply(acknowledged, event_id)])
        if kind in CONTEXT_EVENTS:
            return self._context(kind, event, event_id)
        if kind == "session.update":
            self.config = updated_config(event.get("session"), self.config)
            return Reply([self._session_event("session.updated", event_id)])
        if kind == "session.close":
            self.closing = True
            return Reply(requests=[HalfClose()])
        if kind in ("response.create", "response.item.create"):
            return self._response_event(kind, event)
        if kind in NOT_SERVED:
            raise ClientError("unsupported_event", f"{kind} is not served here", "type")
        raise ClientError("invalid_value", f"unknown event type {kind!r}", "type")

    def _start(self, session: Any) -> Reply:
        if self.config is not None:
            raise ClientError("session_already_started", "session.start is sent once", "type")
        self.config = start_config(
            session, self.offered_modes, self.offered_models, self.delegation_timeout_s
        )
        return Reply(open_call=self.config.converse_config())

    def _session_event(self, kind: str, event_id: str = "") -> Event:
        assert self.config is not None
        resource = self.config.resource(self.id, self.expires_at)
        return _reply(kind, event_id) | {"session": resource}

    def _appended(self, audio: Any) -> bytes:
        assert self.config is not None
        coding = self.config.coding
        data = decoded_audio(audio, coding)
        return coding.silence(coding.seconds(data)) if self.muted else data

    def _context(self, kind: str, event: dict[str, Any], event_id: str) -> Reply:
        """Commentary, thinking or instructions: the gateway's AgentContext."""
        assert self.config is not None
        context_kind, acknowledged = CONTEXT_EVENTS[kind]
        content = event.get("content")
        if not isinstance(content, str) or not content.strip():
            raise ClientError("invalid_value", "content must be non-empty text", "content")
        delegation_id = event.get("delegation_id")
        if delegation_id is not None and not isinstance(delegation_id, str):
            raise ClientError(
                "invalid_type", "delegation_id must be a string or null", "delegation_id"
            )
        if delegation_id and self.config.responses is not None:
            raise ClientError(
                "invalid_value",
                "delegation_id is not accepted with responses delegation",
                "delegation_id",
            )
        if delegation_id and delegation_id not in self.delegations:
            raise ClientError(
                "delegation_not_found",
                f"no delegation {delegation_id[:80]!r} was created in this session",
                "delegation_id",
            )
        if context_kind == Context.INSTRUCTIONS:
            delegation_id = None  # instructions are the session's, whatever they name
        request = SendContext(context_kind, sendable(content, "content"), delegation_id or "")
        at = {"start_ms": self.timeline_ms, "end_ms": self.timeline_ms}
        return Reply([_reply(acknowledged, event_id) | at], requests=[request])

    def _response_event(self, kind: str, event: dict[str, Any]) -> Reply:
        """Responses delegation: a function's output (response.item.create); a
        response.create after it asks for nothing (the module doc)."""
        assert self.config is not None
        if self.config.responses is None:
            raise ClientError("unsupported_event", f"{kind} requires Responses delegation", "type")
        if kind == "response.create":
            return Reply()
        item = event.get("item")
        kind_of_item = item.get("type") if isinstance(item, dict) else None
        if kind_of_item != "function_call_output":
            raise ClientError(
                "unsupported_value",
                "response.item.create takes function_call_output items",
                "item.type",
            )
        assert isinstance(item, dict)
        call_id, output = item.get("call_id"), item.get("output")
        if not isinstance(call_id, str) or call_id not in self.waiting_calls:
            raise ClientError(
                "invalid_value", "no function call waits for this call_id", "item.call_id"
            )
        if not isinstance(output, str):
            output = json.dumps(output)
        del self.waiting_calls[call_id]
        return Reply(requests=[SendFunctionResult(call_id, sendable(output, "item.output"))])

    # Gateway events.

    def on_converse(self, event: ConverseEvent) -> Reply:
        match event:
            case Started():
                reply = self._started()
            case AgentAudio():
                reply = Reply(self._agent_audio(event))
            case AgentText():
                reply = Reply(self._said("output", event.text, event.start_s, event.end_s))
            case UserTranscript():
                reply = Reply(self._heard(event))
            case Delegated():
                reply = Reply(self._delegated(event))
            case FunctionCall():
                reply = Reply(self._function_call(event))
            case Notice(kind="REFUSED", message=message):
                reply = Reply([error_event("request_refused", message)])
            case Notice(kind=kind, message=message):
                reply = Reply([{"type": "info", "code": kind.lower(), "message": message}])
            case _:
                reply = Reply()  # turns, barge-ins (the server's own), keys: no GPT-Live event
        self.stamp(reply.events)
        return reply

    def _started(self) -> Reply:
        """session.started; the start's prior history goes in as context notes."""
        assert self.config is not None
        self.started = True
        self.expires_at = int(self.clock()) + SESSION_LIFETIME_S
        notes = [
            SendContext(Context.THINKING, f"{HISTORY_LABELS[role]}: {text}")
            for role, text in self.config.history
            if self.config.delegates
        ]
        return Reply([self._session_event("session.started")], requests=list(notes))

    def _agent_audio(self, event: AgentAudio) -> list[Event]:
        self.timeline_s = (event.seq + 1) * FRAME_SECONDS
        events: list[Event] = [
            {"type": "session.output_audio.delta", "delta": base64.b64encode(event.data).decode()}
        ]
        if self.timeline_s - self.usage_told_s >= USAGE_EVERY_S:
            self.usage_told_s = self.timeline_s
            events.append({"type": "session.usage.updated", "usage": self.usage()})
        return events

    def usage(self) -> Event:
        return {"seconds": int(self.timeline_s)}

    def _said(self, who: str, text: str, start_s: float, end_s: float) -> list[Event]:
        """A transcript delta on the session's timeline ("input" or "output")."""
        text = " ".join(text.split())
        if not text:
            return []
        delta = f" {text}" if self.said_any[who] else text
        self.said_any[who] = True
        return [
            {
                "type": f"session.{who}_transcript.delta",
                "delta": delta,
                "start_ms": round(start_s * 1000),
                "end_ms": round(end_s * 1000),
            }
        ]

    def _heard(self, event: UserTranscript) -> list[Event]:
        """The stable words of a partial, the rest at the final (the module doc)."""
        words = event.text if isinstance(event, UserFinal) else event.stable_text
        return self._new_words(event.utterance_id, words.split(), event.start_s, event.end_s)

    def _new_words(
        self, utterance_id: str, words: list[str], start_s: float, end_s: float
    ) -> list[Event]:
        sent = self.heard.setdefault(utterance_id, [])
        if len(words) <= len(sent):
            return []
        new = words[len(sent) :]
        sent.extend(new)
        since_s = self.heard_until_ms.get(utterance_id, round(start_s * 1000)) / 1000
        self.heard_until_ms[utterance_id] = round(end_s * 1000)
        return self._said("input", " ".join(new), since_s, max(end_s, since_s))

    def _delegated(self, event: Delegated) -> list[Event]:
        self.delegations[event.delegation_id] = None
        if len(self.delegations) > MAX_DELEGATIONS:
            self.delegations.popitem(last=False)
        offset_s = event.offset_s
        source = self._new_words(
            event.source_utterance_id, event.source_text.split(), offset_s, offset_s
        )
        created = {
            "type": "session.delegation.created",
            "delegation": {"id": event.delegation_id, "target": "client", "type": "delegation"},
            "offset_ms": round(offset_s * 1000),
        }
        return [*source, created]

    def _function_call(self, event: FunctionCall) -> list[Event]:
        """The oracle calls one of the client's function tools: a delegated
        response (responses delegation) whose one output item is the call."""
        self.waiting_calls[event.call_id] = None
        delegation_id, response_id = new_id("delegation"), new_id("resp")
        item = {
            "id": new_id("fc"),
            "type": "function_call",
            "status": "completed",
            "call_id": event.call_id,
            "name": event.name,
            "arguments": event.arguments_json or "{}",
        }
        response = {"id": response_id, "object": "response", "output": []}

        def wrapped(inner: Event) -> Event:
            return {"type": "response.event", "delegation_id": delegation_id, "event": inner}

        return [
            {
                "type": "session.delegation.created",
                "delegation": {
                    "id": delegation_id,
                    "target": "responses",
                    "type": "delegation",
                    "response_id": response_id,
                },
                "offset_ms": self.timeline_ms,
            },
            wrapped({"type": "response.created", "response": response | {"status": "in_progress"}}),
            wrapped({"type": "response.output_item.done", "output_index": 0, "item": item}),
            wrapped({"type": "response.completed", "response": response | {"status": "completed"}}),
        ]

    def on_call_end(self, error: Event | None, expired: bool = False) -> list[Event]:
        """The gateway ended the call: `error` (None: it ended OK) and, once the
        session had started, session.closed with why and the usage."""
        events = [error] if error is not None else []
        if self.started:
            if expired:
                reason = "expired"
            elif error is not None:
                reason = "connection_lost"
            else:
                reason = "close_requested" if self.closing else "remote_hangup"
            closed = self._session_event("session.closed") | {
                "reason": reason,
                "usage": self.usage(),
            }
            events.append(closed)
        return self.stamp(events)


def _answering(client_event_id: str) -> Event:
    """The client_event_id field of a server event answering a client's (if it named one)."""
    return {"client_event_id": client_event_id} if client_event_id else {}


def _reply(kind: str, client_event_id: str) -> Event:
    """A server event answering a client's."""
    return {"type": kind} | _answering(client_event_id)
