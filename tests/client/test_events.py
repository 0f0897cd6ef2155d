"""The one mapping of gateway responses to events (kame_client/events.py):
every response kind has its typed event, and its JSON is named as in `kame
talk`'s timeline and on the web page."""

from __future__ import annotations

import json

import pytest

from kame_client.events import (
    EVENT_OF,
    Notice,
    Resumed,
    Started,
    ToolCall,
    ToolFinished,
    UserFinal,
    UserPartial,
    UserTranscript,
    event_json,
    event_of,
)
from kamepb import common_pb2, gateway_pb2

Response = gateway_pb2.ConverseResponse


def test_every_response_kind_of_the_proto_has_an_event():
    """All but the call's ending, which the client reads as the call's status
    (kame_client/client.py `responses`)."""
    kinds = {field.name for field in Response.DESCRIPTOR.oneofs_by_name["msg"].fields}
    assert kinds - {"ending"} == set(EVENT_OF)


EXAMPLES = [
    (
        Response(
            started=gateway_pb2.SessionStarted(
                session_id="s1", engine="tts", frontend_replica="r1", resume_token="secret"
            )
        ),
        {"type": "started", "session_id": "s1", "engine": "tts", "frontend_replica": "r1"},
    ),
    (
        Response(started=gateway_pb2.SessionStarted(session_id="s1", resumed=True)),
        {"type": "resumed", "session_id": "s1", "engine": "", "frontend_replica": ""},
    ),
    (
        Response(audio=gateway_pb2.AgentAudioChunk(data=b"\x01\x02", seq=7, speaking=True)),
        {"type": "agent_audio", "seq": 7, "speaking": True, "held": False, "data_bytes": 2},
    ),
    (
        Response(audio=gateway_pb2.AgentAudioChunk(data=b"\x00\x00", seq=8, held=True)),
        {"type": "agent_audio", "seq": 8, "speaking": False, "held": True, "data_bytes": 2},
    ),
    (
        Response(
            user_transcript=common_pb2.TranscriptEvent(
                utterance_id="u1",
                text="what is",
                stable_text="what",
                stability=0.9,
                lag_s=0.12345,
                span=common_pb2.AudioSpan(start_s=0.48, end_s=1.2),
            )
        ),
        {
            "type": "user_partial",
            "utterance_id": "u1",
            "text": "what is",
            "stable_text": "what",
            "stability": 0.9,
            "lag_s": 0.1235,
            "start_s": 0.48,
            "end_s": 1.2,
        },
    ),
    (
        Response(user_transcript=common_pb2.TranscriptEvent(is_final=True, text="What is it?")),
        {
            "type": "user_final",
            "utterance_id": "",
            "text": "What is it?",
            "stable_text": "",
            "stability": 0.0,
            "lag_s": 0.0,
            "start_s": 0.0,
            "end_s": 0.0,
        },
    ),
    (
        Response(
            agent_text=common_pb2.AgentText(
                text="Paris.", start_s=1.23456, end_s=1.5, generation=3, filler=False
            )
        ),
        {
            "type": "agent_text",
            "text": "Paris.",
            "start_s": 1.235,
            "end_s": 1.5,
            "generation": 3,
            "filler": False,
        },
    ),
    (
        Response(
            oracle_update=common_pb2.OracleUpdate(
                op=common_pb2.OracleUpdate.RESET,
                generation=3,
                text="Paris is",
                source=common_pb2.CandidateSource(text="what is the capital", is_final=False),
            )
        ),
        {
            "type": "oracle_reset",
            "generation": 3,
            "text": "Paris is",
            "source_text": "what is the capital",
            "source_final": False,
        },
    ),
    (
        Response(
            oracle_update=common_pb2.OracleUpdate(
                op=common_pb2.OracleUpdate.APPEND, generation=3, text=" the capital"
            )
        ),
        {"type": "oracle_append", "generation": 3, "text": " the capital"},
    ),
    (
        Response(
            turn=gateway_pb2.TurnSummary(
                utterance_id="u1",
                user_text="hi",
                response_latency_s=0.5,
                stt_final_lag_s=0.25,
                oracle_first_update_s=0.125,
                answer_latency_s=1.0,
            )
        ),
        {
            "type": "turn",
            "utterance_id": "u1",
            "user_text": "hi",
            "response_latency_s": 0.5,
            "stt_final_lag_s": 0.25,
            "oracle_first_update_s": 0.125,
            "answer_latency_s": 1.0,
        },
    ),
    (
        Response(notice=gateway_pb2.Notice(kind=gateway_pb2.Notice.RECONNECT, message="draining")),
        {"type": "notice", "kind": "RECONNECT", "message": "draining"},
    ),
    (
        Response(dtmf=common_pb2.Dtmf(digit="5", duration_ms=120)),
        {"type": "dtmf", "digit": "5", "duration_ms": 120},
    ),
    (
        Response(barge_in=common_pb2.BargeIn(seq=41)),
        {"type": "barge_in", "seq": 41, "cancelled": False},
    ),
    (
        Response(
            function_call=common_pb2.FunctionCall(
                call_id="c1", name="weather", arguments_json='{"city": "Paris"}'
            )
        ),
        {
            "type": "function_call",
            "call_id": "c1",
            "name": "weather",
            "arguments_json": '{"city": "Paris"}',
        },
    ),
    (
        Response(
            tool=common_pb2.ToolActivity(
                phase=common_pb2.ToolActivity.FINISHED,
                call_id="t1",
                name="door_code",
                source="vault",
                elapsed_s=0.123456,
            )
        ),
        {
            "type": "tool_finished",
            "call_id": "t1",
            "name": "door_code",
            "source": "vault",
            "read_only": False,
            "is_error": False,
            "elapsed_s": 0.1235,
            "reused": False,
        },
    ),
    (
        Response(
            delegation=common_pb2.Delegation(
                delegation_id="delegation-1",
                offset_s=2.4,
                source=common_pb2.CandidateSource(utterance_id="u1", is_final=True, text="hi"),
            )
        ),
        {
            "type": "delegation",
            "delegation_id": "delegation-1",
            "offset_s": 2.4,
            "source_utterance_id": "u1",
            "source_text": "hi",
            "source_final": True,
        },
    ),
    (Response(), {"type": "unknown"}),
]


@pytest.mark.parametrize(("response", "event"), EXAMPLES)
def test_each_response_becomes_its_event_named_as_in_the_timeline(response, event):
    assert event_json(event_of(response)) == event


def test_every_event_is_json_and_none_carries_the_resume_token():
    shown = json.dumps([event_json(event_of(response)) for response, _ in EXAMPLES])
    assert "secret" not in shown


def test_events_are_typed_for_match_and_the_kinds_of_one_family_share_a_class():
    final = event_of(Response(user_transcript=common_pb2.TranscriptEvent(is_final=True, text="Hi")))
    resumed = event_of(Response(started=gateway_pb2.SessionStarted(resumed=True)))
    finished = event_of(
        Response(tool=common_pb2.ToolActivity(phase=common_pb2.ToolActivity.FINISHED))
    )
    assert isinstance(final, UserFinal) and isinstance(final, UserTranscript)
    assert isinstance(resumed, Resumed) and isinstance(resumed, Started)
    assert isinstance(finished, ToolFinished) and isinstance(finished, ToolCall)
    match final:
        case UserPartial():
            raise AssertionError("a final is no partial")
        case UserTranscript(text=text):
            assert text == "Hi"


def test_a_notice_kind_newer_than_the_client_is_named_by_its_number():
    event = event_of(Response(notice=gateway_pb2.Notice(kind=99, message="new")))
    assert event == Notice("99", "new")
