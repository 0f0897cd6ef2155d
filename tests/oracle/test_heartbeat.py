"""HEARTBEAT events: the sign of life a client asks for, sent whether or not
anything else happens, and only when asked."""

from __future__ import annotations

import asyncio
import itertools

import grpc

from kamepb import oracle_pb2

Event = oracle_pb2.OracleEvent


async def test_heartbeats_come_as_often_as_asked_while_nothing_else_does(
    oracle_service, guide_client, stub_http, session_id
):
    _server, url = await stub_http({})
    runtime = await oracle_service(base_url=f"{url}/v1", model="stub-model")
    client = guide_client(runtime.port)
    await client.config(session_id=session_id, heartbeat_interval_s=0.1)
    await asyncio.sleep(1.0)
    beats = [
        t
        for r, t in zip(client.responses, client.arrival, strict=True)
        if r.event.kind == Event.HEARTBEAT
    ]
    assert len(beats) >= 5, client.responses  # about 10 on an idle machine
    assert max(b - a for a, b in itertools.pairwise(beats)) < 0.5
    assert len(beats) == len(client.responses)  # nobody spoke: nothing else came
    assert await client.finish() == grpc.StatusCode.OK


async def test_no_heartbeats_unless_asked(oracle_service, guide_client, stub_http, session_id):
    _server, url = await stub_http({})
    runtime = await oracle_service(base_url=f"{url}/v1", model="stub-model")
    client = guide_client(runtime.port)
    await client.config(session_id=session_id)
    await asyncio.sleep(0.5)
    assert await client.finish() == grpc.StatusCode.OK
    assert not client.events(Event.HEARTBEAT)
