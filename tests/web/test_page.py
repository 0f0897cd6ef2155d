"""The page's protocol (services/web/protocols/page.py), without a network:
what a page's start message becomes (a Converse config and a token), what
each gateway event (kame_client.events) becomes on the page, and what the
adapter asks of the bridge."""

from __future__ import annotations

import json

import grpc
import pytest

from kame_client.client import HalfClose
from kame_client.events import event_of
from kame_client.status import CallEnd
from kamepb import common_pb2, gateway_pb2
from services.web.config import WebSettings
from services.web.protocols.adapter import Actions, Close, OpenCall
from services.web.protocols.page import (
    PageSession,
    StartError,
    error_event,
    is_stop,
    page_event,
    parse_start,
)

Config = gateway_pb2.ConverseConfig


def start_message(**fields) -> str:
    return json.dumps({"type": "start", "rate": 48000, **fields})


def test_a_start_message_becomes_a_converse_config_at_the_pages_rate():
    parsed = parse_start(start_message(mode="cascade", token="page-token"), WebSettings())
    assert parsed.config.mode == Config.CASCADE
    for audio in (parsed.config.input_format, parsed.config.output_format):
        assert (audio.codec, audio.sample_rate_hz) == (gateway_pb2.AudioFormat.PCM16, 48000)
    assert parsed.config.include_oracle_updates
    assert not parsed.config.HasField("llm")
    assert parsed.token == "page-token"


def test_the_page_gets_only_what_the_operator_offers():
    settings = WebSettings(modes="tandem", llm_models="gpt-4o-mini")
    assert parse_start(start_message(), settings).config.mode == Config.TANDEM  # the first offered
    assert parse_start(start_message(llm="gpt-4o-mini"), settings).config.llm.model == "gpt-4o-mini"
    with pytest.raises(StartError, match="mode: 's2s' is not offered"):
        parse_start(start_message(mode="s2s"), settings)
    with pytest.raises(StartError, match="llm: 'gpt-5' is not offered"):
        parse_start(start_message(llm="gpt-5"), settings)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"\x00\x01", "must be the JSON start message"),
        ("{not json", "not JSON"),
        (json.dumps({"type": "stop"}), "must be"),
        (start_message(rate=4000), "rate: PCM16 needs 8000..192000 Hz, got 4000"),
        (start_message(rate="48000"), "rate"),
    ],
)
def test_a_bad_start_message_is_refused_naming_what_is_wrong(raw, message):
    with pytest.raises(StartError, match=message):
        parse_start(raw, WebSettings())


def test_the_bridges_own_token_stands_in_for_a_page_without_one_only_behind_a_login():
    behind_login = WebSettings(
        gateway_auth_token="bridge-token-0123456789", relay_token_behind_login=True
    )
    assert parse_start(start_message(), behind_login).token == "bridge-token-0123456789"
    assert parse_start(start_message(token="page-token"), behind_login).token == "page-token"
    open_to_all = WebSettings(gateway_auth_token="bridge-token-0123456789")
    assert parse_start(start_message(), open_to_all).token == ""


def test_agent_audio_goes_to_the_page_as_bytes_behind_a_speaking_flag():
    speaking = gateway_pb2.ConverseResponse(
        audio=gateway_pb2.AgentAudioChunk(data=b"\x01\x02\x03\x04", speaking=True)
    )
    silent = gateway_pb2.ConverseResponse(audio=gateway_pb2.AgentAudioChunk(data=b"\x00\x00"))
    assert page_event(event_of(speaking)) == b"\x01\x01\x02\x03\x04"
    assert page_event(event_of(silent)) == b"\x00\x00\x00"


def test_the_page_gets_every_other_event_as_json_named_as_in_kame_talk():
    responses = [
        gateway_pb2.ConverseResponse(
            user_transcript=common_pb2.TranscriptEvent(
                utterance_id="u1", is_final=True, text="What is the capital of France?"
            )
        ),
        gateway_pb2.ConverseResponse(
            oracle_update=common_pb2.OracleUpdate(
                op=common_pb2.OracleUpdate.RESET, generation=3, text="Paris is"
            )
        ),
        gateway_pb2.ConverseResponse(agent_text=common_pb2.AgentText(text="Paris.", generation=3)),
        gateway_pb2.ConverseResponse(
            turn=gateway_pb2.TurnSummary(user_text="hi", response_latency_s=0.42)
        ),
        gateway_pb2.ConverseResponse(barge_in=common_pb2.BargeIn(seq=41)),
        gateway_pb2.ConverseResponse(dtmf=common_pb2.Dtmf(digit="5")),
    ]
    sent = [json.loads(page_event(event_of(response))) for response in responses]
    assert [event["type"] for event in sent] == [
        "user_final",
        "oracle_reset",
        "agent_text",
        "turn",
        "barge_in",
        "dtmf",
    ]
    assert sent[0]["text"] == "What is the capital of France?"


def test_errors_are_the_clients_words_with_the_hint_for_the_pages_countdown():
    busy = CallEnd(grpc.StatusCode.RESOURCE_EXHAUSTED, "stt is at capacity", retry_after_s=2.5)
    assert error_event(busy) == {
        "type": "error",
        "code": "RESOURCE_EXHAUSTED",
        "message": busy.message(),
        "retry_after_s": 2.5,
    }
    refused = error_event(CallEnd(grpc.StatusCode.UNAUTHENTICATED, "invalid bearer token"))
    assert refused["message"].startswith("auth refused") and "retry_after_s" not in refused


def test_stop_is_recognized_and_nothing_else():
    assert is_stop('{"type": "stop"}')
    assert not is_stop('{"type": "start"}') and not is_stop("[]") and not is_stop("x")


def test_the_session_opens_its_call_at_once_and_sends_the_pages_audio_as_it_comes():
    start = parse_start(start_message(mode="cascade"), WebSettings())
    page = PageSession(start, 300.0)
    assert page.opening().open_call == OpenCall(start.config, paced=None)  # a microphone's pace
    assert page.on_client(b"\x01\x02").audio == b"\x01\x02"
    assert page.on_client('{"type": "stop"}').requests == [HalfClose()]
    assert page.on_client('{"type": "ping"}') == page.on_client("[]") == Actions()
    assert page.idle_timeout_s == 300.0  # idle is no sound: the page sends silence too


def test_the_call_ends_with_end_or_the_error_in_words():
    page = PageSession(parse_start(start_message(), WebSettings()), 300.0)
    ended = page.on_call_end(None)
    assert [json.loads(m) for m in ended.send] == [{"type": "end"}] and ended.close is None
    busy = CallEnd(grpc.StatusCode.RESOURCE_EXHAUSTED, "full", retry_after_s=3)
    (error,) = [json.loads(m) for m in page.on_call_end(busy).send]
    assert error["message"].startswith("the agent is busy: try again in 3 s")
    (fault,) = [json.loads(m) for m in page.on_fault().send]
    assert fault["code"] == "INTERNAL" and "log" in fault["message"]
    assert Close().code == 1000
