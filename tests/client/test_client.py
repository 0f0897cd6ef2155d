"""The one Converse client (kame_client/client.py): it sends the config first,
audio, keys and requests only once the session started, and reads the
gateway's status where it ends the call."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import grpc
import numpy as np
import pytest

import kame_client
from kame_client.caller import TalkOptions, talk
from kame_client.client import (
    CancelResponse,
    ConverseClient,
    EndTurn,
    HalfClose,
    Respond,
    SendFunctionResult,
    SendText,
)
from kame_client.events import AgentAudio, Dtmf, Started
from kame_common.audio import SAMPLE_RATE
from kamepb import common_pb2, gateway_pb2, gateway_pb2_grpc

Response = gateway_pb2.ConverseResponse
Request = gateway_pb2.ConverseRequest
Action = common_pb2.TurnControl.Action


class EchoGateway(gateway_pb2_grpc.GatewayServicer):
    """Starts a session on the config and answers each audio message with agent audio
    (refuses a token other than "good"); records what came in, in order."""

    def __init__(self) -> None:
        self.received: list[str] = []
        self.requests: list[Request] = []

    async def Converse(self, request_iterator, context):  # noqa: N802 (gRPC's name)
        if ("authorization", "Bearer good") not in context.invocation_metadata():
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "invalid bearer token")
        seq = 0
        async for request in request_iterator:
            kind = request.WhichOneof("msg")
            self.received.append(kind)
            self.requests.append(request)
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
    assert [type(e) for e in events] == [Started, AgentAudio, Dtmf]


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


async def test_each_caller_request_goes_as_its_message_once_started(gateway):
    address, servicer = gateway
    async with ConverseClient.connect(address, token="good") as client:
        reader = asyncio.ensure_future(drained(client))
        await client.start(gateway_pb2.ConverseConfig())
        await asyncio.wait_for(client.wait_started(reader), 5)
        for request in (
            EndTurn(),
            Respond(),
            CancelResponse(),
            SendText("what is the time?"),
            SendFunctionResult("c1", "sunny", is_error=True),
            HalfClose(),
        ):
            assert await client.perform(request)
        await asyncio.wait_for(reader, 5)
    sent = servicer.requests[1:]
    assert [r.turn_control.action for r in sent[:3]] == [
        Action.END_TURN,
        Action.RESPOND,
        Action.CANCEL,
    ]
    assert sent[3].user_text.text == "what is the time?"
    result = sent[4].function_result
    assert (result.call_id, result.output, result.is_error) == ("c1", "sunny", True)
    assert len(sent) == 5, "the half-close ends the stream: no message of its own"
    assert CancelResponse.URGENT and not any(r.URGENT for r in (EndTurn(), Respond(), HalfClose()))


# Calls whose end comes while the caller floods audio: with the old client, grpc.aio
# reported INTERNAL "Internal error from Core" for some of them (grpc/grpc#36066).
FLOODED_CALLS = 12


async def test_a_call_the_gateway_ends_mid_stream_says_the_gateways_status(fakes):
    """The gateway ends a call whose caller is still writing (here: past its
    max_session_s of audio, or of time). Whether or not a write was under way, the client
    reports the gateway's status (OUT_OF_RANGE, its words), as its CallEnding said."""
    gateway = await fakes.gateway(max_session_s=0.4)
    frame = bytes(2 * 1920)  # 80 ms of PCM16 at 24 kHz
    for _ in range(FLOODED_CALLS):
        async with ConverseClient.connect(gateway.address) as client:
            reader = asyncio.ensure_future(drained(client))
            await client.start(gateway_pb2.ConverseConfig())
            await asyncio.wait_for(client.wait_started(reader), 5)
            while await client.send_audio(frame):
                pass
            with pytest.raises(grpc.aio.AioRpcError) as ended:
                await asyncio.wait_for(reader, 5)
        # Its cap of caller audio, or of wall time when a loaded machine delays the
        # flood: the gateway's own words either way, never gRPC Core's INTERNAL.
        assert ended.value.code() == grpc.StatusCode.OUT_OF_RANGE, ended.value.details()
        assert (ended.value.details() or "").startswith("the session reached its cap of 0.4 s"), (
            ended.value.details()
        )


class SilentGateway(gateway_pb2_grpc.GatewayServicer):
    """Takes the call and its config, then never starts the session nor ends the call."""

    async def Converse(self, request_iterator, context):  # noqa: N802 (gRPC's name)
        async for _ in request_iterator:
            await asyncio.Event().wait()
        yield Response()  # never reached: a generator, as gRPC's streaming handlers are


async def test_a_call_the_gateway_never_starts_ends_at_the_start_timeout():
    server = grpc.aio.server()
    gateway_pb2_grpc.add_GatewayServicer_to_server(SilentGateway(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        options = TalkOptions(gateway=f"127.0.0.1:{port}", start_timeout_s=0.5)
        result = await asyncio.wait_for(talk(np.zeros(SAMPLE_RATE, np.float32), options), 10)
    finally:
        await server.stop(None)
    assert result.status == "DEADLINE_EXCEEDED"
    assert "did not start the session in 0.5 s" in result.status_details
    assert result.started is None


async def drained(client: ConverseClient) -> None:
    async for _ in client.events():
        pass


def test_the_client_package_imports_without_the_services():
    """kame_client ships on its own: none of its modules may need services/."""
    modules = sorted(p.stem for p in Path(kame_client.__file__).parent.glob("*.py"))
    code = "import sys\nsys.modules['services'] = None\n" + "".join(
        f"import kame_client.{name}\n" for name in modules if name != "__init__"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert {"client", "events", "status", "codecs", "microphone", "caller"} <= set(modules)
