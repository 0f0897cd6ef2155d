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
from dataclasses import dataclass, field
from typing import Any

from kame_common.audio import FRAME_SECONDS
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
from services.web.realtime_items import AgentResponse, History, UserMessage, new_id

# Seconds of agent silence that end a response (a shorter pause is within it).
RESPONSE_GAP_S = 0.5
# The most audio one input_audio_buffer.append may carry: as much as may wait
# to be sent (realtime_bridge.MAX_BACKLOG_S). A WebSocket message may be larger
# (server.py takes what OpenAI takes, 15 MiB), so a longer append is this
# protocol's error, not a closed socket.
MAX_APPEND_S = 60.0
# The conversation's items (services/web/realtime_items.py).
ITEM_EDITS = frozenset(
    ("conversation.item.retrieve", "conversation.item.delete", "conversation.item.truncate")
)
# Client events not served yet (push-to-talk, typed messages, tools; WebRTC's
# output buffer): an error names them, and the session goes on.
NOT_YET = frozenset(
    (
        "input_audio_buffer.commit",
        "conversation.item.create",
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
        self.history = History()
        self.response: AgentResponse | None = None
        self.user: UserTurn | None = None
        self.muted = False  # the agent's stretch was cancelled: drop its audio
        self.silent_s = 0.0  # agent silence since its last speaking frame
        # The agent's words that came before their audio, with their start_s.
        self.early_words: list[tuple[str, float]] = []
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
        if kind in ITEM_EDITS:
            return Reply(self._item_edit(kind, event))
        if kind in NOT_YET:
            raise ClientError("unsupported_event", f"{kind} is not served yet", "type")
        raise ClientError("invalid_value", f"unknown event type {kind!r}", "type")

    def _appended(self, audio: Any) -> bytes:
        if not isinstance(audio, str):
            raise ClientError("invalid_value", "audio must be base64 text", "audio")
        coding = self.config.input
        if len(audio) * 3 // 4 > MAX_APPEND_S * coding.bytes_per_s:  # before decoding it
            raise ClientError(
                "audio_too_long", f"one append carries at most {MAX_APPEND_S:g} s of audio", "audio"
            )
        try:
            data = base64.b64decode(audio, validate=True)
        except (binascii.Error, ValueError):
            raise ClientError("invalid_value", "audio is not valid base64", "audio") from None
        if len(data) % coding.bytes_per_sample:
            raise ClientError("invalid_value", f"{coding.name} audio is whole samples", "audio")
        self.audio_flowed = True
        self.appended_s += coding.seconds(data)
        return data

    def _item_edit(self, kind: str, event: dict[str, Any]) -> list[Event]:
        """conversation.item.retrieve, .delete or .truncate. Deleting or truncating
        the response under way ends it first (cancelled): the client is done
        playing it."""
        item_id = event.get("item_id")
        if kind == "conversation.item.retrieve":
            return [self.history.retrieve(item_id)]
        if kind == "conversation.item.delete":
            self.history.get(item_id)  # an unknown item: the error, and nothing ends
            return [*self._ended_if_under_way(item_id), self.history.delete(item_id)]
        content_index, audio_end_ms = event.get("content_index"), event.get("audio_end_ms")
        self.history.truncatable(item_id, content_index, audio_end_ms)
        ended = self._ended_if_under_way(item_id)
        return [*ended, self.history.truncate(item_id, content_index, audio_end_ms)]

    def _ended_if_under_way(self, item_id: Any) -> list[Event]:
        if self.response is not None and self.response.item_id == item_id:
            return self._cancelled("client_cancelled")
        return []

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
        events = [] if self.response else self._opened(event["seq"] * FRAME_SECONDS)
        response = self.response
        assert response is not None
        chunks = [*response.held_silence, event["data"]]
        response.held_silence.clear()
        audio = b"".join(chunks)
        response.audio_s += self.config.output.seconds(audio)
        return [
            *events,
            {
                "type": "response.output_audio.delta",
                **response.where(),
                "delta": base64.b64encode(audio).decode(),
            },
        ]

    def _agent_text(self, event: AgentTextEvent) -> list[Event]:
        text = event["text"]
        if self.muted or not text:
            return []  # words of a cancelled stretch
        if self.response is None:
            self.early_words.append((text, event["start_s"]))  # its audio is still to come
            return []
        return [self.response.said(text, event["start_s"])]

    def _opened(self, stream_start_s: float) -> list[Event]:
        response = self.response = AgentResponse(stream_start_s)
        early = [response.said(text, start_s) for text, start_s in self.early_words]
        self.early_words.clear()
        return [
            {"type": "response.created", "response": self._response_object("in_progress")},
            {
                "type": "response.output_item.added",
                "response_id": response.id,
                "output_index": 0,
                "item": response.item(),
            },
            self.history.add(response),
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
        response.status = "completed" if status == "completed" else "incomplete"
        response.held_silence.clear()  # silence after the last speech is not sent
        where = response.where()
        item = response.item()
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
        message = UserMessage(user.item_id, [{"type": "input_audio", "transcript": text}])
        return [
            {
                "type": "input_audio_buffer.speech_stopped",
                "audio_end_ms": int(self.appended_s * 1000),
                "item_id": user.item_id,
            },
            {
                "type": "input_audio_buffer.committed",
                "previous_item_id": self.history.last_id,
                "item_id": user.item_id,
            },
            self.history.add(message),
            self._transcription(
                "completed", user.item_id, transcript=text, usage={"type": "duration", "seconds": 0}
            ),
            {"type": "conversation.item.done", "item": message.item()},
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
