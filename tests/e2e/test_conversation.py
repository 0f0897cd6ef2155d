"""End to end: the whole stack on loopback (real Redis, real llama.cpp server,
stt, oracle, frontend tts and gateway), one shared stack for the module.

A spoken question goes in at real time; the tests check what the caller gets
back, what the upstream services saw, what Redis holds, what /metrics and the
traces say, and that every failure path ends or degrades the session the way
gateway.proto promises, freeing every upstream stream and task."""

from __future__ import annotations

import asyncio
import os
import re
import urllib.request

import grpc
import numpy as np
import pytest

from kame_cli.bench.answer import coherence_of
from kame_cli.talk import TalkOptions, talk
from kame_client.events import (
    AgentAudio,
    AgentText,
    Notice,
    OracleAppend,
    OracleReset,
    Started,
    UserFinal,
    UserTranscript,
)
from kame_client.result import AgentAudioStart
from kame_common.audio import FRAME_SAMPLES, SAMPLE_RATE, rms_dbfs
from kame_common.words import normalize_words
from kamepb import gateway_pb2
from kamepb.common_pb2 import LLM_BACKEND_ANTHROPIC
from tests.e2e.conftest import (
    QUESTION,
    SPAN_EXPORTER,
    LiveCall,
    converse_config,
    session_tasks,
    wait_until,
)
from tests.support import conversation, session_record, voice_says, word_recall, words_of
from tests.support.metrics import metric, scraped_sum

pytestmark = pytest.mark.asyncio(loop_scope="module")

Codec = gateway_pb2.AudioFormat.Codec
SECOND_QUESTION = "How many legs does a spider have?"


def words(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+", text.lower()))


def read_url(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read().decode()


async def upstreams_idle(stack, timeout_s: float = 10.0) -> None:
    for name, runtime in {**stack.upstreams, "gateway": stack.gateway}.items():
        await wait_until(
            lambda r=runtime: r.active_sessions == 0, f"{name} to see its session end", timeout_s
        )


async def test_spoken_question_gets_a_spoken_answer(stack, speak, transcribe):
    result = await talk(
        speak(QUESTION),
        TalkOptions(gateway=stack.gateway.address, mode="tandem", tail_s=1.5, max_wait_s=25.0),
    )
    assert result.status == "OK", result.status_details
    assert result.started is not None
    session_id = result.started.session_id
    assert result.started.frontend_replica == stack.frontend.settings.replica_id

    # The caller's words came back as the final transcript (Whisper may mishear one).
    assert word_recall(QUESTION, result.user_transcript) >= 0.6, result.user_transcript
    # The oracle streamed candidate answers: a RESET carries the first words and
    # what they answer.
    resets = [timed.event for timed in result.of(OracleReset)]
    assert resets and all(e.text for e in resets), resets
    # The agent spoke, and what it said (its own account of its words) answers the
    # question: Paris, unless Whisper missed "France" (then the model cannot know).
    assert result.of(AgentAudioStart), "the agent never started speaking"
    assert rms_dbfs(result.agent) > -40.0
    assert result.agent_text.strip(), "the agent said no word"
    if "france" in words_of(result.user_transcript):
        assert "paris" in words_of(result.agent_text), result.agent_text
    heard = await asyncio.to_thread(transcribe, result.agent)
    assert voice_says(result.agent_text, heard), (result.agent_text, heard)
    # Latency, measured at the client and summarized by the gateway (how fast is
    # for the benchmark; here: both exist and are sane).
    turn_events = [
        timed.json()
        for timed in result.events
        if isinstance(timed.event, UserFinal | AgentAudioStart | Notice)
    ]
    assert result.response_latency_s is not None and 0 < result.response_latency_s < 20, (
        result.speech_end_s,
        turn_events,
    )
    assert result.turns and result.turns[0].response_latency_s > 0
    # One agent frame per caller frame, however long the call.
    assert len(result.agent) == pytest.approx(result.streamed_samples, abs=2 * FRAME_SAMPLES)

    # Redis: the session record, and the conversation the oracle logged.
    record = await session_record(stack.redis_url, session_id)
    assert record["mode"] == "tandem" and record["state"] == "ended"
    turns = await conversation(stack.redis_url, session_id)
    user_turns = [t["text"] for t in turns if t["role"] == "user"]
    agent_turns = [t["text"] for t in turns if t["role"] == "agent"]
    assert any(word_recall("capital France", t) >= 0.5 for t in user_turns), turns
    # What the agent answered is what the oracle logged (hold phrases are not logged).
    answered = " ".join(said.event.text for said in result.of(AgentText) if said.event.generation)
    assert agent_turns and set(words_of(answered)) <= set(words_of(" ".join(agent_turns))), turns

    # /metrics: the per-frame and response-latency histograms have samples.
    metrics = await asyncio.to_thread(read_url, stack.metrics_url)
    assert (
        scraped_sum(metrics, "kame_gateway_frame_round_trip_seconds_count")
        >= result.streamed_samples // FRAME_SAMPLES
    )
    assert scraped_sum(metrics, "kame_gateway_response_latency_seconds_count") >= 1

    # Traces: session -> turn -> stt/oracle/frontend, and the upstream servers
    # joined the session's trace through the gRPC metadata.
    await upstreams_idle(stack)
    spans = SPAN_EXPORTER.get_finished_spans()
    session_span = next(
        s
        for s in spans
        if s.name == "session" and s.attributes.get("kame.session_id") == session_id
    )
    trace_id = session_span.context.trace_id
    turn_span = next(s for s in spans if s.name == "turn" and s.context.trace_id == trace_id)
    assert turn_span.parent.span_id == session_span.context.span_id
    phases = {
        s.name
        for s in spans
        if s.parent is not None and s.parent.span_id == turn_span.context.span_id
    }
    assert phases == {"stt", "oracle", "frontend"}
    server_spans = {
        s.name for s in spans if s.context.trace_id == trace_id and s.kind == s.kind.SERVER
    }
    assert {
        "/kame.v1.Stt/Transcribe",
        "/kame.v1.Oracle/Guide",
        "/kame.v1.Frontend/Stream",
    } <= server_spans


async def test_tandem_answers_an_espeak_caller_with_one_fresh_answer(stack, espeak_questions):
    """A voice that is not piper's, through the whole stack in tandem: the agent may
    hold the floor ("Hmm,"), then speaks ONE candidate, whose source is what the
    caller actually said, never a spliced guess from a partial transcript."""
    question = next(q for q in espeak_questions if q.text == "What is the capital of Germany?")
    options = TalkOptions(
        gateway=stack.gateway.address,
        mode="tandem",
        tail_s=1.5,
        max_wait_s=25.0,
        wait_for_answer=True,
    )
    result = await talk(question.audio, options)
    assert result.status == "OK", result.status_details
    verdict = coherence_of(result)
    assert verdict.coherent, (verdict.note, result.agent_text)
    # The spoken candidate answers the caller's final words (normalized), not a guess.
    reset = next(
        timed.event
        for timed in result.of(OracleReset)
        if timed.event.generation == verdict.generation
    )
    assert normalize_words(reset.source_text) == normalize_words(result.user_transcript)
    if "germany" in words_of(result.user_transcript):  # else the model cannot know
        assert "berlin" in words_of(result.agent_text), result.agent_text


async def test_two_concurrent_sessions_do_not_cross(stack, speak):
    options = TalkOptions(gateway=stack.gateway.address, tail_s=1.5, max_wait_s=25.0)
    first, second = await asyncio.gather(
        talk(speak(QUESTION), options), talk(speak(SECOND_QUESTION), options)
    )
    assert first.status == second.status == "OK"
    assert first.started and second.started
    assert first.started.session_id != second.started.session_id
    assert word_recall(QUESTION, first.user_transcript) >= 0.6, first.user_transcript
    assert word_recall(SECOND_QUESTION, second.user_transcript) >= 0.6, second.user_transcript
    assert not words(first.user_transcript) & {"spider", "legs"}
    assert not words(second.user_transcript) & {"france", "capital"}
    for result in (first, second):  # each caller got exactly its own stream of frames back
        assert len(result.agent) == pytest.approx(result.streamed_samples, abs=2 * FRAME_SAMPLES)
    logs = [await conversation(stack.redis_url, r.started.session_id) for r in (first, second)]
    first_user = " ".join(t["text"] for t in logs[0] if t["role"] == "user")
    second_user = " ".join(t["text"] for t in logs[1] if t["role"] == "user")
    assert word_recall(QUESTION, first_user) >= 0.6 and not words(first_user) & {"spider", "legs"}
    assert word_recall(SECOND_QUESTION, second_user) >= 0.6
    assert not words(second_user) & {"france"}
    await upstreams_idle(stack)


async def test_disconnect_mid_turn_frees_every_upstream_stream_and_task(stack, speak):
    call = await LiveCall(stack.gateway.address, converse_config()).start()
    feeding = asyncio.create_task(
        call.stream(np.concatenate([speak(QUESTION), np.zeros(10 * SAMPLE_RATE, np.float32)]))
    )
    await call.wait_for(AgentAudio, timeout_s=30, speaking=True)
    session_id = call.session_id
    assert session_tasks(session_id), "the session's pump tasks should be running"
    assert all(r.active_sessions == 1 for r in stack.upstreams.values())

    feeding.cancel()
    await call.close()  # the caller hangs up while the agent is talking

    await upstreams_idle(stack)
    await wait_until(lambda: not session_tasks(session_id), "the pump tasks to end", 5.0)
    free_slots = metric("kame_frontend_free_slots")
    assert free_slots == stack.frontend.settings.batch_slots
    record = await session_record(stack.redis_url, session_id)
    assert record["state"] == "failed" and record["outcome"] == "cancelled"


async def test_bad_input_gets_a_clear_status_while_others_are_served(stack, speak):
    good = asyncio.create_task(
        talk(
            speak(QUESTION), TalkOptions(gateway=stack.gateway.address, tail_s=1.0, max_wait_s=25.0)
        )
    )

    async def bad_call(config, *requests, speech=None, send_config=True):
        call = await LiveCall(stack.gateway.address, config).start(send_config)
        try:
            if speech is not None:
                await call.stream(speech)
            for request in requests:
                try:
                    await call.send_raw(request)
                except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
                    break  # the gateway already ended the call: its status is what counts
            code = await call.finish(timeout_s=20)
            return code, call.error.details() if call.error else ""
        finally:
            await call.close()

    audio = gateway_pb2.ConverseRequest
    cases = {
        "garbage opus": bad_call(
            converse_config(codec=Codec.OPUS), *[audio(audio=os.urandom(160)) for _ in range(30)]
        ),
        "odd pcm16": bad_call(
            converse_config(rate=16_000),
            audio(audio=b"\x01\x02\x03"),
            speech=speak(QUESTION)[:12_000],
        ),
        "wrong codec": bad_call(converse_config(codec=42)),
        "no config": bad_call(converse_config(), audio(audio=bytes(3840)), send_config=False),
        "oversized": bad_call(converse_config(), audio(audio=bytes(5 * 1024 * 1024))),
    }
    outcomes = dict(zip(cases, await asyncio.gather(*cases.values()), strict=True))
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    assert outcomes["garbage opus"][0] == invalid
    assert "does not decode as Opus" in outcomes["garbage opus"][1]
    assert outcomes["odd pcm16"][0] == invalid
    assert "even byte count" in outcomes["odd pcm16"][1]
    assert outcomes["wrong codec"] == (
        invalid,
        "input_format.codec: unknown codec 42; choose PCM16, MULAW, ALAW or OPUS",
    )
    assert outcomes["no config"][0] == invalid
    assert "first message must be the config" in outcomes["no config"][1]
    assert outcomes["oversized"][0] == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "larger than max" in outcomes["oversized"][1]

    result = await good  # the well-behaved caller never noticed
    assert result.status == "OK"
    assert word_recall(QUESTION, result.user_transcript) >= 0.6, result.user_transcript
    assert result.of(AgentAudioStart)
    await upstreams_idle(stack)


async def test_oracle_failure_mid_session_goes_on_without_oracle(stack, speak):
    oracle = await stack.services.oracle()
    gateway = await stack.services.gateway(
        stack.stt, oracle, stack.gateway.settings.frontend_address
    )
    call = await LiveCall(gateway.address, converse_config()).start()
    try:
        feeding = asyncio.create_task(
            call.stream(np.concatenate([speak(QUESTION), np.zeros(3 * SAMPLE_RATE, np.float32)]))
        )
        await call.wait_for(UserTranscript, timeout_s=20)
        await oracle.stop()  # the oracle dies mid-turn
        notice = await call.wait_for(Notice, timeout_s=10)
        assert notice.kind == "ORACLE_UNAVAILABLE"
        assert "oracle failed" in notice.message
        await feeding
        assert await call.finish() == grpc.StatusCode.OK  # the call went on to its end
        frames = call.of(AgentAudio)
        assert len(frames) == call.frames_sent  # every caller frame was answered
        assert call.of(UserFinal)
    finally:
        await call.close()
    await wait_until(lambda: stack.stt.active_sessions == 0, "stt to see the session end", 10)
    await wait_until(lambda: stack.frontend.active_sessions == 0, "the frontend session end", 10)


async def test_stt_failure_leaves_the_oracle_open_and_the_call_goes_on(stack, speak):
    stt = await stack.services.stt()
    gateway = await stack.services.gateway(
        stt, stack.oracle, stack.gateway.settings.frontend_address
    )
    call = await LiveCall(gateway.address, converse_config()).start()
    try:
        feeding = asyncio.create_task(
            call.stream(np.concatenate([speak(QUESTION), np.zeros(2 * SAMPLE_RATE, np.float32)]))
        )
        await wait_until(lambda: stack.oracle.active_sessions == 1, "the oracle session", 10)
        await stt.stop()
        notice = await call.wait_for(Notice, timeout_s=10)
        assert notice.kind == "ORACLE_UNAVAILABLE"
        assert "stt failed" in notice.message
        await feeding
        # The oracle waits, open, for the stt the gateway keeps trying to reopen.
        assert stack.oracle.active_sessions == 1
        assert await call.finish() == grpc.StatusCode.OK
        assert len(call.of(AgentAudio)) == call.frames_sent
    finally:
        await call.close()


async def test_frontend_failure_ends_the_session_with_unavailable(stack, speak, e2e_redis_url):
    # A frontend of its own, found by a gateway of its own through another Redis db.
    other_db = e2e_redis_url.rsplit("/", 1)[0] + "/11"  # not the fakes' db (10)
    frontend = await stack.services.frontend(redis_url=other_db)
    gateway = await stack.services.gateway(
        stack.stt, stack.oracle, f"127.0.0.1:{frontend.port}", redis_url=other_db
    )
    call = await LiveCall(gateway.address, converse_config()).start()
    try:
        feeding = asyncio.create_task(call.stream(speak(QUESTION)))
        await call.wait_for(AgentAudio, timeout_s=10)
        await frontend.stop()
        code = await call.finish(timeout_s=15)
        feeding.cancel()
        assert code == grpc.StatusCode.UNAVAILABLE
        assert "the frontend failed" in call.error.details()
        assert "127.0.0.1" not in call.error.details()  # no internal address reaches callers
    finally:
        await call.close()
    await wait_until(lambda: stack.stt.active_sessions == 0, "stt to see the session end", 10)
    await wait_until(lambda: stack.oracle.active_sessions == 0, "oracle session end", 10)
    await wait_until(lambda: gateway.active_sessions == 0, "the gateway session end", 10)


async def test_admission_control_refuses_sessions_over_the_limit(stack):
    gateway = await stack.services.gateway(
        stack.stt, stack.oracle, stack.gateway.settings.frontend_address, max_sessions=1
    )
    first = await LiveCall(gateway.address, converse_config()).start()
    second = await LiveCall(gateway.address, converse_config()).start()
    try:
        await first.wait_for(Started, timeout_s=10)
        assert await second.finish(timeout_s=10) == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "limit of 1 sessions" in second.error.details()
        assert await first.finish(timeout_s=20) == grpc.StatusCode.OK
    finally:
        await first.close()
        await second.close()


async def test_s2s_runs_without_oracle_and_the_gateway_logs_the_conversation(stack, speak):
    """s2s: no oracle stream at all; the gateway writes the conversation. The
    local tts replica stands in for moshi here (s2s_engine "" = the replica's
    engine), holding the floor with a phrase since no oracle feeds it."""
    gateway = await stack.services.gateway(
        stack.stt, stack.oracle, stack.gateway.settings.frontend_address, s2s_engine=""
    )
    hold = gateway_pb2.HoldConfig(phrases=["Let me think about that."])
    call = await LiveCall(
        gateway.address, converse_config(mode=gateway_pb2.ConverseConfig.S2S, hold=hold)
    ).start()
    try:
        feeding = asyncio.create_task(
            call.stream(np.concatenate([speak(QUESTION), np.zeros(4 * SAMPLE_RATE, np.float32)]))
        )
        await wait_until(lambda: stack.stt.active_sessions == 1, "the stt session", 10)
        assert stack.oracle.active_sessions == 0
        await feeding
        assert await call.finish() == grpc.StatusCode.OK
    finally:
        await call.close()
    assert any(a.speaking for a in call.of(AgentAudio))
    assert not call.of(OracleReset) and not call.of(OracleAppend)
    turns = await conversation(stack.redis_url, call.session_id)
    assert [t["role"] for t in turns] == ["user", "agent"], turns
    assert word_recall(QUESTION, turns[0]["text"]) >= 0.6, turns
    assert words(turns[1]["text"]) == {"let", "me", "think", "about", "that"}


async def test_a_rejected_llm_override_ends_the_session_with_invalid_argument(stack):
    config = converse_config(
        llm=gateway_pb2.LlmOverride(backend=LLM_BACKEND_ANTHROPIC)
    )  # and no key
    call = await LiveCall(stack.gateway.address, config).start()
    try:
        await call.stream(np.zeros(SAMPLE_RATE, np.float32))
        assert await call.finish() == grpc.StatusCode.INVALID_ARGUMENT
        assert "the oracle rejected the llm override" in call.error.details()
        assert "allowed_backends" in call.error.details()  # not the operator's to spend
    finally:
        await call.close()
    await upstreams_idle(stack)


async def test_session_length_cap_ends_with_out_of_range(stack):
    gateway = await stack.services.gateway(
        stack.stt,
        stack.oracle,
        stack.gateway.settings.frontend_address,
        max_session_s=0.5,
    )
    call = await LiveCall(gateway.address, converse_config()).start()
    try:
        await call.stream(np.zeros(SAMPLE_RATE, np.float32))
        assert await call.finish() == grpc.StatusCode.OUT_OF_RANGE
        assert "cap of 0.5 s" in call.error.details()
        assert len(call.of(AgentAudio)) <= 6  # 0.5 s of frames at most came back
    finally:
        await call.close()
    await upstreams_idle(stack)
