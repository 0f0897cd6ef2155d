"""The conversation log: agent words go after the user turn they answer, the
oracle writes the log to Redis, and another replica continues it."""

from __future__ import annotations

import grpc
import pytest

from kame_common import store
from kamepb import common_pb2, oracle_pb2
from services.oracle.backends import create_backend
from services.oracle.config import ApiKeys, OracleSettings, resolve_session
from services.oracle.prompts import AGENT, USER, Turn
from services.oracle.session import OracleSession

Event = oracle_pb2.OracleEvent
QUESTION = "What is the capital of France?"


@pytest.fixture
async def unstarted_session():
    """open(history) -> an OracleSession that is fed by hand: not started, so it never
    calls its LLM; it appends committed turns to `history`. Closed at teardown."""
    sessions: list[OracleSession] = []

    def open_session(history: list[Turn], **service: object) -> OracleSession:
        settings = resolve_session(
            oracle_pb2.OracleConfig(session_id="order"), OracleSettings(**service), ApiKeys()
        )
        sessions.append(OracleSession(settings, create_backend(settings.backend), history, None))
        return sessions[-1]

    yield open_session
    for session in sessions:
        await session.close()


def user(session: OracleSession, text: str, span: tuple[float, float], final: bool = True) -> None:
    session.user_transcript(
        common_pb2.TranscriptEvent(
            utterance_id=f"u{span[0]}",
            is_final=final,
            text=text,
            span=common_pb2.AudioSpan(start_s=span[0], end_s=span[1]),
        )
    )


def agent(
    session: OracleSession, words: str, start_s: float, step_s: float = 0.3, filler: bool = False
) -> None:
    """The agent speaks `words` one by one from `start_s` on."""
    for i, word in enumerate(words.split()):
        at = start_s + i * step_s
        session.agent_text(
            common_pb2.AgentText(text=word, start_s=at, end_s=at + step_s, filler=filler)
        )


async def test_an_answer_spoken_before_the_final_arrives_is_stored_after_the_question(
    unstarted_session,
):
    history: list[Turn] = []
    session = unstarted_session(history)
    user(session, "What is the capital of", (0.5, 1.8), final=False)
    # Tandem: the agent answers at 2.4 s, before the caller's final (speech 0.5-2.2 s) lands.
    agent(session, "Paris is the capital.", start_s=2.4)
    user(session, QUESTION, (0.5, 2.2))
    assert history == [Turn(USER, QUESTION)]  # the answer waits: it started after the question
    user(session, "And of Spain?", (4.0, 5.1))
    assert history == [
        Turn(USER, QUESTION),
        Turn(AGENT, "Paris is the capital."),
        Turn(USER, "And of Spain?"),
    ]
    agent(session, "Madrid.", start_s=5.0)  # spoken after the next utterance began
    await session.close()
    assert history[-1] == Turn(AGENT, "Madrid.")  # the session's end saves the rest


async def test_a_hold_phrase_is_not_part_of_the_conversation(unstarted_session):
    history: list[Turn] = []
    session = unstarted_session(history)
    user(session, QUESTION, (0.5, 2.2))
    agent(session, "Hmm,", start_s=2.6, filler=True)  # said while the answer was not ready
    agent(session, "Paris.", start_s=3.4)
    await session.close()
    assert history == [Turn(USER, QUESTION), Turn(AGENT, "Paris.")]


async def test_a_barge_in_splits_the_agent_turn_where_the_caller_began(unstarted_session):
    history: list[Turn] = []
    session = unstarted_session(history)
    user(session, QUESTION, (0.5, 2.2))
    # Words at 3.0, 3.3, 3.6 | the caller breaks in at 3.8 | 3.9, 4.2 spoken over the caller.
    agent(session, "Paris is the capital of", start_s=3.0)
    user(session, "Wait, and Spain?", (3.8, 5.0))
    assert history == [
        Turn(USER, QUESTION),
        Turn(AGENT, "Paris is the"),
        Turn(USER, "Wait, and Spain?"),
    ]
    await session.close()
    assert history[-1] == Turn(AGENT, "capital of")


async def test_without_a_span_a_final_follows_every_word_spoken_so_far(unstarted_session):
    history: list[Turn] = []
    session = unstarted_session(history)
    agent(session, "Hello, how can I help?", start_s=7.0)
    session.user_transcript(common_pb2.TranscriptEvent(utterance_id="u1", is_final=True, text="Hi"))
    assert history == [Turn(AGENT, "Hello, how can I help?"), Turn(USER, "Hi")]


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
    await first.user("What is the capital of", span=(0.3, 1.6))
    await first.wait_event(Event.DONE, 1, timeout_s=10)
    # The agent answers word by word before the caller's final arrives.
    for i, word in enumerate(["Paris", "is", "the", "capital."]):
        await first.agent(word, start_s=2.4 + 0.2 * i)
    await first.user(QUESTION, final=True, span=(0.3, 2.2))
    await first.user("And of", utterance_id="u2", span=(4.0, 4.6))
    await first.user("And of Spain?", final=True, utterance_id="u2", span=(4.0, 5.0))
    start = await first.wait_for(
        lambda r: r.event.kind == Event.REQUEST_START and r.event.detail == "And of Spain?",
        timeout_s=10,
    )
    await first.wait_event(Event.DONE, start.event.generation, timeout_s=10)
    await first.agent("Madrid.", start_s=5.4)
    assert await first.finish() == grpc.StatusCode.OK  # the stream's end saves "Madrid."

    conversation = await store.SessionStore(redis_client).conversation(session_id)
    assert [(t["role"], t["text"]) for t in conversation] == [
        ("user", QUESTION),
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
        f"User: {QUESTION}\nAssistant: Paris is the capital.\n"
        "User: And of Spain?\nAssistant: Madrid.\nUser: And Italy?"
    ) in prompt
    assert await second.finish() == grpc.StatusCode.OK
    conversation = await store.SessionStore(redis_client).conversation(session_id)
    assert [t["text"] for t in conversation][-1] == "And Italy?"
    await store.SessionStore(redis_client).delete_session(session_id)


async def test_a_key_the_caller_pressed_joins_the_callers_side_after_what_the_agent_said(
    unstarted_session,
):
    history: list[Turn] = []
    session = unstarted_session(history)
    user(session, "Press one for sales?", (0.5, 1.8))
    agent(session, "Yes, press one.", start_s=2.0)
    session.keypress("1")
    assert history == [
        Turn(USER, "Press one for sales?"),
        Turn(AGENT, "Yes, press one."),
        Turn(USER, "(pressed a key)"),  # which one only with dtmf_to_llm (a PIN?)
    ]


async def test_keys_pressed_in_a_row_are_one_bounded_turn(unstarted_session):
    """The attack: a flood of keys, each one a turn of the prompt and the log. A
    run is one turn, naming at most 32 keys; what ends it starts a new one."""
    history: list[Turn] = []
    session = unstarted_session(history, dtmf_to_llm=True)
    for digit in "1234":
        session.keypress(digit)
    assert history == [Turn(USER, "(pressed 1 2 3 4 on the keypad)")]
    for _ in range(5000):
        session.keypress("9")
    (run,) = history
    assert run.text.endswith(" 9 and more on the keypad)") and len(run.text) < 100
    user(session, "Did that work?", (3.0, 3.6))
    session.keypress("#")
    assert [t.text for t in history[1:]] == ["Did that work?", "(pressed # on the keypad)"]


async def test_a_pin_never_reaches_the_llm_or_the_log_unless_allowed(
    oracle_service, guide_client, stub_http, redis_client, session_id
):
    """The attack on privacy: a caller's PIN went to the LLM's vendor in every
    prompt and stayed in Redis."""

    async def answer(_request, respond):
        await respond.openai_chat(["Thanks."])

    server, url = await stub_http({("POST", "/v1/chat/completions"): answer})
    oracle = await oracle_service(base_url=f"{url}/v1", model="stub-model")
    client = guide_client(oracle.port)
    await client.config(session_id=session_id, policy=oracle_pb2.OraclePolicy(poll_interval_s=0.05))
    for digit in "4921":
        await client.send(oracle_pb2.GuideRequest(dtmf=common_pb2.Dtmf(digit=digit)))
    await client.user("That is my PIN.", final=True, span=(1.0, 2.0))
    await client.wait_event(Event.DONE, 1, timeout_s=10)
    assert await client.finish() == grpc.StatusCode.OK
    prompt = server.posts()[-1].json()["messages"][-1]["content"]
    assert "User: (pressed 4 keys) That is my PIN." in prompt
    conversation = await store.SessionStore(redis_client).conversation(session_id)
    assert [t["text"] for t in conversation] == ["(pressed 4 keys)", "That is my PIN."]
    assert "9" not in prompt.split("Conversation so far")[-1]
    await store.SessionStore(redis_client).delete_session(session_id)
