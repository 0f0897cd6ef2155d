"""The GPT-Live protocol (services/web/protocols/live.py) without a network:
client events and gateway events in, what to do out. Every server event it
makes is checked against the `openai` SDK's own types (openai.types.live), the
protocol's truth."""

from __future__ import annotations

import base64
import json

import grpc
import pydantic
import pytest
from openai.types import live as sdk

from kame_client.client import HalfClose, SendContext, SendFunctionResult
from kame_client.events import (
    AgentAudio,
    AgentText,
    Delegated,
    FunctionCall,
    Notice,
    Started,
    UserFinal,
    UserPartial,
)
from kame_client.status import CallEnd
from kamepb import common_pb2, gateway_pb2
from services.web.protocols.live import LiveSession, Reply
from services.web.protocols.live_adapter import LiveAdapter

Context = common_pb2.AgentContext
Config = gateway_pb2.ConverseConfig
SERVER_EVENT = pydantic.TypeAdapter(sdk.ServerEvent)
MODES = ["tandem", "cascade", "s2s"]
FRAME = b"\x01\x00" * 1920  # one 80 ms frame of 24 kHz PCM16


def server_events(events: list[dict]) -> list[dict]:
    """`events`, each valid as the SDK's server event of its type."""
    for event in events:
        parsed = SERVER_EVENT.validate_python(event)
        assert getattr(parsed, "type", None) == event["type"], event
    return events


def send(live: LiveSession, /, **event) -> Reply:
    reply = live.on_client(json.dumps(event))
    server_events(reply.events)
    return reply


def started_session(**start) -> LiveSession:
    session = LiveSession(MODES, ["gpt-4o-mini"], clock=lambda: 1000.0)
    reply = send(session, type="session.start", session={"model": "gpt-live-1", **start})
    assert reply.open_call is not None and reply.events == []
    got = session.on_converse(Started("gw-session", "tts", "r1"))
    assert [e["type"] for e in server_events(got.events)] == ["session.started"]
    return session


def only_error(reply: Reply) -> dict:
    (event,) = reply.events
    assert event["type"] == "error"
    return event


def pcm(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_events_before_session_start_are_errors_and_the_start_opens_the_call():
    session = LiveSession(MODES)
    error = only_error(send(session, type="session.input_audio.append", audio="", event_id="c1"))
    assert error["client_event_id"] == "c1" and error["error"]["client_event_id"] == "c1"
    assert error["error"]["code"] == "session_not_started"
    reply = send(session, type="session.start", session={"model": "gpt-live-1"})
    config = reply.open_call
    assert config.mode == Config.TANDEM  # the web service's first mode: the default
    assert config.input_format.sample_rate_hz == config.output_format.sample_rate_hz == 24000
    assert config.delegation.target == gateway_pb2.DelegationConfig.CLIENT  # the default
    assert (config.voice, config.hold.delay_s, config.instructions) == ("", 0.0, "")
    timed = LiveSession(MODES, delegation_timeout_s=30.0)
    start = send(timed, type="session.start", session={"model": "gpt-live-1"})
    assert start.open_call.delegation.timeout_s == 30.0  # the web service's setting
    started = session.on_converse(Started("gw", "tts", "r1")).events
    (event,) = server_events(started)
    assert event["session"]["model"] == "gpt-live-1"
    assert event["session"]["delegation"] == {"type": "client", "acknowledgement_delay_ms": 0}
    assert event["session"]["expires_at"] > 0
    again = only_error(send(session, type="session.start", session={"model": "gpt-live-1"}))
    assert again["error"]["code"] == "session_already_started"


@pytest.mark.parametrize(
    ("start", "mode", "codec", "rate"),
    [
        ({"model": "gpt-live-1.1"}, Config.TANDEM, gateway_pb2.AudioFormat.PCM16, 24000),
        (
            {"model": "kame-cascade", "audio": {"format": {"type": "audio/pcm", "rate": 16000}}},
            Config.CASCADE,
            gateway_pb2.AudioFormat.PCM16,
            16000,
        ),
        (
            {"model": "kame-s2s", "audio": {"format": {"type": "audio/pcmu", "rate": 8000}}},
            Config.S2S,
            gateway_pb2.AudioFormat.MULAW,
            8000,
        ),
        (
            {"model": "gpt-live-1", "audio": {"format": {"type": "audio/pcma"}}},
            Config.TANDEM,
            gateway_pb2.AudioFormat.ALAW,
            8000,
        ),
    ],
)
def test_models_and_formats(start, mode, codec, rate):
    config = send(LiveSession(MODES), type="session.start", session=start).open_call
    assert config.mode == mode
    assert (config.input_format.codec, config.input_format.sample_rate_hz) == (codec, rate)
    assert config.output_format == config.input_format
    # kame-s2s has no oracle: client delegation is a no-op there, not a refusal.
    assert config.HasField("delegation") == (mode != Config.S2S)


@pytest.mark.parametrize(
    ("start", "code", "param"),
    [
        ({"model": "gpt-4o-realtime"}, "model_not_found", "session.model"),
        ({}, "missing_required_parameter", "session.model"),
        (
            {"model": "gpt-live-1", "audio": {"format": {"type": "audio/pcm", "rate": 44100}}},
            "invalid_value",
            "session.audio.format",
        ),
        (
            {"model": "gpt-live-1", "delegation": {"type": "decisions", "decisions": {}}},
            "unsupported_value",
            "session.delegation.type",
        ),
        (
            {
                "model": "gpt-live-1",
                "delegation": {"type": "responses", "responses": {"model": "o9"}},
            },
            "model_not_found",
            "session.delegation.responses.model",
        ),
        (
            {
                "model": "gpt-live-1",
                "delegation": {
                    "type": "responses",
                    "responses": {
                        "model": "default",
                        "tools": [{"type": "mcp", "server_url": "https://evil.example/mcp"}],
                    },
                },
            },
            "unsupported_value",
            "session.delegation.responses.tools[0].type",
        ),
        (
            {
                "model": "kame-s2s",
                "delegation": {"type": "responses", "responses": {"model": "default"}},
            },
            "unsupported_value",
            "session.delegation.type",
        ),
        (
            {
                "model": "gpt-live-1",
                "delegation": {"type": "client", "acknowledgement_delay_ms": 10001},
            },
            "invalid_value",
            "session.delegation.acknowledgement_delay_ms",
        ),
        (
            {"model": "gpt-live-1", "triggers": [{"type": "x"}]},
            "unsupported_value",
            "session.triggers",
        ),
    ],
)
def test_a_start_that_cannot_be_served_is_an_error_and_opens_nothing(start, code, param):
    session = LiveSession(MODES, ["gpt-4o-mini"])
    reply = send(session, type="session.start", session=start, event_id="s1")
    error = only_error(reply)
    assert (error["error"]["code"], error["error"]["param"]) == (code, param)
    assert reply.open_call is None and session.config is None


def test_responses_delegation_is_the_stacks_oracle_with_the_clients_choices():
    tool = {
        "type": "function",
        "name": "door_code",
        "description": "The door code of an office.",
        "parameters": {"type": "object", "properties": {"office": {"type": "string"}}},
    }
    delegation = {
        "type": "responses",
        "acknowledgement_delay_ms": 400,
        "responses": {"model": "gpt-4o-mini", "instructions": "Be brief.", "tools": [tool]},
    }
    session = LiveSession(MODES, ["gpt-4o-mini"])
    start = {"model": "kame-cascade", "delegation": delegation, "instructions": "Speak warmly."}
    config = send(session, type="session.start", session=start).open_call
    assert not config.HasField("delegation")  # the stack's own oracle answers
    assert (config.llm.model, config.instructions, config.hold.delay_s) == (
        "gpt-4o-mini",
        "Be brief.",
        0.4,
    )
    (function,) = config.functions
    assert (function.name, json.loads(function.parameters_json)) == (
        "door_code",
        tool["parameters"],
    )
    default = {"type": "responses", "responses": {"model": "default"}}
    plain = send(
        LiveSession(MODES),
        type="session.start",
        session={"model": "gpt-live-1", "delegation": default},
    )
    assert not plain.open_call.HasField("llm")


def test_audio_is_decoded_and_muted_input_is_silence_of_the_same_length():
    session = started_session(audio={"format": {"type": "audio/pcm", "rate": 16000}})
    assert send(session, type="session.input_audio.append", audio=pcm(b"\x10\x20" * 4)).audio == (
        b"\x10\x20" * 4
    )
    muted = send(session, type="session.input_audio.mute", event_id="m1")
    assert muted.events[0]["type"] == "session.input_audio.muted"
    assert muted.events[0]["client_event_id"] == "m1"
    assert send(session, type="session.input_audio.append", audio=pcm(b"\x10\x20" * 4)).audio == (
        b"\x00\x00" * 4
    )
    send(session, type="session.input_audio.unmute")
    assert (
        send(session, type="session.input_audio.append", audio=pcm(b"\x01\x02")).audio
        == b"\x01\x02"
    )
    odd = only_error(send(session, type="session.input_audio.append", audio=pcm(b"\x01")))
    assert odd["error"]["code"] == "invalid_value"
    bad = only_error(send(session, type="session.input_audio.append", audio="not base64!"))
    assert bad["error"]["param"] == "audio"
    long = only_error(send(session, type="session.input_audio.append", audio="A" * 3_000_000))
    assert long["error"]["code"] == "audio_too_long"


def test_agent_audio_and_words_on_the_sessions_timeline_with_usage_each_minute():
    session = started_session()
    events = server_events(session.on_converse(AgentAudio(0, False, False, FRAME)).events)
    assert [e["type"] for e in events] == ["session.output_audio.delta"]
    assert base64.b64decode(events[0]["delta"]) == FRAME  # silence too: GPT-Live streams it
    words = server_events(
        session.on_converse(AgentText("Paris is", 1.2, 1.6, 3, False)).events
        + session.on_converse(AgentText("the capital.", 1.6, 2.2, 3, False)).events
    )
    assert [(e["delta"], e["start_ms"], e["end_ms"]) for e in words] == [
        ("Paris is", 1200, 1600),
        (" the capital.", 1600, 2200),
    ]
    minute = session.on_converse(AgentAudio(749, True, False, FRAME)).events
    assert [e["type"] for e in server_events(minute)] == [
        "session.output_audio.delta",
        "session.usage.updated",
    ]
    assert minute[1]["usage"] == {"seconds": 60}


def test_the_callers_words_are_stable_words_then_the_rest_of_the_final():
    session = started_session()
    partial = session.on_converse(
        UserPartial("u1", "What is the capit", "What is", 0.5, 0.1, 0.48, 1.3)
    ).events
    again = session.on_converse(
        UserPartial("u1", "What is the capital", "What is", 0.6, 0.1, 0.48, 1.5)
    )
    final = session.on_converse(
        UserFinal("u1", "What is the capital?", "", 1.0, 0.2, 0.48, 1.9)
    ).events
    deltas = server_events(partial + again.events + final)
    assert [(e["delta"], e["start_ms"], e["end_ms"]) for e in deltas] == [
        ("What is", 480, 1300),
        (" the capital?", 1300, 1900),
    ]
    assert "".join(e["delta"] for e in deltas) == "What is the capital?"


def test_a_delegation_is_created_after_its_question_and_commentary_answers_it():
    session = started_session()
    session.on_converse(UserPartial("u1", "What is the door", "What is", 0.5, 0.1, 0.3, 1.0))
    created = server_events(
        session.on_converse(
            Delegated("delegation-7", 1.52, "u1", "What is the door code?", False)
        ).events
    )
    assert [e["type"] for e in created] == [
        "session.input_transcript.delta",
        "session.delegation.created",
    ]
    assert created[0]["delta"] == " the door code?"
    assert created[1]["delegation"] == {
        "id": "delegation-7",
        "target": "client",
        "type": "delegation",
    }
    assert created[1]["offset_ms"] == 1520
    session.on_converse(AgentAudio(24, False, False, FRAME))  # the timeline: 2.0 s

    answer = send(
        session,
        type="session.commentary.append",
        content="The code is 4417.",
        delegation_id="delegation-7",
        event_id="c9",
    )
    assert answer.requests == [SendContext(Context.COMMENTARY, "The code is 4417.", "delegation-7")]
    (appended,) = answer.events
    assert (appended["type"], appended["client_event_id"]) == ("session.commentary.appended", "c9")
    assert appended["start_ms"] == appended["end_ms"] == 2000
    thinking = send(
        session, type="session.thinking.append", content="Checking.", delegation_id=None
    )
    assert thinking.requests == [SendContext(Context.THINKING, "Checking.", "")]
    instructions = send(
        session,
        type="session.instructions.append",
        content="Be brief.",
        delegation_id="delegation-7",
    )
    assert instructions.requests == [SendContext(Context.INSTRUCTIONS, "Be brief.", "")]


@pytest.mark.parametrize(
    ("event", "code", "param"),
    [
        (
            {"type": "session.commentary.append", "content": "Hi.", "delegation_id": "made-up"},
            "delegation_not_found",
            "delegation_id",
        ),
        ({"type": "session.commentary.append", "content": "  "}, "invalid_value", "content"),
        ({"type": "session.thinking.append", "content": 7}, "invalid_value", "content"),
        (
            {"type": "session.thinking.append", "content": "x", "delegation_id": 3},
            "invalid_type",
            "delegation_id",
        ),
        ({"type": "response.create"}, "unsupported_event", "type"),
        ({"type": "session.output_audio.fixture.play", "audio": ""}, "unsupported_event", "type"),
        ({"type": "conversation.item.create"}, "invalid_value", "type"),
    ],
)
def test_client_events_that_cannot_be_served_are_errors_and_the_session_goes_on(event, code, param):
    session = started_session()
    reply = send(session, **event, event_id="bad")
    error = only_error(reply)
    assert (error["error"]["code"], error["error"]["param"]) == (code, param)
    assert error["client_event_id"] == "bad" and reply.requests == [] and reply.audio == b""
    assert send(session, type="session.input_audio.append", audio=pcm(b"\x00\x00")).audio


def test_not_json_and_binary_messages_are_errors():
    session = started_session()
    assert only_error(session.on_client("{nope"))["error"]["code"] == "invalid_json"
    assert only_error(session.on_client(b"\x00\x01"))["error"]["code"] == "invalid_json"
    assert only_error(session.on_client('["type"]'))["error"]["code"] == "invalid_json"


def test_a_function_call_is_a_delegated_response_and_its_output_goes_back():
    delegation = {"type": "responses", "responses": {"model": "default"}}
    session = started_session(delegation=delegation)
    events = server_events(
        session.on_converse(FunctionCall("call-1", "door_code", '{"office": "Paris"}')).events
    )
    assert [e["type"] for e in events] == ["session.delegation.created", *["response.event"] * 3]
    delegation_id = events[0]["delegation"]["id"]
    inner = [e["event"]["type"] for e in events[1:]]
    assert inner == ["response.created", "response.output_item.done", "response.completed"]
    assert all(e["delegation_id"] == delegation_id for e in events[1:])
    item = events[2]["event"]["item"]
    assert (item["call_id"], item["name"], item["arguments"]) == (
        "call-1",
        "door_code",
        '{"office": "Paris"}',
    )
    output = {"type": "function_call_output", "call_id": "call-1", "output": "4417"}
    reply = send(session, type="response.item.create", item=output)
    assert reply.requests == [SendFunctionResult("call-1", "4417")]
    assert send(session, type="response.create").events == []  # the agent goes on by itself
    again = only_error(send(session, type="response.item.create", item=output))
    assert again["error"]["param"] == "item.call_id"
    named = only_error(
        send(session, type="session.commentary.append", content="x", delegation_id="d1")
    )
    assert "not accepted with responses delegation" in named["error"]["message"]


def test_notices_are_errors_or_info():
    session = started_session()
    refused = server_events(session.on_converse(Notice("REFUSED", "context.text: empty")).events)
    assert refused[0]["error"]["code"] == "request_refused"
    info = server_events(session.on_converse(Notice("ORACLE_UNAVAILABLE", "lost")).events)
    assert (info[0]["type"], info[0]["code"]) == ("info", "oracle_unavailable")


def test_session_update_keeps_the_calls_settings():
    session = started_session(delegation={"type": "client", "acknowledgement_delay_ms": 300})
    same = send(
        session,
        type="session.update",
        session={"delegation": {"type": "client", "acknowledgement_delay_ms": 300}},
    )
    assert [e["type"] for e in same.events] == ["session.updated"]
    for update, code in [
        ({"delegation": {"type": "client", "acknowledgement_delay_ms": 900}}, "session_locked"),
        ({"delegation": {"type": "responses", "responses": {"model": "default"}}}, "invalid_value"),
        ({"triggers": [{"type": "x"}]}, "unsupported_value"),
    ]:
        assert (
            only_error(send(session, type="session.update", session=update))["error"]["code"]
            == code
        )


def test_close_and_the_calls_end():
    session = started_session()
    session.on_converse(AgentAudio(99, False, False, FRAME))  # 8 s of the session
    assert send(session, type="session.close").requests == [HalfClose()]
    (closed,) = server_events(session.on_call_end(None))
    assert (closed["type"], closed["reason"], closed["usage"]) == (
        "session.closed",
        "close_requested",
        {"seconds": 8},
    )
    adapter = LiveAdapter(started_session(), idle_timeout_s=30)
    broken = adapter.on_call_end(CallEnd(grpc.StatusCode.UNAVAILABLE, "the frontend failed"))
    events = server_events([json.loads(m) for m in broken.send])
    assert [e["type"] for e in events] == ["error", "session.closed"]
    assert events[1]["reason"] == "connection_lost" and broken.close is not None
    expired = LiveAdapter(started_session(), 30).on_call_end(CallEnd(grpc.StatusCode.OUT_OF_RANGE))
    (event,) = [json.loads(m) for m in expired.send]
    assert (event["type"], event["reason"]) == ("session.closed", "expired")
    # A call the gateway refused at the start: its error, and no session.closed.
    refusing = LiveAdapter(LiveSession(MODES), 30)
    refusing.on_client(json.dumps({"type": "session.start", "session": {"model": "gpt-live-1"}}))
    refused = refusing.on_call_end(
        CallEnd(grpc.StatusCode.INVALID_ARGUMENT, "voice 'x' is not served")
    )
    (error,) = server_events([json.loads(m) for m in refused.send])
    assert error["type"] == "error" and "voice 'x'" in error["error"]["message"]


def test_the_adapter_opens_the_call_paced_in_the_sessions_coding():
    adapter = LiveAdapter(LiveSession(MODES), idle_timeout_s=30)
    assert adapter.opening().send == []
    start = {"model": "gpt-live-1", "audio": {"format": {"type": "audio/pcmu"}}}
    actions = adapter.on_client(json.dumps({"type": "session.start", "session": start}))
    assert actions.open_call is not None and actions.open_call.paced.rate == 8000
    started = adapter.on_event(Started("gw", "tts", "r1"))
    assert [json.loads(m)["type"] for m in started.send] == ["session.started"]
    history = {
        "model": "gpt-live-1",
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "Hi."}]}],
    }
    seeded = LiveAdapter(LiveSession(MODES), 30)
    seeded.on_client(json.dumps({"type": "session.start", "session": history}))
    assert seeded.on_event(Started("gw", "tts", "r1")).requests == [
        SendContext(Context.THINKING, "User: Hi.")
    ]
