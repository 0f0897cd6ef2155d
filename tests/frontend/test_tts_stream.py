"""The tts engine through the real gRPC frontend: turn taking, speech, barge-in,
RESET with its first words and source, TurnEnd, caller transcripts.

Calls are played at real time (one 80 ms frame every 80 ms), so synthesis gets
the wall time it would get in a call; every latency is counted in frames. The
caller's transcripts are written by the test (stt is not what is tested here):
their text and the audio span they cover are what the frontend checks
candidates against.
"""

from __future__ import annotations

import numpy as np
import pytest

from kame_common.audio import FRAME_SECONDS
from kamepb import common_pb2, frontend_pb2
from tests.frontend.calls import (
    append,
    frames_of,
    play_call,
    reset,
    silence,
    speech_frames,
    transcript,
    words_in,
)
from tests.support import word_recall

QUESTION = "Can you tell me what the weather will be like in Paris tomorrow morning?"
ANSWER = ["Tomorrow morning in Paris", "will be sunny and mild,", "with a light breeze."]
LEAD_FRAMES = 6


def caller_with(speech: np.ndarray, after_s: float) -> list[np.ndarray]:
    """LEAD_FRAMES of silence, the speech, then `after_s` of silence, as frames, with a
    faint hiss (-66 dBFS) under everything as on a real line."""
    signal = np.concatenate([silence(LEAD_FRAMES * FRAME_SECONDS), speech, silence(after_s)])
    hiss = np.random.default_rng(7).normal(0.0, 10 ** (-66 / 20), len(signal))
    return frames_of(signal + hiss.astype(np.float32))


def speech_span(speech: np.ndarray) -> tuple[int, int]:
    """First and last frame of the caller call that hold the (clean) speech."""
    voiced = speech_frames(frames_of(speech))
    return LEAD_FRAMES + voiced[0], LEAD_FRAMES + voiced[-1]


async def test_agent_answers_within_three_frames_of_the_callers_end_of_speech(
    frontend_stub, speak, transcribe
):
    question = speak(QUESTION)
    assert 2.7 < len(question) / 24_000 < 3.5  # about 3 s of caller speech
    start, end = speech_span(question)
    caller = caller_with(question, after_s=6.0)
    # The oracle answers while the caller is still talking, from an early partial
    # that already has every word (as if the recognizer were ahead of the audio, so
    # that the answer's first phrase can be synthesized ahead); a partial with the
    # same words that covers the end of speech arrives on the frame after it.
    early = transcript(QUESTION, end_s=(start + 2) * FRAME_SECONDS, final=False)
    oracle = {
        start + 2: [early, reset(1, ANSWER[0], answers=early)],
        start + 12: [append(1, ANSWER[1])],
        start + 22: [append(1, ANSWER[2])],
        end + 1: [transcript(QUESTION, end_s=(end + 1) * FRAME_SECONDS, final=False)],
    }
    assert start + 22 < end
    config = frontend_pb2.FrontendConfig(session_id="answer", turn_end_silence_s=0.16)

    call = await play_call(frontend_stub, caller, oracle, config)

    assert call.ready.engine == "tts" and call.ready.slot == -1
    assert len(call.audio) == len(caller)
    sounding = call.sounding_frames()
    assert sounding, "the agent never spoke"
    first_audio = sounding[0]
    assert end < first_audio <= end + 3, (end, first_audio)
    # Frames flagged silent carry no sound; frames flagged speaking start with the answer.
    assert next(i for i, a in enumerate(call.audio) if a.speaking) == first_audio
    assert all(a.speaking for i, a in enumerate(call.audio) if i in set(sounding))
    # Every phrase is in the agent's audio. Whisper mishears piper's "in Paris" now
    # and then (as "end terrace" in one CI run), so each phrase is checked by the
    # share of its words heard: a dropped phrase scores 0.
    heard = transcribe(call.agent_signal())
    recall = [word_recall(phrase, heard) for phrase in ANSWER]
    assert min(recall) >= 0.5 and sum(recall) / len(recall) >= 0.7, (recall, heard)
    # AgentText: the oracle's words in order, timed inside the agent's audio.
    assert [w.text for w in call.words] == " ".join(ANSWER).split()
    assert all(w.generation == 1 for w in call.words)
    starts = [w.start_s for w in call.words]
    assert starts == sorted(starts)
    assert abs(starts[0] - first_audio * FRAME_SECONDS) < 2 * FRAME_SECONDS
    for word in call.words:
        assert word.start_s < word.end_s
        assert call.audio[int(word.start_s / FRAME_SECONDS)].speaking


async def test_output_frame_count_equals_input_and_frames_keep_their_seq(frontend_stub):
    caller = frames_of(silence(1.2))
    call = await play_call(frontend_stub, caller, pace_s=0.0)
    assert len(call.audio) == len(caller)
    assert [a.frame.seq for a in call.audio] == list(range(len(caller)))
    for agent in call.audio:
        assert agent.frame.sample_rate_hz == 24_000 and len(agent.frame.pcm) == 3840
        assert agent.received_time_us > 0 and agent.step_s >= 0.0
        assert not agent.speaking


async def test_caller_speech_silences_the_agent_within_two_frames(frontend_stub, speak):
    question = speak("What is the weather like today?")
    interruption = speak("No wait, stop, I meant something else entirely.")
    answer = (
        "The weather today is bright and clear, with a few clouds in the afternoon "
        "and a gentle wind from the north that keeps it cool."
    )
    speech = np.concatenate([question, silence(2.0), interruption])
    start, _ = speech_span(question)
    caller = caller_with(speech, after_s=3.0)
    interruption_start = LEAD_FRAMES + len(frames_of(question)) + round(2.0 / FRAME_SECONDS)
    interruption_start += speech_frames(frames_of(interruption))[0]
    heard = transcript("What is the weather like today?", end_s=(start + 2) * FRAME_SECONDS)
    oracle = {start + 2: [heard, reset(1, answer, answers=heard)]}
    config = frontend_pb2.FrontendConfig(session_id="barge-in", turn_end_silence_s=0.4)

    call = await play_call(frontend_stub, caller, oracle, config)

    sounding = call.sounding_frames()
    assert sounding and sounding[0] < interruption_start, "the agent should be talking"
    # Talking when interrupted: sound within the 5 frames before (a pause between
    # words or phrases may fall on the very frame before).
    recent = set(range(interruption_start - 5, interruption_start))
    assert recent & set(sounding), "the agent should be talking when interrupted"
    # Silent from the second frame of caller speech on, and for the rest of the call:
    # the interrupted answer is not resumed.
    assert max(sounding) <= interruption_start + 1, (interruption_start, sounding[-5:])
    assert not any(a.speaking for a in call.audio[interruption_start + 2 :])
    # One BargeIn, once the paused-for speech outlasts a backchannel (0.72 s: the
    # agent was already silent), so a client can drop what was left of the answer.
    (barge_in,) = call.barge_ins
    assert interruption_start < barge_in.seq <= interruption_start + 2 + round(0.72 / FRAME_SECONDS)
    spoken = [w.text for w in call.words]
    assert 0 < len(spoken) < len(answer.split())


async def test_a_different_answer_mid_speech_finishes_the_phrase_then_is_repaired(
    frontend_stub, speak, transcribe
):
    question = speak("Where should we go for dinner tonight?")
    # Punctuation fixes the phrases: "We could try", "the Italian place,", "they
    # make wonderful fresh pasta,", ...
    first = (
        "We could try the Italian place, they make wonderful fresh pasta, "
        "and the tables outside are lovely."
    )
    second = "The sushi bar downtown has a table free at eight."
    start, end = speech_span(question)
    caller = caller_with(question, after_s=9.0)
    asked = "Where should we go for dinner"
    partial = transcript(asked, end_s=(start + 2) * FRAME_SECONDS, final=False)
    final = transcript(f"{asked} tonight, somewhere new?", end_s=(end + 4) * FRAME_SECONDS)
    # As in the first test: an early partial with the words, then the same words
    # covering the end of speech; the agent answers them at the turn end.
    oracle = {
        start + 2: [partial, reset(1, first, answers=partial)],
        end + 1: [transcript(asked, end_s=(end + 1) * FRAME_SECONDS, final=False)],
    }
    config = frontend_pb2.FrontendConfig(session_id="repair", turn_end_silence_s=0.4)

    def new_final_during_wonderful(word: common_pb2.AgentText) -> list:
        # The final differs from what the agent answered; the oracle answers it anew.
        return [final, reset(2, second, answers=final)] if word.text == "wonderful" else []

    call = await play_call(frontend_stub, caller, oracle, config, react=new_final_during_wonderful)

    [reset_frame] = call.reactions
    said = [(w.text, w.generation) for w in call.words]
    # The phrase in progress is finished, then the repair, then the new answer whole.
    upto_pasta = first.split()[: first.split().index("pasta,") + 1]
    assert said == [(w, 1) for w in upto_pasta] + [("Sorry,", 0)] + [(w, 2) for w in second.split()]
    old, repair, new = call.words_of(1), call.words_of(0), call.words_of(2)
    assert old[-3].text == "wonderful" and old[-3].start_s <= reset_frame * FRAME_SECONDS
    assert old[-1].end_s <= repair[0].start_s < new[0].start_s
    assert [w.filler for w in repair] == [True] and not any(w.filler for w in old + new)
    # The agent keeps sounding from the RESET to the end of the phrase (word timings
    # are estimates and a frame between words may be quiet: two silent frames allowed).
    sounding = set(call.sounding_frames())
    phrase_frames = range(reset_frame, int(old[-1].end_s / FRAME_SECONDS))
    assert sum(i not in sounding for i in phrase_frames) <= 2, (phrase_frames, sounding)
    new_audio = call.agent_signal(from_frame=int(new[0].start_s / FRAME_SECONDS))
    heard = transcribe(new_audio)
    assert word_recall("sushi downtown table", heard) >= 2 / 3, heard
    # The first answer's unspoken rest ("the tables outside are lovely") is not in it:
    # at most one of its words heard, since Whisper may hear the new "table" as "tables".
    assert len({"tables", "outside", "lovely"} & set(words_in(heard))) <= 1, heard


async def test_one_reset_with_text_and_source_is_spoken_and_turn_end_follows_its_frame(
    frontend_stub, speak
):
    hello = speak("Hello there, can you help me?")
    start, end = speech_span(hello)
    caller = caller_with(hello, after_s=2.5)
    partial = transcript("Hello there", end_s=(start + 8) * FRAME_SECONDS, final=False)
    final = transcript("Hello there, can you help me?", end_s=(end + 3) * FRAME_SECONDS)
    # Transcripts and the one RESET (first words and source in one message) arrive
    # in the caller's pause, before the turn ends (0.4 s = 5 frames after the speech).
    oracle = {start + 8: [partial], end + 3: [final, reset(7, "Sure, what do you need?", final)]}
    config = frontend_pb2.FrontendConfig(session_id="one-reset", turn_end_silence_s=0.4)

    call = await play_call(frontend_stub, caller, oracle, config)

    # piper's pause at the comma varies from run to run and may itself reach 0.4 s:
    # then an earlier turn end lies inside the question. The last one follows it.
    turn_end = call.turn_ends[-1]
    assert all(t.seq < turn_end.seq for t in call.turn_ends[:-1])
    assert end + 1 <= turn_end.seq <= end + 6, (end, turn_end.seq)
    # The speech ended where the 5-frame silent run began (the hiss is below the VAD).
    assert turn_end.speech_end_s == pytest.approx((turn_end.seq - 4) * FRAME_SECONDS)
    assert abs(turn_end.speech_end_s - (end + 1) * FRAME_SECONDS) <= 2 * FRAME_SECONDS
    position = max(i for i, r in enumerate(call.responses) if r.HasField("turn_end"))
    before = call.responses[position - 1]
    assert before.HasField("audio") and before.audio.frame.seq == turn_end.seq
    assert [(w.text, w.generation) for w in call.words] == [
        (w, 7) for w in "Sure, what do you need?".split()
    ]
    assert call.words[0].start_s >= turn_end.seq * FRAME_SECONDS - 1e-9


async def test_a_candidate_that_answers_something_else_is_held_then_the_floor_given_back(
    frontend_stub, speak
):
    question = speak("What is the capital of France?")
    start, end = speech_span(question)
    caller = caller_with(question, after_s=3.0)
    partial = transcript("What is the capital", end_s=(start + 10) * FRAME_SECONDS, final=False)
    final = transcript("What is the capital of France?", end_s=(end + 2) * FRAME_SECONDS)
    oracle = {start + 10: [partial, reset(1, "Rome is the capital of Italy.", partial)]}
    oracle[end + 2] = [final]  # no answer to the final comes
    config = frontend_pb2.FrontendConfig(
        session_id="stale", turn_end_silence_s=0.4, hold_phrases=["Hmm,"], hold_max_s=1.0
    )

    call = await play_call(frontend_stub, caller, oracle, config)

    assert [(w.text, w.generation, w.filler) for w in call.words] == [("Hmm,", 0, True)]
    [turn_end] = call.turn_ends
    sounding = call.sounding_frames()
    assert sounding and sounding[0] >= turn_end.seq
    assert max(sounding) < turn_end.seq + round(1.0 / FRAME_SECONDS)  # only the hold phrase
