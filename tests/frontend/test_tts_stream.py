"""The tts engine through the real gRPC frontend: turn taking, speech, barge-in, RESET.

Calls are played at real time (one 80 ms frame every 80 ms), so synthesis gets
the wall time it would get in a call; every latency is counted in frames.
"""

from __future__ import annotations

import numpy as np

from kame_common.audio import FRAME_SECONDS
from kamepb import common_pb2, frontend_pb2
from tests.frontend.calls import (
    append,
    frames_of,
    play_call,
    reset,
    silence,
    speech_frames,
    words_in,
)

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
    # The oracle answers while the caller is still talking.
    oracle = {
        start + 2: [reset(1), append(1, ANSWER[0])],
        start + 12: [append(1, ANSWER[1])],
        start + 22: [append(1, ANSWER[2])],
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
    heard = set(words_in(transcribe(call.agent_signal())))
    said = words_in(" ".join(ANSWER))
    missing = [w for w in said if w not in heard]
    assert len(missing) <= 1, f"agent audio lacks {missing}; heard {sorted(heard)}"
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


async def test_caller_speech_stops_the_agent_within_two_frames(frontend_stub, speak):
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
    oracle = {start + 2: [reset(1), append(1, answer)]}
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
    spoken = [w.text for w in call.words]
    assert 0 < len(spoken) < len(answer.split())


async def test_reset_mid_speech_finishes_the_word_then_speaks_the_new_candidate(
    frontend_stub, speak, transcribe
):
    question = speak("Where should we go for dinner tonight?")
    first = (
        "We could try the little Italian place on the corner, they make wonderful "
        "pasta and the tables outside are lovely in the evening."
    )
    second = "Actually the sushi bar downtown has a table free at eight."
    start, _ = speech_span(question)
    caller = caller_with(question, after_s=9.0)
    oracle = {start + 2: [reset(1), append(1, first)]}
    config = frontend_pb2.FrontendConfig(session_id="reset", turn_end_silence_s=0.4)

    def reset_during_wonderful(word: common_pb2.AgentText) -> list[common_pb2.OracleUpdate]:
        # Sent before the next caller frame: lands early in a long word.
        return [reset(2), append(2, second)] if word.text == "wonderful" else []

    call = await play_call(frontend_stub, caller, oracle, config, react=reset_during_wonderful)

    [reset_frame] = call.reactions
    old, new = call.words_of(1), call.words_of(2)
    assert [w.text for w in old] == first.split()[: first.split().index("wonderful") + 1]
    wonderful = old[-1]
    assert wonderful.start_s < reset_frame * FRAME_SECONDS < wonderful.end_s - 2 * FRAME_SECONDS
    # The word in progress is finished: the agent keeps sounding up to its end
    # rather than stopping at the RESET (word timings are estimates and one frame
    # inside the word may be quiet, so one silent frame is tolerated)...
    sounding = set(call.sounding_frames())
    frames_of_word = range(reset_frame, int(wonderful.end_s / FRAME_SECONDS))
    assert {frames_of_word[-1], frames_of_word[-2]} & sounding, (frames_of_word, sounding)
    assert sum(i in sounding for i in frames_of_word) >= len(frames_of_word) - 1
    # ...and then goes on with the whole new candidate, nothing more of the old one.
    assert [w.text for w in new] == second.split()
    assert wonderful.end_s - 0.06 <= new[0].start_s < wonderful.end_s + 1.0
    new_audio = call.agent_signal(from_frame=int(new[0].start_s / FRAME_SECONDS))
    heard = set(words_in(transcribe(new_audio)))
    assert {"sushi", "downtown", "table"} <= heard, heard
    assert not {"pasta", "tables", "evening"} & heard, heard
