"""The oracle against the real llama.cpp server serving the embedded Gemma 3 270M."""

from __future__ import annotations

import asyncio
import time

import grpc

from kame_common import store
from kamepb import common_pb2, oracle_pb2
from services.oracle.config import ApiKeys, OracleSettings
from services.oracle.factory import SessionFactory
from tests.support.metrics import metric

Event = oracle_pb2.OracleEvent
Update = common_pb2.OracleUpdate
QUESTION = "What is the capital of France?"


async def speak_partials(client, timeline: list[tuple[float, str, bool]]) -> None:
    """Send (at_s, text, is_final) transcript events at their times."""
    started = time.monotonic()
    for at_s, text, final in timeline:
        await asyncio.sleep(max(0.0, started + at_s - time.monotonic()))
        await client.user(text, final=final)


async def test_partials_then_final_stream_an_answer_that_mentions_paris(
    llm_url, oracle_service, guide_client, redis_client, session_id
):
    ttft_before = metric("kame_oracle_time_to_first_token_seconds_count", backend="openai")
    lag_before = metric("kame_oracle_update_lag_seconds_count")
    runtime = await oracle_service(base_url=llm_url)
    client = guide_client(runtime.port)
    await client.config(session_id=session_id)
    await client.user("What is")
    start = await client.wait_event(Event.REQUEST_START, timeout_s=30)
    assert (start.generation, start.detail) == (1, "What is")  # the first partial starts it
    await speak_partials(
        client,
        [
            (0.0, "What is the capital", False),
            (0.6, "What is the capital of", False),
            (1.2, QUESTION, True),
        ],
    )
    final_start = (
        await client.wait_for(
            lambda r: r.event.kind == Event.REQUEST_START and r.event.detail == QUESTION
        )
    ).event
    assert final_start.generation > 1
    generation = final_start.generation
    await client.wait_event(Event.DONE, generation, timeout_s=120)

    client.assert_update_protocol()
    answer = client.answer(generation)
    assert "paris" in answer.lower(), answer
    # The RESET holds the answer's first words and names the final it answers.
    reset = client.reset(generation)
    assert reset.text and answer.startswith(reset.text)
    assert reset.source == common_pb2.CandidateSource(
        utterance_id="u1", is_final=True, text=QUESTION
    )
    order = [
        (r.WhichOneof("msg"), r.event.kind if r.HasField("event") else r.update.op)
        for r in client.responses
        if (r.event.generation if r.HasField("event") else r.update.generation) == generation
    ]
    assert order[:3] == [
        ("event", Event.REQUEST_START),
        ("event", Event.FIRST_TOKEN),
        ("update", Update.RESET),
    ]
    assert order[-1] == ("event", Event.DONE)
    assert {kind for kind, op in order[3:-1]} == {"update"}  # only APPENDs in between

    # The agent speaks the answer word by word; the stream's end saves it as one turn.
    for word in answer.split():
        await client.agent(word)
    assert await client.finish() == grpc.StatusCode.OK
    conversation = await store.SessionStore(redis_client).conversation(session_id)
    assert [(t["role"], t["text"]) for t in conversation] == [("user", QUESTION), ("agent", answer)]
    assert metric("kame_oracle_time_to_first_token_seconds_count", backend="openai") > ttft_before
    assert metric("kame_oracle_update_lag_seconds_count") > lag_before
    assert metric("kame_oracle_restarts_total", reason="final") >= 1
    assert metric("kame_oracle_tokens_per_second_count", backend="openai") >= 1


async def test_cascade_calls_the_llm_only_on_the_final(
    llm_url, oracle_service, guide_client, session_id
):
    runtime = await oracle_service(base_url=llm_url)
    client = guide_client(runtime.port)
    await client.config(
        session_id=session_id, policy=oracle_pb2.OraclePolicy(name="cascade", poll_interval_s=0.1)
    )
    await speak_partials(
        client,
        [
            (0.0, "What is", False),
            (0.3, "What is the capital", False),
            (0.6, "What is the capital of France", False),
        ],
    )
    await asyncio.sleep(0.5)
    assert client.events(Event.REQUEST_START) == []  # partials start nothing
    await client.user(QUESTION, final=True)
    start = await client.wait_event(Event.REQUEST_START, timeout_s=30)
    assert (start.generation, start.detail) == (1, QUESTION)
    await client.wait_event(Event.DONE, 1, timeout_s=120)
    assert "paris" in client.answer(1).lower()
    assert await client.finish() == grpc.StatusCode.OK


def open_http_requests(session) -> tuple[int, list]:
    """In-flight requests and busy connections in the back-end's HTTP pool."""
    pool = session.backend.client._client._transport._pool
    return len(pool._requests), [c for c in pool.connections if not c.is_idle()]


def stream_tasks() -> list[asyncio.Task]:
    return [
        t
        for t in asyncio.all_tasks()
        if not t.done() and t.get_coro().__qualname__ == "OracleSession._run_stream"
    ]


async def test_a_cancelled_stream_leaves_no_task_and_no_http_stream(llm_url, session_id):
    tasks_before = asyncio.all_tasks()
    cancellations_before = metric("kame_oracle_cancellations_total")
    factory = SessionFactory(OracleSettings(base_url=llm_url), ApiKeys(), store=None)
    session = await factory.open(
        oracle_pb2.OracleConfig(
            session_id=session_id,
            max_tokens=200,
            policy=oracle_pb2.OraclePolicy(poll_interval_s=0.05),
        )
    )
    seen: list[oracle_pb2.GuideResponse] = []
    arrived = asyncio.Event()

    async def collect():
        async for response in session.responses():
            seen.append(response)
            arrived.set()

    collector = asyncio.create_task(collect())

    async def wait_event(kind, generation):
        while not any(r.event.kind == kind and r.event.generation == generation for r in seen):
            arrived.clear()
            await asyncio.wait_for(arrived.wait(), 120)

    session.user_transcript(
        common_pb2.TranscriptEvent(utterance_id="u1", text="Tell me a long story about")
    )
    await wait_event(Event.REQUEST_START, 1)
    # Two more words while generation 1 is still being computed: the next poll
    # (50 ms) cancels it and starts generation 2.
    session.user_transcript(
        common_pb2.TranscriptEvent(utterance_id="u1", text="Tell me a long story about a dragon")
    )
    await wait_event(Event.CANCELLED, 1)
    cancelled_at = next(i for i, r in enumerate(seen) if r.event.kind == Event.CANCELLED)
    assert all(r.update.generation != 1 for r in seen[cancelled_at:] if r.HasField("update"))
    assert len(stream_tasks()) <= 1  # only generation 2's stream is alive
    assert metric("kame_oracle_cancellations_total") == cancellations_before + 1
    await wait_event(Event.REQUEST_START, 2)
    await wait_event(Event.DONE, 2)

    assert stream_tasks() == []
    assert open_http_requests(session) == (0, [])
    await session.close()
    await asyncio.wait_for(collector, 10)
    assert session.backend.client._client.is_closed
    assert asyncio.all_tasks() - tasks_before == set()  # no task left behind
