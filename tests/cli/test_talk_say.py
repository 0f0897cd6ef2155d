"""`kame talk --say TEXT`: a typed message of the caller's, answered aloud
(gateway.proto UserText), here against the gateway's scripted fakes."""

from __future__ import annotations

import numpy as np

from kame_client.caller import TalkOptions, talk
from kame_client.result import CallerText
from kame_common.audio import SAMPLE_RATE
from tests.cli.conftest import assert_fails_in_one_line, kame

QUESTION = "What is the capital of France?"


async def test_say_types_the_message_and_waits_for_the_answer(fakes):
    runtime = await fakes.gateway()
    fakes.frontend.speak_at = 12  # the fake agent talks from about 1 s on ...
    fakes.frontend.words = {13: ("Paris", 1)}  # ... an oracle word first
    options = TalkOptions(
        gateway=f"127.0.0.1:{runtime.port}", say=QUESTION, tail_s=0.3, max_wait_s=3.0
    )
    result = await talk(np.zeros(SAMPLE_RATE // 2, np.float32), options)
    assert result.status == "OK", result.status_details
    [typed] = fakes.frontend.log.of("user_text")
    assert typed.text == QUESTION
    assert result.finals == [QUESTION], "the gateway echoes it as the caller's final"
    assert "Paris" in result.agent_words
    said = result.of(CallerText)
    assert [timed.event.text for timed in said] == [QUESTION]
    assert said[0].t >= 0.5, "after the WAV"


def test_talk_needs_a_wav_or_a_message(tmp_path):
    result = kame("talk", "--out", str(tmp_path / "a.wav"), "--timeline", str(tmp_path / "t.json"))
    assert_fails_in_one_line(result, 2, r"^kame talk: give the caller's audio \(--wav\)")
