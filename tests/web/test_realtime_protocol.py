"""The Realtime protocol without a network (services/web/protocols/realtime.py,
realtime_items.py, realtime_config.py): what session.update may choose and the
Converse config it makes, the gateway's events as Realtime server events, the
conversation's items (truncated to what was played, retrieved, deleted). The
caller's audio paced for the gateway: test_pacer.py."""

from __future__ import annotations

import base64
import json

import pytest

from kame_cli.up import realtime_url
from kame_client.client import SendText
from kame_client.events import (
    AgentAudio,
    AgentText,
    BargeIn,
    Notice,
    UserFinal,
    UserPartial,
    UserTranscript,
)
from kamepb import gateway_pb2
from services.web.protocols.realtime import (
    CANCEL,
    END_TURN,
    RESPOND,
    RESPONSE_GAP_S,
    RealtimeSession,
    Reply,
)
from services.web.protocols.realtime_config import ClientError, SessionConfig, mode_of_model
from services.web.protocols.realtime_items import History, UserMessage
from services.web.server import bearer_token

Codec = gateway_pb2.AudioFormat
FRAME = bytes(2 * 1920)  # 80 ms of PCM16 at 24 kHz
MODES = ["tandem", "cascade", "s2s"]


def session() -> RealtimeSession:
    return RealtimeSession("kame-tandem", MODES)


def sent(realtime: RealtimeSession, **event) -> list[dict]:
    return realtime.on_client(json.dumps(event)).events


def agent(
    realtime: RealtimeSession, speaking: bool, frames: int = 1, seq: int = 0, held: bool = False
) -> list[dict]:
    events: list[dict] = []
    for n in range(frames):
        events += realtime.on_converse(AgentAudio(seq + n, speaking, held, FRAME))
    return events


def said(realtime: RealtimeSession, text: str, start_s: float) -> list[dict]:
    return realtime.on_converse(AgentText(text, start_s, start_s + 0.2, 1, False))


def test_session_update_chooses_g711_and_a_voice_of_the_stack():
    update = {
        "type": "realtime",
        "audio": {
            "input": {"format": {"type": "audio/pcmu"}, "turn_detection": {"type": "server_vad"}},
            "output": {"format": {"type": "audio/pcma"}, "voice": "alloy"},
        },
        "tools": [],
    }
    config = SessionConfig().updated(update, locked=False).converse_config("cascade")
    assert config.mode == gateway_pb2.ConverseConfig.CASCADE
    assert (config.input_format.codec, config.input_format.sample_rate_hz) == (Codec.MULAW, 8000)
    assert (config.output_format.codec, config.output_format.sample_rate_hz) == (Codec.ALAW, 8000)
    assert config.voice == ""  # OpenAI's voices are the stack's default
    ours = SessionConfig().updated({"audio": {"output": {"voice": {"id": "amy"}}}}, locked=False)
    assert ours.converse_config("tandem").voice == "amy"


@pytest.mark.parametrize(
    ("update", "code", "param"),
    [
        ({"type": "transcription"}, "invalid_value", "session.type"),
        (
            {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}},
            "invalid_value",
            "session.audio.input.format.rate",
        ),
        (
            {"audio": {"input": {"turn_detection": {"type": "whisper_vad"}}}},
            "invalid_value",
            "session.audio.input.turn_detection",
        ),
        ({"instructions": 3}, "invalid_type", "session.instructions"),
    ],
)
def test_a_session_update_the_stack_cannot_honour_is_refused_naming_the_field(update, code, param):
    with pytest.raises(ClientError) as refused:
        SessionConfig().updated(update, locked=False)
    assert (refused.value.code, refused.value.param) == (code, param)


def test_what_the_call_was_opened_with_stays_once_it_is_open():
    shown_only = SessionConfig()
    assert shown_only.updated({"instructions": "Hi."}, locked=True).instructions == "Hi."
    relayed = SessionConfig(relay_instructions=True)
    for update in (
        {"audio": {"output": {"format": {"type": "audio/pcmu"}}}},
        {"audio": {"input": {"turn_detection": None}}},
        {"instructions": "Be brief."},
    ):
        with pytest.raises(ClientError, match="once it is open") as refused:
            relayed.updated(update, locked=True)
        assert refused.value.code == "session_locked"
    same = {"instructions": "", "audio": {"input": {"turn_detection": {"type": "server_vad"}}}}
    assert relayed.updated(same, locked=True) == relayed  # a client repeating itself


def test_push_to_talk_and_instructions_go_into_the_calls_config():
    update = {"instructions": "Answer in French.", "audio": {"input": {"turn_detection": None}}}
    relayed = SessionConfig(relay_instructions=True).updated(update, locked=False)
    config = relayed.converse_config("tandem")
    assert config.turn_detection == gateway_pb2.ConverseConfig.MANUAL
    assert config.instructions == "Answer in French."
    assert relayed.described("kame-tandem")["audio"]["input"]["turn_detection"] is None
    shown_only = SessionConfig().updated(update, locked=False)
    assert shown_only.converse_config("tandem").instructions == ""
    assert shown_only.described("kame-tandem")["instructions"] == "Answer in French."


def test_the_model_names_an_offered_mode():
    assert mode_of_model("kame-s2s", MODES) == "s2s"
    for model in ("kame-s2s", "tandem", "gpt-realtime"):
        with pytest.raises(ClientError, match="kame-tandem"):
            mode_of_model(model, ["tandem"])


def test_silence_within_a_stretch_is_sent_with_the_next_speech_and_a_gap_ends_it():
    realtime = session()
    opened = agent(realtime, speaking=True)
    assert [e["type"] for e in opened][-1] == "response.output_audio.delta"
    assert agent(realtime, speaking=False, frames=2) == []  # a pause: held
    (delta,) = agent(realtime, speaking=True)
    assert len(base64.b64decode(delta["delta"])) == 3 * len(FRAME)
    frames_in_gap = round(RESPONSE_GAP_S / 0.08 + 0.5)
    closing = agent(realtime, speaking=False, frames=frames_in_gap)
    assert closing[-1]["type"] == "response.done"
    assert closing[-1]["response"]["status"] == "completed"
    ids = [e["event_id"] for e in [*opened, delta, *closing]]
    assert len(set(ids)) == len(ids)


def test_response_cancel_ends_the_response_and_drops_the_rest_of_the_stretch():
    realtime = session()
    (refused,) = sent(realtime, type="response.cancel", event_id="c-1")
    assert refused["error"]["code"] == "response_cancel_not_active"
    assert refused["error"]["event_id"] == "c-1"
    agent(realtime, speaking=True)
    cancelled = sent(realtime, type="response.cancel")
    assert cancelled[-1]["response"]["status_details"]["reason"] == "client_cancelled"
    assert agent(realtime, speaking=True, frames=3) == []  # the same stretch: dropped
    agent(realtime, speaking=False, frames=round(RESPONSE_GAP_S / 0.08 + 0.5))
    assert agent(realtime, speaking=True)[0]["type"] == "response.created"  # the next one


def test_words_that_come_before_their_audio_open_the_responses_transcript():
    realtime = session()
    assert said(realtime, "Paris", 0.0) == []
    opened = agent(realtime, speaking=True)
    assert [e["type"] for e in opened][-2:] == [
        "response.output_audio_transcript.delta",
        "response.output_audio.delta",
    ]
    assert said(realtime, "is", 0.1)[0]["delta"] == " is"
    closed = agent(realtime, speaking=False, frames=round(RESPONSE_GAP_S / 0.08 + 0.5))
    assert closed[1]["transcript"] == "Paris is"


def a_spoken_response(realtime: RealtimeSession) -> str:
    """The agent speaks frames 10-19 (0.8 s into its stream on): "Paris" 0.1 s
    into the response, "is" 0.5 s, "big" 0.75 s; then it falls silent. Its item's id."""
    opened = agent(realtime, speaking=True, seq=10)
    said(realtime, "Paris", 0.9)
    agent(realtime, speaking=True, frames=9, seq=11)
    said(realtime, "is", 1.3)
    said(realtime, "big", 1.55)
    return opened[2]["item"]["id"]


def test_a_truncation_keeps_the_words_that_started_before_the_cut():
    realtime = session()
    item_id = a_spoken_response(realtime)
    agent(realtime, speaking=False, frames=round(RESPONSE_GAP_S / 0.08 + 0.5))
    (cut,) = sent(
        realtime,
        type="conversation.item.truncate",
        item_id=item_id,
        content_index=0,
        audio_end_ms=600,
    )
    assert (cut["type"], cut["audio_end_ms"]) == ("conversation.item.truncated", 600)
    (got,) = sent(realtime, type="conversation.item.retrieve", item_id=item_id)
    assert got["item"]["content"][0]["transcript"] == "Paris is"
    assert got["item"]["status"] == "completed"
    # The item's audio is now 600 ms: a later cut must be within it.
    (longer,) = sent(
        realtime,
        type="conversation.item.truncate",
        item_id=item_id,
        content_index=0,
        audio_end_ms=601,
    )
    assert "600 ms is already shorter than 601 ms" in longer["error"]["message"]


@pytest.mark.parametrize(
    ("fields", "code", "param"),
    [
        ({"content_index": 1, "audio_end_ms": 0}, "invalid_value", "content_index"),
        ({"content_index": 0, "audio_end_ms": -1}, "invalid_value", "audio_end_ms"),
        ({"content_index": 0, "audio_end_ms": 0.5}, "invalid_value", "audio_end_ms"),
        ({"content_index": 0, "audio_end_ms": 801}, "invalid_value", "audio_end_ms"),
        ({"content_index": 0}, "invalid_value", "audio_end_ms"),
    ],
)
def test_a_truncation_outside_the_items_audio_is_refused(fields, code, param):
    realtime = session()
    item_id = a_spoken_response(realtime)  # 800 ms of audio
    (refused,) = sent(realtime, type="conversation.item.truncate", item_id=item_id, **fields)
    assert (refused["error"]["code"], refused["error"]["param"]) == (code, param)
    assert realtime.response is not None  # nothing ended


def test_truncating_or_deleting_the_response_under_way_ends_it_first():
    realtime = session()
    item_id = a_spoken_response(realtime)
    events = sent(
        realtime,
        type="conversation.item.truncate",
        item_id=item_id,
        content_index=0,
        audio_end_ms=200,
    )
    assert [e["type"] for e in events][-2:] == ["response.done", "conversation.item.truncated"]
    assert events[-2]["response"]["status_details"]["reason"] == "client_cancelled"
    assert events[-2]["response"]["output"][0]["content"][0]["transcript"] == "Paris is big"
    assert agent(realtime, speaking=True, frames=2, seq=20) == []  # its stretch: dropped
    (got,) = sent(realtime, type="conversation.item.retrieve", item_id=item_id)
    assert got["item"]["content"][0]["transcript"] == "Paris"
    assert got["item"]["status"] == "incomplete"

    again = session()
    item_id = a_spoken_response(again)
    events = sent(again, type="conversation.item.delete", item_id=item_id)
    assert [e["type"] for e in events][-2:] == ["response.done", "conversation.item.deleted"]
    (gone,) = sent(again, type="conversation.item.retrieve", item_id=item_id)
    assert gone["error"]["code"] == "item_not_found"


def test_only_the_agents_items_are_truncated_and_unknown_ones_are_errors():
    realtime = session()
    for kind, text in ((UserPartial, "hello"), (UserFinal, "hello there")):
        events = realtime.on_converse(kind("u", text, "", 0.0, 0.0))
    user_id = events[0]["item_id"]
    (refused,) = sent(
        realtime,
        type="conversation.item.truncate",
        item_id=user_id,
        content_index=0,
        audio_end_ms=0,
    )
    assert refused["error"]["code"] == "unsupported_content_type"
    (got,) = sent(realtime, type="conversation.item.retrieve", item_id=user_id)
    assert got["item"]["content"] == [{"type": "input_audio", "transcript": "hello there"}]
    for item_id in ("item_unknown", "", 7):
        (unknown,) = sent(realtime, type="conversation.item.delete", item_id=item_id)
        assert unknown["error"]["param"] == "item_id"


def test_the_history_keeps_the_newest_items_and_chains_them():
    history = History(limit=3)
    added = [history.add(UserMessage(f"item_{n}")) for n in range(5)]
    assert [a["previous_item_id"] for a in added] == [None, "item_0", "item_1", "item_2", "item_3"]
    assert "item_1" not in history and "item_2" in history
    history.delete("item_4")
    assert history.last_id == "item_3"


def test_partial_transcripts_are_deltas_of_what_was_not_said_yet():
    realtime = session()

    def heard(kind: type[UserTranscript], text: str) -> list[dict]:
        return realtime.on_converse(kind("u", text, "", 0.0, 0.0))

    started, first = heard(UserPartial, "what is")
    assert started["type"] == "input_audio_buffer.speech_started"
    assert first["delta"] == "what is"
    assert heard(UserPartial, "what is the")[0]["delta"] == " the"
    assert heard(UserPartial, "what was the") == []  # revised: the final says it
    final = heard(UserFinal, "what was the capital")
    completed = next(e for e in final if e["type"].endswith("transcription.completed"))
    assert completed["transcript"] == "what was the capital"
    assert final[0]["item_id"] == started["item_id"]


def test_appended_audio_must_be_base64_of_whole_samples():
    realtime = session()
    for audio, message in (("%%%", "base64"), (base64.b64encode(b"\x00").decode(), "whole")):
        (error,) = sent(realtime, type="input_audio_buffer.append", audio=audio)
        assert message in error["error"]["message"]
    reply = realtime.on_client(
        json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(FRAME).decode()})
    )
    assert reply.audio == FRAME and reply.events == []


def test_the_bearer_token_is_read_from_the_authorization_header():
    assert bearer_token("Bearer tok-1") == "tok-1"
    assert bearer_token("bearer  tok-1 ") == "tok-1"
    assert bearer_token("Basic dXNlcg==") == bearer_token(None) == ""


def test_kame_up_names_the_endpoint_by_the_web_services_address():
    assert realtime_url("http://127.0.0.1:8088/") == "ws://127.0.0.1:8088/v1/realtime"


def heard(
    realtime: RealtimeSession, kind: type[UserTranscript], text: str, utterance_id: str = "u"
) -> list[dict]:
    return realtime.on_converse(kind(utterance_id, text, "", 0.0, 0.0))


def appended(realtime: RealtimeSession, seconds: float) -> Reply:
    audio = base64.b64encode(bytes(int(48000 * seconds))).decode()
    return realtime.on_client(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))


def push_to_talk() -> RealtimeSession:
    realtime = session()
    update = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}
    sent(realtime, type="session.update", session=update)
    return realtime


def test_a_commit_ends_the_turn_after_its_audio_and_the_final_completes_the_item():
    realtime = push_to_talk()
    (empty,) = sent(realtime, type="input_audio_buffer.commit")
    assert empty["error"]["code"] == "input_audio_buffer_commit_empty"
    assert appended(realtime, 0.5).needs_call
    partial = heard(realtime, UserPartial, "what is")  # no VAD events with push-to-talk
    assert [e["type"] for e in partial] == ["conversation.item.input_audio_transcription.delta"]
    reply = realtime.on_client(json.dumps({"type": "input_audio_buffer.commit"}))
    assert reply.requests == [END_TURN]
    (committed,) = reply.events
    assert committed["type"] == "input_audio_buffer.committed"
    final = heard(realtime, UserFinal, "what is the capital")
    assert [e["type"] for e in final] == [
        "conversation.item.added",
        "conversation.item.input_audio_transcription.completed",
        "conversation.item.done",
    ]
    assert final[0]["item"]["id"] == committed["item_id"]
    (again,) = sent(realtime, type="input_audio_buffer.commit")  # nothing new appended
    assert again["error"]["code"] == "input_audio_buffer_commit_empty"


def test_response_create_asks_for_the_answer_once_at_a_time():
    realtime = push_to_talk()
    reply = realtime.on_client(json.dumps({"type": "response.create"}))
    assert (reply.events, reply.requests, reply.needs_call) == ([], [RESPOND], True)
    agent(realtime, speaking=True)
    (busy,) = sent(realtime, type="response.create")
    assert busy["error"]["code"] == "conversation_already_has_active_response"


def test_response_cancel_stops_the_agent_at_the_gateway_too():
    realtime = session()
    agent(realtime, speaking=True)
    reply = realtime.on_client(json.dumps({"type": "response.cancel"}))
    assert reply.requests == [CANCEL] and not reply.needs_call  # urgent: before audio
    assert reply.events[-1]["response"]["status"] == "cancelled"
    # The gateway's barge-in for that cancel: the response is over already.
    assert realtime.on_converse(BargeIn(3, cancelled=True)) == []


def test_a_typed_message_is_an_item_at_once_and_its_echo_is_not_a_second():
    realtime = session()
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi!"}]}
    reply = realtime.on_client(json.dumps({"type": "conversation.item.create", "item": item}))
    assert reply.requests == [SendText("Hi!")] and reply.needs_call
    added, done = reply.events
    assert added["item"]["content"] == [{"type": "input_text", "text": "Hi!"}]
    assert done["type"] == "conversation.item.done"
    # It cut the agent (a barge-in of a request: no speech started), then the
    # gateway echoes it as a final.
    agent(realtime, speaking=True)
    barge_in = realtime.on_converse(BargeIn(1, cancelled=True))
    assert [e["type"] for e in barge_in][-1] == "response.done"
    assert barge_in[-1]["response"]["status"] == "cancelled"
    assert heard(realtime, UserFinal, "Hi!", utterance_id="sess-1-text-1") == []
    started = heard(realtime, UserPartial, "and")  # the caller's next words: a new turn
    assert started[0]["type"] == "input_audio_buffer.speech_started"


@pytest.mark.parametrize(
    ("item", "code", "param"),
    [
        (
            {"type": "function_call", "name": "f", "arguments": "{}"},
            "unsupported_value",
            "item.type",
        ),
        (
            {"type": "message", "role": "assistant", "content": [{"type": "output_text"}]},
            "unsupported_value",
            "item.role",
        ),
        (
            {"type": "message", "role": "user", "content": [{"type": "input_audio"}]},
            "unsupported_value",
            "item.content",
        ),
        (
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": " "}]},
            "invalid_value",
            "item.content",
        ),
        ("hello", "invalid_value", "item"),
    ],
)
def test_items_other_than_the_callers_text_are_refused(item, code, param):
    realtime = session()
    (refused,) = sent(realtime, type="conversation.item.create", item=item)
    assert (refused["error"]["code"], refused["error"]["param"]) == (code, param)
    assert not realtime.call_opened


def test_a_refused_request_is_an_error_and_the_session_goes_on():
    realtime = session()
    notice = Notice("REFUSED", "user_text: at most 2000 characters")
    (error,) = realtime.on_converse(notice)
    assert (error["error"]["code"], error["error"]["message"]) == (
        "request_refused",
        notice.message,
    )
