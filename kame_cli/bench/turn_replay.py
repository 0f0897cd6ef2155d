"""Spoken questions through the front-end's own turn detectors (kame_cli/bench/turn_bench.py's
second part, and `kame bench --turn-taking`).

Each question is played, in 80 ms frames at 24 kHz (what the front-end
receives: 16 kHz, or phone quality, 8 kHz G.711 mu-law, resampled up), with
0.5 s of silence before and 2 s after, into a fresh detector of the tts
engine (services/frontend/engines: turns.TurnDetector with the fixed pause,
semantic_turns.SmartTurnDetector with the real Smart Turn model). Two
recordings of each question:

- whole: the question; the detector's turn end minus the speech end it
  found is the end-of-turn latency (what the caller waits for the turn to
  end after a finished question);
- paused: the same question with a 0.6-0.9 s pause after 60-80 % of its
  words (piper: its own audio with silence put in at the word boundary that
  Whisper tiny.en finds; espeak-ng: spoken with an SSML break there); cut off
  = the turn ended in the pause, before the caller's question was over.

Smart Turn runs on its worker thread as in the front-end, and each frame
waits for the answers asked so far before the next is pushed: an answer is
read on the frame after the one that asked, as a live session reads it when
the model is faster than a frame (35 ms median on 2 busy cores).

"with transcript" adds the transcript and words rules with the exact words
(what a right stt partial covering the speech end would say: the question
with its "?", the words before a pause without one), given to the detector
as each stretch of speech ends: the rules' best case. "stt guesses ?" is
their worst: every pause's words that do not dangle come with a question
mark, as if stt took each for a finished question.
"""

from __future__ import annotations

import statistics
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kame_common.audio import FRAME_SAMPLES, FRAME_SECONDS, SAMPLE_RATE, Samples, resample
from kame_common.turn_model import MODEL_RATE, SmartTurn
from services.frontend.engines.base import DEFAULT_TURN_END_SILENCE_S
from services.frontend.engines.semantic_turns import SmartTurnDetector, TurnTaking
from services.frontend.engines.turns import TurnDetector, TurnEvent

LEAD_S = 0.5
TAIL_S = 2.0


@dataclass
class Recording:
    source: str  # piper or espeak-ng
    voice: str
    text: str
    kind: str  # whole or paused
    quality: str  # 16k or phone
    audio: Samples = field(repr=False)  # 24 kHz, speech only (no lead or tail)
    pause_start_s: float = 0.0  # paused: where the pause starts and ends in `audio`
    pause_end_s: float = 0.0
    prefix: str = ""  # paused: the words before the pause


@dataclass(frozen=True)
class Policy:
    name: str
    taking: TurnTaking | None  # None: the fixed DEFAULT_TURN_END_SILENCE_S pause
    with_transcript: bool = False
    guessed_question_marks: bool = False  # the words before each pause end in "?"


POLICIES = (
    Policy(f"silence {DEFAULT_TURN_END_SILENCE_S:g} s", None),
    Policy("smart_turn (default)", TurnTaking()),
    Policy("smart_turn + transcript", TurnTaking(), with_transcript=True),
    Policy(
        "smart_turn + transcript, stt guesses ?",
        TurnTaking(),
        with_transcript=True,
        guessed_question_marks=True,
    ),
    Policy("smart_turn + transcript, no words", TurnTaking(words_end_s=0), with_transcript=True),
    Policy("smart_turn t 0.95", TurnTaking(threshold=0.95)),
    Policy("smart_turn t 0.97", TurnTaking(threshold=0.97)),
    Policy("smart_turn 1 ask at 0.16 s", TurnTaking(asks=1)),
    Policy("smart_turn 1 ask at 0.24 s", TurnTaking(first_ask_s=0.24, asks=1)),
    Policy("smart_turn 2 asks from 0.24 s", TurnTaking(first_ask_s=0.24)),
)


@dataclass
class Outcome:
    turn_ends_s: list[float]  # when each TURN_END came, from the start of `audio`
    latencies_s: list[float]  # each turn end minus the speech end the detector found
    ended_by: list[str]
    probabilities: list[list[float]]


def frames_of(recording: Recording) -> list[Samples]:
    lead = np.zeros(int(LEAD_S * SAMPLE_RATE), np.float32)
    tail = np.zeros(int(TAIL_S * SAMPLE_RATE), np.float32)
    signal = np.concatenate([lead, recording.audio, tail])
    count = len(signal) // FRAME_SAMPLES
    return list(signal[: count * FRAME_SAMPLES].reshape(count, FRAME_SAMPLES))


def detector_for(policy: Policy, model: SmartTurn, worker: ThreadPoolExecutor) -> TurnDetector:
    if policy.taking is None:
        return TurnDetector(DEFAULT_TURN_END_SILENCE_S)
    return SmartTurnDetector(model.predict, worker, policy.taking)


def replay(
    recording: Recording, policy: Policy, model: SmartTurn, worker: ThreadPoolExecutor
) -> Outcome:
    """`worker`: one thread, so that a no-op submitted after a frame's asks
    finishes after them."""
    detector = detector_for(policy, model, worker)
    said = (
        transcript_times(recording, policy.guessed_question_marks) if policy.with_transcript else []
    )
    outcome = Outcome([], [], [], [])
    for index, frame in enumerate(frames_of(recording)):
        now_s = index * FRAME_SECONDS - LEAD_S
        while said and said[0][0] <= now_s and isinstance(detector, SmartTurnDetector):
            end_s, words = said.pop(0)
            detector.heard(words, end_s + LEAD_S)
        event = detector.push(frame)
        worker.submit(lambda: None).result()
        if event is not TurnEvent.TURN_END:
            continue
        decided_s = (index + 1) * FRAME_SECONDS
        outcome.turn_ends_s.append(round(decided_s - LEAD_S, 3))
        outcome.latencies_s.append(round(decided_s - detector.speech_end_s, 3))
        if isinstance(detector, SmartTurnDetector):
            outcome.ended_by.append(detector.ended_by)
            outcome.probabilities.append(list(detector.probabilities))
        else:
            outcome.ended_by.append("silence")
            outcome.probabilities.append([])
    return outcome


def transcript_times(recording: Recording, guess: bool = False) -> list[tuple[float, str]]:
    """(where the words' audio ends, the words so far), in `audio`'s time;
    `guess`: the words before a pause end in "?" (Policy)."""
    spoken_s = len(recording.audio) / SAMPLE_RATE
    if recording.kind == "whole":
        return [(spoken_s, recording.text)]
    prefix = recording.prefix + ("?" if guess else "")
    return [(recording.pause_start_s, prefix), (spoken_s, recording.text)]


def to_frontend(audio_16k: Samples) -> Samples:
    return resample(audio_16k, MODEL_RATE, SAMPLE_RATE)


# --- the summary ---------------------------------------------------------------


def summarize(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per policy, source and quality: paused questions cut off, and the
    end-of-turn latency of whole ones."""
    rows = []
    keys = {(r["policy"], r["source"], r["quality"]) for r in results}
    keys |= {(policy, "all", "all") for policy, _, _ in keys}
    for policy, source, quality in sorted(keys, key=_order):
        group = [
            r
            for r in results
            if r["policy"] == policy
            and source in (r["source"], "all")
            and quality in (r["quality"], "all")
        ]
        paused = [r for r in group if r["kind"] == "paused"]
        whole = [r for r in group if r["kind"] == "whole"]
        # The turn end after the question (an early one in it would be a cut-off too).
        latencies = sorted(r["latencies_s"][-1] for r in whole if r["latencies_s"])
        by_model = sum(r["ended_by"][-1:] == ["model"] for r in whole)
        cut = sum(r["cut_off"] for r in paused)
        rows.append(
            {
                "policy": policy,
                "source": source,
                "quality": quality,
                "paused": len(paused),
                "cut_off": cut,
                "cut_off_share": round(cut / len(paused), 3) if paused else None,
                "whole": len(whole),
                "no_turn_end": sum(not r["latencies_s"] for r in whole),
                "turn_end_median_s": round(statistics.median(latencies), 3),
                "turn_end_p90_s": round(latencies[int(0.9 * (len(latencies) - 1))], 3),
                "ended_by_model": round(by_model / len(whole), 3),
            }
        )
    return rows


def _order(key: tuple[str, str, str]) -> tuple[int, bool, str, str]:
    names = [policy.name for policy in POLICIES]
    place = names.index(key[0]) if key[0] in names else len(names)
    return (place, key[1] == "all", key[1], key[2])


def print_summary(rows: list[dict[str, Any]]) -> None:
    print(
        "\nthe front-end's turn detectors, frame by frame: paused questions whose turn ended "
        "in the pause (cut off), and the turn end after a finished question"
    )
    print(
        f"{'policy':31}{'source':11}{'quality':>8}{'cut off':>10}{'share':>7}"
        f"{'turn end median':>17}{'p90':>7}{'by model':>10}"
    )
    for row in rows:
        print(
            f"{row['policy']:31}{row['source']:11}{row['quality']:>8}"
            f"{row['cut_off']:>6}/{row['paused']:<3}{row['cut_off_share']:>7.2f}"
            f"{row['turn_end_median_s']:>16.2f}s{row['turn_end_p90_s']:>6.2f}s"
            f"{row['ended_by_model']:>10.2f}"
        )


def run(
    recordings: list[Recording], model: SmartTurn, policies: tuple[Policy, ...] = POLICIES
) -> dict[str, Any]:
    results = []
    worker = ThreadPoolExecutor(1, thread_name_prefix="smart-turn")
    for policy in policies:
        for recording in recordings:
            outcome = replay(recording, policy, model, worker)
            cut_off = recording.kind == "paused" and any(
                end_s <= recording.pause_end_s for end_s in outcome.turn_ends_s
            )
            results.append(
                {
                    "policy": policy.name,
                    "source": recording.source,
                    "voice": recording.voice,
                    "text": recording.text,
                    "kind": recording.kind,
                    "quality": recording.quality,
                    "pause_s": round(recording.pause_end_s - recording.pause_start_s, 3),
                    "cut_off": cut_off,
                    **vars(outcome),
                }
            )
        print(f"  replayed: {policy.name}", flush=True)
    worker.shutdown()
    return {
        "policies": {p.name: vars(p.taking) if p.taking else None for p in policies},
        "summary": summary(results),
        "recordings": results,
    }


def summary(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The table, printed and returned."""
    rows = summarize(results)
    print_summary(rows)
    return rows
