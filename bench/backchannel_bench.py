"""How long do backchannels and short interruptions last, as the front-end's VAD hears them?

The tts engine stops the agent (barge-in) on SPEECH_START: two voiced 80 ms
frames (160 ms). Issue #32 asks that "yeah", "uh-huh", "okay"... said while
the agent speaks do not stop it, while a real interruption stops it within
200 ms. Before choosing a rule, this measures what a rule on loudness and
length alone could use: the span from the first to the last voiced frame
(turns.LevelVad, the engine's own VAD) of each phrase, in the piper voice and
four espeak-ng voices, at 16 kHz and through 8 kHz G.711 mu-law.

    .venv/bin/python bench/backchannel_bench.py [--out bench/results/backchannel_bench.json]

Prints a table (milliseconds, per phrase and voice) and each group's range;
writes the JSON.

Then the outcome of the engine's rule (services/frontend/engines/backchannel.py)
on the same clips, each said while the agent speaks: the engine's turn
detector and `Overlap` take the clip frame by frame; the agent goes silent on
the SPEECH_START frame; when the overlap reports the caller's pause, stt's
final arrives after the time the stt's own decoder (Whisper tiny.en, the stt
service's WindowedWhisper, 0.25 s pre-roll) took to decode the clip here,
rounded up to frames, and carries the words it heard. Reported: backchannels
survived (the answer resumed), interruptions caught (barge-in), the silence
latency (from the clip's first sound, a 10 ms envelope, to the first silent
agent frame) and how long a backchannel paused the agent. Not simulated: the
gateway's hops and a busy stt queue (both add to the pause, not to the
silence latency).
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from kame_cli.bench.report import write_json
from kame_cli.talk import read_wav
from kame_common.audio import (
    FRAME_SAMPLES,
    FRAME_SECONDS,
    SAMPLE_RATE,
    float_to_pcm16,
    mulaw_decode,
    mulaw_encode,
    pcm16_to_float,
    resample,
)
from kame_common.words import normalize_words
from services.frontend.engines.backchannel import Backchannels, Overlap, Verdict
from services.frontend.engines.base import Transcript
from services.frontend.engines.phrases import voiced_bounds
from services.frontend.engines.turns import LevelVad, TurnDetector, TurnEvent

OUT = Path(__file__).resolve().parent / "results" / "backchannel_bench.json"
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
PHONE_RATE = 8_000


def espeak(text: str, voice: str) -> np.ndarray:
    with tempfile.TemporaryDirectory() as scratch:
        wav = Path(scratch) / "phrase.wav"
        subprocess.run(["espeak-ng", "-v", voice, "-w", str(wav), text], check=True)
        samples, rate = read_wav(wav)
    return resample(samples, rate, SAMPLE_RATE)


def phone(audio: np.ndarray) -> np.ndarray:
    narrow = resample(audio, SAMPLE_RATE, PHONE_RATE)
    coded = mulaw_decode(mulaw_encode(float_to_pcm16(narrow)))
    return resample(pcm16_to_float(coded), PHONE_RATE, SAMPLE_RATE)


def voiced_span_ms(audio: np.ndarray) -> int:
    """First to last voiced frame (the engine's LevelVad, 0.5 s of silence around)."""
    quiet = np.zeros(SAMPLE_RATE // 2, np.float32)
    signal = np.concatenate([quiet, audio.astype(np.float32), quiet])
    count = len(signal) // FRAME_SAMPLES
    vad = LevelVad()
    frames = signal[: count * FRAME_SAMPLES].reshape(count, FRAME_SAMPLES)
    voiced = [index for index, frame in enumerate(frames) if vad.voiced(frame)]
    return round((voiced[-1] - voiced[0] + 1) * FRAME_SECONDS * 1000) if voiced else 0


STT_RATE = 16_000
STT_PRE_ROLL_S = 0.25


class SttFinal:
    """The stt service's decoder: the words of a clip and the wall time they took."""

    def __init__(self) -> None:
        from services.stt.engine import SttEngine

        self.engine = SttEngine()

    def __call__(self, audio: np.ndarray) -> tuple[str, float]:
        clip = resample(audio, SAMPLE_RATE, STT_RATE)
        padded = np.concatenate([np.zeros(round(STT_PRE_ROLL_S * STT_RATE), np.float32), clip])
        request = self.engine.request(padded, 0.0, "en", self.engine.settings.beam_size)
        started = time.perf_counter()
        [words] = self.engine.whisper.decode([request])
        return " ".join(w.text for w in words), time.perf_counter() - started


def overlap_outcome(audio: np.ndarray, text: str, decode_s: float, rule: Backchannels) -> dict:
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


def outcomes(clips: list[dict], rule: Backchannels) -> dict:
    """Backchannels survived, interruptions caught, silence latency and pause."""
    summary: dict = {}
    for group, wanted in (("backchannel", "resume"), ("interruption", "barge_in")):
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    from kame_common.voice import load_voice

    piper = load_voice(varied=False)
    voices = ("piper", *ESPEAK_VOICES)
    stt = SttFinal()
    rule = Backchannels()
    rows: list[dict] = []
    clips: list[dict] = []
    for group, phrases in (("backchannel", BACKCHANNELS), ("interruption", INTERRUPTIONS)):
        for text in phrases:
            spoken = [piper.synthesize(text)] + [espeak(text, voice) for voice in ESPEAK_VOICES]
            for quality, heard in (("16k", lambda audio: audio), ("phone", phone)):
                spans = [voiced_span_ms(heard(audio)) for audio in spoken]
                rows.append({"group": group, "text": text, "quality": quality, "ms": spans})
                for voice, audio in zip(voices, spoken, strict=True):
                    words, decode_s = stt(heard(audio))
                    outcome = overlap_outcome(heard(audio), words, decode_s, rule)
                    clips.append(
                        {"group": group, "text": text, "voice": voice, "quality": quality}
                        | {"heard": words, "decode_s": round(decode_s, 3)}
                        | outcome
                    )
    print(f"{'':13}{'phrase':25}{'quality':>8}" + "".join(f"{v[:12]:>14}" for v in voices))
    for row in rows:
        spans = "".join(f"{ms:>12}ms" for ms in row["ms"])
        print(f"{row['group']:13}{row['text']:25}{row['quality']:>8}{spans}")
    ranges = {}
    for group in ("backchannel", "interruption"):
        spans = [ms for row in rows if row["group"] == group for ms in row["ms"]]
        ranges[group] = {
            "min_ms": min(spans),
            "median_ms": int(np.median(spans)),
            "max_ms": max(spans),
        }
        print(f"{group}: {ranges[group]}")
    wrong = [
        c
        for c in clips
        if c["verdict"] != ("resume" if c["group"] == "backchannel" else "barge_in")
    ]
    for clip in wrong:
        words = " ".join(normalize_words(clip["heard"]))
        where = f"{clip['voice']}, {clip['quality']}"
        print(f"  {clip['verdict']:9} {clip['text']!r} ({where}): heard {words!r}")
    summary = outcomes(clips, rule)
    for group in ("backchannel", "interruption"):
        print(f"{group} outcome: {summary[group]}")
    write_json(
        args.out,
        {"voices": voices, "ranges": ranges, "phrases": rows, "outcomes": summary, "clips": clips},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
