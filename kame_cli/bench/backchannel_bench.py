"""How long do backchannels and short interruptions last, as the front-end's VAD hears them?

The tts engine stops the agent (barge-in) on SPEECH_START: two voiced 80 ms
frames (160 ms). Issue #32 asks that "yeah", "uh-huh", "okay"... said while
the agent speaks do not stop it, while a real interruption stops it within
200 ms. Before choosing a rule, this measures what a rule on loudness and
length alone could use: the span from the first to the last voiced frame
(turns.LevelVad, the engine's own VAD) of each phrase, in the piper voice and
four espeak-ng voices, at 16 kHz and through 8 kHz G.711 mu-law.

    .venv/bin/python -m kame_cli.bench.backchannel_bench
        [--out bench/results/backchannel_bench.json]

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
import sys
from pathlib import Path

import numpy as np

from kame_cli.bench.backchannels import (
    BACKCHANNELS,
    ESPEAK_VOICES,
    INTERRUPTIONS,
    WANTED,
    measure,
    outcomes,
)
from kame_cli.bench.paths import RESULTS_DIR
from kame_cli.bench.report import write_json
from kame_common.words import normalize_words
from services.frontend.engines.backchannel import Backchannels

OUT = RESULTS_DIR / "backchannel_bench.json"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    voices = ("piper", *ESPEAK_VOICES)
    rule = Backchannels()
    phrases = {"backchannel": BACKCHANNELS, "interruption": INTERRUPTIONS}
    rows, clips = measure(voices, phrases, rule)
    print(f"{'':13}{'phrase':25}{'quality':>8}" + "".join(f"{v[:12]:>14}" for v in voices))
    for row in rows:
        cells = "".join(f"{ms:>12}ms" for ms in row["ms"])
        print(f"{row['group']:13}{row['text']:25}{row['quality']:>8}{cells}")
    ranges: dict[str, dict[str, int]] = {}
    for group in ("backchannel", "interruption"):
        spans = [ms for row in rows if row["group"] == group for ms in row["ms"]]
        ranges[group] = {
            "min_ms": min(spans),
            "median_ms": int(np.median(spans)),
            "max_ms": max(spans),
        }
        print(f"{group}: {ranges[group]}")
    wrong = [c for c in clips if c["verdict"] != WANTED[c["group"]]]
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
