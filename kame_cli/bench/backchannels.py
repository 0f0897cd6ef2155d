"""Backchannels and interruptions said while the agent speaks, through the tts
engine's turn detector and backchannel rule (services/frontend/engines/backchannel.py),
with the words the stt service's Whisper tiny.en decoder hears in each clip
(kame_cli/bench/backchannel_bench.py, `kame bench --turn-taking`; the method: that script's doc)."""

from __future__ import annotations

import math
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from kame_cli.talk import read_wav
from kame_common.audio import (
    FRAME_SAMPLES,
    FRAME_SECONDS,
    SAMPLE_RATE,
    Samples,
    resample,
    through_phone,
)
from services.frontend.engines.backchannel import Backchannels, Overlap, Verdict
from services.frontend.engines.base import Transcript
from services.frontend.engines.phrases import voiced_bounds
from services.frontend.engines.turns import LevelVad, TurnDetector, TurnEvent

BACKCHANNELS = ("Yeah.", "Uh-huh.", "Okay.", "Right.", "Mm-hmm.", "Yes.", "Sure.", "I see.")
INTERRUPTIONS = (
    "Wait.",
    "Stop.",
    "Hold on.",
    "No, Paris.",
    "Wait, what about Spain?",
    "Actually, never mind.",
)
ESPEAK_VOICES = ("en-us", "en-gb-scotland+m1", "en-us+f3", "en-029+m2")
# The outcome each group should have: the answer goes on, or the caller barges in.
WANTED = {"backchannel": "resume", "interruption": "barge_in"}


def espeak(text: str, voice: str) -> Samples:
    with tempfile.TemporaryDirectory() as scratch:
        wav = Path(scratch) / "phrase.wav"
        subprocess.run(["espeak-ng", "-v", voice, "-w", str(wav), text], check=True)
        samples, rate = read_wav(wav)
    return resample(samples, rate, SAMPLE_RATE)


def voiced_span_ms(audio: Samples) -> int:
    """First to last voiced frame (the engine's LevelVad, 0.5 s of silence around)."""
    quiet = np.zeros(SAMPLE_RATE // 2, np.float32)
    signal = np.concatenate([quiet, audio.astype(np.float32), quiet])
    count = len(signal) // FRAME_SAMPLES
    vad = LevelVad()
    frames = signal[: count * FRAME_SAMPLES].reshape(count, FRAME_SAMPLES)
    voiced = [index for index, frame in enumerate(frames) if vad.voiced(frame)]
    return round((voiced[-1] - voiced[0] + 1) * FRAME_SECONDS * 1000) if voiced else 0


STT_RATE = 16_000


class SttFinal:
    """The stt service's decoder: the words of a clip and the wall time they took."""

    def __init__(self) -> None:
        from services.stt.engine import SttEngine

        self.engine = SttEngine()

    def __call__(self, audio: Samples) -> tuple[str, float]:
        clip = resample(audio, SAMPLE_RATE, STT_RATE)
        # The silence a session's pre-roll gives a clip that starts with its speech.
        pre_roll = np.zeros(round(self.engine.settings.pre_roll_s * STT_RATE), np.float32)
        padded = np.concatenate([pre_roll, clip])
        request = self.engine.request(padded, 0.0, "en", self.engine.settings.beam_size)
        started = time.perf_counter()
        [words] = self.engine.whisper.decode([request])
        return " ".join(w.text for w in words), time.perf_counter() - started


def overlap_outcome(
    audio: Samples, text: str, decode_s: float, rule: Backchannels
) -> dict[str, Any]:
    """The clip said while the agent speaks, through the engine's detector and rule."""
    lead = np.zeros(SAMPLE_RATE, np.float32)  # the agent talks; the caller is quiet
    signal = np.concatenate([lead, audio.astype(np.float32), np.zeros(3 * SAMPLE_RATE, np.float32)])
    count = len(signal) // FRAME_SAMPLES
    frames = signal[: count * FRAME_SAMPLES].reshape(count, FRAME_SAMPLES)
    sound_s = (len(lead) + voiced_bounds(audio)[0]) / SAMPLE_RATE
    detector = TurnDetector(1.04)
    overlap: Overlap | None = None
    final_at: int | None = None
    for index, frame in enumerate(frames):
        event = detector.push(frame)
        if event is TurnEvent.SPEECH_START and overlap is None:
            overlap = Overlap(rule, detector.speech_start_s)
            silent_from = index
        if overlap is None:
            continue
        if index == final_at:
            overlap.heard(Transcript("u1", text, True, sound_s + len(audio) / SAMPLE_RATE))
        if overlap.frame(detector.frames, detector.silent_frames):
            final_at = index + math.ceil(decode_s / FRAME_SECONDS)
        if overlap.verdict is not Verdict.WAIT:
            return {
                "verdict": overlap.verdict.name.lower(),
                "silence_ms": round((silent_from * FRAME_SECONDS - sound_s) * 1000),
                "paused_ms": round((index - silent_from + 1) * FRAME_SECONDS * 1000),
            }
    return {"verdict": "unheard", "silence_ms": None, "paused_ms": None}


def outcomes(clips: list[dict[str, Any]], rule: Backchannels) -> dict[str, Any]:
    """Backchannels survived, interruptions caught, silence latency and pause."""
    summary: dict[str, Any] = {}
    for group, wanted in WANTED.items():
        mine = [c for c in clips if c["group"] == group]
        silences = [c["silence_ms"] for c in mine if c["silence_ms"] is not None]
        summary[group] = {
            "right": sum(c["verdict"] == wanted for c in mine),
            "clips": len(mine),
            "silence_ms_median": int(np.median(silences)),
            "silence_ms_max": max(silences),
            "paused_ms_median": int(np.median([c["paused_ms"] for c in mine if c["paused_ms"]])),
        }
    summary["rule"] = {"max_speech_s": rule.max_speech_s, "wait_s": rule.wait_s}
    return summary


def measure(
    voices: tuple[str, ...], phrases: dict[str, tuple[str, ...]], rule: Backchannels
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Each phrase of each group ("backchannel", "interruption") in each voice
    ("piper" or an espeak-ng voice), at 16 kHz and phone quality: the voiced
    spans (a row per phrase and quality) and each clip's outcome over the agent."""
    from kame_common.voice import load_voice

    piper = load_voice(varied=False) if "piper" in voices else None
    stt = SttFinal()
    rows: list[dict[str, Any]] = []
    clips: list[dict[str, Any]] = []
    for group, said in phrases.items():
        for text in said:
            spoken = [
                piper.synthesize(text) if voice == "piper" and piper else espeak(text, voice)
                for voice in voices
            ]
            for quality in ("16k", "phone"):
                heard = [
                    through_phone(audio, SAMPLE_RATE) if quality == "phone" else audio
                    for audio in spoken
                ]
                spans = [voiced_span_ms(audio) for audio in heard]
                rows.append({"group": group, "text": text, "quality": quality, "ms": spans})
                for voice, audio in zip(voices, heard, strict=True):
                    words, decode_s = stt(audio)
                    outcome = overlap_outcome(audio, words, decode_s, rule)
                    clips.append(
                        {"group": group, "text": text, "voice": voice, "quality": quality}
                        | {"heard": words, "decode_s": round(decode_s, 3)}
                        | outcome
                    )
    return rows, clips
