"""The GPT-Live endpoint, /v1/live/sessions, driven by the official `openai` SDK
as its users drive it (`AsyncOpenAI(base_url=...).live.connect()`), against the
web service and a real gateway in front of the scripted fake upstreams
(tests/gateway/fakes.py): a client delegation answered through the gateway,
and bad input (events before session.start, unknown events, wrong formats,
oversize messages, commentary for an unknown delegation, a model the web
service does not offer, a wrong token, no session.start at all): the
protocol's error, nothing crashes, and another session at the same time goes
on untouched."""

from __future__ import annotations

import asyncio
import base64
import contextlib

import pytest
import websockets
from openai import AsyncOpenAI
from websockets.exceptions import ConnectionClosed

from kamepb import common_pb2
from tests.gateway.fakes import transcript
from tests.web.test_realtime import ONE_SECOND, TOKEN, events_until, received, web_service

Context = common_pb2.AgentContext
START = {"model": "gpt-live-1"}


def connect(web, token: str = TOKEN):
    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{web.port}/v1", api_key=token)
    return client.live.connect()


async def started(connection, session: dict | None = None):
    await connection.session.start(session=session or START)
    (event,) = await received(connection, 1)
    assert event.type == "session.started", event
    return event


async def errors_of(connection, count: int, timeout_s: float = 10.0) -> list:
    """The next `count` error events (the agent's audio, which the bridge's pacing
    keeps flowing, left out)."""
    errors = []
    async with asyncio.timeout(timeout_s):
        while len(errors) < count:
            if (event := await connection.recv()).type == "error":
                errors.append(event)
    return errors


async def stream(connection, seconds: float) -> None:
    """Silence appended at real time, 0.1 s at a time (the agent speaks in caller frames)."""
    for _ in range(round(seconds / 0.1)):
        await connection.session.input_audio.append(
            audio=base64.b64encode(ONE_SECOND[: len(ONE_SECOND) // 10]).decode()
        )
        await asyncio.sleep(0.1)


async def test_a_client_delegation_is_answered_through_the_gateway(fakes):
    fakes.stt.script = {6: [transcript("u-1", "What is the door code?", True, 0.4)]}
    async with web_service(fakes) as web, connect(web) as connection:
        first = await started(connection)
        assert first.session.delegation.type == "client"
        streaming = asyncio.ensure_future(stream(connection, 3.0))
        seen = await events_until(connection, "session.delegation.created")
        created = seen[-1]
        assert created.delegation.target == "client" and created.offset_ms > 0
        question = "".join(e.delta for e in seen if e.type == "session.input_transcript.delta")
        assert question == "What is the door code?"
        await connection.session.commentary.append(
            content="It is 4417.", delegation_id=created.delegation.id, event_id="c1"
        )
        await connection.session.commentary.append(
            content="Made up.", delegation_id="delegation-99", event_id="c2"
        )
        acknowledged = await events_until(connection, "session.commentary.appended")
        refused = await events_until(connection, "error")
        streaming.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await streaming
        await connection.session.close()
        closed = await events_until(connection, "session.closed")

    assert acknowledged[-1].client_event_id == "c1"
    assert (refused[-1].error.code, refused[-1].client_event_id) == ("delegation_not_found", "c2")
    (config,) = fakes.oracle.log.of("config")
    assert config.client_delegation
    relayed = [(c.kind, c.text, c.delegation_id) for c in fakes.oracle.log.of("context")]
    assert relayed == [(Context.COMMENTARY, "It is 4417.", created.delegation.id)]
    assert closed[-1].reason == "close_requested"


async def test_bad_input_gets_the_protocols_error_and_another_session_goes_on(fakes):
    fakes.frontend.speak_at = 0  # every agent frame speaks: the other session hears it
    async with web_service(fakes) as web, connect(web) as other, connect(web) as bad:
        await started(other)
        await bad.send({"type": "session.input_audio.append", "audio": "AAAA", "event_id": "e1"})
        (early,) = await received(bad, 1)
        await started(bad)
        await bad.send({"type": "session.dance", "event_id": "e2"})
        await bad.send({"type": "session.input_audio.append", "audio": "AAA", "event_id": "e3"})
        await bad.send({"type": "session.input_audio.append", "audio": "A" * 4_000_000})
        await bad.send({"type": "session.commentary.append", "content": "", "delegation_id": None})
        await bad.send({"type": "response.create"})
        errors = await errors_of(bad, 5)
        # The other session still talks with the agent.
        await other.session.input_audio.append(audio=base64.b64encode(ONE_SECOND).decode())
        heard = await events_until(other, "session.output_audio.delta")

    assert (early.type, early.error.code, early.client_event_id) == (
        "error",
        "session_not_started",
        "e1",
    )
    assert [(e.type, e.error.code) for e in errors] == [
        ("error", "invalid_value"),  # an unknown event
        ("error", "invalid_value"),  # audio that is not whole samples
        ("error", "audio_too_long"),
        ("error", "invalid_value"),  # empty commentary
        ("error", "unsupported_event"),  # response.create without Responses delegation
    ]
    assert [e.client_event_id for e in errors[:2]] == ["e2", "e3"]
    assert heard[-1].type == "session.output_audio.delta"


@pytest.mark.parametrize(
    ("session", "code"),
    [
        ({"model": "gpt-4o-realtime-preview"}, "model_not_found"),
        (
            {
                "model": "gpt-live-1",
                "delegation": {"type": "responses", "responses": {"model": "o3"}},
            },
            "model_not_found",
        ),
        (
            {"model": "gpt-live-1", "audio": {"format": {"type": "audio/pcm", "rate": 8000}}},
            "invalid_value",
        ),
    ],
)
async def test_a_start_that_cannot_be_served_is_an_error_and_no_session(fakes, session, code):
    async with web_service(fakes) as web, connect(web) as connection:
        await connection.session.start(session=session)
        (error,) = await received(connection, 1)
        await connection.session.start(session=START)  # the socket takes a right one
        (event,) = await received(connection, 1)
    assert (error.type, error.error.code) == ("error", code)
    assert event.type == "session.started"
    assert fakes.frontend.log.opened == 1  # the refused start opened no call


async def test_a_wrong_token_is_the_gateways_refusal_and_no_session(fakes):
    async with web_service(fakes) as web, connect(web, token="not-the-token") as connection:
        await connection.session.start(session=START)
        (error,) = await received(connection, 1)
        with pytest.raises(ConnectionClosed):
            await received(connection, 1)
    assert (error.type, error.error.code) == ("error", "unauthenticated")
    assert fakes.frontend.log.opened == 0


async def test_sockets_count_from_their_session_start_and_must_start_in_time(fakes):
    async with web_service(fakes, max_sessions=1, start_timeout_s=1.0) as web:
        url = f"ws://127.0.0.1:{web.port}/v1/live/sessions"
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with websockets.connect(url, additional_headers=headers) as idle:
            async with connect(web) as connection:
                await started(connection)  # the idle socket holds no slot
                async with connect(web) as third:
                    await third.session.start(session=START)
                    # Its call started at the gateway (the token is good), then the web
                    # service, at its limit, ends it.
                    busy = await received(third, 1)
                    while busy[0].type != "error":
                        busy = await received(third, 1)
                    busy = busy[0]
            with pytest.raises(ConnectionClosed) as closed:
                await asyncio.wait_for(idle.recv(), 5)
                await asyncio.wait_for(idle.recv(), 5)
    assert (busy.type, busy.error.code) == ("error", "resource_exhausted")
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008


async def test_a_message_over_the_size_limit_closes_the_socket_and_not_the_service(fakes):
    async with web_service(fakes) as web:
        async with connect(web) as connection:
            await started(connection)
            oversize = {"type": "session.input_audio.append", "audio": "A" * (17 << 20)}
            with pytest.raises(ConnectionClosed) as closed:
                await connection.send(oversize)
                await received(connection, 2)
        async with connect(web) as after:
            await started(after)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
