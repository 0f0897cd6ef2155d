"""The caller's turns in the Realtime protocol without a network
(services/web/realtime.py): a cancelled stretch's mute ends at the caller's
next turn, and a committed turn stt never finalizes ends at the next commit or
when the agent answers, so the next turn is an item of its own. Then the
`openai` SDK through the web service and a real gateway: a typed message right
after a cancel gets its answer heard."""

from __future__ import annotations

import base64
import json

import pytest

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
from tests.web.test_realtime_protocol import agent, appended, heard, push_to_talk, sent, session

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
    realtime.on_converse({"type": "barge_in", "seq": 1, "cancelled": False})
    assert agent(realtime, speaking=True) == []
    heard(realtime, "user_final", "stop, what about Rome?")
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
    final = heard(realtime, "user_final", "and Rome?")
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
    started = heard(realtime, "user_partial", "and")
    assert started[0]["type"] == "input_audio_buffer.speech_started"
    assert started[0]["item_id"] != first["item_id"]


def test_a_committed_turn_already_heard_waits_for_its_final_while_the_agent_answers():
    realtime = session()
    appended(realtime, 0.5)
    heard(realtime, "user_partial", "what is")
    (committed,) = sent(realtime, type="input_audio_buffer.commit")
    # The agent may answer before stt's final (tandem): the item waits for it.
    assert agent(realtime, speaking=True)[0]["type"] == "response.created"
    final = heard(realtime, "user_final", "what is the capital")
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
