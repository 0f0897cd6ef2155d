"""The Moshi protocol's adapter (services/web/protocols/moshi.py) without a
network: what each client message and gateway event becomes, and how each
way of ending closes the socket (the client told why first). Through a real
socket and gateway: test_moshi_chat.py and test_moshi_limits.py."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import sphn

from kame_client.events import AgentAudio, AgentText, BargeIn, Resumed, Started
from kame_client.status import CallEnd, CloseCode
from kamepb import gateway_pb2
from services.web.config import WebSettings
from services.web.protocols.adapter import Actions, Close, Timer
from services.web.protocols.moshi import MAX_AUDIO_MESSAGE_BYTES, Kind, MoshiSession, closing
from services.web.protocols.moshi_audio import FRAME_BYTES, PCM
from services.web.protocols.realtime_config import ClientError
from tests.web.test_moshi_chat import opus_pages, tone

SETTINGS = WebSettings(start_timeout_s=5.0, realtime_idle_timeout_s=30.0)


def chat() -> MoshiSession:
    return MoshiSession.for_query({"model": "kame-cascade", "text_topk": "25"}, SETTINGS)


def audio_message(samples: np.ndarray) -> bytes:
    return bytes((Kind.AUDIO,)) + b"".join(opus_pages(samples))


def refused(actions: Actions, code: int, reason: str) -> None:
    """`actions` close the socket with `code`, the client told why first."""
    assert actions.close is not None
    assert (actions.close.code, reason in actions.close.reason) == (code, True), actions.close
    assert actions.send == [bytes((Kind.ERROR,)) + actions.close.reason.encode()]


def test_the_call_opens_at_once_in_the_mode_asked_with_paced_pcm_at_24_khz():
    opening = chat().opening()
    assert opening.open_call is not None and opening.open_call.paced == PCM
    config = opening.open_call.config
    assert config.mode == gateway_pb2.ConverseConfig.CASCADE
    assert (config.input_format.codec, config.input_format.sample_rate_hz) == (
        gateway_pb2.AudioFormat.PCM16,
        24000,
    )
    assert MoshiSession.for_query({}, SETTINGS).mode == "tandem"
    with pytest.raises(ClientError):
        MoshiSession.for_query({"model": "kame-other"}, SETTINGS)


def test_the_handshake_arms_the_first_audio_timer_and_audio_disarms_it():
    session = chat()
    started = session.on_event(Started("s1", "tts", "r1"))
    assert started.send == [bytes((Kind.HANDSHAKE,))]
    assert isinstance(started.timer, Timer) and started.timer.seconds == 5.0
    refused(started.timer.then, CloseCode.POLICY_VIOLATION, "no audio within 5 s")
    first = session.on_client(audio_message(tone(0.24)))
    assert first.disarm and len(first.audio) > 0
    assert not session.on_client(audio_message(tone(0.24))).disarm
    # A resumed session (a Started too) after audio came: no timer again.
    assert session.on_event(Resumed("s1", "tts", "r1")).timer is None


def test_the_agents_audio_is_coded_in_moshis_frames_and_its_words_go_with_it():
    session = chat()
    assert session.on_event(AgentText("Paris", 0.1, 0.3, 1, False)).send == []  # not yet heard
    sent = session.on_event(AgentAudio(0, True, False, bytes(FRAME_BYTES * 3))).send
    kinds = [message[0] for message in sent]
    assert kinds[0] == Kind.AUDIO and kinds[1:] == [Kind.TEXT]
    assert sent[1] == bytes((Kind.TEXT,)) + b" Paris"
    reader = sphn.OpusStreamReader(24000)
    assert len(reader.append_bytes(sent[0][1:])) > 0, "an Ogg Opus stream moshi's client reads"
    session.on_event(AgentText("cut", 0.5, 0.6, 1, False))
    session.on_event(BargeIn(2, cancelled=False))  # its words will not be spoken
    assert session.on_event(AgentAudio(3, False, False, bytes(FRAME_BYTES * 10))).send[1:] == []


@pytest.mark.parametrize(
    ("message", "code", "reason"),
    [
        ("hello", CloseCode.UNSUPPORTED_DATA, "text frames are not Moshi messages"),
        (bytes((9,)), CloseCode.UNSUPPORTED_DATA, "unknown message kind 9"),
        (bytes((Kind.AUDIO,)) + b"not ogg at all", CloseCode.INVALID_PAYLOAD, "not an Ogg Opus"),
        (
            bytes((Kind.AUDIO,)) + bytes(MAX_AUDIO_MESSAGE_BYTES + 1),
            CloseCode.MESSAGE_TOO_BIG,
            "more than",
        ),
        (audio_message(tone(2.5)), CloseCode.POLICY_VIOLATION, "of audio in one message"),
    ],
)
def test_bad_client_messages_close_the_socket_saying_why(message, code, reason):
    refused(chat().on_client(message), code, reason)


def test_the_protocols_other_kinds_and_empty_messages_are_ignored():
    session = chat()
    for kind in (Kind.HANDSHAKE, Kind.TEXT, Kind.CONTROL, Kind.METADATA, Kind.PING):
        assert session.on_client(bytes((kind,)) + b"x") == Actions()
    assert session.on_client(b"") == Actions()


def test_each_way_of_ending_closes_as_the_status_maps_it():
    session = chat()
    assert session.on_call_end(None) == Actions(close=Close(1000, "the call ended"))
    refused(
        session.on_call_end(CallEnd(grpc.StatusCode.UNAUTHENTICATED, "invalid bearer token")),
        CloseCode.POLICY_VIOLATION,
        "auth refused",
    )
    busy = CallEnd(grpc.StatusCode.RESOURCE_EXHAUSTED, "full", retry_after_s=2)
    refused(session.on_call_end(busy), CloseCode.TRY_AGAIN_LATER, "try again in 2 s")
    refused(session.on_backlog_full(), CloseCode.POLICY_VIOLATION, "waits to be sent")
    refused(session.on_idle(), CloseCode.POLICY_VIOLATION, "no sound from the caller for 30 s")
    refused(session.on_fault(), CloseCode.INTERNAL_ERROR, "failed")
    assert closing(CloseCode.NORMAL_CLOSURE, "bye").send == []
