"""The one Converse client and the one mapping of gateway responses to events
(kame_common/converse.py): every response kind has its event, named as in `kame
talk`'s timeline; the client sends the config first, audio only once the session
started, and reads the gateway's status where it ends the call."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest

from kame_common.converse import EVENT_OF, ConverseClient, converse_event, retry_after_s
from kamepb import common_pb2, gateway_pb2, gateway_pb2_grpc

Response = gateway_pb2.ConverseResponse
Request = gateway_pb2.ConverseRequest


def test_every_response_kind_of_the_proto_has_an_event():
    kinds = {field.name for field in Response.DESCRIPTOR.oneofs_by_name["msg"].fields}
    assert kinds == set(EVENT_OF)


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
        {"type": "agent_audio", "seq": 7, "speaking": True, "held": False, "data": b"\x01\x02"},
    ),
    (
        Response(audio=gateway_pb2.AgentAudioChunk(data=b"\x00\x00", seq=8, held=True)),
        {"type": "agent_audio", "seq": 8, "speaking": False, "held": True, "data": b"\x00\x00"},
    ),
    (
        Response(
            user_transcript=common_pb2.TranscriptEvent(
                utterance_id="u1", text="what is", stable_text="what", stability=0.9, lag_s=0.12345
            )
        ),
        {
            "type": "user_partial",
            "utterance_id": "u1",
            "text": "what is",
            "stable_text": "what",
            "stability": 0.9,
            "lag_s": 0.1235,
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
    (Response(), {"type": "unknown"}),
]


@pytest.mark.parametrize(("response", "event"), EXAMPLES)
def test_each_response_becomes_its_event(response, event):
    assert converse_event(response) == event


def test_every_event_but_the_audio_is_json_and_none_carries_the_resume_token():
    events = [converse_event(response) for response, _ in EXAMPLES]
    shown = json.dumps([e for e in events if e["type"] != "agent_audio"])
    assert "secret" not in shown


def test_a_notice_kind_newer_than_the_client_is_named_by_its_number():
    event = converse_event(Response(notice=gateway_pb2.Notice(kind=99, message="new")))
    assert event == {"type": "notice", "kind": "99", "message": "new"}


class Refusal(grpc.aio.AioRpcError):
    def __init__(self, *trailing: tuple[str, str]) -> None:
        super().__init__(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            grpc.aio.Metadata(),
            grpc.aio.Metadata(*trailing),
            details="busy",
        )


@pytest.mark.parametrize(
    ("trailing", "hint"),
    [
        ((("retry-after-s", "2.5"),), 2.5),
        ((("other", "1"), ("retry-after-s", "0")), 0.0),
        ((), None),
        ((("retry-after-s", "soon"),), None),
        ((("retry-after-s", "-1"),), None),
        ((("retry-after-s", "inf"),), None),
    ],
)
def test_the_retry_hint_is_read_only_when_it_is_a_time(trailing, hint):
    assert retry_after_s(Refusal(*trailing)) == hint


class EchoGateway(gateway_pb2_grpc.GatewayServicer):
    """Starts a session on the config and answers each audio message with agent audio
    (refuses a token other than "good"); records what came in, in order."""

    def __init__(self) -> None:
        self.received: list[str] = []

    async def Converse(self, request_iterator, context):  # noqa: N802 (gRPC's name)
        if ("authorization", "Bearer good") not in context.invocation_metadata():
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "invalid bearer token")
        seq = 0
        async for request in request_iterator:
            kind = request.WhichOneof("msg")
            self.received.append(kind)
            if kind == "config":
                yield Response(started=gateway_pb2.SessionStarted(session_id="s1", engine="e"))
            elif kind == "audio":
                seq += 1
                yield Response(audio=gateway_pb2.AgentAudioChunk(data=request.audio, seq=seq))
            elif kind == "dtmf":
                yield Response(dtmf=request.dtmf)


@pytest.fixture
async def gateway():
    servicer = EchoGateway()
    server = grpc.aio.server()
    gateway_pb2_grpc.add_GatewayServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield f"127.0.0.1:{port}", servicer
    await server.stop(None)


async def test_a_call_sends_the_config_then_audio_and_keys_and_reads_events(gateway):
    address, servicer = gateway
    async with ConverseClient.connect(address, token="good") as client:
        events = []

        async def read() -> None:
            async for event in client.events():
                events.append(event)

        reader = asyncio.ensure_future(read())
        assert await client.start(gateway_pb2.ConverseConfig())
        await asyncio.wait_for(client.wait_started(reader), 5)
        assert client.session.session_id == "s1"
        assert await client.send_audio(b"\x00\x01")
        assert await client.send(Request(dtmf=common_pb2.Dtmf(digit="#")))
        await client.done_writing()
        await asyncio.wait_for(reader, 5)
        assert await client.code() == grpc.StatusCode.OK
    assert servicer.received == ["config", "audio", "dtmf"]
    assert [e["type"] for e in events] == ["started", "agent_audio", "dtmf"]


async def test_a_refused_call_raises_its_status_where_it_is_read_and_writes_say_false(gateway):
    address, _ = gateway
    async with ConverseClient.connect(address, token="bad") as client:
        await client.start(gateway_pb2.ConverseConfig())
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async for _ in client.responses():
                pass
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert not client.started.is_set()
        assert not await client.send_audio(b"\x00\x01")  # the call is over: no exception
        await client.done_writing()
