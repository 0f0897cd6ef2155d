"""The conversation of a Realtime session as its client sees it (services/web/
realtime.py): the caller's messages, the agent's responses, its calls of the
client's functions and the client's outputs for them as items, and a bounded
list of them that conversation.item.retrieve, .delete and .truncate act on.

The list is the endpoint's record of what was said, not the agent's memory:
the agent (the oracle's conversation, the frontend's) keeps its own, and the
gateway protocol has no call that edits it. So deleting or truncating an item
changes what the client reads back, not what the agent remembers. A
truncation does mark the words the caller did not hear: they leave the item's
transcript and the audio it counts ends where the client says playback
stopped.
"""

from __future__ import annotations

import json
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from services.web.protocols.realtime_config import ClientError, Event, sendable

# Items a session keeps for retrieve/delete/truncate; older ones are forgotten
# (a long call would otherwise grow without end: one item a turn each way),
# also once what they hold passes MAX_KEPT_BYTES (200 typed messages of
# MAX_TEXT_BYTES each would be 13 MB a socket).
MAX_ITEMS = 200
MAX_KEPT_BYTES = 1 << 20
# The longest id a client may give an item it creates (OpenAI's limit too): it is
# kept, and sent back with every event about the item.
MAX_ID_CHARS = 32


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


@dataclass
class AgentResponse:
    """One stretch of agent speech, as a Realtime response and its assistant item.

    `stream_start_s` is where its first audio sits in the agent's output stream
    (the frame's seq), the clock the agent's words are timed on: a word's
    start in this response's audio is its `start_s` less that."""

    stream_start_s: float = 0.0
    id: str = field(default_factory=lambda: new_id("resp"))
    item_id: str = field(default_factory=lambda: new_id("item"))
    status: str = "in_progress"  # the item's: completed or incomplete once it ends
    words: list[str] = field(default_factory=list)
    word_starts: list[float] = field(default_factory=list)  # seconds into this audio
    audio_s: float = 0.0  # audio sent to the client (or kept, after a truncation)
    held_silence: list[bytes] = field(default_factory=list)  # sent if speech resumes
    calls: list[FunctionCall] = field(default_factory=list)  # outputs after the audio

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

    def item(self) -> Event:
        content = {"type": "output_audio", "transcript": self.transcript}
        return {
            "id": self.item_id,
            "object": "realtime.item",
            "type": "message",
            "role": "assistant",
            "status": self.status,
            "content": [content],
        }

    def said(self, text: str, start_s: float) -> Event:
        """The agent said `text` from `start_s` in its output stream: a transcript delta."""
        delta = text if not self.words else " " + text
        self.words.append(text)
        self.word_starts.append(max(0.0, start_s - self.stream_start_s))
        return {"type": "response.output_audio_transcript.delta", **self.where(), "delta": delta}

    def truncated(self, audio_end_s: float) -> None:
        """The client played this much of the audio: the words after it go."""
        kept = sum(1 for start in self.word_starts if start < audio_end_s)
        del self.words[kept:], self.word_starts[kept:]
        self.audio_s = audio_end_s


@dataclass
class UserMessage:
    """What the caller said (`input_audio`, with its transcript) or typed (`input_text`)."""

    item_id: str = field(default_factory=lambda: new_id("item"))
    content: list[Event] = field(default_factory=list)

    def item(self) -> Event:
        return {
            "id": self.item_id,
            "object": "realtime.item",
            "type": "message",
            "role": "user",
            "status": "completed",
            "content": self.content,
        }


@dataclass
class FunctionCall:
    """The agent calls one of the client's functions (the gateway's function_call)."""

    call_id: str
    name: str
    arguments: str  # JSON text
    item_id: str = field(default_factory=lambda: new_id("item"))
    status: str = "in_progress"  # completed once its arguments are sent

    def item(self) -> Event:
        return {
            "id": self.item_id,
            "object": "realtime.item",
            "type": "function_call",
            "status": self.status,
            "call_id": self.call_id,
            "name": self.name,
            "arguments": self.arguments if self.status == "completed" else "",
        }

    def made(self, response_id: str, output_index: int, history: History) -> list[Event]:
        """The call joins the conversation as output `output_index` of response
        `response_id`, as OpenAI streams one: added without its arguments, the
        arguments (here in one delta), done."""
        where = {"response_id": response_id, "output_index": output_index}
        about = {**where, "item_id": self.item_id, "call_id": self.call_id}
        added = [{"type": "response.output_item.added", **where, "item": self.item()}]
        added.append(history.add(self))
        self.status = "completed"
        return [
            *added,
            {"type": "response.function_call_arguments.delta", **about, "delta": self.arguments},
            {
                "type": "response.function_call_arguments.done",
                **about,
                "name": self.name,
                "arguments": self.arguments,
            },
            {"type": "response.output_item.done", **where, "item": self.item()},
            {"type": "conversation.item.done", "item": self.item()},
        ]


@dataclass
class FunctionOutput:
    """The client's output for a FunctionCall (conversation.item.create)."""

    call_id: str
    output: str
    item_id: str = field(default_factory=lambda: new_id("item"))

    def item(self) -> Event:
        return {
            "id": self.item_id,
            "object": "realtime.item",
            "type": "function_call_output",
            "status": "completed",
            "call_id": self.call_id,
            "output": self.output,
        }


Item = AgentResponse | UserMessage | FunctionCall | FunctionOutput


class History:
    """The session's last MAX_ITEMS items, oldest first."""

    def __init__(self, limit: int = MAX_ITEMS, max_bytes: int = MAX_KEPT_BYTES) -> None:
        self.limit = limit
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, Item] = OrderedDict()
        self._sizes: dict[str, int] = {}  # each item's bytes, as its JSON, when added
        self.kept_bytes = 0

    @property
    def last_id(self) -> str | None:
        """The newest item's id: an added item's previous_item_id."""
        return next(reversed(self._items), None)

    def add(self, item: Item) -> Event:
        """`item` joins the conversation: its conversation.item.added."""
        previous = self.last_id
        described = item.item()
        self._items[item.item_id] = item
        self._sizes[item.item_id] = len(json.dumps(described))
        self.kept_bytes += self._sizes[item.item_id]
        while len(self._items) > 1 and (
            len(self._items) > self.limit or self.kept_bytes > self.max_bytes
        ):
            self._forget(next(iter(self._items)))
        return {
            "type": "conversation.item.added",
            "previous_item_id": previous,
            "item": described,
        }

    def _forget(self, item_id: str) -> None:
        del self._items[item_id]
        self.kept_bytes -= self._sizes.pop(item_id)

    def __contains__(self, item_id: str) -> bool:
        return item_id in self._items

    def get(self, item_id: Any) -> Item:
        if not isinstance(item_id, str) or not item_id:
            raise ClientError("invalid_value", "item_id must be an item's id", "item_id")
        item = self._items.get(item_id)
        if item is None:
            raise ClientError(
                "item_not_found", f"no item {item_id!r} in this conversation", "item_id"
            )
        return item

    def retrieve(self, item_id: Any) -> Event:
        return {"type": "conversation.item.retrieved", "item": self.get(item_id).item()}

    def delete(self, item_id: Any) -> Event:
        self._forget(self.get(item_id).item_id)
        return {"type": "conversation.item.deleted", "item_id": item_id}

    def truncatable(self, item_id: Any, content_index: Any, audio_end_ms: Any) -> AgentResponse:
        """The agent's item a conversation.item.truncate may cut there; ClientError if none."""
        item = self.get(item_id)
        if not isinstance(item, AgentResponse):
            raise ClientError(
                "unsupported_content_type",
                "only the agent's audio messages can be truncated",
                "item_id",
            )
        if content_index != 0 or isinstance(content_index, bool):
            raise ClientError(
                "invalid_value", "content_index: an audio item has part 0 only", "content_index"
            )
        if not isinstance(audio_end_ms, int) or isinstance(audio_end_ms, bool) or audio_end_ms < 0:
            raise ClientError(
                "invalid_value", "audio_end_ms: a whole number of ms, 0 or more", "audio_end_ms"
            )
        audio_ms = round(item.audio_s * 1000)
        if audio_end_ms > audio_ms:
            raise ClientError(
                "invalid_value",
                f"audio content of {audio_ms} ms is already shorter than {audio_end_ms} ms",
                "audio_end_ms",
            )
        return item

    def truncate(self, item_id: Any, content_index: Any, audio_end_ms: Any) -> Event:
        """The agent's audio in `item_id` cut at `audio_end_ms` (what the client
        played), its transcript with it: conversation.item.truncated."""
        item = self.truncatable(item_id, content_index, audio_end_ms)
        item.truncated(audio_end_ms / 1000)
        return {
            "type": "conversation.item.truncated",
            "item_id": item.item_id,
            "content_index": 0,
            "audio_end_ms": audio_end_ms,
        }


def typed_message(item: Any, history: History) -> UserMessage:
    """The user text message a conversation.item.create carries; ClientError for
    any other item but a function's output (function_output): the agent's
    messages and calls are its own, the gateway has no call that adds them."""
    if not isinstance(item, dict):
        raise ClientError("invalid_value", "item must be an object", "item")
    if item.get("type", "message") != "message" or item.get("role") != "user":
        raise ClientError(
            "unsupported_value",
            "only the caller's messages (type message, role user) and function outputs "
            "(type function_call_output) can be added",
            "item.role" if item.get("type", "message") == "message" else "item.type",
        )
    content = item.get("content")
    parts = content if isinstance(content, list) and content else [None]
    texts = [part.get("text") if isinstance(part, dict) else None for part in parts]
    kinds = {part.get("type") if isinstance(part, dict) else None for part in parts}
    if kinds != {"input_text"} or not all(isinstance(text, str) for text in texts):
        raise ClientError(
            "unsupported_value",
            "a message's content: input_text parts with their text",
            "item.content",
        )
    text = sendable(" ".join(str(text).strip() for text in texts).strip(), "item.content")
    if not text:
        raise ClientError("invalid_value", "the message has no text", "item.content")
    return UserMessage(new_item_id(item, history), [{"type": "input_text", "text": text}])


def function_output(item: dict[str, Any], history: History, waiting: set[str]) -> FunctionOutput:
    """The function_call_output a conversation.item.create carries, for one of
    the agent's calls still `waiting` for its output; ClientError otherwise."""
    call_id, output = item.get("call_id"), item.get("output")
    if not isinstance(call_id, str) or call_id not in waiting:
        raise ClientError(
            "invalid_value",
            f"call_id: no function call {call_id!r} of the agent waits for its output",
            "item.call_id",
        )
    if not isinstance(output, str):
        raise ClientError("invalid_type", "output must be a string", "item.output")
    return FunctionOutput(call_id, sendable(output, "item.output"), new_item_id(item, history))


def new_item_id(item: dict[str, Any], history: History) -> str:
    """The id the client gave an item it creates (a new one), else one of ours."""
    item_id = item.get("id") or new_id("item")
    if not isinstance(item_id, str) or item_id in history:
        raise ClientError("invalid_value", "item.id: a new item's id", "item.id")
    if len(item_id) > MAX_ID_CHARS:
        raise ClientError(
            "string_above_max_length",
            f"item.id: at most {MAX_ID_CHARS} characters, got {len(item_id)}",
            "item.id",
        )
    return item_id


def is_typed_echo(utterance_id: str) -> bool:
    """A final transcript that is the gateway's echo of a typed message (its
    utterance_id is "<session_id>-text-<n>": gateway.proto, UserText)."""
    _, marker, number = utterance_id.rpartition("-text-")
    return bool(marker) and number.isdigit()
