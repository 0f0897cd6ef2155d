"""The dictation set (bench/questions/dictation/): speech the stt's word error rate
is measured on, and no test hears.

48 sentences a caller might say to a voice agent (questions with names of
places and people, requests with times and numbers), six in each of eight
voices: the piper voice the stack speaks with (at three speeds) and seven
espeak-ng voice+variant combinations that neither the tests, the espeak set
nor the held-out question set use. A third of them went through a phone line
(8 kHz G.711 mu-law and back). Each is a 16 kHz mono 16-bit WAV, made as
make_questions makes the question sets (loudness normalized to -3 dBFS peak,
0.3 s of silence either side), listed in sentences.json with its text, voice,
speed and whether it went through the phone line.

No test may name its voices, its sentences or its directory
(tests/bench/test_dictation_set.py guards that), so a measure on it is not
tuned to the speech the tests check.

    python -m kame_cli.bench.dictation            # write the set (the committed bytes)
    python -m kame_cli.bench.dictation --out-dir /tmp/d

Needs espeak-ng and sox (make_questions.MADE_WITH names the versions that made
the committed WAVs). Piper speaks without its random noise (kame_common.voice's
varied=False), so it too gives the same bytes every time on one machine.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kame_cli.bench.make_questions import (
    SpokenQuestion,
    speak,
    through_phone_line,
    to_set_format,
    tools_ready,
    write_set,
)
from kame_cli.bench.paths import DICTATION_SET
from kame_cli.say import write_wav
from kame_common.audio import SAMPLE_RATE
from kame_common.voice import load_voice

INDEX = "sentences.json"
PIPER = "piper"
# espeak-ng speaks at 175 words per minute by default; piper's own pace is its
# length scale 1.0. These make the piper sentences slower and faster.
PIPER_SPEEDS = {140: 1.15, 160: 1.0, 180: 0.9}


@dataclass(frozen=True)
class Sentence:
    text: str
    voice: str  # "piper", or an espeak-ng voice+variant ("en-us+m7")
    speed_wpm: int  # espeak-ng's words per minute; for piper a key of PIPER_SPEEDS
    pitch: int = 50  # espeak-ng's 0-99
    telephone: bool = False  # through 8 kHz G.711 mu-law and back

    def entry(self, wav: str) -> dict[str, Any]:
        return {
            "wav": wav,
            "text": self.text,
            "voice": self.voice,
            "speed_wpm": self.speed_wpm,
            "pitch": self.pitch,
            "telephone": self.telephone,
        }


def _voice(
    voice: str, speed_wpm: int, pitch: int, texts: tuple[str, ...], by_phone: tuple[int, ...]
) -> tuple[Sentence, ...]:
    return tuple(
        Sentence(text, voice, speed_wpm, pitch, index in by_phone)
        for index, text in enumerate(texts)
    )


SENTENCES = (
    *_voice(
        PIPER,
        160,
        50,
        (
            "What is the capital of Australia?",
            "Please set an alarm for six tomorrow morning.",
            "Who wrote the novel Pride and Prejudice?",
            "Which country has the largest population in the world?",
            "I need to change my flight to Chicago on Friday.",
            "What does a koala eat?",
        ),
        (1, 4),
    ),
    *_voice(
        "en-us+m7",
        150,
        45,
        (
            "What is the capital of Canada?",
            "How far is the moon from the earth?",
            "Can you recommend a good Italian restaurant nearby?",
            "Remind me to call my sister at five o'clock.",
            "Who discovered penicillin?",
            "Which ocean is the deepest?",
        ),
        (0, 3),
    ),
    *_voice(
        "en-us-nyc+f4",
        145,
        55,
        (
            "How many players are on a soccer team?",
            "What is the boiling point of water in Fahrenheit?",
            "Tell me a short story about a brave little mouse.",
            "What is the capital of Sweden?",
            "Translate good morning into Spanish.",
            "Where is the Eiffel Tower?",
        ),
        (2, 5),
    ),
    *_voice(
        "en-029+m4",
        140,
        50,
        (
            "What time does the pharmacy close tonight?",
            "How do I reset my password?",
            "What is the square root of eighty one?",
            "What is the capital of Portugal?",
            "How long should I boil an egg?",
            "Who built the first telephone?",
        ),
        (1, 3),
    ),
    *_voice(
        "en+m2",
        150,
        50,
        (
            "Book a taxi to the airport for seven in the evening.",
            "Is it going to rain in London this weekend?",
            "How many bones are in the human body?",
            "What is the chemical symbol for gold?",
            "What is the capital of Kenya?",
            "Who was Cleopatra?",
        ),
        (0, 4),
    ),
    *_voice(
        "en-gb-x-rp+f4",
        145,
        60,
        (
            "Play some relaxing music in the kitchen.",
            "Who composed the Four Seasons?",
            "My order arrived damaged and I would like a refund.",
            "What is the tallest mountain in Europe?",
            "How do you say thank you in German?",
            "What year did the Berlin Wall fall?",
        ),
        (3, 5),
    ),
    *_voice(
        "en-gb-scotland+m3",
        140,
        45,
        (
            "Which planet has the most moons?",
            "Can you read me the news headlines?",
            "What is the speed of light?",
            "Cancel my dentist appointment on Tuesday.",
            "What is the capital of Argentina?",
            "Turn off the lights in the living room.",
        ),
        (1, 4),
    ),
    *_voice(
        "en-gb-x-gbcwmd+m2",
        145,
        40,
        (
            "What is the largest desert on earth?",
            "How many continents are there?",
            "Which river flows through Vienna?",
            "How much is a ticket to the museum?",
            "Who was the first woman to fly across the Atlantic?",
            "Send a text message to Oliver saying I am running late.",
        ),
        (2, 5),
    ),
)


def speak_piper(sentence: Sentence, wav: Path) -> None:
    """The piper voice, without its random noise, at the stack's 24 kHz."""
    voice = load_voice(length_scale=PIPER_SPEEDS[sentence.speed_wpm], varied=False)
    write_wav(wav, voice.synthesize(sentence.text), SAMPLE_RATE)


def _as_question(sentence: Sentence) -> SpokenQuestion:
    """An espeak-ng sentence as make_questions speaks one (it has no keywords)."""
    return SpokenQuestion(
        sentence.text, (), sentence.voice, sentence.speed_wpm, sentence.pitch, sentence.telephone
    )


def synthesize(sentence: Sentence, wav: Path) -> None:
    """The voice -> (the phone line) -> the set's WAV format."""
    with tempfile.TemporaryDirectory() as scratch:
        source = Path(scratch) / "raw.wav"
        if sentence.voice == PIPER:
            speak_piper(sentence, source)
        else:
            speak(_as_question(sentence), source)
        if sentence.telephone:
            phone = Path(scratch) / "phone.wav"
            through_phone_line(source, phone)
            source = phone
        to_set_format(source, wav)


def make(out_dir: Path) -> list[dict[str, Any]]:
    return write_set(SENTENCES, synthesize, out_dir, prefix="s", index=INDEX)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=DICTATION_SET)
    args = parser.parse_args(argv)
    if not tools_ready(tuple(_as_question(s) for s in SENTENCES if s.voice != PIPER)):
        return 1
    entries = make(args.out_dir)
    print(f"wrote {len(entries)} WAVs and {INDEX} to {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
