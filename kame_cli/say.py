"""`kame say "text" --out q.wav`: a spoken question from the piper voice (offline)."""

from __future__ import annotations

import argparse
import wave
from pathlib import Path

import numpy as np
import numpy.typing as npt

from kame_cli.errors import file_error
from kame_common.audio import SAMPLE_RATE, Samples, float_to_pcm16, resample


def write_wav(path: Path, samples: npt.ArrayLike, rate: int) -> None:
    """Mono PCM s16le WAV."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(float_to_pcm16(samples))


def synthesize(text: str, voice_path: str = "", pad_s: float = 0.3) -> Samples:
    """`text` spoken by the voice at 24 kHz, with `pad_s` of silence on both
    sides (a caller breathes before and after a question)."""
    from kame_common.voice import load_voice

    speech = load_voice(voice_path).synthesize(text)
    pad = np.zeros(int(pad_s * SAMPLE_RATE), dtype=np.float32)
    return np.concatenate([pad, speech, pad])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("text", help="what the caller says")
    parser.add_argument("--out", type=Path, required=True, help="WAV file to write")
    parser.add_argument("--voice", default="", help="piper voice .onnx (default: embedded joe)")
    parser.add_argument("--rate", type=int, default=SAMPLE_RATE, help="sample rate of the WAV")
    parser.add_argument("--pad-s", type=float, default=0.3, help="silence before and after")


def run(args: argparse.Namespace) -> int:
    if args.voice and not Path(args.voice).is_file():
        raise file_error(args.voice, "voice")
    samples = resample(synthesize(args.text, args.voice, args.pad_s), SAMPLE_RATE, args.rate)
    write_wav(args.out, samples, args.rate)
    print(f"{args.out}: {len(samples) / args.rate:.2f} s at {args.rate} Hz: {args.text!r}")
    return 0
