"""`kame bench --turn-taking`: the tts engine's turn-taking, without a stack.

Two measurements, both through the engine's own code on synthetic voices:

- questions (turn_questions, turn_replay): each question of the espeak-ng set
  (kame_cli/bench/make_questions.py, one voice per question) and the same text in the
  piper voice, whole and with a 0.6-0.9 s pause in the middle, at 16 kHz and
  8 kHz G.711, played frame by frame into Smart Turn's detector (the default,
  hearing the words as stt would give them: the exact words, the rules' best
  case) and the fixed 0.4 s pause it replaced: the end-of-turn latency after a
  finished question, and how many paused questions lose their turn in the pause;
- backchannels and interruptions (backchannels): "yeah", "uh-huh"... and
  "wait", "stop"... said over the agent, through the detector and the
  backchannel rule with the stt decoder's real words: how many backchannels
  let the answer go on, how many interruptions barge in, and how soon the agent
  goes silent after the caller's first sound.

The default set (the first 4 questions, so 4 espeak-ng voices, plus piper)
runs in a few minutes; --turn-taking-full takes all 14 questions (13 voices),
what kame_cli/bench/turn_bench.py replays.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any

from kame_cli.bench import turn_replay
from kame_cli.bench.backchannels import (
    BACKCHANNELS,
    ESPEAK_VOICES,
    INTERRUPTIONS,
    measure,
    outcomes,
)
from kame_cli.bench.report import _table, run_header
from kame_cli.bench.turn_questions import load_questions, replay_questions
from kame_common import turn_model
from kame_common.turn_model import SmartTurn
from services.frontend.engines.backchannel import Backchannels

# The engine as it runs: Smart Turn with stt's words (here the exact words,
# turn_replay's "smart_turn + transcript"), against the fixed pause it replaced.
BASELINE, SMART_TURN = turn_replay.POLICIES[0], turn_replay.POLICIES[2]
SOURCES = ("piper", "espeak-ng")


@dataclass(frozen=True)
class TurnTakingSet:
    questions: int | None  # the first N questions of the espeak-ng set; None: all
    voices: tuple[str, ...]  # who says the backchannels and interruptions
    backchannels: tuple[str, ...] = BACKCHANNELS
    interruptions: tuple[str, ...] = INTERRUPTIONS


DEFAULT_SET = TurnTakingSet(4, ("piper", *ESPEAK_VOICES))
FULL_SET = TurnTakingSet(None, ("piper", *ESPEAK_VOICES))


def measure_turn_taking(chosen: TurnTakingSet, model: SmartTurn | None = None) -> dict[str, Any]:
    """Both measurements on `chosen`; the section's table is under "table"."""
    model = model or SmartTurn(turn_model.smart_turn_path())
    questions = load_questions(chosen.questions)
    print(f"kame bench: {len(questions)} questions through the turn detectors ...", flush=True)
    replayed = replay_questions(model, questions, (BASELINE, SMART_TURN))
    print("kame bench: backchannels and interruptions over the agent ...", flush=True)
    rule = Backchannels()
    phrases = {"backchannel": chosen.backchannels, "interruption": chosen.interruptions}
    _, clips = measure(chosen.voices, phrases, rule)
    said_over = outcomes(clips, rule)
    return {
        "set": asdict(chosen),
        "table": section_table(replayed["recordings"], said_over),
        "replay": replayed,
        "said_over_the_agent": {"outcomes": said_over, "clips": clips},
    }


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def _questions(results: list[dict[str, Any]], policy: str) -> dict[str, Any]:
    """One policy's end-of-turn latency per voice family and its paused questions cut off."""
    mine = [r for r in results if r["policy"] == policy]
    paused = [r for r in mine if r["kind"] == "paused"]
    return {
        "turn_end_median_s": {
            source: _median(
                [
                    r["latencies_s"][-1]
                    for r in mine
                    if r["kind"] == "whole" and r["source"] == source and r["latencies_s"]
                ]
            )
            for source in SOURCES
        },
        "paused_cut_off": sum(r["cut_off"] for r in paused),
        "paused": len(paused),
    }


def section_table(results: list[dict[str, Any]], said_over: dict[str, Any]) -> dict[str, Any]:
    """The figures of the "Turn-taking" table (render_section draws it)."""
    caught, survived = said_over["interruption"], said_over["backchannel"]
    return {
        "smart_turn": _questions(results, SMART_TURN.name),
        "baseline": _questions(results, BASELINE.name),
        "backchannels_survived": survived["right"],
        "backchannels": survived["clips"],
        "interruptions_caught": caught["right"],
        "interruptions": caught["clips"],
        "silence_ms_median": caught["silence_ms_median"],
        "silence_ms_max": caught["silence_ms_max"],
    }


def _seconds(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} s"


def render_section(table: dict[str, Any]) -> list[str]:
    """The "Turn-taking" markdown table: Smart Turn (the default) against the fixed 0.4 s pause."""
    smart, fixed = table["smart_turn"], table["baseline"]
    rows = [
        f"end of turn after a finished question, median, {source} | "
        f"{_seconds(smart['turn_end_median_s'][source])} | "
        f"{_seconds(fixed['turn_end_median_s'][source])}"
        for source in SOURCES
    ]
    rows += [
        "paused questions cut off in the pause | "
        f"{smart['paused_cut_off']}/{smart['paused']} | "
        f"{fixed['paused_cut_off']}/{fixed['paused']}",
        "backchannels said over the agent: the answer went on | "
        f"{table['backchannels_survived']}/{table['backchannels']} | -",
        "interruptions said over the agent: barge-in | "
        f"{table['interruptions_caught']}/{table['interruptions']} | -",
        "agent silent after an interruption's first sound (median / max) | "
        f"{table['silence_ms_median']} ms / {table['silence_ms_max']} ms | -",
    ]
    return _table(
        "Turn-taking",
        f"measure | {SMART_TURN.name} | {BASELINE.name} (the old default)",
        rows,
    )


def render_markdown(report: dict[str, Any]) -> str:
    chosen = report["turn_taking"]["set"]
    questions = f"first {chosen['questions']}" if chosen["questions"] else "all"
    lines = [
        *run_header(report, "a shared machine"),
        f"- questions: the {questions} of bench/questions/espeak (one espeak-ng voice "
        "each) and the same texts in piper, whole and with a 0.6-0.9 s pause, 16 kHz and "
        "8 kHz G.711, through the tts engine's turn detectors",
        f"- said over the agent: {len(chosen['backchannels'])} backchannels and "
        f"{len(chosen['interruptions'])} interruptions in {', '.join(chosen['voices'])}, "
        "16 kHz and 8 kHz, with the stt decoder's words",
        *render_section(report["turn_taking"]["table"]),
    ]
    return "\n".join(lines) + "\n"
