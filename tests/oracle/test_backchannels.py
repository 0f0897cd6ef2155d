"""A backchannel ("Uh-huh.") said while the agent speaks is context, not a
question: the generation in flight goes on and nothing restarts; the same
words once the agent is quiet, or a real question over it, restart as before."""

from __future__ import annotations

import asyncio

import grpc

from kamepb import common_pb2, oracle_pb2
from services.oracle.backends import create_backend
from services.oracle.config import ApiKeys, OracleSettings, resolve_session
from services.oracle.prompts import AGENT, USER, Turn
from services.oracle.session import OracleSession
from tests.oracle.test_candidates import QUESTION, open_client, scripted_chat
from tests.oracle.test_history import agent, user

Event = oracle_pb2.OracleEvent


async def say(client, text: str, utterance_id: str, span: tuple[float, float]) -> None:
    await client.user(text, utterance_id=utterance_id, span=span)
    await client.user(text, final=True, utterance_id=utterance_id, span=span)


async def speak(client, words: str, start_s: float, step_s: float = 0.3) -> None:
    for i, word in enumerate(words.split()):
        at = start_s + i * step_s
        text = common_pb2.AgentText(text=word, start_s=at, end_s=at + step_s)
        await client.send(oracle_pb2.GuideRequest(agent_text=text))


async def test_a_backchannel_over_the_agent_does_not_restart_the_answer(
    oracle_service, guide_client, stub_http, session_id
):
    hold = asyncio.Event()
    handler = scripted_chat(["Paris", " is the capital of France."], ["Madrid."], hold=hold)
    client = await open_client(handler, oracle_service, guide_client, stub_http, session_id)
    await say(client, QUESTION, "u1", (0.2, 1.8))
    await client.wait_event(Event.FIRST_TOKEN, 1, timeout_s=10)
    await speak(client, "Paris", start_s=2.0)  # the agent says the answer's first word
    await say(client, "Uh-huh.", "u2", (2.4, 2.8))  # over it, in the caller's audio
    await asyncio.sleep(0.5)  # ten poll ticks
    assert client.events(Event.CANCELLED) == []
    assert [e.generation for e in client.events(Event.REQUEST_START)] == [1]
    hold.set()
    await client.wait_event(Event.DONE, 1, timeout_s=10)
    assert client.answer(1) == "Paris is the capital of France."

    # A real question over the agent still starts a new answer.
    await speak(client, "is the capital", start_s=3.2)
    await say(client, "And of Spain?", "u3", (3.5, 4.2))
    await client.wait_event(Event.DONE, 2, timeout_s=10)
    assert client.reset(2).source.utterance_id == "u3"
    assert await client.finish() == grpc.StatusCode.OK


async def test_a_backchannel_joins_the_conversation_and_after_the_agent_is_a_turn():
    history: list[Turn] = []
    config = oracle_pb2.OracleConfig(session_id="nod")
    settings = resolve_session(config, OracleSettings(), ApiKeys())
    # Fed by hand, never started: it calls no LLM; committed turns land in `history`.
    session = OracleSession(settings, create_backend(settings.backend), history, None)
    user(session, QUESTION, (0.2, 1.8))
    assert session.policy.decide() is not None  # the question starts an answer
    agent(session, "Paris is", start_s=2.0)
    user(session, "Yeah, okay.", (2.5, 3.0))
    assert session.policy.decide() is None  # said over the agent: nothing to answer
    assert history == [Turn(USER, QUESTION), Turn(AGENT, "Paris is"), Turn(USER, "Yeah, okay.")]
    user(session, "Okay.", (6.0, 6.4))  # two seconds after the agent's last word
    assert session.policy.decide() is not None
    await session.close()
