"""The OpenAI Realtime protocol (GA event shapes) spoken over one Gateway.Converse
call, without a network: `RealtimeSession` turns the client's events into what
to do (audio and requests for the gateway, events to answer) and the gateway's
events (kame_client/events.py) into Realtime server events.
realtime_config.py holds what session.update may choose, realtime_items.py
the conversation's items, realtime_responses.py the events that open and close
a response, realtime_caller.py those of the caller's turn and the
backchannels; realtime_adapter.py makes it an adapter of the web service's
bridge (services/web/bridge.py), which carries it over the WebSocket and the
call.

How a full-duplex agent reads in this protocol:
- with turn detection on (server_vad, the default) the stack's own decides:
  the gateway hears the caller, ends its turns, and the agent speaks when it
  has something to say. With `turn_detection: null` (push-to-talk) the client
  ends the turn (input_audio_buffer.commit: the gateway's end_turn) and asks
  for the answer (response.create: respond);
- each stretch of agent speech is a response the server starts: the agent's
  first speaking frame opens it (response.created ... content_part.added),
  its frames are output_audio deltas, its words output_audio_transcript
  deltas, and `RESPONSE_GAP_S` of silence closes it (completed). Silence
  inside a stretch is sent with the next speech, so a pause between two
  sentences keeps its length; silence between stretches is not sent. The
  agent paused while the caller speaks over it (`held` frames, until the
  stack tells a backchannel from a barge-in) is no gap: the response stays
  open;
- the caller's words are an item of their own: the first partial transcript
  is input_audio_buffer.speech_started (not with push-to-talk: no voice
  activity detection), partials are transcription deltas, the final stops,
  commits and completes it (a committed turn whose final never comes, stt
  having heard nothing, completes empty at the next commit or when the agent
  answers); a typed message (conversation.item.create) is an item at once,
  sent as the gateway's send_text;
- a backchannel ("uh-huh", "okay") heard while a response is under way or
  the agent is held is no turn (realtime_caller.py): no speech_started, no
  transcription events, and the response goes on; its final is a user item;
- a barge-in (the caller talking over the agent) is speech_started, and the
  response under way ends `cancelled`; `response.cancel` ends it the same way
  and stops the agent at the gateway (cancel_response). The agent's audio is
  dropped until its stretch ends or the caller's next turn does (a commit, a
  final transcript, a typed message, a function's output, response.create);
- the agent calling one of the client's functions (session.update `tools`) is
  a function_call item: an output of the response under way, or of a response
  of its own that ends with it. The client's function_call_output goes to the
  gateway (send_function_result); the agent goes on by itself with it, so the
  client's response.create after an output asks the gateway for nothing: the
  agent's next stretch is that response.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import json
from dataclasses import dataclass, field
from typing import Any

from kame_client import events as gateway
from kame_client.client import (
    CallerRequest,
    CancelResponse,
    EndTurn,
    Respond,
    SendFunctionResult,
    SendText,
)
from kame_client.events import (
    AgentAudio,
    AgentText,
    BargeIn,
    ConverseEvent,
    Notice,
    UserPartial,
    UserTranscript,
)
from kame_common.audio import FRAME_SECONDS
from services.web.protocols.realtime_caller import DEFAULT_BACKCHANNELS, Nods, UserTurn
from services.web.protocols.realtime_config import (
    AudioCoding,
    ClientError,
    Event,
    SessionConfig,
    error_event,
    mode_of_model,
)
from services.web.protocols.realtime_items import (
    AgentResponse,
    FunctionCall,
    History,
    function_output,
    is_typed_echo,
    new_id,
    typed_message,
)
from services.web.protocols.realtime_responses import call_response, closed, opened

# Seconds of agent silence that end a response (a shorter pause is within it).
RESPONSE_GAP_S = 0.5
# The most audio one input_audio_buffer.append may carry: as much as may wait
# to be sent (pacer.MAX_BACKLOG_S). A WebSocket message may be larger
# (server.py takes what OpenAI takes, 15 MiB), so a longer append is this
# protocol's error, not a closed socket.
MAX_APPEND_S = 60.0
# A commit needs this much audio appended since the last turn ended (OpenAI's rule too).
MIN_COMMIT_S = 0.1
# The conversation's items (services/web/realtime_items.py).
ITEM_EDITS = frozenset(
    ("conversation.item.retrieve", "conversation.item.delete", "conversation.item.truncate")
)
# Client events not served (WebRTC's output buffer): an error names them, and
# the session goes on.
NOT_SERVED = frozenset(("output_audio_buffer.clear",))
# The agent's function calls a session keeps waiting for their output; the
# oldest beyond are forgotten (the oracle waits for none that long).
MAX_WAITING_CALLS = 64


END_TURN, RESPOND, CANCEL = EndTurn(), Respond(), CancelResponse()


@dataclass
class Reply:
    """What one client event asks for: events to send back, audio and requests
    for the gateway."""

    events: list[Event] = field(default_factory=list)
    audio: bytes = b""
    clear_audio: bool = False  # input_audio_buffer.clear: drop what is not sent yet
    requests: list[CallerRequest] = field(default_factory=list)

    @property
    def needs_call(self) -> bool:
        """The gateway call must be open for this (a cancel needs one already:
        urgent, it goes before the audio appended before it)."""
        return bool(self.audio) or any(not r.URGENT for r in self.requests)


class RealtimeSession:
    """One Realtime session's protocol state. `on_client` for each client
    message, `on_converse` for each gateway event, `on_call_end` once; each
    returns the server events to send, in order, already stamped."""

    def __init__(
        self,
        model: str,
        offered_modes: list[str],
        relay_instructions: bool = False,
        backchannels: tuple[tuple[str, ...], ...] = DEFAULT_BACKCHANNELS,
    ) -> None:
        self.mode = mode_of_model(model, offered_modes)
        self.model = model
        self.config = SessionConfig(relay_instructions=relay_instructions)
        self.nods = Nods(backchannels)  # the caller's backchannels over the agent
        self.call_opened = False  # the gateway call is opened with the config of then
        self.history = History()
        self.response: AgentResponse | None = None
        self.user: UserTurn | None = None
        self.held = False  # the agent's last frame was `held`: paused for the caller
        # The agent's stretch was cancelled: drop its audio until its silence or
        # the caller's next turn (_caller_turn).
        self.muted = False
        self.silent_s = 0.0  # agent silence since its last speaking frame
        # The agent's words that came before their audio, with their start_s.
        self.early_words: list[tuple[str, float]] = []
        self.appended_s = 0.0  # caller audio appended, for audio_start_ms/audio_end_ms
        self.uncommitted_s = 0.0  # ... since the caller's turn last ended
        self.waiting_calls: dict[str, None] = {}  # call_ids of the agent's, oldest first
        # A function's output came since the last response.create and caller turn.
        self.output_given = False
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
            event = parsed_event(raw)
            event_id = str(event.get("event_id") or "")
            reply = self._handle(event)
        except ClientError as exc:
            reply = Reply([error_event(exc.code, exc.message, event_id=event_id, param=exc.param)])
        self.stamp(reply.events)
        return reply

    def _handle(self, event: dict[str, Any]) -> Reply:
        kind = event["type"]
        if kind == "session.update":
            self.config = self.config.updated(event.get("session"), self.call_opened)
            return Reply([self._session_event("session.updated")])
        if kind == "input_audio_buffer.append":
            return self._opening_call(Reply(audio=self._appended(event.get("audio"))))
        if kind == "input_audio_buffer.clear":
            self.uncommitted_s = 0.0
            return Reply([{"type": "input_audio_buffer.cleared"}], clear_audio=True)
        if kind == "input_audio_buffer.commit":
            return self._opening_call(self._committed())
        if kind == "response.create":
            return self._opening_call(self._response_asked())
        if kind == "response.cancel":
            return Reply(self._cancelled("client_cancelled"), requests=[CANCEL])
        if kind == "conversation.item.create":
            return self._opening_call(self._created(event.get("item")))
        if kind in ITEM_EDITS:
            return self._item_edit(kind, event)
        if kind in NOT_SERVED:
            raise ClientError("unsupported_event", f"{kind} is not served here", "type")
        raise ClientError("invalid_value", f"unknown event type {kind!r}", "type")

    def _opening_call(self, reply: Reply) -> Reply:
        """`reply` needs the gateway call: from now on its config is fixed."""
        self.call_opened = True
        return reply

    def _appended(self, audio: Any) -> bytes:
        coding = self.config.input
        data = decoded_audio(audio, coding)
        self.appended_s += coding.seconds(data)
        self.uncommitted_s += coding.seconds(data)
        return data

    def _committed(self) -> Reply:
        """input_audio_buffer.commit: the caller's turn ends now (the gateway's
        end_turn). The item's transcript follows when stt has it."""
        if self.uncommitted_s < MIN_COMMIT_S:
            raise ClientError(
                "input_audio_buffer_commit_empty",
                f"nothing to commit: at least {MIN_COMMIT_S * 1000:g} ms of audio must be "
                "appended since the last turn ended",
            )
        self.uncommitted_s = 0.0
        self.output_given = False  # a response.create from now on is for this turn
        self._caller_turn()
        unheard = self._unheard_turn_closed(heard_or_not=True)
        user = self.user = self.user or UserTurn()
        user.committed = True
        return Reply([*unheard, user.commit(self.history)], requests=[END_TURN])

    def _caller_turn(self) -> None:
        """The caller's turn ended, or the client asked for the answer: what the
        agent says from now on answers it, so the mute of a cancelled stretch
        ends here too, not only after that stretch's silence (an answer that
        starts sooner would lose its first words)."""
        self.muted = False

    def _unheard_turn_closed(self, heard_or_not: bool) -> list[Event]:
        """A committed caller turn whose final transcript has not come: stt may
        never send one (the gateway's end_turn of silence is a no-op). At the
        next commit (`heard_or_not`), or when the agent answers and nothing of
        it was heard, its item ends with what was heard (as OpenAI's item of a
        commit whose transcription completes empty), so the next turn is an item
        of its own, with its speech_started."""
        user = self.user
        if user is None or not user.committed or (user.heard and not heard_or_not):
            return []
        self.user = None
        return self._user_said(user, user.heard)

    def _response_asked(self) -> Reply:
        """response.create: the agent answers the caller's last turn now (the
        gateway's respond); its speech comes as the server's response. After a
        function's output the agent goes on by itself: nothing to ask."""
        self._caller_turn()
        if self.output_given:
            self.output_given = False
            return Reply()
        if self.response is not None:
            raise ClientError(
                "conversation_already_has_active_response",
                f"response {self.response.id} is under way: cancel it first",
            )
        return Reply(requests=[RESPOND])

    def _created(self, item: Any) -> Reply:
        if isinstance(item, dict) and item.get("type") == "function_call_output":
            return self._function_output(item)
        return self._typed(item)

    def _function_output(self, item: dict[str, Any]) -> Reply:
        """A function_call_output: the agent's call answered (the gateway's
        send_function_result), an item of the conversation."""
        output = function_output(item, self.history, set(self.waiting_calls))
        del self.waiting_calls[output.call_id]
        self.output_given = True
        self._caller_turn()  # the agent goes on with it
        events = [
            self.history.add(output),
            {"type": "conversation.item.done", "item": output.item()},
        ]
        result = SendFunctionResult(output.call_id, output.output)
        return Reply(events, requests=[result])

    def _typed(self, item: Any) -> Reply:
        """conversation.item.create of a user text message: a caller turn of its
        own (the gateway's send_text), answered like a spoken one."""
        message = typed_message(item, self.history)
        self.output_given = False  # a response.create from now on is for this turn
        self._caller_turn()
        text = message.content[0]["text"]
        events = [
            self.history.add(message),
            {"type": "conversation.item.done", "item": message.item()},
        ]
        return Reply(events, requests=[SendText(text)])

    def _item_edit(self, kind: str, event: dict[str, Any]) -> Reply:
        """conversation.item.retrieve, .delete or .truncate. Deleting or truncating
        the response under way ends it first (cancelled, and the agent stops):
        the client is done playing it."""
        item_id = event.get("item_id")
        if kind == "conversation.item.retrieve":
            return Reply([self.history.retrieve(item_id)])
        if kind == "conversation.item.delete":
            self.history.get(item_id)  # an unknown item: the error, and nothing ends
            ended = self._ended_if_under_way(item_id)
            ended.events.append(self.history.delete(item_id))
            return ended
        content_index, audio_end_ms = event.get("content_index"), event.get("audio_end_ms")
        self.history.truncatable(item_id, content_index, audio_end_ms)
        ended = self._ended_if_under_way(item_id)
        ended.events.append(self.history.truncate(item_id, content_index, audio_end_ms))
        return ended

    def _ended_if_under_way(self, item_id: Any) -> Reply:
        if self.response is not None and self.response.item_id == item_id:
            return Reply(self._cancelled("client_cancelled"), requests=[CANCEL])
        return Reply()

    # Gateway events.

    def on_converse(self, event: ConverseEvent) -> list[Event]:
        match event:
            case AgentAudio():
                events = self._agent_audio(event)
            case AgentText():
                events = self._agent_text(event)
            case UserTranscript():
                events = self._user_transcript(event)
            case BargeIn(cancelled=True):
                # A request cut the agent, not speech: a typed message (the response
                # under way ends), or a response.cancel (it ended already).
                events = self._cancelled("client_cancelled", quiet=True)
            case BargeIn():
                self.held = False
                events = [
                    *self._speech_started(),
                    *self.nods.was_a_turn(self.user),
                    *self._cancelled("turn_detected", quiet=True),
                ]
            case gateway.FunctionCall():
                events = self._function_call(event)
            case Notice(kind="REFUSED", message=message):
                events = [error_event("request_refused", message)]
            case _:
                # started, turns, other notices, keys, what the oracle's own tools did:
                # nothing a Realtime client reads (no event of the protocol says it).
                events = []
        return self.stamp(events)

    def on_call_end(self, error: Event | None) -> list[Event]:
        """The gateway ended the call: the response under way ends (failed, if
        `error`, the error event to send, says how)."""
        events = self._closed("failed" if error else "completed") if self.response else []
        return self.stamp([*events, *([error] if error else [])])

    def _agent_audio(self, event: AgentAudio) -> list[Event]:
        seconds = self.config.output.seconds(event.data)
        self.held = event.held
        if event.held:
            return self._held(event.data)
        if not event.speaking:
            self.silent_s += seconds
            if self.silent_s >= RESPONSE_GAP_S:
                self.muted = False
                return self._closed("completed") if self.response else []
            if self.response:
                self.response.held_silence.append(event.data)
            return []
        self.silent_s = 0.0
        if self.muted:
            return []
        events = [] if self.response else self._opened(event.seq * FRAME_SECONDS)
        response = self.response
        assert response is not None
        chunks = [*response.held_silence, event.data]
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

    def _held(self, silence: bytes) -> list[Event]:
        """The agent paused while the caller speaks over it: no gap, so a barge-in
        ends the response cancelled and a backchannel lets it go on (the pause
        sent with its next speech). No speech_started: clients stop their own
        playback on it, which would cut the agent at every "uh-huh" (nor
        when the caller's words come, if they are a backchannel: Nods.nodded)."""
        self.silent_s = 0.0
        if self.response is not None and not self.muted:
            self.response.held_silence.append(silence)
        return []

    def _agent_text(self, event: AgentText) -> list[Event]:
        text = event.text
        if self.muted or not text:
            return []  # words of a cancelled stretch
        if self.response is None:
            self.early_words.append((text, event.start_s))  # its audio is still to come
            return []
        return [self.response.said(text, event.start_s)]

    def _opened(self, stream_start_s: float) -> list[Event]:
        unheard = self._unheard_turn_closed(heard_or_not=False)
        response = self.response = AgentResponse(stream_start_s)
        early = [response.said(text, start_s) for text, start_s in self.early_words]
        self.early_words.clear()
        return [*unheard, *opened(self.config, response, self.history), *early]

    def _closed(self, status: str, reason: str = "") -> list[Event]:
        """The response under way ends: `status` completed, cancelled or failed."""
        assert self.response is not None
        events = closed(self.config, self.response, status, reason)
        self.response = None
        return events

    def _function_call(self, event: gateway.FunctionCall) -> list[Event]:
        """The agent calls a function of the client's: an output of the response
        under way (after its audio), or of a response of its own that ends with it."""
        call = FunctionCall(event.call_id, event.name, event.arguments_json or "{}")
        self.waiting_calls[call.call_id] = None
        if len(self.waiting_calls) > MAX_WAITING_CALLS:
            del self.waiting_calls[next(iter(self.waiting_calls))]
        if self.response is not None:
            self.response.calls.append(call)
            return call.made(self.response.id, len(self.response.calls), self.history)
        return call_response(self.config, call, self.history)

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
        """The caller started speaking. No event with push-to-talk: there is no
        voice activity detection to report it (as with OpenAI's)."""
        if self.user is not None:
            return []
        self.user = UserTurn()
        if self.config.manual_turns:
            return []
        return [self.user.speech_started(int(self.appended_s * 1000))]

    def _user_transcript(self, event: UserTranscript) -> list[Event]:
        if is_typed_echo(event.utterance_id):
            return []  # a typed message, echoed: its item is there
        if self.nods.is_nod(event, may_begin=self._may_nod()):
            return self.nods.nodded(event, self.history)
        self.nods.pending = None  # words beyond a backchannel: the caller's turn, told as any
        events = self._speech_started()
        user = self.user
        assert user is not None
        if isinstance(event, UserPartial):
            return [*events, *user.partial(event.text)]
        self.user = None
        self.uncommitted_s = 0.0  # the turn ended: a commit needs new audio
        self._caller_turn()
        return [*events, *self._user_said(user, event.text)]

    def _may_nod(self) -> bool:
        """Caller words now may begin a backchannel: said while the agent speaks
        (a response under way, or the agent held for them) and outside a turn
        of the caller's. Not with push-to-talk: the client's commit ends every
        turn there, and the frontend stops the agent at any caller speech."""
        over_the_agent = self.response is not None or self.held
        return over_the_agent and self.user is None and not self.config.manual_turns

    def _user_said(self, user: UserTurn, text: str) -> list[Event]:
        """The caller's final transcript (UserTurn.said): speech_stopped only
        with voice activity detection."""
        audio_end_ms = None if self.config.manual_turns else int(self.appended_s * 1000)
        return user.said(text, self.history, audio_end_ms)


def lone_error(code: str, message: str, error_type: str = "invalid_request_error") -> Event:
    """An error sent outside a session (a refused model, a full web service)."""
    return error_event(code, message, error_type) | {"event_id": new_id("event")}


def decoded_audio(audio: Any, coding: AudioCoding) -> bytes:
    """An append's base64 `audio` in `coding`, decoded; ClientError for what is not
    base64, not whole samples, or more than MAX_APPEND_S (told before decoding)."""
    if not isinstance(audio, str):
        raise ClientError("invalid_value", "audio must be base64 text", "audio")
    if len(audio) * 3 // 4 > MAX_APPEND_S * coding.bytes_per_s:
        raise ClientError(
            "audio_too_long", f"one append carries at most {MAX_APPEND_S:g} s of audio", "audio"
        )
    try:
        data = base64.b64decode(audio, validate=True)
    except (binascii.Error, ValueError):
        raise ClientError("invalid_value", "audio is not valid base64", "audio") from None
    if len(data) % coding.bytes_per_sample:
        raise ClientError("invalid_value", f"{coding.name} audio is whole samples", "audio")
    return data


def parsed_event(raw: str | bytes) -> dict[str, Any]:
    """A client's JSON event (an object with a `type`); ClientError otherwise."""
    if isinstance(raw, bytes):
        raise ClientError("invalid_json", "send events as JSON text messages")
    try:
        event = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ClientError("invalid_json", f"not JSON ({exc.msg})") from None
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        raise ClientError("invalid_json", "an event is a JSON object with a type", "type")
    return event
