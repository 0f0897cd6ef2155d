"""The OpenAI Realtime endpoint, /v1/realtime, driven by the official `openai`
SDK as its users drive it (`AsyncOpenAI(base_url=...).realtime.connect`),
against the web service and a real gateway in front of the scripted fake
upstreams (tests/gateway/fakes.py): the session's events, a spoken turn and the
agent's answer as a response with its whole lifecycle, a barge-in that cancels
it, the agent's item truncated to what was played, retrieved and deleted, and
the protocol's errors (bad events, events out of order, an unknown model, a
missing or wrong token, an idle socket) with another session at the same time
untouched."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator

import pytest
import websockets
from openai import AsyncOpenAI
from websockets.exceptions import ConnectionClosed, InvalidStatus

from kamepb import common_pb2
from services.web.server import WebServer
from tests.gateway.fakes import transcript
from tests.support import wait_until
from tests.support.web import web_before

TOKEN = "realtime-test-token-0123456789"
ONE_SECOND = bytes(2 * 24000)  # PCM16 at 24 kHz, silent: the fakes do not listen
# The response lifecycle a client asserts, in order (deltas left out).
OPENED = [
    "response.created",
    "response.output_item.added",
    "conversation.item.added",
    "response.content_part.added",
]
CLOSED = [
    "response.output_audio.done",
    "response.output_audio_transcript.done",
    "response.content_part.done",
    "response.output_item.done",
    "conversation.item.done",
    "response.done",
]
DELTAS = ("response.output_audio.delta", "response.output_audio_transcript.delta")


@contextlib.asynccontextmanager
async def web_service(fakes, gateway_settings=None, **settings) -> AsyncIterator[WebServer]:
    """The web service (with `settings`) before a gateway that takes TOKEN
    (with `gateway_settings`)."""
    gateway = await fakes.gateway(auth_tokens=TOKEN, **(gateway_settings or {}))
    async with web_before(gateway.address, **settings) as server:
        yield server


@pytest.fixture
async def web(fakes):
    async with web_service(fakes) as server:
        yield server


def connect(web, model: str = "kame-tandem", token: str = TOKEN, **headers: str):
    """The SDK's connection, as its users open it (the gateway's token is the API key)."""
    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{web.port}/v1", api_key=token)
    return client.realtime.connect(model=model, extra_headers=headers)


async def events_until(connection, last: str, timeout_s: float = 10.0) -> list:
    """The events received up to the first of type `last`, that one included."""
    seen = []
    async with asyncio.timeout(timeout_s):
        while not seen or seen[-1].type != last:
            seen.append(await connection.recv())
    return seen


async def received(connection, count: int, timeout_s: float = 10.0) -> list:
    """The next `count` events (a test that expects more than come fails, not hangs)."""
    async with asyncio.timeout(timeout_s):
        return [await connection.recv() for _ in range(count)]


def kinds(events: list, leave_out: tuple[str, ...] = DELTAS) -> list[str]:
    return [e.type for e in events if e.type not in leave_out]


async def test_a_spoken_turn_gets_the_agents_answer_as_a_whole_response(web, fakes):
    fakes.stt.script = {
        3: [transcript("u-1", "what is the", False, 0.2)],
        6: [transcript("u-1", "what is the capital", True, 0.4)],
    }
    # The agent speaks from frame 20, well after the final (stt's and the frontend's
    # answers reach the gateway on streams of their own, in no set order).
    fakes.frontend.speak_at = 20
    fakes.frontend.words = {21: ("Paris", 1)}
    async with connect(web) as connection:
        created = await connection.recv()
        assert created.type == "session.created" and created.session.model == "kame-tandem"
        await connection.session.update(
            session={
                "type": "realtime",
                "instructions": "Be brief.",
                "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}}},
            }
        )
        updated = await connection.recv()
        assert updated.type == "session.updated" and updated.session.instructions == "Be brief."

        # A second of the caller at once, then nothing: the endpoint goes on with
        # silence, so the agent, whose frames follow the caller's, answers.
        await connection.input_audio_buffer.append(audio=base64.b64encode(ONE_SECOND).decode())
        seen = await events_until(connection, "response.output_audio_transcript.delta")
        fakes.frontend.speak_at = None  # the agent falls silent: its response ends
        seen += await events_until(connection, "response.done")

    assert kinds(seen) == [
        "input_audio_buffer.speech_started",
        "conversation.item.input_audio_transcription.delta",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.input_audio_transcription.completed",
        "conversation.item.done",
        *OPENED,
        *CLOSED,
    ]
    heard = next(e for e in seen if e.type.endswith("transcription.completed"))
    assert heard.transcript == "what is the capital"
    audio = [base64.b64decode(e.delta) for e in seen if e.type == "response.output_audio.delta"]
    assert audio and all(len(chunk) % 2 == 0 for chunk in audio)
    done = seen[-1].response
    assert done.status == "completed"
    assert done.output[0].content[0].transcript == "Paris"


async def test_a_barge_in_cancels_the_response_under_way(web, fakes):
    fakes.frontend.speak_at = 2
    fakes.frontend.barge_in_at = 8
    async with connect(web) as connection:
        await connection.recv()  # session.created
        await connection.input_audio_buffer.append(audio=base64.b64encode(ONE_SECOND).decode())
        seen = await events_until(connection, "response.done")

    assert kinds(seen) == [*OPENED, "input_audio_buffer.speech_started", *CLOSED]
    done = seen[-1].response
    assert (done.status, done.status_details.reason) == ("cancelled", "turn_detected")


async def test_g711_both_ways_at_8_khz(web, fakes):
    fakes.frontend.speak_at = 0  # the fake agent says back what it hears
    g711 = {"format": {"type": "audio/pcmu"}}
    async with connect(web) as connection:
        await connection.recv()  # session.created
        await connection.session.update(
            session={"type": "realtime", "audio": {"input": g711, "output": g711}}
        )
        updated = await connection.recv()
        assert updated.session.audio.output.format.type == "audio/pcmu"
        mulaw_silence = b"\xff" * 8000  # a second
        await connection.input_audio_buffer.append(audio=base64.b64encode(mulaw_silence).decode())
        seen = await events_until(connection, "response.output_audio.delta")
    agent = base64.b64decode(seen[-1].delta)
    assert agent and set(agent) <= {0xFF, 0x7F}  # mu-law's two silences, a byte a sample


async def test_bad_events_get_the_protocols_errors_and_the_session_goes_on(web):
    async with connect(web) as connection:
        await connection.recv()  # session.created
        await connection.send_raw("{not json")
        await connection.send_raw('{"type": "no.such.event", "event_id": "mine-1"}')
        # 61 s at once: about 4 MB of base64, past a 1 MiB WebSocket cap, so the
        # session itself must see it and refuse it.
        too_long = base64.b64encode(61 * ONE_SECOND).decode()
        await connection.input_audio_buffer.append(audio=too_long)
        await connection.send_raw(
            '{"type": "session.update", "session": {"audio": '
            '{"output": {"format": {"type": "audio/opus"}}}}}'
        )
        await connection.session.update(
            session={
                "type": "realtime",
                "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}},
            }
        )
        await connection.send_raw('{"type": "input_audio_buffer.append", "audio": "AAA"}')
        errors = await received(connection, 6)
        await connection.session.update(session={"type": "realtime", "instructions": "Hi."})
        (still,) = await received(connection, 1)

    assert [e.type for e in errors] == ["error"] * 6
    assert [(e.error.code, e.error.param) for e in errors] == [
        ("invalid_json", None),
        ("invalid_value", "type"),
        ("audio_too_long", "audio"),
        ("invalid_value", "session.audio.output.format"),
        ("invalid_value", "session.audio.input.format.rate"),
        ("invalid_value", "audio"),  # not base64 of whole PCM16 samples
    ]
    assert errors[1].error.event_id == "mine-1"
    assert all(e.error.type == "invalid_request_error" and e.event_id for e in errors)
    assert still.type == "session.updated"


async def test_an_unknown_model_is_refused_with_the_protocols_error(web):
    async with connect(web, model="gpt-realtime") as connection:
        refused = await connection.recv()
        with pytest.raises(ConnectionClosed):  # and the socket closes
            await connection.recv()
    assert refused.type == "error" and refused.error.code == "model_not_found"
    assert "kame-tandem" in refused.error.message


async def test_the_gateway_token_is_the_key_and_a_foreign_page_is_refused(web):
    async with connect(web, token="wrong-token") as connection:
        await connection.recv()  # session.created: the gateway hears the token with the audio
        await connection.input_audio_buffer.append(audio=base64.b64encode(ONE_SECOND).decode())
        refused = await connection.recv()
        with pytest.raises(ConnectionClosed):
            await connection.recv()
    assert refused.type == "error" and refused.error.code == "unauthenticated"
    assert refused.error.type == "invalid_request_error"

    # A browser page of another site (it sends an Origin) may not use a visitor's network.
    with pytest.raises(InvalidStatus) as refused_upgrade:
        async with connect(web, Origin="https://evil.example"):
            pass
    assert refused_upgrade.value.response.status_code == 403


async def test_the_agents_item_is_truncated_to_what_was_played_retrieved_and_deleted(web, fakes):
    # The agent speaks from frame 2 (0.16 s into its stream): "Paris" 0.1 s into
    # the response's audio, "is" 0.66 s in.
    fakes.frontend.speak_at = 2
    fakes.frontend.words = {3: ("Paris", 1), 10: ("is", 1)}
    async with connect(web) as connection:
        await connection.recv()  # session.created
        await connection.input_audio_buffer.append(audio=base64.b64encode(ONE_SECOND).decode())
        seen = await events_until(connection, "response.output_audio_transcript.delta")
        seen += await events_until(connection, "response.output_audio_transcript.delta")
        fakes.frontend.speak_at = None
        seen += await events_until(connection, "response.done")
        item_id = seen[-1].response.output[0].id
        played_ms = sum(
            len(base64.b64decode(e.delta)) // 48 for e in seen if e.type.endswith("audio.delta")
        )
        assert played_ms >= 720  # frames 2 to 10 at least

        await connection.conversation.item.truncate(
            item_id=item_id, content_index=0, audio_end_ms=played_ms + 1, event_id="cut-1"
        )
        await connection.conversation.item.truncate(
            item_id=item_id, content_index=0, audio_end_ms=400
        )
        await connection.conversation.item.retrieve(item_id=item_id)
        await connection.conversation.item.delete(item_id=item_id)
        await connection.conversation.item.retrieve(item_id=item_id, event_id="again")
        too_long, truncated, retrieved, deleted, gone = await received(connection, 5)

    assert (too_long.error.code, too_long.error.param) == ("invalid_value", "audio_end_ms")
    assert too_long.error.event_id == "cut-1" and f"{played_ms} ms" in too_long.error.message
    assert (truncated.type, truncated.item_id, truncated.audio_end_ms) == (
        "conversation.item.truncated",
        item_id,
        400,
    )
    assert retrieved.type == "conversation.item.retrieved"
    assert retrieved.item.content[0].transcript == "Paris"  # "is" came after 400 ms
    assert (deleted.type, deleted.item_id) == ("conversation.item.deleted", item_id)
    assert (gone.error.code, gone.error.event_id) == ("item_not_found", "again")


async def test_a_bad_session_leaves_another_at_the_same_time_untouched(web, fakes):
    fakes.frontend.speak_at = 4
    fakes.frontend.words = {5: ("Paris", 1)}
    async with connect(web) as good, connect(web, token="wrong-token") as bad:
        await good.recv(), await bad.recv()  # session.created, both
        await good.input_audio_buffer.append(audio=base64.b64encode(ONE_SECOND).decode())
        await bad.send_raw("{not json")
        await bad.send_raw(b"\x00\x01")  # a binary message: not an event
        await bad.send_raw('{"type": "response.cancel"}')  # none under way
        await bad.input_audio_buffer.append(audio=base64.b64encode(61 * ONE_SECOND).decode())
        await bad.input_audio_buffer.append(audio=base64.b64encode(ONE_SECOND).decode())
        refusals = await received(bad, 5)
        with pytest.raises(ConnectionClosed):  # the gateway refused its token
            await received(bad, 1)
        answer = await events_until(good, "response.output_audio_transcript.delta")

    assert [e.error.code for e in refusals] == [
        "invalid_json",
        "invalid_json",
        "response_cancel_not_active",
        "audio_too_long",
        "unauthenticated",
    ]
    assert kinds(answer)[:4] == OPENED
    assert answer[-1].delta == "Paris"


async def test_events_out_of_order_get_errors_and_change_nothing(web, fakes):
    fakes.frontend.speak_at = 0
    async with connect(web) as connection:
        await connection.recv()  # session.created
        await connection.conversation.item.truncate(
            item_id="item_unknown", content_index=0, audio_end_ms=0
        )
        await connection.input_audio_buffer.append(audio=base64.b64encode(ONE_SECOND).decode())
        opened = await events_until(connection, "response.content_part.added")
        # The call has its formats: a new one now is refused, the response goes on.
        await connection.session.update(
            session={"type": "realtime", "audio": {"output": {"format": {"type": "audio/pcmu"}}}}
        )
        after = await events_until(connection, "error")

    refused, locked = opened[0], after[-1]
    assert (refused.type, refused.error.code) == ("error", "item_not_found")
    assert (locked.error.code, locked.error.param) == ("session_locked", "session")
    assert set(kinds(after[:-1], ())) <= {"response.output_audio.delta"}


async def test_a_missing_token_is_refused_by_the_gateway(web):
    # The SDK will not connect without a key: a plain WebSocket client sends none.
    url = f"ws://127.0.0.1:{web.port}/v1/realtime?model=kame-tandem"
    append = {"type": "input_audio_buffer.append", "audio": base64.b64encode(ONE_SECOND).decode()}
    async with websockets.connect(url) as socket:
        created = json.loads(await socket.recv())
        await socket.send(json.dumps(append))
        async with asyncio.timeout(10):
            refused = json.loads(await socket.recv())
            with pytest.raises(ConnectionClosed):
                await socket.recv()
    assert created["type"] == "session.created"
    assert (refused["error"]["code"], refused["error"]["type"]) == (
        "unauthenticated",
        "invalid_request_error",
    )


async def test_a_socket_that_opens_no_call_is_closed_with_an_error(fakes):
    """A socket without a call (here: nothing sent) lives `start_timeout_s`, not
    `realtime_idle_timeout_s`, and never held a slot."""
    settings = {"start_timeout_s": 0.5, "realtime_idle_timeout_s": 300.0}
    async with web_service(fakes, **settings) as web, connect(web) as connection:
        await connection.recv()  # session.created
        (late,) = await received(connection, 1, timeout_s=5.0)
        with pytest.raises(ConnectionClosed):
            await received(connection, 1)
        assert web.web.admission.active == 0 and not web.web.admission.waiting
    assert (late.error.code, late.error.type) == ("session_start_timeout", "invalid_request_error")


def typed(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


async def test_push_to_talk_and_a_typed_message_reach_the_gateway_in_order(web, fakes):
    Action = common_pb2.TurnControl.Action  # noqa: N806 (the proto's name)
    fakes.frontend.speak_at = 30  # 2.4 s into the call
    half_second = bytes(2 * 12000)
    async with connect(web) as connection:
        await connection.recv()  # session.created
        push_to_talk = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}
        await connection.session.update(session=push_to_talk)
        (updated,) = await received(connection, 1)
        assert updated.session.audio.input.turn_detection is None
        await connection.input_audio_buffer.append(audio=base64.b64encode(half_second).decode())
        await connection.input_audio_buffer.commit()
        await connection.response.create()
        await connection.conversation.item.create(item=typed("And  Germany?"))
        committed, added, done = await received(connection, 3)
        # The gateway echoes the typed message as a final transcript: no second item.
        seen = await events_until(connection, "response.output_audio.delta")
        await connection.response.cancel()
        cancelled = await events_until(connection, "response.done")
        await wait_until(
            lambda: len(fakes.frontend.log.of("turn_control")) == 3, "the cancel at the front-end"
        )

    assert committed.type == "input_audio_buffer.committed"
    assert (added.type, added.item.content[0].text) == ("conversation.item.added", "And  Germany?")
    assert done.type == "conversation.item.done"
    # stt heard nothing in the committed silence: its item ends empty as the agent answers.
    unheard = [
        "conversation.item.added",
        "conversation.item.input_audio_transcription.completed",
        "conversation.item.done",
    ]
    assert kinds(seen) == [*unheard, *OPENED]
    assert (seen[1].item_id, seen[1].transcript) == (committed.item_id, "")
    assert cancelled[-1].response.status_details.reason == "client_cancelled"

    frontend = fakes.frontend.log
    assert frontend.of("config")[0].manual_turns
    actions = [control.action for control in frontend.of("turn_control")]
    assert actions == [Action.END_TURN, Action.RESPOND, Action.CANCEL]
    assert [text.text for text in frontend.of("user_text")] == ["And Germany?"]
    kinds_sent = [request.WhichOneof("msg") for request in frontend.requests]
    audio_before_commit = kinds_sent[: kinds_sent.index("turn_control")].count("audio")
    assert audio_before_commit >= 6  # the half second appended before the commit (80 ms frames)


async def test_a_typed_message_the_gateway_refuses_is_an_error_and_the_session_goes_on(fakes):
    async with (
        web_service(fakes, gateway_settings={"user_text_max_chars": 10}) as web,
        connect(web) as connection,
    ):
        await connection.recv()  # session.created
        await connection.conversation.item.create(item=typed("Far too long for this gateway."))
        await connection.conversation.item.create(item=typed("Hi."))
        # Its items at once; then the gateway's refusal of the first.
        events = await events_until(connection, "error")
        await connection.conversation.item.retrieve(item_id=events[2].item.id)
        (still,) = await received(connection, 1)

    assert kinds(events) == ["conversation.item.added", "conversation.item.done"] * 2 + ["error"]
    refused = events[-1].error
    assert refused.code == "request_refused" and "user_text_max_chars" in refused.message
    assert still.item.content[0].text == "Hi."


async def test_instructions_reach_the_agent_only_where_both_services_allow_them(fakes):
    brief = {"type": "realtime", "instructions": "Answer in French."}
    relayed = {"realtime_relay_instructions": True}
    async with (
        web_service(fakes, {"allow_instructions": True}, **relayed) as web,
        connect(web) as connection,
    ):
        await connection.recv()  # session.created
        await connection.session.update(session=brief)
        await connection.input_audio_buffer.append(audio=base64.b64encode(ONE_SECOND).decode())
        await received(connection, 1)  # session.updated
        await wait_until(lambda: fakes.oracle.log.of("config"), "the oracle's config")
    assert fakes.oracle.log.of("config")[0].instructions == "Answer in French."

    # The gateway's operator did not allow them: the call is refused, and says why.
    async with web_service(fakes, **relayed) as web, connect(web) as connection:
        await connection.recv()  # session.created
        await connection.session.update(session=brief)
        await connection.input_audio_buffer.append(audio=base64.b64encode(ONE_SECOND).decode())
        updated, refused = await received(connection, 2)
    assert updated.session.instructions == "Answer in French."
    assert refused.error.code == "permission_denied"
    assert "allow_instructions" in refused.error.message


async def test_a_mode_the_operator_does_not_offer_is_refused(fakes):
    async with (
        web_service(fakes, modes="tandem") as web,
        connect(web, model="kame-s2s") as connection,
    ):
        (refused,) = await received(connection, 1)
        with pytest.raises(ConnectionClosed):
            await received(connection, 1)
    assert (refused.error.code, refused.error.message) == (
        "model_not_found",
        "model 'kame-s2s' is not served here; choose kame-tandem",
    )
