"""The gateway session alone: a real gateway on loopback against scripted fake
frontend, stt and oracle servers (tests/gateway/fakes.py) and the real Redis.
No models, so each case takes milliseconds. Every failure path named in
services/gateway/session.py's docstring is here, plus the limits, drain and
teardown."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import grpc
import numpy as np
import pytest
from prometheus_client import REGISTRY

from kame_common.audio import FRAME_SAMPLES, float_to_pcm16
from kamepb import (
    common_pb2,
    gateway_pb2,
    gateway_pb2_grpc,
)
from tests.gateway.fakes import Activity, activity, sync_converse, transcript
from tests.support import conversation, wait_until

Config = gateway_pb2.ConverseConfig
Notice = gateway_pb2.Notice


def frame_bytes() -> bytes:
    return float_to_pcm16(np.zeros(FRAME_SAMPLES, dtype=np.float32))


@dataclass
class Outcome:
    responses: list[gateway_pb2.ConverseResponse]
    code: grpc.StatusCode
    details: str
    frames_sent: int = 0

    def of(self, kind: str) -> list:
        return [getattr(r, kind) for r in self.responses if r.WhichOneof("msg") == kind]


# A call that goes on until the test has seen what it waits for ends after this
# many frames at most (40 s of audio), so that a failing test does not hang.
MAX_FRAMES_UNTIL = 500


async def converse(
    address: str,
    frames: int,
    config: gateway_pb2.ConverseConfig | None = None,
    pace_s: float = 0.0,
    until: threading.Event | None = None,
) -> Outcome:
    """A whole call: config, `frames` 80 ms frames (one every `pace_s`, or as fast
    as flow control allows), half-close; every response and the final status.
    With `until`, frames go on (paced) until the test sets it, then `frames`
    more: the call lasts as long as what the test waits for takes, not a length
    long enough for a slow machine. It runs on the sync API in a thread (see
    `sync_converse`)."""
    sent = 0

    def requests() -> Iterator[gateway_pb2.ConverseRequest]:
        nonlocal sent
        yield gateway_pb2.ConverseRequest(config=config or Config(include_oracle_updates=True))
        while until is not None and not until.is_set() and sent < MAX_FRAMES_UNTIL:
            sent += 1
            yield gateway_pb2.ConverseRequest(audio=frame_bytes())
            time.sleep(pace_s)
        for _ in range(frames):
            sent += 1
            yield gateway_pb2.ConverseRequest(audio=frame_bytes())
            time.sleep(pace_s)

    code, details, responses = await asyncio.to_thread(sync_converse, address, requests())
    return Outcome(responses, code, details, sent)


async def held_open(
    release: asyncio.Event, frames: int = 1, after: int = 0
) -> AsyncIterator[gateway_pb2.ConverseRequest]:
    """A call held open: the config and `frames` frames, nothing more until
    `release` is set, then `after` frames and the half-close."""
    yield gateway_pb2.ConverseRequest(config=Config())
    for _ in range(frames):
        yield gateway_pb2.ConverseRequest(audio=frame_bytes())
    await release.wait()
    for _ in range(after):
        yield gateway_pb2.ConverseRequest(audio=frame_bytes())


def roles_and_texts(turns: list[dict]) -> list[tuple[str, str]]:
    return [(t["role"], t["text"]) for t in turns]


def dropped_messages(queue: str) -> float:
    labels = {"queue": queue}
    return REGISTRY.get_sample_value("kame_gateway_dropped_messages_total", labels) or 0.0


def upstream_failures(service: str) -> float:
    labels = {"service": service}
    return REGISTRY.get_sample_value("kame_gateway_upstream_failures_total", labels) or 0.0


# Side streams that fail are reopened at once in these tests, and watched closely.
QUICK_REOPEN = {"side_backoff_s": 0.05, "side_backoff_max_s": 0.1}


def gateway_tasks() -> list[asyncio.Task]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("gateway-")]


def no_internal_address(outcome: Outcome) -> bool:
    texts = [outcome.details, *(n.message for n in outcome.of("notice"))]
    return not any("127.0.0.1" in t or "10.9.8.7" in t for t in texts)


async def test_a_call_flows_through_every_upstream_and_ends_in_order(fakes):
    fakes.stt.script = {
        2: [activity(Activity.SPEECH_START, "s-1", 0.1)],
        4: [transcript("s-1", "what is the", False, 0.3)],
        8: [
            activity(Activity.FINAL_DECODE, "s-1", 0.7),
            activity(Activity.SPEECH_END, "s-1", 0.5),
            transcript("s-1", "what is the capital", True, 0.6),
        ],
    }
    fakes.frontend.speak_at = 12
    fakes.frontend.words = {12: ("Hmm,", 0), 14: ("Paris", 1)}
    fakes.frontend.turn_end_at = 11
    fakes.frontend.held = range(16, 18)  # the agent paused: the caller talks over it
    for fake in (fakes.frontend, fakes.stt, fakes.oracle):
        fake.log.expect_normal_end()
    gateway = await fakes.gateway()
    outcome = await converse(gateway.address, frames=20, pace_s=0.04)

    assert outcome.code == grpc.StatusCode.OK, outcome.details
    (started,) = outcome.of("started")
    assert started.frontend_replica == "fake-1" and started.engine == "fake"
    assert len(outcome.of("audio")) == 20  # one agent frame per caller frame
    held = [(a.seq, a.speaking) for a in outcome.of("audio") if a.held]
    assert held == [(16, False), (17, False)]
    assert [t.text for t in outcome.of("user_transcript")] == [
        "what is the",
        "what is the capital",
    ]
    # stt's transcripts reach the frontend; the oracle's RESET reaches the frontend
    # and the client; the agent's words reach the oracle.
    assert [t.text for t in fakes.frontend.log.of("user_transcript")] == [
        "what is the",
        "what is the capital",
    ]
    (update,) = fakes.frontend.log.of("oracle")
    assert update.text == "Paris is the capital." and update.source.text == "what is the capital"
    assert len(outcome.of("oracle_update")) == 1
    assert [a.text for a in fakes.oracle.log.of("agent_text")] == ["Hmm,", "Paris"]
    # stt's FINAL_DECODE reaches the oracle (its speculation yields), not the client.
    (decode,) = fakes.oracle.log.of("speech_activity")
    assert (decode.kind, decode.utterance_id) == (Activity.FINAL_DECODE, "s-1")
    # The frontend's turn end reaches stt as EndOfTurn.
    (end_of_turn,) = fakes.stt.log.of("end_of_turn")
    assert end_of_turn.speech_end_s == pytest.approx(11 * 0.08 - 0.4)
    # Every upstream's stream ended normally, none was cancelled.
    for fake in (fakes.frontend, fakes.stt, fakes.oracle):
        await asyncio.wait_for(fake.log.ended.wait(), 2)
        assert fake.log.outcome == "finished"
    (turn,) = outcome.of("turn")
    assert turn.user_text == "what is the capital"
    # The hold phrase started the audio; the answer word came two frames later: a
    # hold phrase is no answer. The turn's summary leaves the gateway once its
    # answer word is known, so it follows "Paris", not "Hmm,". How far apart the
    # two latencies are is wall-clock time between two frames (nominally 0.10 s)
    # that a busy machine stretches or bunches: only their order is certain.
    words_and_turns = [
        r.agent_text.text if r.HasField("agent_text") else "(turn)"
        for r in outcome.responses
        if r.WhichOneof("msg") in ("agent_text", "turn")
    ]
    assert words_and_turns == ["Hmm,", "Paris", "(turn)"]
    assert turn.answer_latency_s > turn.response_latency_s
    record = await fakes.session_record(started.session_id)
    assert record["state"] == "ended" and record["replica_id"] == "fake-1"
    await wait_until(lambda: not gateway_tasks(), "the session's tasks to end", 2)


def notice_kinds(outcome: Outcome) -> list[int]:
    return [n.kind for n in outcome.of("notice")]


async def test_a_failed_stt_is_reopened_on_the_sessions_clock(fakes):
    fakes.stt.fail_at = 3
    # Scripted by frame: whichever stream gets frame 15 sends these (the reopened
    # one does, live or in its replay).
    fakes.stt.script = {
        15: [
            activity(Activity.SPEECH_START, "s.1-1", 0.1),
            transcript("s.1-1", "hello again", True, 0.3),
        ]
    }
    fakes.oracle.log.expect_normal_end()
    gateway = await fakes.gateway(**QUICK_REOPEN)
    outcome = await converse(gateway.address, frames=20, pace_s=0.02)
    assert outcome.code == grpc.StatusCode.OK
    assert len(outcome.of("audio")) == 20
    assert notice_kinds(outcome) == [Notice.ORACLE_UNAVAILABLE, Notice.ORACLE_RESTORED]
    assert "stt failed" in outcome.of("notice")[0].message
    assert no_internal_address(outcome)
    # A fresh stream with its own session id; the oracle stayed through it all.
    session_id = outcome.of("started")[0].session_id
    configs = fakes.stt.log.of("config")
    assert [c.session_id for c in configs] == [session_id, f"{session_id}.1"]
    assert configs[1].progress_interval_s == pytest.approx(0.5)
    assert fakes.oracle.log.opened == 1 and fakes.oracle.log.outcome == "finished"
    # The reopened stream first hears again what the failed one may have missed (no
    # utterance was open: the last second), the frame it broke at included, then every
    # later frame once, in order; its audio times are moved onto the session's clock.
    requests = fakes.stt.log.requests
    reopened = next(i for i, r in enumerate(requests) if r.config.session_id.endswith(".1"))
    second = requests[reopened + 1]
    start_s = second.audio.seq * 0.08
    heard_again = [r.audio.seq for r in requests[reopened + 1 :] if r.WhichOneof("msg") == "audio"]
    assert heard_again == list(range(second.audio.seq, 20)) and second.audio.seq <= 3
    (heard,) = fakes.frontend.log.of("user_transcript")
    assert heard.text == "hello again"
    assert heard.span.start_s == pytest.approx(start_s)
    assert heard.span.end_s == pytest.approx(start_s + 0.3)
    # ... and the final reaches the oracle, which is open all along.
    assert [t.text for t in fakes.oracle.log.of("user_transcript")] == ["hello again"]


async def test_a_failed_oracle_is_reopened_and_answers_the_next_question(fakes):
    fakes.oracle.fail_after_first = True
    fakes.stt.script = {
        2: [transcript("s-1", "hello", False, 0.2)],
        15: [transcript("s-2", "what is the capital", True, 1.2)],
    }
    fakes.stt.log.expect_normal_end()
    gateway = await fakes.gateway(**QUICK_REOPEN)
    outcome = await converse(gateway.address, frames=20, pace_s=0.02)
    assert outcome.code == grpc.StatusCode.OK
    assert len(outcome.of("audio")) == 20
    assert notice_kinds(outcome) == [Notice.ORACLE_UNAVAILABLE, Notice.ORACLE_RESTORED]
    assert "oracle failed" in outcome.of("notice")[0].message
    # The same session id again: a real oracle loads the conversation from Redis.
    session_id = outcome.of("started")[0].session_id
    configs = fakes.oracle.log.of("config")
    assert [c.session_id for c in configs] == [session_id, session_id]
    assert configs[1].heartbeat_interval_s == pytest.approx(0.5)
    (update,) = fakes.frontend.log.of("oracle")
    assert update.source.text == "what is the capital"
    assert fakes.stt.log.opened == 1 and fakes.stt.log.outcome == "finished"


async def test_the_gateway_keeps_the_conversation_while_the_oracle_is_down(fakes):
    """...and the reopened oracle is handed the turn it missed, and answers it."""
    fakes.oracle.fail_after_first = True
    fakes.stt.script = {
        2: [transcript("s-1", "hello", False, 0.2)],  # the oracle fails on this one
        6: [transcript("s-1", "hello there", True, 0.5)],  # while it is down
    }
    fakes.frontend.words = {8: ("Hi", 0), 9: ("again", 0)}
    # Reopened 0.4-0.6 s after it failed: well after frame 9 (0.18 s), so the final
    # and the agent's words come while it is down.
    gateway = await fakes.gateway(side_backoff_s=0.5, side_backoff_max_s=0.5)
    answered = threading.Event()
    call = asyncio.ensure_future(converse(gateway.address, 5, pace_s=0.02, until=answered))
    await wait_until(
        lambda: any(u.source.text == "hello there" for u in fakes.frontend.log.of("oracle")),
        "the reopened oracle to answer",
        5,
    )
    answered.set()
    outcome = await call
    assert notice_kinds(outcome) == [Notice.ORACLE_UNAVAILABLE, Notice.ORACLE_RESTORED]
    requests = fakes.oracle.log.requests
    reopened = max(i for i, r in enumerate(requests) if r.WhichOneof("msg") == "config")
    assert requests[reopened + 1].user_transcript.text == "hello there"
    (answer,) = [u for u in fakes.frontend.log.of("oracle") if u.source.text == "hello there"]
    assert answer.op == common_pb2.OracleUpdate.RESET
    session_id = outcome.of("started")[0].session_id
    assert roles_and_texts(await conversation(fakes.redis_url, session_id)) == [
        ("user", "hello there"),
        ("agent", "Hi again"),
    ]


async def test_a_hung_stt_is_found_by_the_watchdog_and_reopened(fakes):
    fakes.stt.hang = True
    gateway = await fakes.gateway(side_timeout_s=0.2, side_heartbeat_s=0.1, **QUICK_REOPEN)
    reopened = threading.Event()
    call = asyncio.ensure_future(converse(gateway.address, 25, pace_s=0.02, until=reopened))
    # A hung stream is cancelled and a new one opened, again and again, while it hangs.
    await wait_until(lambda: fakes.stt.log.opened >= 2, "stt to be reopened", 5)
    fakes.stt.hang = False
    reopened.set()  # 25 frames (0.5 s) more, for a stream to answer
    outcome = await call
    assert outcome.code == grpc.StatusCode.OK
    assert len(outcome.of("audio")) == outcome.frames_sent
    assert notice_kinds(outcome) == [Notice.ORACLE_UNAVAILABLE, Notice.ORACLE_RESTORED]


async def test_silence_from_the_caller_is_no_stall(fakes):
    """The watchdog waits for answers only while caller audio flows."""
    fakes.stt.hang = True  # and the caller sends nothing after the config

    async def requests() -> AsyncIterator[gateway_pb2.ConverseRequest]:
        yield gateway_pb2.ConverseRequest(config=Config())
        await asyncio.sleep(0.6)  # three times side_timeout_s

    gateway = await fakes.gateway(side_timeout_s=0.2, side_heartbeat_s=0.1, **QUICK_REOPEN)
    async with grpc.aio.insecure_channel(gateway.address) as channel:
        call = gateway_pb2_grpc.GatewayStub(channel).Converse(requests())
        responses = [response async for response in call]
    assert await call.code() == grpc.StatusCode.OK
    assert not [r for r in responses if r.HasField("notice")]
    assert fakes.stt.log.opened == 1


async def test_a_stalled_stt_costs_transcripts_not_frames(fakes):
    fakes.stt.stall = True
    # The stalled stream never ends: the call's end waits drain_timeout_s for it.
    gateway = await fakes.gateway(queue_frames=2, drain_timeout_s=0.1, side_timeout_s=0)
    before = dropped_messages("stt")
    # 8 s of audio as fast as flow control allows: the stalled stream's HTTP/2
    # window and buffer are full after a few dozen frames.
    outcome = await converse(gateway.address, frames=100)
    assert outcome.code == grpc.StatusCode.OK
    assert len(outcome.of("audio")) == 100
    assert dropped_messages("stt") > before


async def test_an_oracle_that_rejects_the_llm_override_ends_the_call(fakes):
    fakes.oracle.reject = True
    gateway = await fakes.gateway()
    config = Config(llm=gateway_pb2.LlmOverride(model="x"))
    outcome = await converse(gateway.address, frames=5, config=config)
    assert outcome.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "model 'x' is not allowed" in outcome.details


async def test_a_stalled_oracle_costs_agent_text_not_frames(fakes):
    fakes.oracle.stall = True
    fakes.frontend.speak_at = 0
    # Long "words" fill the HTTP/2 window to the stalled oracle quickly.
    fakes.frontend.words = {seq: ("w" * 50_000, 1) for seq in range(100)}
    # 8 s of audio as fast as flow control allows.
    gateway = await fakes.gateway(queue_frames=2, drain_timeout_s=0.1)
    before = dropped_messages("oracle")
    outcome = await converse(gateway.address, frames=100)
    assert outcome.code == grpc.StatusCode.OK
    assert len(outcome.of("audio")) == 100 and len(outcome.of("agent_text")) == 100
    assert dropped_messages("oracle") > before


async def test_frontend_failure_ends_the_call_unavailable_without_its_address(fakes):
    fakes.frontend.fail_at = 4
    for fake in (fakes.stt, fakes.oracle):
        fake.log.expect_cancellation()
    gateway = await fakes.gateway()
    outcome = await converse(gateway.address, frames=100, pace_s=0.01)
    assert outcome.code == grpc.StatusCode.UNAVAILABLE
    assert "frontend failed" in outcome.details
    assert no_internal_address(outcome)
    for fake in (fakes.stt, fakes.oracle):
        await fake.log.cancelled(5)


@pytest.mark.parametrize("pace_s", [0.0, 0.05])
async def test_a_frontend_that_ends_early_is_a_failure(fakes, pace_s):
    """Early, whether the caller is still sending (paced) or already done (its
    frames all sent at once, and the frontend's input half-closed): frames it
    never answered make it a failure either way."""
    fakes.frontend.end_at = 3
    gateway = await fakes.gateway()
    outcome = await converse(gateway.address, frames=10, pace_s=pace_s)
    assert outcome.code == grpc.StatusCode.UNAVAILABLE and "frontend" in outcome.details


async def test_a_frontend_that_leaves_frames_unanswered_is_a_failure(fakes):
    """It ends its stream normally once the caller is done, but answered only
    the first 3 of 10 frames: the call must not end OK."""
    fakes.frontend.mute_at = 3
    gateway = await fakes.gateway()
    outcome = await converse(gateway.address, frames=10)
    assert outcome.code == grpc.StatusCode.UNAVAILABLE
    assert "7 caller frames unanswered" in outcome.details
    assert len(outcome.of("audio")) == 3


@pytest.mark.parametrize(
    ("refusal", "code", "message"),
    [
        (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "no frontend slot",
        ),
        (
            grpc.StatusCode.INVALID_ARGUMENT,
            grpc.StatusCode.INVALID_ARGUMENT,
            "rejected the session",
        ),
        (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNAVAILABLE, "frontend is unavailable"),
    ],
)
async def test_a_refusing_frontend(fakes, refusal, code, message):
    fakes.frontend.refuse = refusal
    gateway = await fakes.gateway()
    outcome = await converse(gateway.address, frames=3)
    assert outcome.code == code and message in outcome.details
    assert no_internal_address(outcome)
    assert not outcome.of("started")


async def test_a_frontend_that_never_gets_ready_times_out(fakes):
    fakes.frontend.silent_start = True
    gateway = await fakes.gateway(connect_timeout_s=0.1)
    outcome = await converse(gateway.address, frames=3)
    assert outcome.code == grpc.StatusCode.UNAVAILABLE
    assert "did not start the session within 0.1 s" in outcome.details


async def test_a_side_service_that_is_down_is_one_notice_however_often_it_is_tried(fakes):
    # No readiness check: it would refuse the call while stt is down.
    gateway = await fakes.gateway(stt_address="127.0.0.1:1", readiness_interval_s=0, **QUICK_REOPEN)
    before = upstream_failures("stt")
    outcome = await converse(gateway.address, frames=15, pace_s=0.02)
    assert outcome.code == grpc.StatusCode.OK and len(outcome.of("audio")) == 15
    assert notice_kinds(outcome) == [Notice.ORACLE_UNAVAILABLE]
    assert no_internal_address(outcome)
    assert upstream_failures("stt") - before >= 2


async def test_a_caller_who_hangs_up_frees_every_upstream(fakes):
    for fake in (fakes.frontend, fakes.stt, fakes.oracle):
        fake.log.expect_cancellation()
    gateway = await fakes.gateway()
    release = asyncio.Event()

    async with grpc.aio.insecure_channel(gateway.address) as channel:
        call = gateway_pb2_grpc.GatewayStub(channel).Converse(held_open(release))
        assert (await call.read()).HasField("started")
        await wait_until(lambda: fakes.oracle.log.opened == 1, "the oracle stream", 2)
        call.cancel()
    for fake in (fakes.frontend, fakes.stt, fakes.oracle):
        await fake.log.cancelled(5)
    await wait_until(lambda: not gateway_tasks(), "the session's tasks to end", 2)
    await wait_until(lambda: gateway.active_sessions == 0, "the session to close", 2)


async def test_limits(fakes):
    gateway = await fakes.gateway(max_session_s=0.4, max_sessions=1)
    over = await converse(gateway.address, frames=10)
    assert over.code == grpc.StatusCode.OUT_OF_RANGE and "0.4 s" in over.details

    release = asyncio.Event()

    async with grpc.aio.insecure_channel(gateway.address) as channel:
        first = gateway_pb2_grpc.GatewayStub(channel).Converse(held_open(release, frames=0))
        assert (await first.read()).HasField("started")
        refused = await converse(gateway.address, frames=1)
        assert refused.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        release.set()
        assert await first.code() == grpc.StatusCode.OK


@pytest.mark.parametrize(
    ("second", "message"),
    [
        (gateway_pb2.ConverseRequest(config=Config()), "a second config"),
        (
            gateway_pb2.ConverseRequest(),
            "after the config a stream takes only audio, dtmf, turn_control, user_text, "
            "function_result, context; got an empty message",
        ),
        (gateway_pb2.ConverseRequest(dtmf=common_pb2.Dtmf(digit="x")), "dtmf.digit"),
        (gateway_pb2.ConverseRequest(audio=b"\x01"), "audio chunk 0"),
    ],
)
async def test_bad_input_after_the_config(fakes, second, message):
    gateway = await fakes.gateway()

    async def requests() -> AsyncIterator[gateway_pb2.ConverseRequest]:
        yield gateway_pb2.ConverseRequest(config=Config())
        yield second

    async with grpc.aio.insecure_channel(gateway.address) as channel:
        call = gateway_pb2_grpc.GatewayStub(channel).Converse(requests())
        with contextlib.suppress(grpc.aio.AioRpcError):
            async for _ in call:
                pass
        assert await call.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert message in await call.details()


async def test_drain_lets_an_open_call_finish_and_refuses_new_ones(fakes):
    gateway = await fakes.gateway(grace_s=5)
    release = asyncio.Event()

    async with grpc.aio.insecure_channel(gateway.address) as channel:
        call = gateway_pb2_grpc.GatewayStub(channel).Converse(held_open(release, after=1))
        assert (await call.read()).HasField("started")
        drain = asyncio.ensure_future(gateway.drain())
        await wait_until(lambda: gateway.draining, "the gateway to drain", 2)
        refused = await converse(gateway.address, frames=1)
        assert refused.code == grpc.StatusCode.UNAVAILABLE
        release.set()
        responses = []
        while (response := await call.read()) is not grpc.aio.EOF:
            responses.append(response)
        audio = [r for r in responses if r.HasField("audio")]
        assert await call.code() == grpc.StatusCode.OK and len(audio) == 2
    await asyncio.wait_for(drain, 5)


async def test_s2s_opens_no_oracle_and_logs_the_conversation(fakes):
    fakes.stt.script = {
        1: [activity(Activity.SPEECH_START, "s-1", 0.0)],
        4: [activity(Activity.SPEECH_END, "s-1", 0.3), transcript("s-1", "hi there", True, 0.4)],
    }
    fakes.frontend.speak_at = 6
    fakes.frontend.words = {6: ("Hello", 0), 7: ("friend", 0)}
    gateway = await fakes.gateway()
    outcome = await converse(gateway.address, frames=12, config=Config(mode=Config.S2S))
    assert outcome.code == grpc.StatusCode.OK
    assert fakes.oracle.log.opened == 0
    (turn,) = outcome.of("turn")
    assert turn.answer_latency_s == pytest.approx(turn.response_latency_s, abs=0.05)
    session_id = outcome.of("started")[0].session_id
    assert roles_and_texts(await conversation(fakes.redis_url, session_id)) == [
        ("user", "hi there"),
        ("agent", "Hello friend"),
    ]


@pytest.mark.parametrize(
    ("mode", "engine", "endpoint_s"),
    [
        (Config.CASCADE, "tts", 3.0),  # stt waits for the frontend's turn end: a true cascade
        (Config.TANDEM, "tts", 0.0),  # stt's own short pause: tandem speculates on it
        (Config.CASCADE, "kame", 0.0),  # the kame engine reports no turn ends
    ],
)
async def test_a_cascade_on_the_tts_engine_finalizes_at_the_turn_end(
    fakes, mode, engine, endpoint_s
):
    fakes.frontend.engine = engine
    gateway = await fakes.gateway()
    outcome = await converse(gateway.address, frames=3, config=Config(mode=mode))
    assert outcome.code == grpc.StatusCode.OK, outcome.details
    (config,) = fakes.stt.log.of("config")
    assert config.endpoint_silence_s == pytest.approx(endpoint_s)
    # The oracle learns whether the front-end speaks only at the turn end (its
    # partial_starts "auto" decides on it).
    (oracle_config,) = fakes.oracle.log.of("config")
    assert oracle_config.frontend_ends_turns is (engine == "tts")


async def test_call_events_reach_the_client_the_oracle_and_the_session_record(fakes):
    """A telephony bridge's events: keys pressed are echoed and join the oracle's
    conversation, the frontend's barge-in reaches the client, and where the call
    comes from is in the session record."""
    fakes.frontend.speak_at = 2
    fakes.frontend.barge_in_at = 5
    gateway = await fakes.gateway()
    call_info = gateway_pb2.CallInfo(
        provider="sip", caller="sip:+15550100@trunk", callee="sip:agent@kame", provider_call_id="c1"
    )

    async def requests() -> AsyncIterator[gateway_pb2.ConverseRequest]:
        yield gateway_pb2.ConverseRequest(config=Config(call=call_info))
        for seq in range(8):
            yield gateway_pb2.ConverseRequest(audio=frame_bytes())
            if seq in (3, 4):
                digit = "5" if seq == 3 else "#"
                yield gateway_pb2.ConverseRequest(dtmf=common_pb2.Dtmf(digit=digit, duration_ms=90))
            await asyncio.sleep(0.02)

    async with grpc.aio.insecure_channel(gateway.address) as channel:
        call = gateway_pb2_grpc.GatewayStub(channel).Converse(requests())
        responses = [response async for response in call]
    outcome = Outcome(responses, grpc.StatusCode.OK, "")
    assert [(d.digit, d.duration_ms) for d in outcome.of("dtmf")] == [("5", 90), ("#", 90)]
    assert [b.seq for b in outcome.of("barge_in")] == [5]
    assert [d.digit for d in fakes.oracle.log.of("dtmf")] == ["5", "#"]
    session_id = outcome.of("started")[0].session_id
    record = await fakes.session_record(session_id)
    assert record["call_provider"] == "sip" and record["call_caller"] == "sip:+15550100@trunk"
    assert record["call_callee"] == "sip:agent@kame" and record["call_provider_call_id"] == "c1"
    assert record["dtmf"] == "**"  # keys may be a PIN: masked unless dtmf_in_records


async def test_keys_pressed_without_an_oracle_are_in_the_gateways_conversation(fakes):
    gateway = await fakes.gateway()

    async def requests() -> AsyncIterator[gateway_pb2.ConverseRequest]:
        yield gateway_pb2.ConverseRequest(config=Config(mode=Config.S2S))
        yield gateway_pb2.ConverseRequest(audio=frame_bytes())
        yield gateway_pb2.ConverseRequest(dtmf=common_pb2.Dtmf(digit="1"))
        yield gateway_pb2.ConverseRequest(audio=frame_bytes())

    async with grpc.aio.insecure_channel(gateway.address) as channel:
        call = gateway_pb2_grpc.GatewayStub(channel).Converse(requests())
        responses = [response async for response in call]
    session_id = Outcome(responses, grpc.StatusCode.OK, "").of("started")[0].session_id
    assert roles_and_texts(await conversation(fakes.redis_url, session_id)) == [
        ("user", "(pressed a key)")  # which key only with dtmf_in_records
    ]


@pytest.mark.parametrize("field_name", ["provider", "caller", "callee", "provider_call_id"])
async def test_call_info_longer_than_the_limit_is_refused(fakes, field_name):
    gateway = await fakes.gateway()
    config = Config(call=gateway_pb2.CallInfo(**{field_name: "x" * 257}))
    outcome = await converse(gateway.address, frames=1, config=config)
    assert outcome.code == grpc.StatusCode.INVALID_ARGUMENT
    assert f"call.{field_name}" in outcome.details
