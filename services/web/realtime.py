"""The OpenAI Realtime protocol (GA event shapes) spoken over one Gateway.Converse
call, without a network: `RealtimeSession` turns the client's events into what
to do (audio for the gateway, events to answer) and the gateway's events
(kame_common/converse.py) into Realtime server events. realtime_config.py
holds what session.update may choose; realtime_bridge.py carries the events
over the WebSocket and the call.

How a full-duplex agent reads in this protocol:
- the session's turn detection is always the stack's own (server_vad): the
  gateway hears the caller, decides when a turn ends, and the agent speaks
  when it has something to say;
- each stretch of agent speech is a response the server starts: the agent's
  first speaking frame opens it (response.created ... content_part.added),
  its frames are output_audio deltas, its words output_audio_transcript
  deltas, and `RESPONSE_GAP_S` of silence closes it (completed). Silence
  inside a stretch is sent with the next speech, so a pause between two
  sentences keeps its length; silence between stretches is not sent;
- the caller's words are an item of their own: the first partial transcript
  is input_audio_buffer.speech_started, partials are transcription deltas,
  the final stops, commits and completes it;
- a barge-in (the caller talking over the agent) is speech_started, and the
  response under way ends `cancelled`; `response.cancel` ends it the same way.
  The agent's audio is dropped until its stretch ends.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from kame_common.converse import (
    AgentAudioEvent,
    AgentTextEvent,
    ConverseEvent,
    UserTranscriptEvent,
)
from services.web.realtime_config import (
    ClientError,
    Event,
    SessionConfig,
    error_event,
    mode_of_model,
)

# Seconds of agent silence that end a response (a shorter pause is within it).
RESPONSE_GAP_S = 0.5
# The most audio one input_audio_buffer.append may carry (WebSocket messages are
# capped at 1 MiB anyway: kame_common/http_server.py).
MAX_APPEND_S = 10.0
# Client events this first cut does not serve yet (push-to-talk, typed messages,
# tools, history edits): an error names them, and the session goes on.
NOT_YET = frozenset(
    (
        "input_audio_buffer.commit",
        "conversation.item.create",
        "conversation.item.truncate",
        "conversation.item.delete",
        "conversation.item.retrieve",
        "response.create",
        "output_audio_buffer.clear",
    )
)


@dataclass
class Reply:
    """What one client event asks for: events to send back, audio for the gateway."""

    events: list[Event] = field(default_factory=list)
    audio: bytes = b""
    clear_audio: bool = False  # input_audio_buffer.clear: drop what is not sent yet


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


@dataclass
class AgentResponse:
    """One stretch of agent speech, as a Realtime response."""

    id: str = field(default_factory=lambda: new_id("resp"))
    item_id: str = field(default_factory=lambda: new_id("item"))
    words: list[str] = field(default_factory=list)
    held_silence: list[bytes] = field(default_factory=list)  # sent if speech resumes

    @property
    def transcript(self) -> str:
        return " ".join(self.words)

    def where(self) -> Event:
        """The fields that place an event in this response's one audio part."""
        return {
            "response_id": self.id,
            "item_id": self.item_id,
            "output_index": 0,
            "content_index": 0,
        }

    def item(self, status: str) -> Event:
        content = {"type": "output_audio", "transcript": self.transcript}
        return {
            "id": self.item_id,
            "object": "realtime.item",
            "type": "message",
            "role": "assistant",
            "status": status,
            "content": [content],
        }


@dataclass
class UserTurn:
    """What the caller is saying, as a user item."""

    item_id: str = field(default_factory=lambda: new_id("item"))
    heard: str = ""  # the transcript sent in deltas so far


class RealtimeSession:
    """One Realtime session's protocol state. `on_client` for each client
    message, `on_converse` for each gateway event, `on_call_end` once; each
    returns the server events to send, in order, already stamped."""

    def __init__(self, model: str, offered_modes: list[str]) -> None:
        self.mode = mode_of_model(model, offered_modes)
        self.model = model
        self.config = SessionConfig()
        self.audio_flowed = False  # the gateway call is opened with the config of then
        self.response: AgentResponse | None = None
        self.user: UserTurn | None = None
        self.last_item_id: str | None = None
        self.muted = False  # the agent's stretch was cancelled: drop its audio
        self.silent_s = 0.0  # agent silence since its last speaking frame
        self.early_words: list[str] = []  # the agent's words that came before its audio
        self.appended_s = 0.0  # caller audio appended, for audio_start_ms/audio_end_ms
        self._event_numbers = itertools.count(1)
        self.id = new_id("sess")

    def stamp(self, events: list[Event]) -> list[Event]:
        for event in events:
            event["event_id"] = f"event_{self.id[5:13]}_{next(self._event_numbers)}"
        return events

    def opening(self) -> list[Event]:
        return self.stamp([self._session_event("session.created")])

    def _session_event(self, kind: str) -> Event:
        session = self.config.described(self.model) | {"id": self.id}
        return {"type": kind, "session": session}

    # Client events.

    def on_client(self, raw: str | bytes) -> Reply:
        event_id = ""
        try:
            event = self._parsed(raw)
            event_id = str(event.get("event_id") or "")
            reply = self._handle(event)
        except ClientError as exc:
            reply = Reply([error_event(exc.code, exc.message, event_id=event_id, param=exc.param)])
        self.stamp(reply.events)
        return reply

    @staticmethod
    def _parsed(raw: str | bytes) -> dict[str, Any]:
        if isinstance(raw, bytes):
            raise ClientError("invalid_json", "send events as JSON text messages")
        try:
            event = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ClientError("invalid_json", f"not JSON ({exc.msg})") from None
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            raise ClientError("invalid_json", "an event is a JSON object with a type", "type")
        return event

    def _handle(self, event: dict[str, Any]) -> Reply:
        kind = event["type"]
        if kind == "session.update":
            self.config = self.config.updated(event.get("session"), self.audio_flowed)
            return Reply([self._session_event("session.updated")])
        if kind == "input_audio_buffer.append":
            return Reply(audio=self._appended(event.get("audio")))
        if kind == "input_audio_buffer.clear":
            return Reply([{"type": "input_audio_buffer.cleared"}], clear_audio=True)
        if kind == "response.cancel":
            return Reply(self._cancelled("client_cancelled"))
        if kind in NOT_YET:
            raise ClientError("unsupported_event", f"{kind} is not served yet", "type")
        raise ClientError("invalid_value", f"unknown event type {kind!r}", "type")

    def _appended(self, audio: Any) -> bytes:
        if not isinstance(audio, str):
            raise ClientError("invalid_value", "audio must be base64 text", "audio")
        try:
            data = base64.b64decode(audio, validate=True)
        except (binascii.Error, ValueError):
            raise ClientError("invalid_value", "audio is not valid base64", "audio") from None
        coding = self.config.input
        if len(data) % coding.bytes_per_sample:
            raise ClientError("invalid_value", f"{coding.name} audio is whole samples", "audio")
        if coding.seconds(data) > MAX_APPEND_S:
            raise ClientError(
                "audio_too_long", f"one append carries at most {MAX_APPEND_S:g} s of audio", "audio"
            )
        self.audio_flowed = True
        self.appended_s += coding.seconds(data)
        return data

    # Gateway events.

    def on_converse(self, event: ConverseEvent) -> list[Event]:
        if event["type"] == "agent_audio":
            events = self._agent_audio(event)
        elif event["type"] == "agent_text":
            events = self._agent_text(event)
        elif event["type"] in ("user_partial", "user_final"):
            events = self._user_transcript(event)
        elif event["type"] == "barge_in":
            events = [*self._speech_started(), *self._cancelled("turn_detected", quiet=True)]
        else:
            events = []  # started, turns, notices, keys: nothing a Realtime client reads
        return self.stamp(events)

    def on_call_end(self, error: Event | None) -> list[Event]:
        """The gateway ended the call: the response under way ends (failed, if
        `error`, the error event to send, says how)."""
        events = self._closed("failed" if error else "completed") if self.response else []
        return self.stamp([*events, *([error] if error else [])])

    def _agent_audio(self, event: AgentAudioEvent) -> list[Event]:
        seconds = self.config.output.seconds(event["data"])
        if not event["speaking"]:
            self.silent_s += seconds
            if self.silent_s >= RESPONSE_GAP_S:
                self.muted = False
                return self._closed("completed") if self.response else []
            if self.response:
                self.response.held_silence.append(event["data"])
            return []
        self.silent_s = 0.0
        if self.muted:
            return []
        events = [] if self.response else self._opened()
        response = self.response
        assert response is not None
        chunks = [*response.held_silence, event["data"]]
        response.held_silence.clear()
        audio = base64.b64encode(b"".join(chunks)).decode()
        return [
            *events,
            {"type": "response.output_audio.delta", **response.where(), "delta": audio},
        ]

    def _agent_text(self, event: AgentTextEvent) -> list[Event]:
        text = event["text"]
        if self.muted or not text:
            return []  # words of a cancelled stretch
        if self.response is None:
            self.early_words.append(text)  # its audio is still to come
            return []
        return [self._said(self.response, text)]

    @staticmethod
    def _said(response: AgentResponse, text: str) -> Event:
        delta = text if not response.words else " " + text
        response.words.append(text)
        return {
            "type": "response.output_audio_transcript.delta",
            **response.where(),
            "delta": delta,
        }

    def _opened(self) -> list[Event]:
        response = self.response = AgentResponse()
        early = [self._said(response, " ".join(self.early_words))] if self.early_words else []
        self.early_words.clear()
        return [
            {"type": "response.created", "response": self._response_object("in_progress")},
            {
                "type": "response.output_item.added",
                "response_id": response.id,
                "output_index": 0,
                "item": response.item("in_progress"),
            },
            self._item_added(response.item("in_progress")),
            {
                "type": "response.content_part.added",
                **response.where(),
                "part": {"type": "audio", "transcript": ""},
            },
            *early,
        ]

    def _closed(self, status: str, reason: str = "") -> list[Event]:
        """The response under way ends: `status` completed, cancelled or failed."""
        response = self.response
        assert response is not None
        where = response.where()
        item = response.item("completed" if status == "completed" else "incomplete")
        events = [
            {"type": "response.output_audio.done", **where},
            {
                "type": "response.output_audio_transcript.done",
                **where,
                "transcript": response.transcript,
            },
            {
                "type": "response.content_part.done",
                **where,
                "part": item["content"][0] | {"type": "audio"},
            },
            {
                "type": "response.output_item.done",
                "response_id": response.id,
                "output_index": 0,
                "item": item,
            },
            {"type": "conversation.item.done", "item": item},
            {"type": "response.done", "response": self._response_object(status, reason, item)},
        ]
        self.response = None
        return events

    def _response_object(self, status: str, reason: str = "", item: Event | None = None) -> Event:
        response = self.response
        assert response is not None
        details = {"type": status, **({"reason": reason} if reason else {})}
        return {
            "id": response.id,
            "object": "realtime.response",
            "status": status,
            "status_details": None if status == "in_progress" else details,
            "output": [item] if item else [],
            "output_modalities": ["audio"],
            "audio": {
                "output": {"format": self.config.output.described(), "voice": self.config.voice}
            },
            "usage": None,
        }

    def _item_added(self, item: Event) -> Event:
        event = {
            "type": "conversation.item.added",
            "previous_item_id": self.last_item_id,
            "item": item,
        }
        self.last_item_id = item["id"]
        return event

    def _cancelled(self, reason: str, quiet: bool = False) -> list[Event]:
        """Ends the response under way as cancelled, and drops the rest of its
        stretch. None under way: an error, unless `quiet` (a barge-in)."""
        if self.response is None:
            if quiet:
                return []
            raise ClientError("response_cancel_not_active", "no response is under way")
        self.muted, self.silent_s = True, 0.0
        return self._closed("cancelled", reason)

    def _speech_started(self) -> list[Event]:
        if self.user is not None:
            return []
        self.user = UserTurn()
        started_ms = int(self.appended_s * 1000)
        return [
            {
                "type": "input_audio_buffer.speech_started",
                "audio_start_ms": started_ms,
                "item_id": self.user.item_id,
            }
        ]

    def _user_transcript(self, event: UserTranscriptEvent) -> list[Event]:
        events = self._speech_started()
        user = self.user
        assert user is not None
        if event["type"] == "user_partial":
            text = event["text"]
            if not text.startswith(user.heard) or text == user.heard:
                return events  # a revised partial: the final says it right
            delta, user.heard = text[len(user.heard) :], text
            return [*events, self._transcription("delta", user.item_id, delta=delta)]
        self.user = None
        return [*events, *self._user_said(user, event["text"])]

    def _user_said(self, user: UserTurn, text: str) -> list[Event]:
        item = {
            "id": user.item_id,
            "object": "realtime.item",
            "type": "message",
            "role": "user",
            "status": "completed",
            "content": [{"type": "input_audio", "transcript": text}],
        }
        return [
            {
                "type": "input_audio_buffer.speech_stopped",
                "audio_end_ms": int(self.appended_s * 1000),
                "item_id": user.item_id,
            },
            {
                "type": "input_audio_buffer.committed",
                "previous_item_id": self.last_item_id,
                "item_id": user.item_id,
            },
            self._item_added(item),
            self._transcription(
                "completed", user.item_id, transcript=text, usage={"type": "duration", "seconds": 0}
            ),
            {"type": "conversation.item.done", "item": item},
        ]

    @staticmethod
    def _transcription(kind: str, item_id: str, **fields: Any) -> Event:
        return {
            "type": f"conversation.item.input_audio_transcription.{kind}",
            "item_id": item_id,
            "content_index": 0,
            **fields,
        }


def lone_error(code: str, message: str, error_type: str = "invalid_request_error") -> Event:
    """An error sent outside a session (a refused model, a full web service)."""
    return error_event(code, message, error_type) | {"event_id": new_id("event")}
