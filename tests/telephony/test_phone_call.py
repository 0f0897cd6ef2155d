"""A PhoneCall alone, against a real gateway on loopback whose upstreams are the
scripted fakes of tests/gateway: the Converse config a phone call makes, audio
both ways without transcoding, keys, a barge-in that clears the far end, and
either side hanging up. The protocols (SIP, Twilio, AudioSocket) have their own
tests with real peers."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import time

import grpc
from prometheus_client import REGISTRY

from services.telephony.call import CallInfo, CallSettings, Ended, PhoneCall
from services.telephony.playout import PCMA, PCMU
from tests.support import wait_until

SETTINGS = CallSettings(mode=1, auth_token="", prebuffer_ms=40, max_queued_ms=1000)
PACKET = b"\x55" * 160  # 20 ms of A-law/mu-law


class Leg:
    """A phone's side that records what the call did to it."""

    def __init__(self) -> None:
        self.packets: list[tuple[bytes, bool]] = []
        self.cleared = 0
        self.hung_up: str | None = None

    async def send_audio(self, packet: bytes, speaking: bool) -> None:
        self.packets.append((packet, speaking))

    async def clear(self) -> None:
        self.cleared += 1

    async def hang_up(self, reason: str) -> None:
        self.hung_up = reason


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def active_sessions(service: str) -> float:
    return REGISTRY.get_sample_value("kame_active_sessions", {"service": service}) or 0.0


async def talk(call: PhoneCall, packets: int) -> None:
    """The phone's side at real time: a 20 ms packet every 20 ms."""
    for _ in range(packets):
        call.caller_audio(PACKET)
        await asyncio.sleep(0.02)


async def test_a_phone_call_is_one_converse_call_in_the_phones_codec(fakes, redis_url):
    fakes.frontend.speak_at = 3
    gateway = await fakes.gateway()
    leg = Leg()
    info = CallInfo("sip", "sip:+15550100@trunk", "sip:agent@kame", "call-1")
    async with grpc.aio.insecure_channel(gateway.address) as channel:
        call = PhoneCall(channel, SETTINGS, info, PCMA, leg)
        running = asyncio.ensure_future(call.run())
        await talk(call, 20)  # 400 ms: five gateway frames
        call.caller_dtmf("7", 120)
        await talk(call, 8)
        await wait_until(lambda: call.dtmf_echoed == ["7"], "the key's echo", 3)
        call.caller_hung_up()
        assert await asyncio.wait_for(running, 5) is Ended.CALLER_HUNG_UP
    assert leg.hung_up is None  # the caller hung up: nothing to tell the phone
    # The agent's audio came back in 20 ms A-law packets, the speech marked as such.
    assert leg.packets and all(len(p) == 160 for p, _ in leg.packets)
    assert any(speaking for _, speaking in leg.packets)
    (config,) = fakes.frontend.log.of("config")
    assert config.session_id == call.session_id
    record = await fakes.session_record(call.session_id)
    assert record["input_codec"] == record["output_codec"] == "alaw"
    assert record["call_provider_call_id"] == "call-1" and len(record["dtmf"]) == 1
    # Hanging up cancelled the Converse call: the gateway let the session go.
    await wait_until(lambda: active_sessions("gateway") == 0, "the gateway's session to end", 5)


async def test_a_barge_in_clears_what_the_phone_has_queued(fakes):
    fakes.frontend.speak_at = 1
    fakes.frontend.barge_in_at = 4
    gateway = await fakes.gateway()
    leg = Leg()
    async with grpc.aio.insecure_channel(gateway.address) as channel:
        call = PhoneCall(channel, SETTINGS, CallInfo("twilio"), PCMU, leg)
        running = asyncio.ensure_future(call.run())
        await talk(call, 30)
        await wait_until(lambda: leg.cleared == 1, "the far end cleared", 3)
        call.caller_hung_up()
        await asyncio.wait_for(running, 5)
    assert call.barge_ins == 1 and call.playout.stats.flushed_bytes > 0


async def test_the_gateway_ending_the_call_hangs_up_the_phone(fakes):
    fakes.frontend.fail_at = 3  # the frontend fails: the gateway ends the call UNAVAILABLE
    gateway = await fakes.gateway()
    leg = Leg()
    async with grpc.aio.insecure_channel(gateway.address) as channel:
        call = PhoneCall(channel, SETTINGS, CallInfo("audiosocket"), PCMU, leg)
        running = asyncio.ensure_future(call.run())
        await talk(call, 25)
        assert await asyncio.wait_for(running, 5) is Ended.GATEWAY_ERROR
    assert call.status.startswith("UNAVAILABLE") and leg.hung_up is not None
    assert "UNAVAILABLE" in leg.hung_up


async def test_a_gateway_that_is_not_there_hangs_up_the_phone_after_the_start_timeout():
    leg = Leg()
    settings = dataclasses.replace(SETTINGS, start_timeout_s=1.0)
    async with grpc.aio.insecure_channel("127.0.0.1:1") as channel:
        call = PhoneCall(channel, settings, CallInfo("sip"), PCMU, leg)
        started = time.monotonic()
        assert await asyncio.wait_for(call.run(), 10) is Ended.GATEWAY_ERROR
    assert 0.9 < time.monotonic() - started < 5
    assert call.status == "no session from the gateway within 1 s" and leg.hung_up


async def test_a_gateway_that_comes_up_late_still_takes_the_call(fakes):
    """wait_for_ready: the call waits for a gateway that is starting (a rollout)."""
    fakes.frontend.speak_at = 0
    port = free_port()
    leg = Leg()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = PhoneCall(channel, SETTINGS, CallInfo("sip"), PCMU, leg)
        running = asyncio.ensure_future(call.run())
        await asyncio.sleep(0.5)  # the call is waiting for a gateway
        await fakes.gateway(port=port)
        await talk(call, 10)
        await wait_until(lambda: call.started.is_set(), "the session to start", 4)
        call.caller_hung_up()
        assert await asyncio.wait_for(running, 5) is Ended.CALLER_HUNG_UP
