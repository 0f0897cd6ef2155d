"""The gateway's client port as an attacker meets it (a real gateway on
loopback; its upstreams are addresses where nothing listens, since every check
here happens before a session needs them): bearer tokens in metadata, the
slow-down of a peer that keeps guessing, reflection off, and error messages
that name no internal address."""

from __future__ import annotations

import asyncio
import logging
import os
import time

import grpc
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from prometheus_client import REGISTRY

from kame_common import auth
from kame_common.auth import PeerThrottle, peer_host, peer_key
from kame_common.redact import REDACTED, redact_addresses
from kamepb import gateway_pb2
from services.gateway.config import GatewaySettings
from services.gateway.server import serve
from tests.gateway.fakes import sync_converse
from tests.support import wait_until

TOKEN_A = "alpha-token-0123456789abcdef"
TOKEN_B = "bravo-token-0123456789abcdef"
NOWHERE = "127.0.0.1:1"  # nothing listens on port 1
AUDIO_FIRST = gateway_pb2.ConverseRequest(audio=bytes(3840))
PCM = gateway_pb2.AudioFormat(codec=gateway_pb2.AudioFormat.PCM16, sample_rate_hz=24000)
CONFIG_FIRST = gateway_pb2.ConverseRequest(
    config=gateway_pb2.ConverseConfig(input_format=PCM, output_format=PCM)
)


@pytest.fixture
async def gateway(e2e_redis_url):
    """start(**settings) -> a running gateway whose upstreams are all unreachable."""
    runtimes = []

    async def start(**overrides):
        settings = dict(
            host="127.0.0.1",
            port=0,
            metrics_port=0,
            redis_url=e2e_redis_url,
            stt_address=NOWHERE,
            oracle_address=NOWHERE,
            frontend_address=NOWHERE,
            connect_timeout_s=3.0,
            registry_secret="registry-secret-for-edge-tests",  # no stray record is chosen
            readiness_interval_s=0,  # admit calls to the missing upstreams: the edge is tested
        )
        config = GatewaySettings(**{**settings, **overrides})
        config.validate()
        runtimes.append(await serve(config))
        return runtimes[-1]

    yield start
    for runtime in runtimes:
        await runtime.stop()


@pytest.fixture
def e2e_redis_url(redis_url) -> str:
    return os.environ.get("KAME_TEST_E2E_REDIS_URL", redis_url)


async def converse(
    address: str, first: gateway_pb2.ConverseRequest, token: str | None = None, header: str = ""
) -> tuple[str, str]:
    """One call that sends `first` and half-closes; (status name, details). The sync
    client, in a thread: the gateway refuses a bad token before it reads the request,
    and a grpc.aio client still writing then may report INTERNAL instead."""
    value = header or (f"Bearer {token}" if token is not None else "")
    metadata = (("authorization", value),) if value else ()
    code, details, _ = await asyncio.to_thread(sync_converse, address, [first], metadata)
    return code.name, details


def failures(reason: str) -> float:
    return REGISTRY.get_sample_value("kame_gateway_auth_failures_total", {"reason": reason}) or 0.0


# -- bearer tokens -------------------------------------------------------------------------------


async def test_missing_or_wrong_tokens_are_unauthenticated_and_either_valid_token_works(
    gateway, caplog
):
    runtime = await gateway(auth_tokens=f"{TOKEN_A}, {TOKEN_B}")
    before = {reason: failures(reason) for reason in ("missing", "malformed", "invalid")}
    wrong = "alpha-token-0123456789abcdeX"  # one character off
    with caplog.at_level(logging.WARNING, logger="kame_common.auth"):
        assert await converse(runtime.address, CONFIG_FIRST) == (
            "UNAUTHENTICATED",
            "send the metadata 'authorization: Bearer <token>'",
        )
        assert await converse(runtime.address, CONFIG_FIRST, token=wrong) == (
            "UNAUTHENTICATED",
            "the bearer token is not valid",
        )
        code, details = await converse(runtime.address, CONFIG_FIRST, header=f"Basic {TOKEN_A}")
        assert (code, "must be 'Bearer <token>'" in details) == ("UNAUTHENTICATED", True)

    # Past the check, the call meets the next one: the config must come first.
    for token in (TOKEN_A, TOKEN_B):
        code, details = await converse(runtime.address, AUDIO_FIRST, token=token)
        assert code == "INVALID_ARGUMENT" and "first message must be the config" in details

    assert {r: failures(r) - before[r] for r in before} == {
        "missing": 1,
        "malformed": 1,
        "invalid": 1,
    }
    assert "invalid token" in caplog.text and "ipv4:127.0.0.1" in caplog.text
    assert wrong not in caplog.text and TOKEN_A not in caplog.text


async def test_without_tokens_every_caller_is_admitted(gateway):
    runtime = await gateway()
    code, details = await converse(runtime.address, AUDIO_FIRST)
    assert code == "INVALID_ARGUMENT" and "first message must be the config" in details


async def test_a_peer_that_keeps_failing_is_slowed_down_and_a_valid_token_still_works(gateway):
    """A valid token from the same address does not wipe the failures: web and
    telephony call from their pod's one address, and a guesser behind them started
    afresh whenever a real caller got in (the old gateway held the sixth guess 0 s)."""
    runtime = await gateway(auth_tokens=TOKEN_A)
    wrong = "wrong-token-0123456789abcdef"

    async def held_s() -> float:
        started = time.monotonic()
        assert (await converse(runtime.address, CONFIG_FIRST, token=wrong))[0] == "UNAUTHENTICATED"
        return time.monotonic() - started

    held = [await held_s() for _ in range(5)]
    # 3 free failures, then held 0.5 s, then 1 s (a lower bound: sleeps never end early).
    assert held[3] >= 0.5 and held[4] >= 1.0
    assert (await converse(runtime.address, AUDIO_FIRST, token=TOKEN_A))[0] == "INVALID_ARGUMENT"
    assert await held_s() >= 2.0  # the sixth failure, however many calls got in between


def test_the_throttle_doubles_caps_forgets_and_stays_bounded():
    now = [0.0]
    throttle = PeerThrottle(
        free_failures=2,
        base_delay_s=1.0,
        max_delay_s=4.0,
        forget_after_s=60.0,
        max_peers=3,
        clock=lambda: now[0],
    )
    assert throttle.slowed("a") == 0
    assert [throttle.failed("a")[1] for _ in range(6)] == [0, 0, 1, 2, 4, 4]
    assert throttle.slowed("a") == 4  # what its next failure would be held
    now[0] = 61.0
    assert throttle.slowed("a") == 0
    assert throttle.failed("b") == (1, 0)
    assert len(throttle) == 1  # "a" was forgotten
    for peer in ("c", "d", "e"):
        throttle.failed(peer)
    assert len(throttle) == 3  # the least recent peer made room


async def test_a_flood_of_bad_tokens_holds_a_bounded_number_of_calls(gateway, monkeypatch):
    """The attack: many refused calls at once, each held open by the slow-down (and
    counted nowhere) while it lasts. At most MAX_HELD are held. Past them, a peer
    being slowed down is refused at once without its token being looked at: the
    old gateway answered every further guess at once, 'invalid', so a flood
    guessed at full speed."""
    monkeypatch.setattr(auth, "MAX_HELD", 2)
    runtime = await gateway(auth_tokens=TOKEN_A)
    wrong = "wrong-token-0123456789abcdef"
    for _ in range(3):  # the free failures
        assert (await converse(runtime.address, CONFIG_FIRST, token=wrong))[0] == "UNAUTHENTICATED"
    before = failures("throttled")
    holding = [asyncio.ensure_future(converse(runtime.address, CONFIG_FIRST, token=wrong))]
    holding.append(asyncio.ensure_future(converse(runtime.address, CONFIG_FIRST, token=wrong)))
    await wait_until(lambda: held_refusals() == 2, "two refusals held", 10)
    flood = await asyncio.gather(
        *(converse(runtime.address, CONFIG_FIRST, token=token) for token in [wrong] * 4 + [TOKEN_A])
    )
    for code, details in flood:  # the valid token too: it was not even checked
        assert code == "RESOURCE_EXHAUSTED", (code, details)
        assert "too many failed attempts from this address; retry in" in details
    assert failures("throttled") == before + 5
    assert [code for code, _ in await asyncio.gather(*holding)] == ["UNAUTHENTICATED"] * 2
    assert (await converse(runtime.address, AUDIO_FIRST, token=TOKEN_A))[0] == "INVALID_ARGUMENT"


def held_refusals() -> float:
    return REGISTRY.get_sample_value("kame_gateway_auth_held_refusals") or 0.0


def test_ipv6_peers_are_keyed_by_their_64():
    """One host gets a /64 of IPv6 addresses: a new address each guess is no new peer."""
    first, second = "ipv6:[2001:db8:1:2:aaaa::1]:5001", "ipv6:[2001:db8:1:2:bbbb::9]:5002"
    assert peer_key(first) == peer_key(second) == "ipv6:2001:db8:1:2::/64"
    assert peer_key("ipv6:[2001:db8:1:3::1]:5001") != peer_key(first)
    assert peer_key("ipv4:10.0.0.7:51234") == "ipv4:10.0.0.7"


def test_peers_are_keyed_by_address_without_the_port():
    assert peer_host("ipv4:10.0.0.7:51234") == "ipv4:10.0.0.7"
    assert peer_host("ipv6:[fd00::1]:51234") == "ipv6:[fd00::1]"
    assert peer_host("unix:/tmp/sock") == "unix:/tmp/sock"


# -- what the client port shows ------------------------------------------------------------------


async def list_services(address: str) -> str | set[str]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        try:
            async for response in stub.ServerReflectionInfo(iter([request])):
                return {s.name for s in response.list_services_response.service}
        except grpc.aio.AioRpcError as exc:
            return exc.code().name
    return set()


async def test_reflection_is_off_on_the_client_port_unless_enabled(gateway):
    assert await list_services((await gateway()).address) == "UNIMPLEMENTED"
    assert "kame.v1.Gateway" in await list_services((await gateway(reflection=True)).address)


async def test_a_failing_frontend_is_reported_without_its_address(gateway):
    # The "frontend" is a real gRPC server that serves no Frontend: it answers UNIMPLEMENTED.
    not_a_frontend = await gateway()
    runtime = await gateway(frontend_address=not_a_frontend.address)
    code, details = await converse(runtime.address, CONFIG_FIRST)
    assert code == "UNAVAILABLE"
    assert "frontend" in details and "UNIMPLEMENTED" in details
    assert "127.0.0.1" not in details and str(not_a_frontend.port) not in details


@pytest.mark.parametrize(
    "message, kept",
    [
        ("the frontend 10.2.3.4:50052 failed: ipv4:10.2.3.4:50052: refused", "the frontend"),
        ("oracle LLM error: no answer within 10 s from http://llm.kame.svc:8080/v1", "within 10 s"),
        ("frontend-0.frontend.kame.svc.cluster.local:50052 is unavailable", "is unavailable"),
        ("the frontend [fd00::1]:50052 failed", "failed"),
    ],
)
def test_addresses_are_redacted_and_the_words_around_them_kept(message, kept):
    redacted = redact_addresses(message)
    assert kept in redacted and REDACTED in redacted
    for leaked in ("10.2.3.4", "llm.kame.svc", "cluster.local", "fd00::1", "50052", "8080"):
        assert leaked not in redacted


@pytest.mark.parametrize(
    "message",
    [
        "gateway is at its limit of 1 sessions",
        "the session reached its cap of 0.5 s of caller audio",
        "input_format.codec: unknown codec 42; choose PCM16, MULAW, ALAW or OPUS",
        "no config within 10.0 s of opening the stream",
        "functions[0].name: must be 1-64 characters; tools[12] is declared twice",
    ],
)
def test_messages_without_addresses_are_unchanged(message):
    assert redact_addresses(message) == message
