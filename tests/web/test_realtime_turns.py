"""The caller's turns in the Realtime protocol without a network
(services/web/protocols/realtime.py): a cancelled stretch's mute ends at the caller's
next turn, and a committed turn stt never finalizes ends at the next commit or
when the agent answers, so the next turn is an item of its own. Then the
`openai` SDK through the web service and a real gateway: a typed message right
after a cancel gets its answer heard. The agent held while the caller talks
over it (a backchannel or a barge-in, still undecided) keeps its response
open past RESPONSE_GAP_S: a barge-in then cancels it, a backchannel lets it
go on."""

from __future__ import annotations

import base64
import json

import pytest

from kame_client.events import BargeIn, UserFinal, UserPartial
from services.web.protocols.realtime import RESPONSE_GAP_S
from tests.web.test_realtime import (
    CLOSED,
    ONE_SECOND,
    OPENED,
    connect,
    events_until,
    kinds,
    typed,
    web_service,
)
from tests.web.test_realtime_protocol import (
    FRAME,
    agent,
    appended,
    heard,
    push_to_talk,
    sent,
    session,
)

TYPED = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}
# Client events that end the caller's turn or ask for the answer.
NEXT_TURNS = {
    "typed message": {"type": "conversation.item.create", "item": TYPED},
    "response.create": {"type": "response.create"},
    "commit": {"type": "input_audio_buffer.commit"},
}


@pytest.mark.parametrize("next_turn", list(NEXT_TURNS), ids=list(NEXT_TURNS))
def test_the_agents_answer_after_a_cancel_is_heard_without_waiting_for_silence(next_turn):
    realtime = session()
    appended(realtime, 0.5)  # something to commit
    agent(realtime, speaking=True)
    sent(realtime, type="response.cancel")
    assert agent(realtime, speaking=True) == []  # the cancelled stretch: dropped
    realtime.on_client(json.dumps(NEXT_TURNS[next_turn]))
    # The agent's next speech answers the new turn, no gap of silence between.
    assert "response.created" in [e["type"] for e in agent(realtime, speaking=True)]


def test_the_callers_final_after_a_barge_in_ends_the_mute():
    realtime = session()
    agent(realtime, speaking=True)
    realtime.on_converse(BargeIn(1, cancelled=False))
    assert agent(realtime, speaking=True) == []
    heard(realtime, UserFinal, "stop, what about Rome?")
    assert agent(realtime, speaking=True)[0]["type"] == "response.created"


def test_a_commit_stt_never_finalizes_ends_empty_at_the_next_commit():
    realtime = push_to_talk()
    appended(realtime, 0.5)
    (first,) = sent(realtime, type="input_audio_buffer.commit")  # silence: no final comes
    appended(realtime, 0.5)
    closed = sent(realtime, type="input_audio_buffer.commit")
    assert [e["type"] for e in closed] == [
        "conversation.item.added",
        "conversation.item.input_audio_transcription.completed",
        "conversation.item.done",
        "input_audio_buffer.committed",
    ]
    assert closed[0]["item"]["id"] == first["item_id"] == closed[1]["item_id"]
    assert closed[1]["transcript"] == ""
    second = closed[-1]
    assert second["item_id"] != first["item_id"]
    assert second["previous_item_id"] == first["item_id"]
    final = heard(realtime, UserFinal, "and Rome?")
    assert final[0]["item"]["id"] == second["item_id"]


def test_a_commit_stt_never_finalizes_ends_when_the_agent_answers():
    realtime = session()  # server_vad
    appended(realtime, 0.5)
    (first,) = sent(realtime, type="input_audio_buffer.commit")
    opened = agent(realtime, speaking=True)
    assert [e["type"] for e in opened][:4] == [
        "conversation.item.added",
        "conversation.item.input_audio_transcription.completed",
        "conversation.item.done",
        "response.created",
    ]
    assert opened[1]["item_id"] == first["item_id"]
    # The caller's next words are a turn of their own, with its speech_started.
    started = heard(realtime, UserPartial, "and")
    assert started[0]["type"] == "input_audio_buffer.speech_started"
    assert started[0]["item_id"] != first["item_id"]


def test_a_committed_turn_already_heard_waits_for_its_final_while_the_agent_answers():
    realtime = session()
    appended(realtime, 0.5)
    heard(realtime, UserPartial, "what is")
    (committed,) = sent(realtime, type="input_audio_buffer.commit")
    # The agent may answer before stt's final (tandem): the item waits for it.
    assert agent(realtime, speaking=True)[0]["type"] == "response.created"
    final = heard(realtime, UserFinal, "what is the capital")
    assert final[0]["item"]["id"] == committed["item_id"]
    assert final[1]["transcript"] == "what is the capital"


async def test_a_typed_message_right_after_a_cancel_is_answered_through_the_gateway(fakes):
    fakes.frontend.speak_at = 0  # the fake agent speaks on, never silent for 0.5 s
    async with web_service(fakes) as web, connect(web) as connection:
        await connection.recv()  # session.created
        await connection.input_audio_buffer.append(audio=base64.b64encode(ONE_SECOND).decode())
        await events_until(connection, "response.output_audio.delta")
        await connection.response.cancel()
        cancelled = await events_until(connection, "response.done")
        await connection.conversation.item.create(item=typed("And Rome?"))
        answered = await events_until(connection, "response.output_audio.delta")

    assert kinds(cancelled) == CLOSED
    assert cancelled[-1].response.status_details.reason == "client_cancelled"
    assert kinds(answered) == ["conversation.item.added", "conversation.item.done", *OPENED]


# Held frames longer than the gap that would end a response of silent ones.
HELD_FRAMES = round(2 * RESPONSE_GAP_S / 0.08)


def test_a_barge_in_after_a_long_hold_cancels_the_response_the_caller_talked_over():
    realtime = session()
    agent(realtime, speaking=True)
    assert agent(realtime, speaking=False, frames=HELD_FRAMES, seq=1, held=True) == []
    barge_in = realtime.on_converse(BargeIn(1, cancelled=False))
    assert [e["type"] for e in barge_in][:2] == [
        "input_audio_buffer.speech_started",
        "response.output_audio.done",
    ]
    done = barge_in[-1]["response"]
    assert (done["status"], done["status_details"]["reason"]) == ("cancelled", "turn_detected")


def test_a_backchannel_after_a_long_hold_lets_the_same_response_go_on():
    realtime = session()
    agent(realtime, speaking=True)
    agent(realtime, speaking=False, frames=HELD_FRAMES, seq=1, held=True)
    # The agent resumes: the pause's silence comes with its next speech, in the
    # same response (no response.created), and nothing says the caller spoke.
    (delta,) = agent(realtime, speaking=True, seq=1 + HELD_FRAMES)
    assert delta["type"] == "response.output_audio.delta"
    assert len(base64.b64decode(delta["delta"])) == (HELD_FRAMES + 1) * len(FRAME)
    closing = agent(realtime, speaking=False, frames=HELD_FRAMES, seq=2 + HELD_FRAMES)
    assert closing[-1]["response"]["status"] == "completed"


async def test_the_agent_held_past_the_gap_then_cut_by_a_barge_in_ends_cancelled(fakes):
    fakes.frontend.speak_at = 2
    fakes.frontend.held = range(4, 4 + HELD_FRAMES)
    fakes.frontend.barge_in_at = 4 + HELD_FRAMES
    async with web_service(fakes) as web, connect(web) as connection:
        await connection.recv()  # session.created
        await connection.input_audio_buffer.append(audio=base64.b64encode(ONE_SECOND).decode())
        seen = await events_until(connection, "response.done")

    assert kinds(seen) == [*OPENED, "input_audio_buffer.speech_started", *CLOSED]
    done = seen[-1].response
    assert (done.status, done.status_details.reason) == ("cancelled", "turn_detected")


async def test_the_agent_held_past_the_gap_then_resumed_is_one_response(fakes):
    fakes.frontend.speak_at = 2
    fakes.frontend.held = range(4, 4 + HELD_FRAMES)
    async with web_service(fakes) as web, connect(web) as connection:
        await connection.recv()  # session.created
        await connection.input_audio_buffer.append(audio=base64.b64encode(ONE_SECOND).decode())
        seen = []
        # The delta after the hold carries its silence too (the output is PCM16
        # at 24 kHz, as the frames): then the agent falls silent.
        while not any(
            len(base64.b64decode(e.delta)) > HELD_FRAMES * len(FRAME)
            for e in seen
            if e.type == "response.output_audio.delta"
        ):
            seen += await events_until(connection, "response.output_audio.delta")
        fakes.frontend.speak_at = None
        seen += await events_until(connection, "response.done")

    assert kinds(seen) == [*OPENED, *CLOSED]
    assert seen[-1].response.status == "completed"
