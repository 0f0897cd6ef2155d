"""From calls to the report: per-call records built from hand-made `kame talk`
results, the per-run summary, the cold call against the warm median, the
markdown tables and the figure."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kame_cli import talk
from kame_cli.bench import conversation, report, summary
from kame_cli.bench.plots import plot
from kame_cli.bench.questions import Question
from kame_cli.bench.runner import Captured
from kame_cli.bench.runs import Run
from kame_client.events import AgentText, OracleAppend, OracleReset, UserFinal, UserPartial
from kame_client.result import AgentAudioStart, Timed
from kame_common.audio import FRAME_SAMPLES, FRAME_SECONDS, SAMPLE_RATE

TANDEM, CASCADE = Run("tandem", "tandem", "tts"), Run("cascade", "cascade", "tts")
QUESTION = Question("What is the capital of Italy?", ("rome",), np.zeros(SAMPLE_RATE, np.float32))
SPEECH_START_S, SPEECH_END_S = 0.5, 2.0
FRAMES = 60
DELAY_S = 0.02  # every agent frame reaches the client this long after it was due


def heard_at(start_s: float) -> float:
    """When stream second `start_s` reaches the client in these calls."""
    return start_s + FRAME_SECONDS + DELAY_S


def talk_result(
    audio_start_s: float, words: list[tuple[float, str, int]], generations: dict[int, str]
) -> talk.TalkResult:
    """A call as `kame talk` records it: agent audio from stream second
    `audio_start_s`, the agent's words (stream second, text, generation), and
    each generation's oracle text (a RESET with the first word, one APPEND)."""
    result = talk.TalkResult(
        caller=np.zeros(SAMPLE_RATE * 3, np.float32),
        speech_start_s=SPEECH_START_S,
        speech_end_s=SPEECH_END_S,
    )
    result.agent = np.zeros(FRAMES * FRAME_SAMPLES, np.float32)
    result.agent_t = [
        heard_at(k * FRAME_SECONDS) + np.arange(FRAME_SAMPLES) / SAMPLE_RATE for k in range(FRAMES)
    ]
    seq = int(audio_start_s / FRAME_SECONDS)
    events: list[Timed[Any]] = [
        Timed(1.0, UserPartial("u1", "what is the", "", 0.5, 0.3)),
        Timed(2.6, UserFinal("u1", QUESTION.text, "", 1.0, 0.4)),
    ]
    for generation, text in generations.items():
        first, rest = text.split(" ", 1)
        events.append(Timed(1.4, OracleReset(generation, first, "", True)))
        events.append(Timed(1.5, OracleAppend(generation, rest)))
    events.append(Timed(heard_at(audio_start_s), AgentAudioStart(seq)))
    for start_s, text, generation in words:
        result.agent_words.append(text)
        events.append(
            Timed(heard_at(start_s), AgentText(text, start_s, start_s, generation, False))
        )
    result.events = sorted(events, key=lambda timed: timed.t)
    result.finals = [QUESTION.text]
    return result


def captured(run: Run, result: talk.TalkResult, correct: bool = True) -> Captured:
    record = conversation.conversation_record(0, QUESTION, run, result, late_s=FRAME_SECONDS)
    record.update(repeat=0, correct=correct, agent_transcript=result.agent_text)
    lags = conversation.frame_lags(result)
    return Captured(record, QUESTION.keywords, result.agent, lags, result=result)


ROME = {7: "Rome is the capital of Italy."}


def tandem_calls() -> list[Captured]:
    held = talk_result(2.2, [(2.2, "Hmm,", 0), (2.8, "Rome is", 7), (3.1, "the capital", 7)], ROME)
    direct = talk_result(2.4, [(2.4, "Rome is the", 7)], ROME)
    spliced = talk_result(
        2.3,
        [(2.3, "Paris", 6), (2.9, "Rome", 7)],
        {6: "Paris is lovely.", **ROME},
    )
    return [captured(TANDEM, r) for r in (held, direct, spliced)]


def test_records_hold_first_audio_answer_latency_and_coherence():
    held, _direct, spliced = tandem_calls()
    record = held.record
    # First audio is the hold phrase; the answer starts with "Rome".
    assert record["response_latency_s"] == pytest.approx(heard_at(2.2) - SPEECH_END_S, abs=1e-3)
    assert record["answer_latency_s"] == pytest.approx(heard_at(2.8) - SPEECH_END_S, abs=1e-3)
    assert record["timeline"]["answer_t"] == pytest.approx(heard_at(2.8), abs=1e-3)
    assert record["coherent"] is True and record["answer_hold_words"] == 1
    assert record["text_correct"]
    assert spliced.record["coherent"] is False and spliced.record["answer_generations"] == 2
    assert spliced.record["coherence_note"]


def test_s2s_answers_are_not_scored_for_coherence():
    s2s = Run("s2s", "s2s", "moshi")
    record = captured(s2s, talk_result(2.2, [(2.2, "Rome", 0)], {})).record
    assert record["coherent"] is None and record["answer_latency_s"] is None
    assert summary.coherence_counts([record])["coherent_fraction"] is None


def test_summary_and_cold_call_ratio():
    calls = tandem_calls()
    cascade = [captured(CASCADE, talk_result(3.0, [(3.0, "Rome is", 7)], ROME), correct=False)]
    runs = summary.summarize([*calls, *cascade], [TANDEM, CASCADE], late_s=FRAME_SECONDS)
    tandem = runs["tandem"]
    answers = sorted(c.record["answer_latency_s"] for c in calls)
    assert tandem["answer_latency_s"]["median"] == pytest.approx(answers[1])
    assert tandem["answer_latency_s"]["n"] == 3
    assert (tandem["coherent"], tandem["coherence_scored"]) == (2, 3)
    assert tandem["coherent_fraction"] == pytest.approx(2 / 3, abs=1e-4)
    assert (tandem["held"], tandem["repaired"]) == (1, 0)
    assert runs["cascade"]["correct"] == 0 and runs["cascade"]["text_correct"] == 1

    cold = captured(TANDEM, talk_result(2.8, [(2.8, "Rome", 7)], ROME))
    cold.record["cold"] = True
    (row,) = summary.cold_calls([cold], [*calls, *cascade])
    first_audio = sorted(c.record["response_latency_s"] for c in calls)[1]
    assert row["warm_calls"] == 3
    assert row["warm_median_response_latency_s"] == pytest.approx(first_audio)
    assert row["response_latency_vs_warm"] == pytest.approx(
        cold.record["response_latency_s"] / first_audio, abs=1e-3
    )
    assert row["answer_latency_vs_warm"] == pytest.approx(
        cold.record["answer_latency_s"] / answers[1], abs=1e-3
    )


def report_data(calls: list[Captured], cold: Captured, load: list[dict[str, Any]]) -> dict:
    runs = summary.summarize(calls, [TANDEM], late_s=FRAME_SECONDS)
    return {
        "name": "t",
        "command": "kame bench --questions q.json",
        "started_at": "2026-01-01T00:00:00+00:00",
        "duration_s": 12.0,
        "machine": {
            "cpu": "test cpu",
            "cores": 2,
            "memory_gib": 4,
            "gpu": "none",
            "os": "linux",
            "python": "3.11",
            "load_average": [0.5],
        },
        "models": {"llm": "gemma"},
        "settings": {"repeats": 1, "late_ms": 80},
        "questions": [{"text": QUESTION.text, "source": "/q/q01.wav"}],
        "summary": runs,
        "cold_calls": summary.cold_calls([cold], calls),
        "conversations": [c.record for c in calls],
        "load": load,
        "failures": [],
    }


def load_level(
    sessions: int, ok: int, refused: int, median: float, hints: list[float]
) -> dict[str, Any]:
    """A load level as the runner records it (frame figures made up, not looked at)."""
    return {
        "sessions": sessions,
        "run": "tandem",
        "ok": ok,
        "refused": refused,
        "frames": 100 * ok,
        "late_frames": 0,
        "late_fraction": 0.0,
        **{
            f"{kind}_{q}_s": 0.01
            for kind in ("frame_lag", "step", "transport")
            for q in ("p50", "p99")
        },
        "response_latency_median_s": median / 2,
        "response_latency_p90_s": median,
        "answer_latency_median_s": median,
        "answer_latency_p90_s": median * 1.2,
        "correct": ok,
        "text_correct": ok,
        "coherent": ok,
        "retry_after_s": hints,
    }


def test_load_levels_show_the_ratio_to_one_call_and_when_refused_calls_retry(tmp_path):
    calls = tandem_calls()
    cold = captured(TANDEM, talk_result(2.8, [(2.8, "Rome", 7)], ROME))
    alone = [  # one slow call alone; the load run's at 8 do not count as alone
        {"run": "tandem", "answer_latency_s": 0.8, "load": 1},
        *({"run": "tandem", "answer_latency_s": s} for s in (0.7, 0.8, 0.9, 2.5)),
        {"run": "cascade", "answer_latency_s": 9.0},
        {"run": "tandem", "answer_latency_s": 9.0, "load": 8},
    ]
    levels = summary.with_answer_ratios(
        [load_level(1, 1, 0, 0.8, []), load_level(8, 6, 2, 1.0, [4.0, 12.5])], alone
    )
    assert [level["answer_ratio"] for level in levels] == [1.0, 1.25]
    data = report_data(calls, cold, levels)
    rows = [line for line in report.render_markdown(data).splitlines() if line.startswith("| 8 |")]
    assert len(rows) == 1 and "| 6 (2 refused) |" in rows[0]
    assert "| 1.25 | 4-12.5 |" in rows[0]
    plot(data, tmp_path / "t.png")
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_a_call_made_alone_there_is_no_ratio():
    (level,) = summary.with_answer_ratios([load_level(8, 8, 0, 1.0, [])], [])
    assert level["answer_ratio"] is None


def test_markdown_and_figure_show_both_latencies_coherence_and_the_cold_call(tmp_path):
    calls = tandem_calls()
    cold = captured(TANDEM, talk_result(2.8, [(2.8, "Rome", 7)], ROME))
    cold.record["cold"] = True
    data = report_data(calls, cold, [])
    markdown = report.render_markdown(data)
    assert "| tandem | tts | 3/3 |" in markdown
    assert "2/3 (67%) | 1 / 0 |" in markdown  # coherent, then held / repaired
    assert "1 from WAVs" in markdown
    cold_row = next(line for line in markdown.splitlines() if line.startswith("| tts | tandem |"))
    assert QUESTION.text in cold_row and "x)" in cold_row
    assert "incoherent" in markdown  # the spliced call, per question
    plot(data, tmp_path / "t.png")
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
