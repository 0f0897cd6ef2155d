"""Resuming a session: a call's resume token opens the same session again, on
another gateway too (the oracle loads the conversation so far), once (the
resumed call gets a new token) and not after a hang-up; tokens that resume
nothing are refused before any upstream is touched, and a draining gateway
asks its calls to reconnect with theirs. Same fakes and real Redis as
test_session.py, whose call helpers these share."""

from __future__ import annotations

import asyncio
import threading

import grpc
import pytest

from kame_common import store
from kame_common.auth import bearer_metadata
from kamepb import gateway_pb2, gateway_pb2_grpc
from services.gateway import resume
from tests.gateway.test_session import Config, Notice, converse, frame_bytes, held_open
from tests.support import wait_until

RESUME = {"resume_secret": "resume-secret-of-the-test-gateways"}


async def broken_off(
    fakes, address: str, config: gateway_pb2.ConverseConfig | None = None, bearer: str = ""
) -> gateway_pb2.SessionStarted:
    """A call that breaks off (its client cancels it, as a lost connection ends it)
    once the gateway has written its resume token's nonce: its SessionStarted."""

    async def requests():
        yield gateway_pb2.ConverseRequest(config=config or Config())
        yield gateway_pb2.ConverseRequest(audio=frame_bytes())
        await asyncio.Event().wait()

    async with grpc.aio.insecure_channel(address) as channel:
        call = gateway_pb2_grpc.GatewayStub(channel).Converse(
            requests(), metadata=bearer_metadata(bearer)
        )
        response = await call.read()
        assert response is not grpc.aio.EOF, await call.details()
        started = response.started
        client = store.connect(fakes.redis_url)
        try:
            sessions = store.SessionStore(client)
            await wait_until(
                lambda: sessions.resume_nonce(started.session_id), "the token's nonce", 5
            )
        finally:
            await client.aclose()
        call.cancel()
    return started


async def test_a_call_resumes_its_session_on_another_gateway(fakes):
    first_gateway, second_gateway = await fakes.gateway(**RESUME), await fakes.gateway(**RESUME)
    started = await broken_off(fakes, first_gateway.address)
    assert started.resume_token.startswith(f"{started.session_id}.") and not started.resumed

    config = Config(include_oracle_updates=True, resume_token=started.resume_token)
    # The call lasts until the oracle has its config: a loaded machine opens it late.
    oracle_opened = threading.Event()
    call = asyncio.ensure_future(
        converse(second_gateway.address, 3, config, pace_s=0.02, until=oracle_opened)
    )
    try:
        await wait_until(lambda: len(fakes.oracle.log.of("config")) == 2, "the oracle's config", 10)
    finally:
        oracle_opened.set()
    second = await call
    assert second.code == grpc.StatusCode.OK, second.details
    (again,) = second.of("started")
    assert again.session_id == started.session_id and again.resumed
    # The oracle gets the same session id again: it loads the conversation so far.
    assert [c.session_id for c in fakes.oracle.log.of("config")] == [started.session_id] * 2
    record = await fakes.session_record(started.session_id)
    assert float(record["resumed_at"]) >= float(record["started_at"])


async def test_a_token_resumes_once_and_the_resumed_call_gets_a_new_one(fakes):
    """The attack: a copy of a token (a log, a shared client) used to resume the
    session again and again, for as long as resume_ttl_s, each resume extending it."""
    gateway = await fakes.gateway(**RESUME)
    first = await broken_off(fakes, gateway.address)
    second = await broken_off(fakes, gateway.address, Config(resume_token=first.resume_token))
    assert second.resumed and second.session_id == first.session_id
    assert second.resume_token != first.resume_token  # rotated
    assert second.resume_token.startswith(f"{first.session_id}.")
    opened = fakes.frontend.log.opened
    replayed = await converse(
        gateway.address, frames=1, config=Config(resume_token=first.resume_token)
    )
    assert replayed.code == grpc.StatusCode.PERMISSION_DENIED, replayed.details
    assert "not valid any more" in replayed.details
    assert fakes.frontend.log.opened == opened  # refused before any upstream
    third = await converse(
        gateway.address, frames=1, config=Config(resume_token=second.resume_token)
    )
    assert third.code == grpc.StatusCode.OK, third.details
    assert third.of("started")[0].resumed


async def test_a_resume_that_fails_before_it_started_leaves_its_token_valid(fakes):
    """Used up before the frontend answered, the token would be lost with a resumed
    call that failed to open: the caller never got the new one."""
    gateway = await fakes.gateway(**RESUME)
    first = await broken_off(fakes, gateway.address)
    fakes.frontend.refuse = grpc.StatusCode.UNAVAILABLE
    config = Config(resume_token=first.resume_token)
    failed = await converse(gateway.address, frames=1, config=config)
    assert failed.code == grpc.StatusCode.UNAVAILABLE, failed.details
    fakes.frontend.refuse = None
    again = await converse(gateway.address, frames=1, config=config)
    assert again.code == grpc.StatusCode.OK, again.details
    assert again.of("started")[0].resumed


async def test_no_token_resumes_a_call_that_hung_up(fakes):
    """The attack: a token stayed good for resume_ttl_s after a normal hang-up."""
    gateway = await fakes.gateway(**RESUME)
    first = await converse(gateway.address, frames=2)  # the caller half-closes: hung up
    assert first.code == grpc.StatusCode.OK
    token = first.of("started")[0].resume_token
    again = await converse(gateway.address, frames=1, config=Config(resume_token=token))
    assert again.code == grpc.StatusCode.PERMISSION_DENIED, again.details
    assert "none does after its call hung up" in again.details
    assert fakes.frontend.log.opened == 1


@pytest.mark.parametrize(
    ("token", "code", "message"),
    [
        ("0123.forged", grpc.StatusCode.PERMISSION_DENIED, "not a token this service issued"),
        ("no-dot", grpc.StatusCode.PERMISSION_DENIED, "not a token this service issued"),
        ("valid-for-a-session-never-seen", grpc.StatusCode.NOT_FOUND, "has expired"),
    ],
)
async def test_a_token_that_resumes_nothing_is_refused(fakes, token, code, message):

    if token.startswith("valid"):
        token = resume.issue(RESUME["resume_secret"], token, "a-nonce")
    gateway = await fakes.gateway(**RESUME)
    outcome = await converse(gateway.address, frames=1, config=Config(resume_token=token))
    assert outcome.code == code and message in outcome.details
    assert fakes.frontend.log.opened == 0  # refused before any upstream was touched


async def test_a_resumed_session_keeps_its_mode_and_needs_resume_on(fakes):
    gateway = await fakes.gateway(**RESUME)
    first = await converse(gateway.address, frames=1)
    token = first.of("started")[0].resume_token
    other_mode = await converse(
        gateway.address, frames=1, config=Config(mode=Config.CASCADE, resume_token=token)
    )
    assert other_mode.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "a tandem session, not cascade" in other_mode.details
    no_resume = await fakes.gateway()
    refused = await converse(no_resume.address, frames=1, config=Config(resume_token=token))
    assert refused.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "does not resume sessions" in refused.details
    assert not (await converse(no_resume.address, frames=1)).of("started")[0].resume_token


async def test_a_call_resumes_after_redis_lost_its_record_under_it(fakes):
    """Redis restarts empty while a call is live (a soak's kill of Redis did): the
    call's lease renewal writes its binding again, so its own caller can still
    resume it later (it was refused PERMISSION_DENIED, 'another caller')."""
    gateway = await fakes.gateway(**RESUME)
    release = asyncio.Event()
    async with grpc.aio.insecure_channel(gateway.address) as channel:
        call = gateway_pb2_grpc.GatewayStub(channel).Converse(held_open(release))
        started = (await call.read()).started
        session_id = started.session_id

        async def bound() -> bool:
            return resume.PRINCIPAL_FIELD in await fakes.session_record(session_id)

        await wait_until(bound, "the session's binding in its record", 3)
        client = store.connect(fakes.redis_url)
        try:  # what a Redis restarted without its data holds of the session: nothing
            await client.delete(f"{store.PREFIX}:session:{session_id}")
            await client.delete(f"{store.PREFIX}:lease:{session_id}")
            await client.delete(f"{store.PREFIX}:resume:{session_id}")
            await wait_until(bound, "a lease renewal to write the binding again", 5)
            sessions = store.SessionStore(client)
            await wait_until(lambda: sessions.resume_nonce(session_id), "the nonce again", 5)
        finally:
            await client.aclose()
        call.cancel()  # the call breaks off
    again = await converse(
        gateway.address, frames=1, config=Config(resume_token=started.resume_token)
    )
    assert again.code == grpc.StatusCode.OK, again.details
    assert again.of("started")[0].resumed


async def test_a_draining_gateway_asks_its_calls_to_reconnect(fakes):
    gateway = await fakes.gateway(grace_s=5, **RESUME)
    release = asyncio.Event()

    async with grpc.aio.insecure_channel(gateway.address) as channel:
        call = gateway_pb2_grpc.GatewayStub(channel).Converse(held_open(release))
        assert (await call.read()).HasField("started")
        drain = asyncio.ensure_future(gateway.drain())
        responses = []
        while not (response := await call.read()).HasField("notice"):
            responses.append(response)
        assert response.notice.kind == Notice.RECONNECT
        assert "resume token" in response.notice.message
        release.set()  # the caller moves on: this call ends normally
        while (response := await call.read()) is not grpc.aio.EOF:
            responses.append(response)
        assert await call.code() == grpc.StatusCode.OK
    await asyncio.wait_for(drain, 5)
