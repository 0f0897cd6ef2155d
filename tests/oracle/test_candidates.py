"""What each candidate carries and when a final restarts the LLM.

- A RESET carries the candidate's first whole words and its source (the caller's
  utterance it answers) in one message; a stream without words sends no RESET.
- A final whose words equal the source of the generation in flight, or of the one
  that just finished, keeps that generation; any other final restarts at once,
  without waiting for the poll tick.

A local OpenAI-compatible server (chat completions) plays scripted answers, so
the chunking and the timing of each stream are known exactly.
"""

from __future__ import annotations

import asyncio

import grpc
from prometheus_client import REGISTRY

from kamepb import common_pb2, oracle_pb2
from services.oracle.backends import create_backend
from services.oracle.config import ApiKeys, OracleSettings, resolve_session
from services.oracle.policy import StartReason
from services.oracle.session import OracleSession
from tests.oracle.test_history import user
from tests.support import wait_until

Event = oracle_pb2.OracleEvent
Update = common_pb2.OracleUpdate
QUESTION = "What is the capital of France?"


def finals_kept() -> float:
    return REGISTRY.get_sample_value("kame_oracle_finals_kept_total") or 0.0


def scripted_chat(*answers: list[str], hold: asyncio.Event | None = None):
    """A /v1/chat/completions handler that streams `answers[n]` (chunks) on the n-th
    request (the last repeats); "<error>" answers HTTP 500. With `hold`, the first
    request stops after its first chunk until `hold` is set."""
    script = list(answers)

    async def handle(_request, respond):
        chunks = script.pop(0) if len(script) > 1 else script[0]
        if chunks == ["<error>"]:
            await respond.json(500, {"error": {"message": "boom", "type": "server"}})
            return
        if hold is not None and not hold.is_set():
            await respond.start_sse()
            await respond.sse(chat_chunk(chunks[0]))
            await hold.wait()
            for chunk in chunks[1:]:
                await respond.sse(chat_chunk(chunk))
            await respond.sse("[DONE]")
            return
        await respond.openai_chat(chunks)

    return handle


def chat_chunk(text: str) -> dict:
    return {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "stub-model",
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
    }


async def open_client(handler, oracle_service, guide_client, stub_http, session_id, poll_s=0.05):
    _server, url = await stub_http({("POST", "/v1/chat/completions"): handler})
    runtime = await oracle_service(base_url=f"{url}/v1", model="stub-model")
    client = guide_client(runtime.port)
    await client.config(
        session_id=session_id, policy=oracle_pb2.OraclePolicy(poll_interval_s=poll_s)
    )
    return client


def of_generation(client, generation: int) -> list[tuple[str, int]]:
    """(message kind, event kind or update op) of one generation, in arrival order."""
    return [
        ("event", r.event.kind) if r.HasField("event") else ("update", r.update.op)
        for r in client.responses
        if (r.event.generation if r.HasField("event") else r.update.generation) == generation
    ]


async def test_the_reset_carries_the_first_whole_words_and_the_source(
    oracle_service, guide_client, stub_http, session_id
):
    # The first chunk is half a word: nothing goes out until the word is whole.
    handler = scripted_chat([" Par", "is", " is the", " capital", "."])
    client = await open_client(handler, oracle_service, guide_client, stub_http, session_id)
    await client.user("What is the capital  of", utterance_id="u7")
    await client.wait_event(Event.DONE, 1, timeout_s=10)

    client.assert_update_protocol()
    assert [(u.op, u.text) for u in client.updates()] == [
        (Update.RESET, "Paris is"),  # one message: the anchor and its first words
        (Update.APPEND, "the"),
        (Update.APPEND, "capital."),
    ]
    assert client.reset(1).source == common_pb2.CandidateSource(
        utterance_id="u7", is_final=False, text="What is the capital of"
    )
    assert of_generation(client, 1) == [
        ("event", Event.REQUEST_START),
        ("event", Event.FIRST_TOKEN),
        ("update", Update.RESET),
        ("update", Update.APPEND),
        ("update", Update.APPEND),
        ("event", Event.DONE),
    ]
    assert await client.finish() == grpc.StatusCode.OK


async def test_a_one_word_answer_resets_at_the_end_and_a_blank_one_not_at_all(
    oracle_service, guide_client, stub_http, session_id
):
    handler = scripted_chat(["Paris."], ["  ", "\n"])
    client = await open_client(handler, oracle_service, guide_client, stub_http, session_id)
    await client.user(QUESTION, final=True)
    await client.wait_event(Event.DONE, 1, timeout_s=10)
    await client.user("And of Spain?", final=True, utterance_id="u2")
    await client.wait_event(Event.DONE, 2, timeout_s=10)

    updates = client.updates()
    assert [(u.op, u.generation, u.text) for u in updates] == [(Update.RESET, 1, "Paris.")]
    assert updates[0].source == common_pb2.CandidateSource(
        utterance_id="u1", is_final=True, text=QUESTION
    )
    assert client.events(Event.FIRST_TOKEN) != [] and client.events(Event.ERROR) == []
    assert await client.finish() == grpc.StatusCode.OK


async def test_a_final_with_the_words_of_the_finished_generation_keeps_it(
    oracle_service, guide_client, stub_http, session_id
):
    handler = scripted_chat(["Paris is the capital."])
    client = await open_client(handler, oracle_service, guide_client, stub_http, session_id)
    kept_before = finals_kept()
    await client.user("what is the capital of France")
    await client.wait_event(Event.DONE, 1, timeout_s=10)
    # The final differs only in case and punctuation: generation 1 already answers it.
    await client.user(QUESTION, final=True)
    await asyncio.sleep(0.5)  # ten poll ticks
    assert [e.generation for e in client.events(Event.REQUEST_START)] == [1]
    assert finals_kept() == kept_before + 1

    await client.user("And of Spain?", final=True, utterance_id="u2")  # other words: restart
    start = await client.wait_event(Event.REQUEST_START, 2, timeout_s=10)
    assert start.detail.endswith("And of Spain?")
    await client.wait_event(Event.DONE, 2, timeout_s=10)
    assert client.reset(2).source.is_final
    assert await client.finish() == grpc.StatusCode.OK


async def test_a_final_with_the_words_of_the_generation_in_flight_keeps_it(
    oracle_service, guide_client, stub_http, session_id
):
    hold = asyncio.Event()
    handler = scripted_chat(["Paris", " is the capital."], hold=hold)
    client = await open_client(handler, oracle_service, guide_client, stub_http, session_id)
    kept_before = finals_kept()
    await client.user("What is the capital of France")
    await client.wait_event(Event.FIRST_TOKEN, 1, timeout_s=10)
    await client.user(QUESTION, final=True)  # generation 1 is still streaming
    await asyncio.sleep(0.5)
    assert client.events(Event.CANCELLED) == []
    assert [e.generation for e in client.events(Event.REQUEST_START)] == [1]
    assert finals_kept() == kept_before + 1
    hold.set()
    await client.wait_event(Event.DONE, 1, timeout_s=10)
    assert client.answer(1) == "Paris is the capital."
    assert await client.finish() == grpc.StatusCode.OK


async def test_a_final_after_a_failed_generation_restarts(
    oracle_service, guide_client, stub_http, session_id
):
    handler = scripted_chat(["<error>"], ["Paris."])
    client = await open_client(handler, oracle_service, guide_client, stub_http, session_id)
    await client.user("What is the capital of France")
    await client.wait_event(Event.ERROR, 1, timeout_s=10)
    await client.user(QUESTION, final=True)  # same words, but generation 1 has no answer
    await client.wait_event(Event.DONE, 2, timeout_s=10)
    assert client.answer(2) == "Paris."
    assert await client.finish() == grpc.StatusCode.OK


async def test_a_final_starts_a_stream_without_waiting_for_the_poll_tick(
    oracle_service, guide_client, stub_http, session_id
):
    handler = scripted_chat(["Paris."])
    client = await open_client(
        handler, oracle_service, guide_client, stub_http, session_id, poll_s=60.0
    )
    await client.user("What is the capital", utterance_id="u1")
    await client.user(QUESTION, final=True, utterance_id="u1")
    # The first tick would come a minute after the config; the final does not wait for it.
    start = await client.wait_event(Event.REQUEST_START, 1, timeout_s=20)
    assert start.detail == QUESTION
    await client.wait_event(Event.DONE, 1, timeout_s=20)
    assert client.answer(1) == "Paris."
    assert await client.finish() == grpc.StatusCode.OK


async def test_a_settled_partial_starts_at_once_and_its_final_keeps_that_candidate(
    oracle_service, guide_client, stub_http, session_id
):
    """stt sends the early final's words as a partial whose every word is stable, a
    pause before the final: the LLM starts on it without waiting for the poll tick,
    and the final with the same words keeps that one candidate."""
    handler = scripted_chat(["Paris."])
    client = await open_client(
        handler, oracle_service, guide_client, stub_http, session_id, poll_s=60.0
    )
    kept_before = finals_kept()
    await client.user("What is the capital", utterance_id="u1")  # unsettled: waits for a tick
    settled = common_pb2.TranscriptEvent(
        utterance_id="u1", text=QUESTION, stable_text=QUESTION, stability=1.0
    )
    await client.send(oracle_pb2.GuideRequest(user_transcript=settled))
    start = await client.wait_event(Event.REQUEST_START, 1, timeout_s=20)
    assert start.detail == QUESTION
    await client.wait_event(Event.DONE, 1, timeout_s=20)
    await client.user(QUESTION.rstrip("?"), final=True, utterance_id="u1")
    await asyncio.sleep(0.5)
    assert [e.generation for e in client.events(Event.REQUEST_START)] == [1]
    assert finals_kept() == kept_before + 1
    reset = client.reset(1)
    assert (reset.source.text, reset.source.is_final) == (QUESTION, False)
    assert client.answer(1) == "Paris."
    assert await client.finish() == grpc.StatusCode.OK


def final_decode(at_s: float) -> oracle_pb2.GuideRequest:
    activity = common_pb2.SpeechActivity(
        kind=common_pb2.SpeechActivity.FINAL_DECODE, utterance_id="u1", at_s=at_s
    )
    return oracle_pb2.GuideRequest(speech_activity=activity)


async def test_speculation_yields_to_the_final_decode_until_its_words_come(
    oracle_service, guide_client, stub_http, session_id
):
    """stt starts decoding the final (FINAL_DECODE): the stream an ordinary partial
    started is cancelled, a later partial of the same audio starts nothing, and the
    settled partial (the decode's words) starts the answer at once."""
    hold = asyncio.Event()
    handler = scripted_chat(["Well,", " the"], ["Paris."], hold=hold)
    client = await open_client(handler, oracle_service, guide_client, stub_http, session_id)
    await client.user("What is the capital", span=(0.0, 1.5))
    await client.wait_event(Event.FIRST_TOKEN, 1, timeout_s=20)
    await client.send(final_decode(at_s=2.4))
    await client.wait_event(Event.CANCELLED, 1, timeout_s=20)
    hold.set()  # (it holds every request while unset)
    await client.user("What is the capital of France", span=(0.0, 2.2))  # 2 new words
    await asyncio.sleep(0.3)  # six poll ticks
    assert [e.generation for e in client.events(Event.REQUEST_START)] == [1]
    settled = common_pb2.TranscriptEvent(
        utterance_id="u1", text=QUESTION, stable_text=QUESTION, stability=1.0
    )
    settled.span.start_s, settled.span.end_s = 0.0, 2.4
    await client.send(oracle_pb2.GuideRequest(user_transcript=settled))
    start = await client.wait_event(Event.REQUEST_START, 2, timeout_s=20)
    assert start.detail == QUESTION
    await client.wait_event(Event.DONE, 2, timeout_s=20)
    assert client.answer(2) == "Paris."
    assert await client.finish() == grpc.StatusCode.OK


async def test_speech_after_the_decoded_audio_ends_the_yield(
    oracle_service, guide_client, stub_http, session_id
):
    """The caller went on talking (stt discards its early final): a partial of audio
    past the decoded end starts a candidate as before."""
    client = await open_client(
        scripted_chat(["Hmm."]), oracle_service, guide_client, stub_http, session_id
    )
    await client.send(final_decode(at_s=1.0))
    await client.user("What is the capital of France", span=(0.0, 2.0))
    start = await client.wait_event(Event.REQUEST_START, 1, timeout_s=20)
    assert start.detail == "What is the capital of France"
    assert await client.finish() == grpc.StatusCode.OK


async def test_without_final_priority_the_partials_stream_runs_through_the_decode(
    oracle_service, guide_client, stub_http, session_id
):
    """final_priority off (an LLM on other hardware than stt): nothing yields."""
    hold = asyncio.Event()
    _server, url = await stub_http(
        {("POST", "/v1/chat/completions"): scripted_chat(["Well,", " the"], hold=hold)}
    )
    runtime = await oracle_service(base_url=f"{url}/v1", model="stub-model", final_priority=False)
    client = guide_client(runtime.port)
    await client.config(session_id=session_id, policy=oracle_pb2.OraclePolicy(poll_interval_s=0.05))
    await client.user("What is the capital", span=(0.0, 1.5))
    await client.wait_event(Event.FIRST_TOKEN, 1, timeout_s=20)
    await client.send(final_decode(at_s=2.4))
    await client.user("What is the capital of France", span=(0.0, 2.2))
    await client.wait_event(Event.REQUEST_START, 2, timeout_s=20)  # the new words restart it
    hold.set()
    assert await client.finish() == grpc.StatusCode.OK


async def test_a_final_that_lands_while_the_old_stream_closes_starts_one_candidate():
    """The start a final asks for first closes the partial's stream; a newer final
    that lands while it closes is the new stream's source, and starts no second
    stream that cancels the first (a full run saw the caller's "And of Spain?"
    started twice, the first cancelled before its DONE)."""
    config = oracle_pb2.OracleConfig(
        session_id="race", policy=oracle_pb2.OraclePolicy(poll_interval_s=0.05)
    )
    settings = resolve_session(config, OracleSettings(), ApiKeys())
    backend = create_backend(settings.backend)
    asked: list[str] = []
    closing, closed = asyncio.Event(), asyncio.Event()

    async def stream_with_tools(turns, _cost, _specs, _exchanges):  # the LLM, faked
        asked.append(turns[-1].text)
        if len(asked) == 1:  # the partial's stream: words, then it waits to be cancelled
            try:
                yield "Paris "
                await asyncio.Event().wait()
            finally:
                closing.set()
                await closed.wait()  # its HTTP stream closes slowly
        yield "Madrid."

    backend.stream_with_tools = stream_with_tools  # type: ignore[method-assign]
    session = OracleSession(settings, backend, [], None)
    events: list[tuple[str, int]] = []

    async def read() -> None:
        async for response in session.responses():
            if response.HasField("event"):
                kind = Event.Kind.Name(response.event.kind)
                events.append((kind, response.event.generation))

    reader = asyncio.create_task(read())
    session.start()
    user(session, "What is the capital of", (0.3, 1.6), final=False)
    await wait_until(lambda: ("FIRST_TOKEN", 1) in events, "the partial's stream")
    user(session, QUESTION, (0.3, 2.2))  # its start cancels the partial's stream
    await asyncio.wait_for(closing.wait(), 10)
    session.user_transcript(
        common_pb2.TranscriptEvent(utterance_id="u2", is_final=True, text="And of Spain?")
    )
    closed.set()
    await wait_until(lambda: ("DONE", 2) in events or ("CANCELLED", 2) in events, "gen 2's end")
    await session.close()
    reader.cancel()
    assert ("CANCELLED", 2) not in events, events
    # One stream for the final, with both of the caller's turns (one user turn: no
    # agent words between them).
    assert len(asked) == 2 and asked[1].endswith(f"{QUESTION} And of Spain?"), asked


async def test_a_stream_cancelled_before_it_ran_still_ends_with_cancelled():
    """Every REQUEST_START gets its end: a start right after another cancels a
    stream whose task never ran, and CANCELLED still goes out for it."""
    settings = resolve_session(
        oracle_pb2.OracleConfig(session_id="quick"), OracleSettings(), ApiKeys()
    )
    backend = create_backend(settings.backend)

    async def stream_with_tools(_turns, _cost, _specs, _exchanges):  # the LLM, faked
        yield "Madrid."

    backend.stream_with_tools = stream_with_tools  # type: ignore[method-assign]
    session = OracleSession(settings, backend, [], None)
    user(session, QUESTION, (0.3, 2.2))
    await session._restart(StartReason.FINAL)  # no await between: stream 1 never runs
    await session._restart(StartReason.FINAL)
    events: list[tuple[str, int]] = []
    async for response in session.responses():
        if response.HasField("event"):
            events.append((Event.Kind.Name(response.event.kind), response.event.generation))
        if ("DONE", 2) in events:
            break
    await session.close()
    assert events[:3] == [("REQUEST_START", 1), ("CANCELLED", 1), ("REQUEST_START", 2)], events
