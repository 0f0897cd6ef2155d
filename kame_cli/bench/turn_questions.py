"""The turn-taking questions: the espeak-ng set (kame_cli/bench/make_questions.py) and the
same texts in the piper voice, each whole and with a 0.6-0.9 s pause after
60-80 % of its words, at 16 kHz and at phone quality (8 kHz G.711 mu-law and
back), as recordings for turn_replay (kame_cli/bench/turn_bench.py, `kame bench --turn-taking`)."""

from __future__ import annotations

import json
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kame_cli.bench import turn_replay
from kame_cli.bench.paths import ESPEAK_QUESTIONS
from kame_cli.talk import read_wav
from kame_common.audio import (
    Samples,
    resample,
    through_phone,
)
from kame_common.turn_model import MODEL_RATE, SmartTurn


@dataclass(frozen=True)
class Question:
    text: str
    source: str  # "espeak-ng" or "piper"
    voice: str
    speed_wpm: int = 0
    pitch: int = 0
    wav: str = ""


def cut_words(index: int, count: int) -> int:
    """How many of `count` words the cut keeps: 60 to 80 % (varied by question),
    at least one, never all."""
    share = 0.6 + 0.2 * (index % 5) / 4
    return min(count - 1, max(1, round(share * count)))


def pause_s(index: int) -> float:
    return (0.6, 0.7, 0.8, 0.9)[index % 4]


def levels_db(audio: Samples, hop: int) -> Samples:
    frames = audio[: len(audio) // hop * hop].reshape(-1, hop)
    levels: Samples = 10 * np.log10(np.mean(frames**2, axis=1) + 1e-12)
    return levels


def speech_span(audio: Samples, below_peak_db: float = 40.0) -> tuple[int, int]:
    """First and last sample of the 10 ms frames within `below_peak_db` of the loudest."""
    hop = MODEL_RATE // 100
    levels = levels_db(audio, hop)
    voiced = np.flatnonzero(levels > levels.max() - below_peak_db)
    return int(voiced[0]) * hop, (int(voiced[-1]) + 1) * hop


def phone_quality(audio: Samples) -> Samples:
    """A telephone caller (8 kHz G.711 mu-law and back) at the model's 16 kHz."""
    return through_phone(audio, MODEL_RATE)


def quietest_near(audio: Samples, at_s: float, within_s: float = 0.06) -> int:
    """The sample at the quietest 10 ms frame within `within_s` of `at_s`: a cut
    there does not clip the next word's onset."""
    hop = MODEL_RATE // 100
    first = max(0, int((at_s - within_s) * MODEL_RATE) // hop)
    levels = levels_db(audio, hop)
    last = min(len(levels), int((at_s + within_s) * MODEL_RATE) // hop + 1)
    return (first + int(np.argmin(levels[first:last]))) * hop


def longest_gap(audio: Samples) -> tuple[int, int]:
    """Start and end sample of the longest run of silent 10 ms frames inside the speech."""
    hop = MODEL_RATE // 100
    start, end = speech_span(audio)
    levels = levels_db(audio[start:end], hop)
    silent = levels < levels.max() - 40.0
    best, run_start, best_span = 0, 0, (0, 0)
    for index, quiet in enumerate([*silent, False]):
        if quiet and (index == 0 or not silent[index - 1]):
            run_start = index
        if not quiet and index > 0 and silent[index - 1] and index - run_start > best:
            best, best_span = index - run_start, (run_start, index)
    return start + best_span[0] * hop, start + best_span[1] * hop


def espeak_ssml(question: Question, ssml: str) -> Samples:
    """espeak-ng with SSML (-m) in the question's voice, speed and pitch, at 16 kHz."""
    with tempfile.TemporaryDirectory() as scratch:
        wav = Path(scratch) / "q.wav"
        command = ["espeak-ng", "-m", "-v", question.voice, "-s", str(question.speed_wpm)]
        command += ["-p", str(question.pitch), "-w", str(wav), f"<speak>{ssml}</speak>"]
        subprocess.run(command, check=True)
        samples, rate = read_wav(wav)
    return resample(samples, rate, MODEL_RATE)


def with_break(text: str, keep: int, pause: float) -> str:
    spoken = text.split()
    return " ".join([*spoken[:keep], f'<break time="{round(pause * 1000)}ms"/>', *spoken[keep:]])


class WordClock:
    """Whisper tiny.en's word timestamps (the STT's own embedded model)."""

    def __init__(self) -> None:
        from faster_whisper import WhisperModel

        from kame_common.models import whisper_tiny_en_dir

        self._model = WhisperModel(
            str(whisper_tiny_en_dir()), device="cpu", compute_type="int8", cpu_threads=1
        )

    def boundary_s(self, audio: Samples, keep: int) -> float:
        """Between word `keep` and the next, in seconds (the words as Whisper hears them)."""
        segments, _ = self._model.transcribe(audio, beam_size=1, word_timestamps=True)
        heard = [word for segment in segments for word in (segment.words or [])]
        if len(heard) <= keep:
            raise ValueError(f"Whisper heard {len(heard)} words, the cut keeps {keep}")
        return float(heard[keep - 1].end + heard[keep].start) / 2


def load_questions(count: int | None = None) -> list[Question]:
    """The first `count` questions of the espeak-ng set (each in its own voice),
    then the same texts in the piper voice; every question by default."""
    entries = json.loads(ESPEAK_QUESTIONS.read_text())[:count]
    espeak = [
        Question(e["text"], "espeak-ng", e["voice"], e["speed_wpm"], e["pitch"], e["wav"])
        for e in entries
    ]
    return espeak + [Question(e["text"], "piper", "en_US-joe-medium") for e in entries]


def speech_of(question: Question, piper_voice: Any) -> Samples:
    if question.source == "piper":
        return resample(piper_voice.synthesize(question.text), 24_000, MODEL_RATE)
    samples, rate = read_wav(ESPEAK_QUESTIONS.parent / question.wav)
    return resample(samples, rate, MODEL_RATE)


def recordings(
    number: int, question: Question, speech: Samples, clock: WordClock
) -> list[turn_replay.Recording]:
    """The question whole and with its pause (turn_replay's doc), in both qualities."""
    start, end = speech_span(speech)
    spoken = question.text.split()
    keep, pause = cut_words(number, len(spoken)), pause_s(number)
    if question.source == "piper":
        cut_at = quietest_near(speech, clock.boundary_s(speech, keep))
        gap = np.zeros(round(pause * MODEL_RATE), np.float32)
        paused = np.concatenate([speech[start:cut_at], gap, speech[cut_at:end]])
        pause_start, pause_end = cut_at - start, cut_at - start + len(gap)
    else:
        with_pause = espeak_ssml(question, with_break(question.text, keep, pause))
        first, last = speech_span(with_pause)
        paused = with_pause[first:last]
        gap_start, gap_end = longest_gap(with_pause)
        pause_start, pause_end = gap_start - first, gap_end - first
    made = []
    for quality, heard in (("16k", lambda a: a), ("phone", phone_quality)):
        common = (question.source, question.voice, question.text)
        whole = turn_replay.to_frontend(heard(speech[start:end]))
        made.append(turn_replay.Recording(*common, "whole", quality, whole))
        made.append(
            turn_replay.Recording(
                *common,
                "paused",
                quality,
                turn_replay.to_frontend(heard(paused)),
                pause_start / MODEL_RATE,
                pause_end / MODEL_RATE,
                " ".join(spoken[:keep]),
            )
        )
    return made


def replay_questions(
    model: SmartTurn,
    questions: list[Question],
    policies: tuple[turn_replay.Policy, ...] = turn_replay.POLICIES,
) -> dict[str, Any]:
    """`questions` as load_questions gives them (espeak-ng, then piper), through
    the front-end's detectors under each policy (turn_replay.run)."""
    from kame_common.voice import load_voice

    piper_voice = load_voice(varied=False)
    clock = WordClock()
    count = len(questions) // 2
    made = []
    for number, question in enumerate(questions):
        made += recordings(number % count, question, speech_of(question, piper_voice), clock)
    return turn_replay.run(made, model, policies)
