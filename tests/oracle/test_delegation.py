"""Client delegation: the caller's back-end answers in the LLM's place, and the
client's context (commentary, thinking, instructions) in any session.

The test plays the gateway on the real oracle's Guide stream: it reads each
GuideResponse.delegation and answers it with AgentContext, as a client's
back-end would through the gateway. The facts the answers carry are made up
by the test, so no model could have said them. Sessions with an LLM use the
fake of tool_support.py (on conftest's stub_http), whose requests show the
prompt the oracle built.
"""

from __future__ import annotations

import asyncio
import uuid

import grpc
import pytest

from kame_common import store
from kamepb import common_pb2, oracle_pb2
from services.oracle.delegation import APOLOGY
from tests.oracle.test_bad_input import closed_port_url
from tests.oracle.tool_support import FAKE_LLM_ROUTES
from tests.support.metrics import metric

Event = oracle_pb2.OracleEvent
Update = common_pb2.OracleUpdate
Context = common_pb2.AgentContext
POLICY = oracle_pb2.OraclePolicy(poll_interval_s=0.05, max_starts=50)
QUESTION = "What is the door code of the Paris office?"


@pytest.fixture
def secret() -> str:
    return f"zq-{uuid.uuid4().hex[:8]}"


def context(kind: int, text: str, delegation_id: str = "") -> oracle_pb2.GuideRequest:
    return oracle_pb2.GuideRequest(
        context=Context(kind=kind, text=text, delegation_id=delegation_id)
    )


def delegations(client) -> list[common_pb2.Delegation]:
    return [r.delegation for r in client.responses if r.HasField("delegation")]


async def next_delegation(client, count: int) -> common_pb2.Delegation:
    """The `count`-th delegation of the stream (1-based), once it is out."""
    await client.wait_for(lambda _r: len(delegations(client)) >= count, timeout_s=10)
    return delegations(client)[count - 1]


async def open_delegating(oracle_service, guide_client, session_id, timeout_s=1.0):
    """A client-delegation session on an oracle whose own LLM cannot be reached:
    a delegation needs none, so none is checked."""
    runtime = await oracle_service(base_url=closed_port_url())
    client = guide_client(runtime.port)
    await client.config(
        session_id=session_id,
        policy=POLICY,
        client_delegation=True,
        delegation_timeout_s=timeout_s,
        frontend_ends_turns=True,
    )
    return client


async def test_commentary_answers_a_delegation_as_the_candidate(
    secret, oracle_service, guide_client, session_id
):
    client = await open_delegating(oracle_service, guide_client, session_id)
    answered_before = metric("kame_oracle_delegations_total", outcome="answered")
    await client.user("What is the door")  # an ordinary partial starts no delegation
    await asyncio.sleep(0.3)
    assert delegations(client) == []
    await client.user(QUESTION, final=True)

    delegation = await next_delegation(client, 1)
    assert delegation.delegation_id.startswith("delegation-")
    assert (delegation.source.utterance_id, delegation.source.text) == ("u1", QUESTION)
    assert delegation.source.is_final
    await client.send(context(Context.THINKING, "Looking it up.", delegation.delegation_id))
    await client.send(
        context(Context.COMMENTARY, f"The code is  {secret}.", delegation.delegation_id)
    )
    await client.send(context(Context.COMMENTARY, "Anything else?", delegation.delegation_id))
    await client.wait_event(Event.DONE, 1, timeout_s=10)

    reset, append = client.updates()
    assert (reset.op, reset.text, reset.source.text) == (
        Update.RESET,
        f"The code is {secret}.",
        QUESTION,
    )
    assert (append.op, append.generation, append.text) == (Update.APPEND, 1, "Anything else?")
    assert [e.kind for e in client.events() if e.generation == 1] == [
        Event.REQUEST_START,
        Event.FIRST_TOKEN,
        Event.DONE,
    ]
    assert metric("kame_oracle_delegations_total", outcome="answered") == answered_before + 1
    client.assert_update_protocol()

    # The delegation has ended: more commentary for it is dropped, not spoken.
    late_before = metric("kame_oracle_late_delegation_context_total")
    await client.send(context(Context.COMMENTARY, "Too late.", delegation.delegation_id))
    assert await client.finish() == grpc.StatusCode.OK
    assert metric("kame_oracle_late_delegation_context_total") == late_before + 1
    assert len(client.updates()) == 2


async def test_a_delegation_without_commentary_apologises_and_the_call_goes_on(
    secret, oracle_service, guide_client, session_id
):
    client = await open_delegating(oracle_service, guide_client, session_id, timeout_s=0.5)
    await client.user(QUESTION, final=True)
    first = await next_delegation(client, 1)
    # Thinking keeps a delegation open, but says nothing: the apology comes after it.
    await asyncio.sleep(0.3)
    await client.send(context(Context.THINKING, "Still looking.", first.delegation_id))
    await client.wait_event(Event.DONE, 1, timeout_s=10)
    assert client.answer(1) == APOLOGY

    await client.user("And the London office?", final=True, utterance_id="u2")
    second = await next_delegation(client, 2)
    assert second.delegation_id != first.delegation_id
    await client.send(context(Context.COMMENTARY, f"It is {secret}.", second.delegation_id))
    await client.wait_event(Event.DONE, 2, timeout_s=10)
    assert client.answer(2) == f"It is {secret}."
    assert await client.finish() == grpc.StatusCode.OK


async def test_a_newer_question_replaces_the_delegation_in_flight(
    secret, oracle_service, guide_client, session_id
):
    client = await open_delegating(oracle_service, guide_client, session_id, timeout_s=5.0)
    settled = common_pb2.TranscriptEvent(
        utterance_id="u1", text="What is the door code", stable_text="What is the door code"
    )
    await client.send(oracle_pb2.GuideRequest(user_transcript=settled))
    first = await next_delegation(client, 1)  # stt's settled early final starts one
    await client.user(QUESTION, final=True)  # other words: a delegation of its own
    second = await next_delegation(client, 2)
    await client.wait_event(Event.CANCELLED, 1, timeout_s=10)
    await client.send(context(Context.COMMENTARY, "Stale words.", first.delegation_id))
    await client.send(context(Context.COMMENTARY, f"Code {secret}.", second.delegation_id))
    await client.wait_for(lambda r: r.HasField("update"), timeout_s=10)
    (update,) = client.updates()
    assert (update.generation, update.text, update.source.text) == (2, f"Code {secret}.", QUESTION)
    assert await client.finish() == grpc.StatusCode.OK


async def test_a_final_with_the_settled_words_keeps_their_delegation(
    oracle_service, guide_client, session_id
):
    client = await open_delegating(oracle_service, guide_client, session_id, timeout_s=5.0)
    settled = common_pb2.TranscriptEvent(utterance_id="u1", text=QUESTION, stable_text=QUESTION)
    await client.send(oracle_pb2.GuideRequest(user_transcript=settled))
    first = await next_delegation(client, 1)
    await client.user(QUESTION, final=True)
    await client.send(context(Context.COMMENTARY, "Four two.", first.delegation_id))
    await client.wait_for(lambda r: r.HasField("update"), timeout_s=10)
    assert len(delegations(client)) == 1 and client.answer(1) == "Four two."
    assert await client.finish() == grpc.StatusCode.OK


async def test_thinking_and_instructions_reach_the_llms_prompt_and_the_conversation(
    secret, stub_http, oracle_service, guide_client, session_id, redis_client
):
    llm, url = await stub_http(FAKE_LLM_ROUTES)
    runtime = await oracle_service(base_url=f"{url}/v1", model="stub-model")
    client = guide_client(runtime.port)
    await client.config(session_id=session_id, policy=POLICY)
    await client.send(context(Context.THINKING, f"The caller's account is {secret}."))
    await client.send(context(Context.COMMENTARY, "The shop closes at six."))
    await client.send(context(Context.INSTRUCTIONS, "Answer in one short sentence."))
    await client.user("When do you close?", final=True)
    await client.wait_event(Event.DONE, 1, timeout_s=30)

    messages = llm.posts()[-1].json()["messages"]
    assert messages[0]["content"].endswith("\nAnswer in one short sentence.")
    assert (
        f"Note: The caller's account is {secret}. The shop closes at six.\nUser: When do you close?"
    ) in messages[-1]["content"]
    assert await client.finish() == grpc.StatusCode.OK
    conversation = await store.SessionStore(redis_client).conversation(session_id)
    assert [(t["role"], t["text"]) for t in conversation][:3] == [
        ("context", f"The caller's account is {secret}."),
        ("context", "The shop closes at six."),
        ("user", "When do you close?"),
    ]
    await store.SessionStore(redis_client).delete_session(session_id)
