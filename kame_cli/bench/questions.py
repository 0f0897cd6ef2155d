"""The questions the bench asks, and how an answer is scored against them.

Built in: six factual questions spoken by the piper voice. Or a JSON list of
{"wav": FILE or "text": TEXT, "keywords": [...]} (bench/questions/espeak/ is
one, spoken by espeak-ng). An answer is right when every keyword is among its
words; a keyword may list alternatives ("eight|8") and an alternative may be
several words ("twenty four").
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from kame_cli import say, talk
from kame_common.audio import SAMPLE_RATE, Samples, resample

BUILTIN_QUESTIONS = (
    ("What is the capital of France?", ("paris",)),
    ("Who wrote Romeo and Juliet?", ("shakespeare",)),
    ("How many legs does a spider have?", ("eight|8",)),
    ("What is the largest planet in the solar system?", ("jupiter",)),
    ("Who painted the Mona Lisa?", ("leonardo|vinci",)),
    ("What is the capital of Japan?", ("tokyo",)),
)
PIPER = "piper"


@dataclass(frozen=True)
class Question:
    text: str
    keywords: tuple[str, ...]
    audio: Samples = field(repr=False, compare=False)  # at 24 kHz
    source: str = ""  # the WAV it came from, or "piper"

    @property
    def speech_end_s(self) -> float | None:
        return talk.speech_region(self.audio)[1]


def load_questions(path: Path | None) -> list[Question]:
    """The built-in questions, or a JSON list of {"wav": FILE or "text": TEXT,
    "keywords": [...]} (WAV paths relative to the JSON file; a text without
    a WAV is spoken by the piper voice; other fields are ignored)."""
    if path is None:
        return [
            Question(text, keywords, say.synthesize(text), PIPER)
            for text, keywords in BUILTIN_QUESTIONS
        ]
    entries = json.loads(path.read_text())
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{path}: expected a non-empty JSON list of questions")
    questions = []
    for index, entry in enumerate(entries):
        keywords = entry.get("keywords") if isinstance(entry, dict) else None
        if not keywords or not isinstance(keywords, list):
            raise ValueError(f'{path}: question {index} needs a non-empty "keywords" list')
        if entry.get("wav"):
            wav = (path.parent / entry["wav"]).resolve()
            samples, rate = talk.read_wav(wav)
            audio, source = resample(samples, rate, SAMPLE_RATE), str(wav)
        elif entry.get("text"):
            audio, source = say.synthesize(entry["text"]), PIPER
        else:
            raise ValueError(f'{path}: question {index} needs "wav" or "text"')
        questions.append(
            Question(entry.get("text", Path(source).stem), tuple(keywords), audio, source)
        )
    return questions


def words(text: str) -> list[str]:
    """Normalized words: lower case, letters, digits and apostrophes only."""
    return re.findall(r"[a-z0-9']+", text.lower())


def heard(transcript: str, keywords: tuple[str, ...]) -> bool:
    """Every keyword (each may list alternatives, "eight|8") is in the transcript
    as whole words."""
    said = words(transcript)
    return all(
        any(_contains(said, words(alternative)) for alternative in keyword.split("|"))
        for keyword in keywords
    )


def _contains(said: list[str], phrase: list[str]) -> bool:
    size = len(phrase)
    return size > 0 and any(said[i : i + size] == phrase for i in range(len(said) - size + 1))
