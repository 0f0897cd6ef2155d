"""Asterisk AudioSocket against the telephony service: a test client speaks the
protocol as res_audiosocket does (UUID first, 320-byte slin packets every 20 ms,
DTMF, hang-up) against the service on loopback, with a real gateway behind it:
scripted fake upstreams for the protocol and its pacing, the whole real stack
for a question spoken by espeak-ng."""

from __future__ import annotations

import asyncio
import time

import pytest

from kame_common.audio import pcm16_to_float, resample, rms_dbfs
from tests.e2e import conftest as e2e
from tests.gateway import test_admission
from tests.support import conversation, session_record, wait_until, word_recall
from tests.support.metrics import metric
from tests.telephony.phone_support import (
    AUDIO,
    DTMF,
    ERROR,
    HANG_UP,
    SLIN_PACKET,
    AudioSocketClient,
    calls_ended,
    espeak_8k,
    fake_gateway,
    gateway_sessions,
    inter_arrival_ms,
    median,
    quiet_at_end,
    refused,
    speech_seconds,
    telephony_server,
    the_call,
)

# The real stack of tests/e2e (module-scoped), for the slow test here.
stack = e2e.stack
e2e_redis_url = e2e.e2e_redis_url
# The stt and oracle capacity registries of the admission tests.
registries = test_admission.registries

QUESTION = "What is the capital of Germany?"


@pytest.fixture(scope="module")
def question_slin() -> bytes:
    return espeak_8k(QUESTION)


async def test_a_call_gets_paced_audio_back_dtmf_through_and_a_clean_hang_up(
    redis_url, question_slin
):
    async with fake_gateway(redis_url) as gateway, telephony_server(gateway.address) as server:
        gateway.frontend.speaking = set(range(0, 1000))
        sessions_before = gateway_sessions()
        ended_before = calls_ended("audiosocket", "caller_hung_up")
        client = await AudioSocketClient.connect(server.audiosocket.port)
        try:
            await client.send_uuid()
            speaking = asyncio.create_task(client.speak(question_slin + b"\x00" * 16000))
            call = await the_call(server)
            await client.send(DTMF, b"x")  # not a key: dropped, the call goes on
            await client.send(DTMF, b"7")
            await wait_until(lambda: call.dtmf_echoed == ["7"], "the gateway's dtmf echo")
            await speaking
            record = await gateway.session_record(call.session_id)
            await client.send(HANG_UP)
            await wait_until(lambda: client.eof.is_set(), "the service to close the connection")
        finally:
            await client.close()
        await wait_until(
            lambda: gateway_sessions() == sessions_before, "the gateway session to end"
        )

    assert call.info.provider_call_id == str(client.call_id)
    assert record["call_provider"] == "audiosocket"
    assert record["call_provider_call_id"] == str(client.call_id)
    assert len(record["dtmf"]) == 1  # one key (the gateway may mask its digit: "*")
    assert calls_ended("audiosocket", "caller_hung_up") == ended_before + 1

    # Agent audio came back as 20 ms slin packets, paced: one every 20 ms.
    audio = client.of(AUDIO)
    assert len(audio) > 100
    assert {len(payload) for _, payload in audio} == {SLIN_PACKET}
    gaps = inter_arrival_ms([at for at, _ in audio])
    assert 17.0 <= median(gaps) <= 23.0, median(gaps)
    span_s = audio[-1][0] - audio[0][0]
    assert (len(audio) - 1) * 0.020 == pytest.approx(span_s, rel=0.05)
    # The fake frontend echoes the caller: the question came back, audibly.
    heard = pcm16_to_float(b"".join(payload for _, payload in audio))
    assert rms_dbfs(heard) > -40
    # The caller hung up: the service does not hang up on it as well.
    assert HANG_UP not in client.kinds()


@pytest.mark.parametrize("how", ["the service stops", "the gateway ends the call"])
async def test_a_call_ended_on_the_services_side_sends_a_hang_up_packet(redis_url, how):
    async with fake_gateway(redis_url) as gateway, telephony_server(gateway.address) as server:
        if how == "the gateway ends the call":
            gateway.frontend.end_at = 10
        client = await AudioSocketClient.connect(server.audiosocket.port)
        try:
            await client.send_uuid()
            speaking = asyncio.create_task(client.silence(5.0))
            await the_call(server)
            if how == "the service stops":
                await server.stop()
            await wait_until(
                lambda: client.eof.is_set(), "the service to close the connection", 5.0
            )
            speaking.cancel()
            await asyncio.gather(speaking, return_exceptions=True)
        finally:
            await client.close()
    assert client.kinds()[-1] == HANG_UP
    assert client.of(HANG_UP) == [(client.of(HANG_UP)[0][0], b"")]


async def test_a_peer_outside_allowed_networks_is_closed_unanswered(redis_url):
    async with (
        fake_gateway(redis_url) as gateway,
        telephony_server(gateway.address, allowed_networks="10.0.0.0/8") as server,
    ):
        before = refused("audiosocket", "network")
        client = await AudioSocketClient.connect(server.audiosocket.port)
        try:
            await client.send_uuid()
            await wait_until(
                lambda: client.eof.is_set(), "the service to close the connection", 5.0
            )
        finally:
            await client.close()
        assert not server.telephony.calls
    assert client.received == []
    assert refused("audiosocket", "network") == before + 1


async def test_a_busy_service_answers_a_hang_up(redis_url):
    async with (
        fake_gateway(redis_url) as gateway,
        telephony_server(gateway.address, max_sessions=1) as server,
    ):
        before = refused("audiosocket", "busy")
        first = await AudioSocketClient.connect(server.audiosocket.port)
        second = None
        try:
            await first.send_uuid()
            speaking = asyncio.create_task(first.silence(3.0))
            await the_call(server)
            second = await AudioSocketClient.connect(server.audiosocket.port)
            await second.send_uuid()
            await wait_until(lambda: second.eof.is_set(), "the second connection to close", 5.0)
            speaking.cancel()
            await asyncio.gather(speaking, return_exceptions=True)
        finally:
            await first.close()
            if second is not None:
                await second.close()
    assert second.kinds() == [HANG_UP]
    assert refused("audiosocket", "busy") == before + 1


@pytest.mark.parametrize(
    ("case", "data"),
    [
        ("audio before the UUID", bytes([AUDIO, 0x01, 0x40]) + b"\x00" * 320),
        ("an unknown kind", bytes([0x12, 0x00, 0x02, 0x00, 0x00])),
        ("a UUID of 15 bytes", bytes([0x01, 0x00, 0x0F]) + b"\x01" * 15),
    ],
)
async def test_a_malformed_first_packet_closes_the_connection(redis_url, case, data):
    async with fake_gateway(redis_url) as gateway, telephony_server(gateway.address) as server:
        before = refused("audiosocket", "protocol")
        client = await AudioSocketClient.connect(server.audiosocket.port)
        try:
            client.writer.write(data)
            await wait_until(lambda: client.eof.is_set(), f"{case}: the connection closed", 5.0)
        finally:
            await client.close()
        assert not server.telephony.calls
    assert refused("audiosocket", "protocol") == before + 1


async def test_a_malformed_packet_mid_call_ends_the_call(redis_url):
    async with fake_gateway(redis_url) as gateway, telephony_server(gateway.address) as server:
        sessions_before = gateway_sessions()
        before = refused("audiosocket", "protocol")
        client = await AudioSocketClient.connect(server.audiosocket.port)
        try:
            await client.send_uuid()
            await client.silence(0.3)
            await the_call(server)
            await client.send(AUDIO, b"\x00" * 17_000)  # more than a second of audio
            await wait_until(lambda: client.eof.is_set(), "the connection to close", 5.0)
        finally:
            await client.close()
        await wait_until(lambda: not server.telephony.calls, "the call to end", 5.0)
        await wait_until(
            lambda: gateway_sessions() == sessions_before, "the gateway session to end"
        )
    assert refused("audiosocket", "protocol") == before + 1


async def test_an_asterisk_error_packet_ends_the_call(redis_url):
    async with fake_gateway(redis_url) as gateway, telephony_server(gateway.address) as server:
        before = calls_ended("audiosocket", "caller_hung_up")
        client = await AudioSocketClient.connect(server.audiosocket.port)
        try:
            await client.send_uuid()
            await client.silence(0.3)
            await the_call(server)
            await client.send(ERROR, b"\x04")
            await wait_until(lambda: client.eof.is_set(), "the connection to close", 5.0)
        finally:
            await client.close()
    assert calls_ended("audiosocket", "caller_hung_up") == before + 1


@pytest.mark.e2e  # the embedded stack (tests/support/tiers.py)
@pytest.mark.asyncio(loop_scope="module")
async def test_an_asterisk_caller_asking_in_espeaks_voice_hears_an_answer(
    stack, transcribe, question_slin
):
    """espeak-ng (not piper) asks over AudioSocket at real time; the whole stack
    answers in 8 kHz slin, paced at 20 ms, and the caller's hang-up ends it."""
    async with telephony_server(stack.gateway.address) as server:
        client = await AudioSocketClient.connect(server.audiosocket.port)
        try:
            await client.send_uuid()
            line = asyncio.create_task(client.speak(question_slin + b"\x00" * 16_000 * 30))
            call = await the_call(server, timeout_s=15.0)
            asked_at = time.monotonic() + len(question_slin) / 16_000
            # More speech than a hold phrase ("Hmm,"), then a pause.
            await wait_until(
                lambda: (
                    speech_seconds(client.agent_samples(asked_at)) > 1.0
                    and quiet_at_end(client.agent_samples(), 1.0)
                ),
                "the agent to speak its answer and fall silent",
                30.0,
                interval_s=0.1,
            )
            line.cancel()
            await asyncio.gather(line, return_exceptions=True)
            await client.send(HANG_UP)
            await wait_until(lambda: client.eof.is_set(), "the connection to close", 5.0)
        finally:
            await client.close()

    async def closed() -> bool:  # the agent's last turn is logged when the session ends
        return "ended_at" in await session_record(stack.redis_url, call.session_id)

    await wait_until(closed, "the gateway to close the session's record", 10.0)
    record = await session_record(stack.redis_url, call.session_id)
    turns = await conversation(stack.redis_url, call.session_id)

    assert record["call_provider"] == "audiosocket"
    assert record["call_provider_call_id"] == str(client.call_id)
    user = [t["text"] for t in turns if t["role"] == "user"]
    assert any(word_recall("capital Germany", text) >= 0.5 for text in user), turns
    # What the agent said is audible and is words (Whisper hears some of them).
    answer = client.agent_samples(after=asked_at)
    assert rms_dbfs(answer) > -45
    heard = await asyncio.to_thread(transcribe, resample(answer, 8000, 24_000))
    spoken = " ".join(t["text"] for t in turns if t["role"] == "agent")
    assert word_recall(spoken, heard) >= 0.3, (spoken, heard)
    # Paced at 20 ms on a machine busy with the models.
    audio = client.of(AUDIO)
    assert {len(payload) for _, payload in audio} == {SLIN_PACKET}
    assert 15.0 <= median(inter_arrival_ms([at for at, _ in audio])) <= 25.0


# ---- abuse -----------------------------------------------------------------------------


async def test_a_burst_of_connections_passes_max_sessions_no_more_than_calls_one_by_one(
    redis_url,
):
    """Ten PBX connections at once, each sending its UUID only once all are open:
    two calls, eight hang-ups (the slot is taken when the connection is admitted,
    not when its Converse call starts)."""
    async with (
        fake_gateway(redis_url) as gateway,
        telephony_server(gateway.address, max_sessions=2) as server,
    ):
        clients = [await AudioSocketClient.connect(server.audiosocket.port) for _ in range(10)]
        try:
            for client in clients:
                await client.send_uuid()
            await wait_until(lambda: sum(c.eof.is_set() for c in clients) >= 8, "the refusals", 5.0)
            await wait_until(lambda: len(server.telephony.calls) == 2, "the two calls", 5.0)
            await asyncio.sleep(0.3)  # any more calls that would start
            assert len(server.telephony.calls) == 2
            assert sorted(c.kinds() for c in clients if c.eof.is_set()) == [[HANG_UP]] * 8
        finally:
            for client in clients:
                await client.close()
        await wait_until(lambda: server.telephony.slots == 0, "every slot given back", 5.0)


async def test_a_flood_of_keys_reaches_the_gateway_at_the_rate_limit(redis_url):
    """60 DTMF packets at once on a call allowed a burst of 5 and 2 a second: the
    gateway gets at most the limit, the rest is dropped and counted."""
    async with (
        fake_gateway(redis_url) as gateway,
        telephony_server(gateway.address, dtmf_burst=5, dtmf_rate_per_s=2) as server,
    ):
        dropped_before = metric("kame_telephony_dropped_dtmf_total", provider="audiosocket")
        client = await AudioSocketClient.connect(server.audiosocket.port)
        try:
            await client.send_uuid()
            speaking = asyncio.create_task(client.silence(3.0))
            call = await the_call(server)
            flood_at = time.monotonic()
            for _ in range(60):
                await client.send(DTMF, b"1")
            await wait_until(lambda: len(call.dtmf_echoed) >= 5, "the burst's keys")
            await asyncio.sleep(0.5)
            allowed = 5 + 2 * (time.monotonic() - flood_at)
            echoed = len(call.dtmf_echoed)
            record = await gateway.session_record(call.session_id)
            speaking.cancel()
            await asyncio.gather(speaking, return_exceptions=True)
        finally:
            await client.close()
    assert 5 <= echoed <= allowed, (echoed, allowed)
    assert len(record["dtmf"]) <= allowed
    dropped = metric("kame_telephony_dropped_dtmf_total", provider="audiosocket") - dropped_before
    assert dropped >= 60 - allowed


async def test_a_gateway_that_refuses_for_now_ends_the_call_with_a_hang_up_and_a_log_line(
    fakes, registries, caplog
):
    """stt has no free session: the gateway refuses the call (RESOURCE_EXHAUSTED,
    retry-after-s 3); Asterisk gets a hang-up, the log says why and when to retry."""
    gateway = await fakes.gateway()
    await registries["stt"].publish("stt-a", "10.0.0.1:50053", free_slots=0, total_slots=3)
    async with telephony_server(gateway.address) as server:
        client = await AudioSocketClient.connect(server.audiosocket.port)
        try:
            await client.send_uuid()
            await wait_until(lambda: client.eof.is_set(), "the service to close", 5.0)
        finally:
            await client.close()
        assert server.telephony.slots == 0
    assert client.kinds() == [HANG_UP]
    assert any(
        "RESOURCE_EXHAUSTED" in r.getMessage() and "retry after 3 s" in r.getMessage()
        for r in caplog.records
    ), [r.getMessage() for r in caplog.records]
