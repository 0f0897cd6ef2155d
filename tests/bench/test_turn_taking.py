"""`kame bench --turn-taking` on a tiny set: one question (espeak-ng and piper,
whole and paused, 16 kHz and 8 kHz) through the tts engine's real turn
detectors and Smart Turn, and one backchannel and one interruption over the
agent with the stt decoder's real words; the section's table holds every row
with values a working engine gives."""

from __future__ import annotations

from kame_cli.bench.config import parse_config
from kame_cli.bench.turn_taking import (
    DEFAULT_SET,
    TurnTakingSet,
    measure_turn_taking,
    render_markdown,
)

TINY = TurnTakingSet(1, ("piper",), ("Yeah.",), ("Stop.",))


def test_the_flags_choose_the_section():
    assert parse_config(["--turn-taking"]).turn_taking
    assert parse_config(["--turn-taking-full"]).turn_taking_full
    assert not parse_config([]).turn_taking
    assert DEFAULT_SET.questions == 4 and DEFAULT_SET.voices[0] == "piper"


def test_the_section_measures_a_tiny_set():
    section = measure_turn_taking(TINY)
    table = section["table"]
    smart, fixed = table["smart_turn"], table["baseline"]
    # One question, espeak-ng and piper, at two qualities: four paused recordings.
    assert smart["paused"] == fixed["paused"] == 4
    # Every pause (0.6 s or more) outlasts the old fixed 0.4 s silence.
    assert fixed["paused_cut_off"] == 4
    assert fixed["turn_end_median_s"] == {"piper": 0.4, "espeak-ng": 0.4}
    for source in ("piper", "espeak-ng"):
        # Smart Turn ends the turn at its first ask at the earliest, at the fallback at the latest.
        assert 0.16 <= smart["turn_end_median_s"][source] <= 1.2
    assert smart["paused_cut_off"] < fixed["paused_cut_off"]
    assert (table["backchannels"], table["interruptions"]) == (2, 2)  # 16 kHz and 8 kHz
    assert table["interruptions_caught"] == 2
    assert 0 <= table["backchannels_survived"] <= 2
    assert 0 <= table["silence_ms_median"] <= table["silence_ms_max"] <= 200

    report = {
        "name": "tiny",
        "command": "kame bench --turn-taking",
        "started_at": "2026-12-03T00:00:00+00:00",
        "duration_s": 1.0,
        "machine": {
            "cpu": "test",
            "cores": 2,
            "load_average": [0.0, 0.0, 0.0],
            "load_average_end": [0.0, 0.0, 0.0],
        },
        "turn_taking": section,
    }
    markdown = render_markdown(report)
    assert "## Turn-taking" in markdown
    for row in (
        "| end of turn after a finished question, median, piper | ",
        "| end of turn after a finished question, median, espeak-ng | ",
        f"| paused questions cut off in the pause | {smart['paused_cut_off']}/4 | 4/4 |",
        f"| backchannels said over the agent: the answer went on | "
        f"{table['backchannels_survived']}/2 | - |",
        "| interruptions said over the agent: barge-in | 2/2 | - |",
        "| agent silent after an interruption's first sound (median / max) | ",
    ):
        assert row in markdown
