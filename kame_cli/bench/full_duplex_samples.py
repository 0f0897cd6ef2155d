"""Full-Duplex-Bench v1-format samples of our own, spoken by espeak-ng voices that no
test uses, for kame_cli/bench/full_duplex_live.py (docs/turn-taking.md,
"Full-Duplex-Bench figures").

FDB's v1.0 recordings are a download outside this repository; these stand in for three
of its tasks, in its folder layout ({out}/{folder}/{ID}/input.wav and the task's
annotation file), so `full_duplex_live --data {out}` plays and scores them as it does
FDB's:

- synthetic_turn_taking (smooth turn-taking): a whole question, then ANSWER_S of
  silence; turn_taking.json's timestamp[0] is the caller's end of turn.
- synthetic_pause_handling (pause handling): a question said in two halves with a
  pause of 1.0 to 1.5 s between them (the first half ends on a comma, so espeak-ng
  keeps its voice up), the recording ending END_S after the question, so only an
  agent that speaks over the caller takes the turn; pause.json gives the pause.
- synthetic_user_interruption (user interruption): a question, INTERRUPT_AFTER_S of
  silence for the agent to start answering, then a second question over the agent's
  answer, then ANSWER_S of silence; interrupt.json's timestamp is the second
  question's [start, end] (FDB scores from its end), with context.wav and
  interrupt.wav, the two questions alone, as FDB's synthetic set has.

Each sample also has transcription.json: the text and, per spoken part (not per word,
as FDB's), its [start, end]; and {out}/samples.json lists every sample's voice, texts
and times. The voices, speeds, pitches and texts are those of the bench's held-out
question set (kame_cli/bench/make_questions.py, HELDOUT_QUESTIONS: no test may use
them), recombined so no sample repeats a committed WAV; a third of them come through
a telephone line (8 kHz mu-law) as that set's do. Each part is spoken by
make_questions.synthesize (espeak-ng, then sox: 16 kHz, normalized, padded), and the
caller's speech is timed by its level (kame_client.caller.speech_region), the rule
the scoring times speech with. The same tools' versions give the same bytes.

    python -m kame_cli.bench.full_duplex_samples --out /tmp/fdb_samples [--count 4]
    python -m kame_cli.bench.full_duplex_live --data /tmp/fdb_samples --url ws://...
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kame_cli.bench import make_questions
from kame_cli.bench.full_duplex import Task
from kame_cli.bench.make_questions import SpokenQuestion
from kame_cli.say import write_wav
from kame_cli.talk import read_wav
from kame_client.caller import speech_region
from kame_common.audio import SAMPLE_RATE, Samples, resample

RATE = make_questions.WAV_RATE  # input.wav's rate (16 kHz, as the question sets')
LEAD_S = 0.5  # silence before the caller's first word
ANSWER_S = 6.0  # silence after the caller's last question: time to answer
INTERRUPT_AFTER_S = 2.0  # from the first question's end to the interrupting one's start
END_S = 0.3  # pause handling: the recording ends this long after the question
PAUSES_S = (1.0, 1.1, 1.2, 1.3, 1.4, 1.5)  # the mid-sentence pauses, in turn

FOLDERS = {
    Task.SMOOTH: "synthetic_turn_taking",
    Task.PAUSE: "synthetic_pause_handling",
    Task.INTERRUPTION: "synthetic_user_interruption",
}
# Where each task starts in the pool (voices and texts), so the tasks hear different
# voices; a text goes with the voice TEXT_SHIFT entries on, not its own.
OFFSETS = {Task.SMOOTH: 0, Task.PAUSE: 5, Task.INTERRUPTION: 9}
TEXT_SHIFT = 7


@dataclass(frozen=True)
class Part:
    """One stretch of the caller's speech and the silence after it."""

    text: str
    silence_after_s: float


@dataclass(frozen=True)
class Plan:
    """One sample: who speaks (voice, speed, pitch, phone line) and what, in parts."""

    task: Task
    sample_id: str
    voice: SpokenQuestion  # its text unused: the parts say what is spoken
    parts: tuple[Part, ...]

    @property
    def folder(self) -> str:
        return FOLDERS[self.task]

    @property
    def text(self) -> str:
        return " ".join(part.text for part in self.parts)


@dataclass(frozen=True)
class Spoken:
    """A part as spoken: its samples at RATE and where in them the speech is."""

    audio: Samples
    start: int  # samples
    end: int


def split_for_pause(text: str) -> tuple[str, str]:
    """The text in two halves at the word boundary nearest its middle (the first half
    at least as long), the first ending on a comma."""
    words = text.split()
    cut = (len(words) + 1) // 2
    return " ".join(words[:cut]) + ",", " ".join(words[cut:])


def plans(count: int, pool: Sequence[SpokenQuestion] | None = None) -> list[Plan]:
    """`count` samples of each task, voices and texts from `pool` (default: the
    held-out question set) in turn, deterministic."""
    pool = make_questions.HELDOUT_QUESTIONS if pool is None else pool
    made = []
    for task, offset in OFFSETS.items():
        for index in range(count):
            at = offset + index
            voice = pool[at % len(pool)]
            text = pool[(at + TEXT_SHIFT) % len(pool)].text
            if task is Task.SMOOTH:
                parts: tuple[Part, ...] = (Part(text, ANSWER_S),)
            elif task is Task.PAUSE:
                first, second = split_for_pause(text)
                pause = PAUSES_S[index % len(PAUSES_S)]
                parts = (Part(first, pause), Part(second, END_S))
            else:
                second = pool[(at + TEXT_SHIFT + 1) % len(pool)].text
                parts = (Part(text, INTERRUPT_AFTER_S), Part(second, ANSWER_S))
            made.append(Plan(task, f"{index:02d}", voice, parts))
    return made


def layout(
    spoken: Sequence[tuple[int, int, int]], silences_s: Sequence[float], lead_s: float = LEAD_S
) -> tuple[list[int], list[tuple[float, float]], int]:
    """Where each part goes: given each part's (length, speech start, speech end) in
    samples at RATE and the silence after each part's speech, the offset each part's
    audio is laid at, each part's speech (start_s, end_s) in the recording, and the
    recording's length in samples. The first speech starts at `lead_s`; each next one
    the silence after the one before; the recording ends the last silence after the
    last speech (or with the last part's audio, if that is later)."""
    offsets, spans = [], []
    speech_at = round(lead_s * RATE)
    length = 0
    for (size, start, end), silence_s in zip(spoken, silences_s, strict=True):
        offset = max(0, speech_at - start)
        offsets.append(offset)
        spans.append(((offset + start) / RATE, (offset + end) / RATE))
        speech_at = offset + end + round(silence_s * RATE)
        length = max(length, offset + size)
    return offsets, spans, max(length, speech_at)


def mix(parts: Sequence[Samples], offsets: Sequence[int], length: int) -> Samples:
    """The parts' audio laid at their offsets (summed where their padding overlaps)."""
    out = np.zeros(length, np.float32)
    for audio, offset in zip(parts, offsets, strict=True):
        out[offset : offset + len(audio)] += audio[: length - offset]
    return out


def annotation_files(
    plan: Plan, spans: Sequence[tuple[float, float]], length_s: float
) -> dict[str, Any]:
    """The sample's JSON files, by name: the task's annotation as FDB's scripts and
    full_duplex_live read it, and transcription.json."""

    def at(seconds: float) -> float:
        return round(seconds, 3)

    files: dict[str, Any] = {
        "transcription.json": {
            "text": plan.text,
            "chunks": [
                {"text": part.text, "timestamp": [at(start), at(end)]}
                for part, (start, end) in zip(plan.parts, spans, strict=True)
            ],
        }
    }
    if plan.task is Task.SMOOTH:
        files["turn_taking.json"] = [
            {"text": plan.text, "timestamp": [at(spans[-1][1]), at(length_s)]}
        ]
    elif plan.task is Task.PAUSE:
        files["pause.json"] = [{"text": plan.text, "timestamp": [at(spans[0][1]), at(spans[1][0])]}]
    else:
        files["interrupt.json"] = [
            {
                "context": plan.parts[0].text,
                "interrupt": plan.parts[1].text,
                "timestamp": [at(spans[1][0]), at(spans[1][1])],
            }
        ]
    return files


def speech_bounds(audio: Samples) -> tuple[int, int]:
    """Where the speech in a clip at RATE starts and ends, in samples, by the level rule
    the scoring uses (it works at SAMPLE_RATE)."""
    start_s, end_s = speech_region(resample(audio, RATE, SAMPLE_RATE))
    if start_s is None or end_s is None:
        raise ValueError("no speech in the clip")
    return round(start_s * RATE), min(len(audio), round(end_s * RATE))


def espeak(voice: SpokenQuestion, text: str) -> Samples:
    """`text` in `voice`'s voice, speed, pitch and line, as the question sets are made."""
    with tempfile.TemporaryDirectory() as scratch:
        wav = Path(scratch) / "part.wav"
        make_questions.synthesize(dataclasses.replace(voice, text=text), wav)
        audio, rate = read_wav(wav)
    return resample(audio, rate, RATE)


def speak_plan(plan: Plan, say: Callable[[SpokenQuestion, str], Samples] = espeak) -> list[Spoken]:
    spoken = []
    for part in plan.parts:
        audio = say(plan.voice, part.text)
        start, end = speech_bounds(audio)
        spoken.append(Spoken(audio, start, end))
    return spoken


def write_sample(out: Path, plan: Plan, spoken: Sequence[Spoken]) -> dict[str, Any]:
    """The sample's folder: input.wav, its JSON files (and, for an interruption, its
    two questions alone, as FDB's context.wav and interrupt.wav); its samples.json entry."""
    offsets, spans, length = layout(
        [(len(s.audio), s.start, s.end) for s in spoken], [p.silence_after_s for p in plan.parts]
    )
    folder = out / plan.folder / plan.sample_id
    write_wav(folder / "input.wav", mix([s.audio for s in spoken], offsets, length), RATE)
    for name, content in annotation_files(plan, spans, length / RATE).items():
        (folder / name).write_text(json.dumps(content, indent=1) + "\n")
    if plan.task is Task.INTERRUPTION:
        write_wav(folder / "context.wav", spoken[0].audio, RATE)
        write_wav(folder / "interrupt.wav", spoken[1].audio, RATE)
    voice = plan.voice
    return {
        "folder": plan.folder,
        "id": plan.sample_id,
        "voice": voice.voice,
        "speed_wpm": voice.speed_wpm,
        "pitch": voice.pitch,
        "telephone": voice.telephone,
        "parts": [
            {"text": part.text, "start_s": round(start, 3), "end_s": round(end, 3)}
            for part, (start, end) in zip(plan.parts, spans, strict=True)
        ],
        "duration_s": round(length / RATE, 3),
    }


def describe(entry: dict[str, Any]) -> str:
    """A progress line for a written sample."""
    line = " | ".join(f"{p['text']} [{p['start_s']:.2f}-{p['end_s']:.2f}]" for p in entry["parts"])
    phone = ", telephone" if entry["telephone"] else ""
    return (
        f"{entry['folder']}/{entry['id']}: {entry['voice']}{phone}, "
        f"{entry['duration_s']:.1f} s: {line}"
    )


def make(
    out: Path,
    count: int,
    pool: Sequence[SpokenQuestion] | None = None,
    say: Callable[[SpokenQuestion, str], Samples] = espeak,
    progress: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """`count` samples of each task in `out`, and out/samples.json listing them."""
    entries = []
    for plan in plans(count, pool):
        entry = write_sample(out, plan, speak_plan(plan, say))
        progress(describe(entry))
        entries.append(entry)
    (out / "samples.json").write_text(json.dumps(entries, indent=1) + "\n")
    return entries


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the folder to fill")
    parser.add_argument("--count", type=int, default=4, help="samples per task (default 4)")
    args = parser.parse_args(argv)
    if args.count < 1:
        parser.error("--count must be at least 1")
    if not make_questions.tools_ready(make_questions.HELDOUT_QUESTIONS):
        return 1
    entries = make(args.out, args.count)
    print(f"wrote {len(entries)} samples and samples.json to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
