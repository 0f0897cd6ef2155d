"""The Realtime protocol as an adapter of the bridge
(services/web/protocols/realtime_adapter.py), without a network: the call
opens once, with the first event that needs it and the session's config of
then, paced in its input coding; the errors of a full backlog, an idle client
and the call's end."""

from __future__ import annotations

import base64
import json

import grpc

from kame_client.client import CancelResponse, EndTurn
from kame_client.status import CallEnd
from kamepb import gateway_pb2
from services.web.protocols.adapter import Close
from services.web.protocols.realtime import RealtimeSession
from services.web.protocols.realtime_adapter import RealtimeAdapter
from services.web.protocols.realtime_config import CODINGS

FRAME = bytes(2 * 1920)  # 80 ms of PCM16 at 24 kHz


def adapter() -> RealtimeAdapter:
    return RealtimeAdapter(RealtimeSession("kame-cascade", ["tandem", "cascade"]), 30.0)


def client(realtime: RealtimeAdapter, **event: object) -> object:
    return realtime.on_client(json.dumps(event))


def sent(actions) -> list[dict]:
    return [json.loads(message) for message in actions.send]


def test_the_call_opens_once_with_the_config_of_then_and_paced_in_its_input_coding():
    realtime = adapter()
    assert [e["type"] for e in sent(realtime.opening())] == ["session.created"]
    cancel = client(realtime, type="response.cancel")  # nothing under way: no call for it
    assert cancel.open_call is None and cancel.requests == []
    update = {"audio": {"input": {"format": {"type": "audio/pcmu"}}}}
    assert client(realtime, type="session.update", session=update).open_call is None
    audio = base64.b64encode(bytes(800)).decode()
    first = client(realtime, type="input_audio_buffer.append", audio=audio)
    assert first.open_call is not None and first.open_call.paced == CODINGS["audio/pcmu"]
    assert first.open_call.config.mode == gateway_pb2.ConverseConfig.CASCADE
    assert first.open_call.config.input_format.codec == gateway_pb2.AudioFormat.MULAW
    assert first.audio == bytes(800)
    commit = client(realtime, type="input_audio_buffer.commit")
    assert commit.open_call is None and commit.requests == [EndTurn()]
    assert CancelResponse.URGENT  # a cancel goes before the audio waiting


def test_backlog_idle_and_the_calls_end_are_the_protocols_errors():
    realtime = adapter()
    (full,) = sent(realtime.on_backlog_full())
    assert full["error"]["code"] == "input_audio_buffer_full"
    idle = realtime.on_idle()
    assert sent(idle)[0]["error"]["code"] == "idle_timeout" and idle.close == Close()
    ended = realtime.on_call_end(CallEnd(grpc.StatusCode.UNAUTHENTICATED, "invalid token"))
    (error,) = sent(ended)
    assert (error["error"]["type"], error["error"]["code"]) == (
        "invalid_request_error",
        "unauthenticated",
    )
    assert error["error"]["message"].startswith("auth refused") and ended.close == Close()
    (fault,) = sent(realtime.on_fault())
    assert fault["error"]["type"] == "server_error"
    assert realtime.name.startswith("realtime session sess_")
