"""Backchannels in the Realtime protocol (services/web/protocols/realtime.py): a caller's
"uh-huh" while the agent speaks, which the stack lets the agent talk through
(services/frontend/engines/backchannel.py), is no speech_started (LiveKit's
and Pipecat's clients stop their playback on it) and no transcription event,
and the response goes on; its final is a user item of the conversation. Caller
speech the stack takes for a barge-in is speech_started and cancels the
response, as before. First the gateway's events fed to a session as the
gateway client hands them over, then the `openai` SDK through the web service
and a real gateway in front of the scripted fakes."""

from __future__ import annotations

import base64

import pytest

from kame_client.events import BargeIn, UserFinal, UserPartial
from kame_common.words import BACKCHANNEL_PHRASES
from services.web.config import WebSettings
from services.web.protocols.realtime import RESPONSE_GAP_S
from tests.gateway.fakes import transcript
from tests.web.test_realtime import (
    CLOSED,
    ONE_SECOND,
    OPENED,
    connect,
    events_until,
    kinds,
    web_service,
)
from tests.web.test_realtime_protocol import FRAME, agent, heard, push_to_talk, session

# Held frames longer than the gap that would end a response of silent ones.
HELD_FRAMES = round(2 * RESPONSE_GAP_S / 0.08)
# Events that tell a client the caller took, or is taking, a turn.
TURN_EVENTS = (
    "input_audio_buffer.speech_started",
    "input_audio_buffer.speech_stopped",
    "input_audio_buffer.committed",
    "conversation.item.input_audio_transcription.delta",
    "conversation.item.input_audio_transcription.completed",
)


def types(events: list[dict]) -> list[str]:
    return [e["type"] for e in events]


def barge_in(realtime, seq: int = 1) -> list[dict]:
    return realtime.on_converse(BargeIn(seq, cancelled=False))


def agent_held(realtime, held: bool) -> dict:
    """The agent speaks, then the caller talks over it: held frames (the tts
    engine), or its speech goes on (an engine that does not pause)."""
    (created, *_) = agent(realtime, speaking=True)
    agent(realtime, speaking=not held, frames=HELD_FRAMES, seq=1, held=held)
    return created["response"]


@pytest.mark.parametrize("held", [True, False], ids=["held", "speaking"])
@pytest.mark.parametrize("words", ["uh-huh", "Yeah, okay.", "mm hmm", "right"])
def test_a_backchannel_over_the_agent_is_no_speech_started_and_the_response_goes_on(held, words):
    realtime = session()
    response = agent_held(realtime, held)

    assert heard(realtime, UserPartial, words.split()[0], "u-2") == []
    final = heard(realtime, UserFinal, words, "u-2")
    # The words join the conversation after the agent's item, and nothing says
    # the caller took a turn.
    assert types(final) == ["conversation.item.added", "conversation.item.done"]
    item = final[0]["item"]
    assert (item["role"], item["content"]) == (
        "user",
        [{"type": "input_audio", "transcript": words}],
    )
    assert realtime.history.get(item["id"]).item() == item
    # The agent resumes in the same response, the pause sent as its silence.
    (delta,) = agent(realtime, speaking=True, seq=1 + HELD_FRAMES)
    assert delta["type"] == "response.output_audio.delta"
    assert delta["response_id"] == response["id"]
    closing = agent(realtime, speaking=False, frames=HELD_FRAMES, seq=2 + HELD_FRAMES)
    assert closing[-1]["response"]["status"] == "completed"


def test_the_backchannel_item_follows_the_agents_item_it_was_said_over():
    realtime = session()
    agent_held(realtime, held=True)
    agent_item = realtime.history.last_id
    added, _ = heard(realtime, UserFinal, "uh-huh", "u-2")
    assert added["previous_item_id"] == agent_item


def test_every_phrase_of_the_one_list_is_a_backchannel():
    for phrase in BACKCHANNEL_PHRASES:
        realtime = session()
        agent_held(realtime, held=True)
        seen = heard(realtime, UserPartial, phrase) + heard(realtime, UserFinal, phrase)
        assert not set(types(seen)) & set(TURN_EVENTS), phrase


def test_a_cough_over_the_agent_is_nothing():
    realtime = session()
    agent_held(realtime, held=True)
    assert heard(realtime, UserPartial, "") == []
    assert heard(realtime, UserFinal, "") == []


def test_a_real_interruption_is_speech_started_and_cancels_the_response():
    realtime = session()
    agent_held(realtime, held=True)
    started = heard(realtime, UserPartial, "wait, what about Rome", "u-2")
    assert types(started) == [
        "input_audio_buffer.speech_started",
        "conversation.item.input_audio_transcription.delta",
    ]
    cut = barge_in(realtime)
    assert types(cut) == CLOSED
    done = cut[-1]["response"]
    assert (done["status"], done["status_details"]["reason"]) == ("cancelled", "turn_detected")
    final = heard(realtime, UserFinal, "wait, what about Rome", "u-2")
    assert final[-1]["item"]["id"] == started[0]["item_id"]


def test_a_backchannel_the_stack_takes_for_a_barge_in_is_speech_started_with_its_words():
    # "Yeah" said for longer than backchannel_max_s: the frontend stops the agent.
    realtime = session()
    agent_held(realtime, held=True)
    assert heard(realtime, UserPartial, "yeah", "u-2") == []
    cut = barge_in(realtime)
    assert types(cut) == [
        "input_audio_buffer.speech_started",
        "conversation.item.input_audio_transcription.delta",
        *CLOSED,
    ]
    assert cut[1]["delta"] == "yeah"
    assert cut[-1]["response"]["status_details"]["reason"] == "turn_detected"
    more = heard(realtime, UserPartial, "yeah but why", "u-2")
    assert [e.get("delta") for e in more] == [" but why"]
    final = heard(realtime, UserFinal, "yeah but why", "u-2")
    completed = next(e for e in final if e["type"].endswith("transcription.completed"))
    assert (completed["item_id"], completed["transcript"]) == (cut[0]["item_id"], "yeah but why")


def test_a_backchannel_that_goes_on_into_other_words_is_the_callers_turn():
    realtime = session()
    agent_held(realtime, held=True)
    assert heard(realtime, UserPartial, "okay", "u-2") == []
    started = heard(realtime, UserPartial, "okay so what about Rome", "u-2")
    assert types(started) == [
        "input_audio_buffer.speech_started",
        "conversation.item.input_audio_transcription.delta",
    ]
    assert started[1]["delta"] == "okay so what about Rome"
    cut = barge_in(realtime)
    assert types(cut) == CLOSED  # one speech_started for the one turn
    assert cut[-1]["response"]["status"] == "cancelled"


def test_a_late_final_of_a_backchannel_stays_one_after_the_response_ended():
    realtime = session()
    agent_held(realtime, held=True)
    heard(realtime, UserPartial, "uh-huh", "u-2")
    agent(realtime, speaking=True, seq=1 + HELD_FRAMES)
    agent(realtime, speaking=False, frames=HELD_FRAMES, seq=2 + HELD_FRAMES)  # it ends
    assert realtime.response is None
    final = heard(realtime, UserFinal, "uh-huh", "u-2")
    assert types(final) == ["conversation.item.added", "conversation.item.done"]


def test_yes_when_the_agent_is_silent_is_a_turn():
    realtime = session()
    started = heard(realtime, UserPartial, "yes")
    assert types(started)[0] == "input_audio_buffer.speech_started"
    final = heard(realtime, UserFinal, "yes")
    assert "conversation.item.input_audio_transcription.completed" in types(final)


def test_with_push_to_talk_every_word_is_the_callers_item():
    # No voice activity detection to report: the client's commit ends the turn,
    # and the frontend stops the agent at any caller speech.
    realtime = push_to_talk()
    agent(realtime, speaking=True)
    partial = heard(realtime, UserPartial, "uh-huh")
    assert types(partial) == ["conversation.item.input_audio_transcription.delta"]


def test_the_web_service_takes_its_phrases_from_its_setting():
    assert WebSettings().backchannel_phrases == ", ".join(BACKCHANNEL_PHRASES)


async def test_an_uh_huh_while_the_agent_is_held_reaches_the_sdk_as_an_item_only(fakes):
    fakes.frontend.speak_at = 2
    fakes.frontend.held = range(4, 4 + HELD_FRAMES)
    fakes.stt.script = {
        6: [transcript("u-1", "uh-huh", False, 0.5)],
        9: [transcript("u-1", "uh-huh", True, 0.6)],
    }
    async with web_service(fakes) as web, connect(web) as connection:
        await connection.recv()  # session.created
        await connection.input_audio_buffer.append(audio=base64.b64encode(ONE_SECOND).decode())
        seen = []
        # The delta after the hold carries its silence too: then the agent falls silent.
        while not any(
            len(base64.b64decode(e.delta)) > HELD_FRAMES * len(FRAME)
            for e in seen
            if e.type == "response.output_audio.delta"
        ):
            seen += await events_until(connection, "response.output_audio.delta")
        fakes.frontend.speak_at = None
        seen += await events_until(connection, "response.done")

    assert kinds(seen) == [*OPENED, "conversation.item.added", "conversation.item.done", *CLOSED]
    said = [e.item for e in seen if e.type == "conversation.item.added"][-1]
    assert (said.role, said.content[0].transcript) == ("user", "uh-huh")
    assert seen[-1].response.status == "completed"


async def test_an_interruption_while_the_agent_is_held_reaches_the_sdk_as_speech_started(fakes):
    fakes.frontend.speak_at = 2
    fakes.frontend.held = range(4, 4 + HELD_FRAMES)
    fakes.frontend.barge_in_at = 4 + HELD_FRAMES
    fakes.stt.script = {6: [transcript("u-1", "wait", False, 0.5)]}
    async with web_service(fakes) as web, connect(web) as connection:
        await connection.recv()  # session.created
        await connection.input_audio_buffer.append(audio=base64.b64encode(ONE_SECOND).decode())
        seen = await events_until(connection, "response.done")

    assert kinds(seen) == [
        *OPENED,
        "input_audio_buffer.speech_started",
        "conversation.item.input_audio_transcription.delta",
        *CLOSED,
    ]
    done = seen[-1].response
    assert (done.status, done.status_details.reason) == ("cancelled", "turn_detected")
