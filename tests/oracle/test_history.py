"""The oracle writes the conversation to Redis, and another replica continues it."""

from __future__ import annotations

import grpc

from kame_common import store
from kamepb import oracle_pb2

Event = oracle_pb2.OracleEvent


async def test_another_replica_continues_the_conversation(
    oracle_service, guide_client, stub_http, redis_client, session_id
):
    async def answer(_request, respond):
        await respond.openai_chat(["Madrid."])

    server, url = await stub_http({("POST", "/v1/chat/completions"): answer})
    replica_a = await oracle_service(base_url=f"{url}/v1", model="stub-model")
    replica_b = await oracle_service(base_url=f"{url}/v1", model="stub-model")
    policy = oracle_pb2.OraclePolicy(poll_interval_s=0.05)

    first = guide_client(replica_a.port)
    await first.config(session_id=session_id, policy=policy)
    await first.user("What is the capital of France?", final=True)
    await first.wait_event(Event.DONE, 1, timeout_s=10)
    for word in ["Paris", "is", "the", "capital."]:  # the agent speaks, word by word
        await first.agent(word)
    await first.user("And of", utterance_id="u2")
    await first.user("And of Spain?", final=True, utterance_id="u2")
    start = await first.wait_for(
        lambda r: r.event.kind == Event.REQUEST_START and r.event.detail == "And of Spain?",
        timeout_s=10,
    )
    await first.wait_event(Event.DONE, start.event.generation, timeout_s=10)
    await first.agent("Madrid.")
    assert await first.finish() == grpc.StatusCode.OK  # the stream's end saves "Madrid."

    conversation = await store.SessionStore(redis_client).conversation(session_id)
    assert [(t["role"], t["text"]) for t in conversation] == [
        ("user", "What is the capital of France?"),
        ("agent", "Paris is the capital."),
        ("user", "And of Spain?"),
        ("agent", "Madrid."),
    ]

    # The gateway reconnects the same session to replica B, which loads the history.
    second = guide_client(replica_b.port)
    await second.config(session_id=session_id, policy=policy)
    await second.user("And Italy?", final=True)
    await second.wait_event(Event.DONE, 1, timeout_s=10)
    prompt = server.posts()[-1].json()["messages"][-1]["content"]
    assert (
        "User: What is the capital of France?\nAssistant: Paris is the capital.\n"
        "User: And of Spain?\nAssistant: Madrid.\nUser: And Italy?"
    ) in prompt
    assert await second.finish() == grpc.StatusCode.OK
    conversation = await store.SessionStore(redis_client).conversation(session_id)
    assert [t["text"] for t in conversation][-1] == "And Italy?"
    await store.SessionStore(redis_client).delete_session(session_id)
