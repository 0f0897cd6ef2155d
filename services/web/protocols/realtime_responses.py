"""The server events of a Realtime response's lifecycle (services/web/
realtime.py decides when): the events that open a response of agent speech,
those that close it (completed, cancelled or failed), the response object
they carry, and the response of its own that a function call outside any
speech makes. The response and its item are in realtime_items.py.
"""

from __future__ import annotations

from services.web.protocols.realtime_config import Event, SessionConfig
from services.web.protocols.realtime_items import AgentResponse, FunctionCall, History, new_id


def response_object(
    config: SessionConfig,
    response_id: str,
    status: str,
    reason: str = "",
    output: list[Event] | None = None,
) -> Event:
    """The `response` of response.created and response.done."""
    details = {"type": status, **({"reason": reason} if reason else {})}
    return {
        "id": response_id,
        "object": "realtime.response",
        "status": status,
        "status_details": None if status == "in_progress" else details,
        "output": output or [],
        "output_modalities": ["audio"],
        "audio": {"output": {"format": config.output.described(), "voice": config.voice}},
        "usage": None,
    }


def opened(config: SessionConfig, response: AgentResponse, history: History) -> list[Event]:
    """`response` starts: created, its assistant item added (to `history` too)
    and its one audio part."""
    return [
        {
            "type": "response.created",
            "response": response_object(config, response.id, "in_progress"),
        },
        {
            "type": "response.output_item.added",
            "response_id": response.id,
            "output_index": 0,
            "item": response.item(),
        },
        history.add(response),
        {
            "type": "response.content_part.added",
            **response.where(),
            "part": {"type": "audio", "transcript": ""},
        },
    ]


def closed(config: SessionConfig, response: AgentResponse, status: str, reason: str) -> list[Event]:
    """`response` ends, `status` completed, cancelled or failed: its part, its
    item and itself are done."""
    response.status = "completed" if status == "completed" else "incomplete"
    response.held_silence.clear()  # silence after the last speech is not sent
    where = response.where()
    item = response.item()
    outputs = [item, *(call.item() for call in response.calls)]
    return [
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
        {
            "type": "response.done",
            "response": response_object(config, response.id, status, reason, outputs),
        },
    ]


def call_response(config: SessionConfig, call: FunctionCall, history: History) -> list[Event]:
    """A function call with no response under way: a response of its own, the
    call its one output, that ends with it."""
    response_id = new_id("resp")
    made = call.made(response_id, 0, history)
    return [
        {
            "type": "response.created",
            "response": response_object(config, response_id, "in_progress"),
        },
        *made,
        {
            "type": "response.done",
            "response": response_object(config, response_id, "completed", output=[call.item()]),
        },
    ]
