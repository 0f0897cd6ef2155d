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
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
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
from services.frontend.engines.turns import LevelVad

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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    from kame_common.voice import load_voice

    piper = load_voice(varied=False)
    voices = ("piper", *ESPEAK_VOICES)
    rows = []
    for group, phrases in (("backchannel", BACKCHANNELS), ("interruption", INTERRUPTIONS)):
        for text in phrases:
            spoken = [piper.synthesize(text)] + [espeak(text, voice) for voice in ESPEAK_VOICES]
            for quality, heard in (("16k", lambda audio: audio), ("phone", phone)):
                spans = [voiced_span_ms(heard(audio)) for audio in spoken]
                rows.append({"group": group, "text": text, "quality": quality, "ms": spans})
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
    write_json(args.out, {"voices": voices, "ranges": ranges, "phrases": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
