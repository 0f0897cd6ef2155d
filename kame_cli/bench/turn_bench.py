"""Smart Turn v3.2 on the bench's questions: does it tell a finished question from one cut short?

For each question of the espeak-ng set (bench/questions/espeak, made by
kame_cli/bench/make_questions.py: 14 questions in 13 voices) and for the same texts in
the piper voice, the model hears (at 16 kHz, and at phone quality: 8 kHz
G.711 mu-law and back):

- whole: the question;
- cut:   its own audio cut at the word boundary after 60-80 % of its words
         (Whisper tiny.en's word timestamps, moved to the quietest 10 ms near
         them), as if the caller stopped there;
- pause: (espeak-ng only) the question spoken with a 0.6-0.9 s break after
         those words (SSML <break>): the part before the pause, which is what
         the turn detector has when the pause begins; and the whole question
         with the pause in it (pause+rest).

Each clip is asked after 0.16 to 0.96 s of silence after its speech (80 ms
steps: the front-end's frames), as the turn detector would ask while the
silence grows. Two tables:

- accuracy after --silence-s (0.24 s): whole and pause+rest should score
  "complete" (p >= t), cut and pause "incomplete", at thresholds 0.3..0.7;
- the policy "end the turn at the first silence where p >= t, else after the
  fixed --fallback-s (1.0 s)": how soon a finished question's turn ends, and
  how many of the cut and pause clips (the caller stops for 0.6-0.9 s there
  and goes on) are cut off, against today's fixed 0.4 s silence.

Both also with a second signal the turn detector has, the text rule: the
words so far end in a word no question ends with (an article, a preposition,
an auxiliary...), on the exact words (what a right transcript says); "with"
ends the turn only when the model says complete and the words do not dangle.

Then (kame_cli/bench/turn_replay.py) the same questions, whole and with a 0.6-0.9 s
pause in the middle, go frame by frame through the front-end's own turn
detectors (the fixed 0.4 s pause; Smart Turn with the default settings and
some variants): how many paused questions are cut off in their pause, and
how soon the turn ends after a finished question.

    .venv/bin/python -m kame_cli.bench.turn_bench
        [--silence-s 0.24] [--fallback-s 1.0] [--part replay]

Writes bench/results/turn_bench.json (or --out): every clip's probabilities
and latencies, every replay's turn ends, the tables, the machine and its load.
Needs the model (python -m kame_cli.smart_turn_model), espeak-ng, and the
stack's venv (piper, faster-whisper for the word timestamps).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from kame_cli.bench import turn_replay
from kame_cli.bench.paths import RESULTS_DIR
from kame_cli.bench.report import write_json
from kame_cli.bench.turn_questions import (
    Question,
    WordClock,
    cut_words,
    espeak_ssml,
    load_questions,
    longest_gap,
    pause_s,
    phone_quality,
    quietest_near,
    replay_questions,
    speech_of,
    speech_span,
    with_break,
)
from kame_common import turn_model
from kame_common.audio import Samples
from kame_common.turn_model import MODEL_RATE, SmartTurn

OUT = RESULTS_DIR / "turn_bench.json"
QUICK_POLICIES = 5  # turn_replay.POLICIES: silence, smart_turn, + transcript, guessed ?, no words
THRESHOLDS = (0.3, 0.4, 0.5, 0.6, 0.7)
# The silences (after the speech) at which the model is asked: the front-end's
# 80 ms frames from two frames on.
SILENCES_S = tuple(round(0.08 * frames, 2) for frames in range(2, 13))
DEFAULT_SILENCE_S = 0.4  # services/frontend/engines/base.py DEFAULT_TURN_END_SILENCE_S
COMPLETE_VARIANTS = ("whole", "pause+rest")
LEAD_S = 0.3
# Words no English question ends with: when the words so far end in one, the
# caller has more to say. (Function words only; "first", "now"... can end one.)
DANGLING = frozenset(
    "a an the of in on at to for from with by about into than as and or but if "
    "is are was were be do does did can could will would should has have had "
    "what which who whose where when how why my your his her their our its this that".split()
)


@dataclass
class Case:
    source: str
    voice: str
    text: str
    variant: str  # whole, cut, pause, pause+rest
    quality: str  # 16k or phone
    words_heard: str  # the words the clip holds
    pause_s: float  # how long the caller pauses after a cut or pause clip
    probabilities: list[float]  # p(complete) after each of SILENCES_S
    latencies_ms: list[float]
    text_rule_complete: bool

    @property
    def complete(self) -> bool:
        return self.variant in COMPLETE_VARIANTS

    def p_at(self, silence_s: float) -> float:
        return self.probabilities[SILENCES_S.index(silence_s)]


def words(text: str) -> list[str]:
    return re.findall(r"[A-Za-z0-9']+", text)


def text_rule_complete(heard: str) -> bool:
    said = words(heard.lower())
    return bool(said) and said[-1] not in DANGLING


# --- audio ---------------------------------------------------------------------


def as_heard(speech: Samples, tail_s: float) -> Samples:
    """The speech trimmed to its span, LEAD_S of silence before, `tail_s` after."""
    start, end = speech_span(speech)
    lead, tail = np.zeros(int(LEAD_S * MODEL_RATE)), np.zeros(int(tail_s * MODEL_RATE))
    return np.concatenate([lead, speech[start:end], tail]).astype(np.float32)


# --- voices --------------------------------------------------------------------


def clips(
    index: int, question: Question, speech: Samples, clock: WordClock
) -> list[tuple[str, str, float, Samples]]:
    """(variant, the words it holds, pause, audio) of one question."""
    spoken = question.text.split()
    keep = cut_words(index, len(spoken))
    prefix = " ".join(spoken[:keep])
    cut_at = quietest_near(speech, clock.boundary_s(speech, keep))
    pause = pause_s(index)  # how long the caller stops after the cut, too
    made = [("whole", question.text, 0.0, speech), ("cut", prefix, pause, speech[:cut_at])]
    if question.source == "espeak-ng":
        paused = espeak_ssml(question, with_break(question.text, keep, pause))
        gap_start, _ = longest_gap(paused)
        made += [
            ("pause", prefix, pause, paused[:gap_start]),
            ("pause+rest", question.text, pause, paused),
        ]
    return made


def measure(model: SmartTurn) -> list[Case]:
    from kame_common.voice import load_voice

    piper_voice = load_voice(varied=False)
    clock = WordClock()
    questions = load_questions()
    count = len(questions) // 2
    cases = []
    for number, question in enumerate(questions):
        speech = speech_of(question, piper_voice)
        for variant, heard, pause, audio in clips(number % count, question, speech, clock):
            for quality in ("16k", "phone"):
                probabilities, latencies = [], []
                for silence in SILENCES_S:
                    clip = as_heard(audio, silence)
                    probabilities.append(
                        round(model.predict(clip if quality == "16k" else phone_quality(clip)), 4)
                    )
                    latencies.append(round(model.last_latency_s * 1000, 2))
                cases.append(
                    Case(
                        question.source,
                        question.voice,
                        question.text,
                        variant,
                        quality,
                        heard,
                        pause,
                        probabilities,
                        latencies,
                        text_rule_complete(heard),
                    )
                )
        print(f"  {question.source:9} {question.voice:20} {question.text}", flush=True)
    return cases


# --- the summary ---------------------------------------------------------------


def groups_of(cases: list[Case]) -> dict[str, list[Case]]:
    found: dict[str, list[Case]] = {}
    for case in cases:
        found.setdefault(f"{case.source} {case.variant} {case.quality}", []).append(case)
    return found


def accuracy(cases: list[Case], silence_s: float) -> dict[str, dict[str, float]]:
    """Per group and threshold: the share the model gets right after `silence_s`."""
    table: dict[str, dict[str, float]] = {}
    for name, group in groups_of(cases).items():
        row = {
            f"{t:.1f}": sum((c.p_at(silence_s) >= t) == c.complete for c in group) / len(group)
            for t in THRESHOLDS
        }
        row["median p"] = statistics.median(c.p_at(silence_s) for c in group)
        row["text rule"] = sum(c.text_rule_complete == c.complete for c in group) / len(group)
        table[name] = {key: round(value, 3) for key, value in row.items()}
    return table


def turn_end_s(case: Case, ask_at: tuple[float, ...], threshold: float, rule: Rule) -> float:
    """When the policy ends the turn: at the first silence of `ask_at` at which
    the model says complete (and, with the text rule, the words do not dangle),
    else after the fallback silence."""
    if rule.use_text and not case.text_rule_complete:
        return rule.fallback_s
    for silence in ask_at:
        if silence < rule.fallback_s and case.p_at(silence) >= threshold:
            return silence
    return rule.fallback_s


@dataclass(frozen=True)
class Rule:
    fallback_s: float
    use_text: bool


def policy(cases: list[Case], ask_once_s: float, fallback_s: float) -> list[dict[str, object]]:
    """Per source, way of asking and threshold, with the model alone and with the
    text rule: how long a finished question waits for its turn to end, and how
    often a question with a pause (cut, pause) is cut off in it. The model is
    asked once, after `ask_once_s` of silence (then the fallback decides), or
    on every frame of the silence."""
    asking = {f"once at {ask_once_s:g} s": (ask_once_s,), "every 80 ms": SILENCES_S}
    rows: list[dict[str, object]] = []
    for source in sorted({c.source for c in cases}):
        finished = [c for c in cases if c.source == source and c.complete]
        paused = [c for c in cases if c.source == source and not c.complete]
        for asked, ask_at in asking.items():
            for threshold in THRESHOLDS:
                for use_text in (False, True):
                    rule = Rule(fallback_s, use_text)
                    waits = sorted(turn_end_s(c, ask_at, threshold, rule) for c in finished)
                    cut_off = [turn_end_s(c, ask_at, threshold, rule) < c.pause_s for c in paused]
                    rows.append(
                        {
                            "source": source,
                            "asked": asked,
                            "threshold": threshold,
                            "with_text_rule": use_text,
                            "turn_end_median_s": round(statistics.median(waits), 2),
                            "turn_end_p90_s": round(waits[int(0.9 * (len(waits) - 1))], 2),
                            "ended_before_fallback": round(
                                sum(w < fallback_s for w in waits) / len(waits), 3
                            ),
                            "pauses_cut_off": round(sum(cut_off) / len(cut_off), 3),
                            "questions": len(finished),
                            "pauses": len(paused),
                        }
                    )
    return rows


def latency(cases: list[Case]) -> dict[str, float]:
    calls = sorted(ms for c in cases for ms in c.latencies_ms)
    return {
        "median": round(statistics.median(calls), 1),
        "p90": round(calls[int(0.9 * (len(calls) - 1))], 1),
        "calls": len(calls),
    }


def print_accuracy(table: dict[str, dict[str, float]], silence_s: float) -> None:
    print(
        f"\nshare right after {silence_s:g} s of silence "
        "(whole, pause+rest: p >= t; cut, pause: p < t)"
    )
    columns = list(next(iter(table.values())))
    print(f"{'':28}" + "".join(f"{name:>10}" for name in columns))
    for name, row in table.items():
        print(f"{name:28}" + "".join(f"{row[column]:>10.2f}" for column in columns))


def print_policy(rows: list[dict[str, object]], fallback_s: float) -> None:
    print(
        "\npolicy: end the turn when the model, asked once or on every 80 ms frame of the "
        f"silence, says p >= t, else after {fallback_s:g} s of silence; 16k and phone together"
    )
    print(
        f"{'source':10}{'asked':>15}{'t':>5}{'text rule':>11}{'turn end median':>17}{'p90':>7}"
        f"{'ended by model':>16}{'pauses cut off':>16}"
    )
    for row in rows:
        print(
            f"{row['source']!s:10}{row['asked']!s:>15}{row['threshold']!s:>5}"
            f"{'with' if row['with_text_rule'] else '-':>11}"
            f"{row['turn_end_median_s']!s:>16}s{row['turn_end_p90_s']!s:>6}s"
            f"{row['ended_before_fallback']!s:>16}{row['pauses_cut_off']!s:>16}"
        )
    print(
        f"fixed silence ({DEFAULT_SILENCE_S:g} s, today's default): turn end "
        f"{DEFAULT_SILENCE_S:g} s, every pause of 0.6-0.9 s cut off"
    )


def clip_tables(args: argparse.Namespace, model: SmartTurn | None) -> dict[str, object]:
    if model is None:
        saved = json.loads(args.tables_from.read_text())["cases"]
        cases = [Case(**case) for case in saved]
    else:
        cases = measure(model)
    table = accuracy(cases, args.silence_s)
    rows = policy(cases, args.silence_s, args.fallback_s)
    print_accuracy(table, args.silence_s)
    print_policy(rows, args.fallback_s)
    calls = latency(cases)
    print(
        f"\nlatency per call (features and model, one thread): median {calls['median']} ms, "
        f"p90 {calls['p90']} ms ({calls['calls']} calls)"
    )
    return {
        "silences_s": list(SILENCES_S),
        "accuracy_silence_s": args.silence_s,
        "accuracy": table,
        "fallback_s": args.fallback_s,
        "policy": rows,
        "latency_ms": calls,
        "cases": [asdict(case) for case in cases],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--silence-s", type=float, default=0.24, help="when the model is asked (accuracy, once)"
    )
    parser.add_argument("--fallback-s", type=float, default=1.0, help="the policy's fixed silence")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument(
        "--tables-from",
        type=Path,
        help="only redo the tables from the clips and replays of an earlier run",
    )
    parser.add_argument(
        "--part",
        choices=("both", "clips", "replay"),
        default="both",
        help="clips: the model on clips (the first tables); replay: the front-end's detectors "
        "(kept beside the clips of an earlier run in --out)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"replay only the first {QUICK_POLICIES} policies (the fixed pause, Smart Turn, "
        "and the transcript and words rules with it)",
    )
    args = parser.parse_args()
    load_before = os.getloadavg()
    model = None if args.tables_from else SmartTurn(turn_model.smart_turn_path())
    report: dict[str, object] = {}
    if args.part == "replay" and args.out.is_file():
        report = json.loads(args.out.read_text())
    report |= {
        "model": turn_model.MODEL_FILE,
        "model_sha256": turn_model.MODEL_SHA256,
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
    }
    if args.part != "replay":
        report |= clip_tables(args, model)
    if args.part != "clips" and model is not None:
        policies = turn_replay.POLICIES[:QUICK_POLICIES] if args.quick else turn_replay.POLICIES
        report["replay"] = replay_questions(model, load_questions(), policies)
    elif args.tables_from and "replay" in (saved := json.loads(args.tables_from.read_text())):
        report["replay"] = saved["replay"] | {
            "summary": turn_replay.summary(saved["replay"]["recordings"])
        }
    report["load_average"] = {"before": load_before, "after": os.getloadavg()}
    if args.tables_from:  # the machine's load while it measured, not while it redid tables
        report["load_average"] = json.loads(args.tables_from.read_text())["load_average"]
    write_json(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
