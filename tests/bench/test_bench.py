"""`kame bench`: the measuring pieces on known inputs, and one short real run
(one question, the tandem run, a load level of two sessions) through the whole
local stack."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from kame_cli import say, talk
from kame_cli.bench import conversation, metrics, questions, runs
from kame_cli.bench.config import BenchConfig, parse_config
from kame_cli.stack_options import Ports, options_from_args
from kame_common.audio import FRAME_SECONDS, SAMPLE_RATE
from kame_common.metrics import FRAME_BUCKETS
from tests.support import word_recall


def exposition(values: list[float], mode: str = "tandem") -> str:
    registry = CollectorRegistry()
    histogram = Histogram(
        "kame_gateway_frame_round_trip_seconds",
        "test",
        ["mode"],
        buckets=FRAME_BUCKETS,
        registry=registry,
    )
    for value in values:
        histogram.labels(mode).observe(value)
    histogram.labels("cascade").observe(0.9)  # another series the filter must leave out
    return generate_latest(registry).decode()


def test_histogram_quantiles_follow_prometheus_interpolation():
    # 100 frames: 50 in (0.001, 0.0025], 49 in (0.0025, 0.005], one in (0.08, 0.1].
    values = [0.002] * 50 + [0.004] * 49 + [0.09]
    parsed = metrics.parse_histogram(
        exposition(values), metrics.ROUND_TRIP_METRIC, {"mode": "tandem"}
    )
    assert parsed.count == 100
    assert parsed.total == pytest.approx(sum(values))
    assert parsed.quantile(0.5) == pytest.approx(0.0025)  # the 50th frame closes a bucket
    assert parsed.quantile(0.75) == pytest.approx(0.0025 + 0.0025 * 25 / 49)
    assert parsed.quantile(0.995) == pytest.approx(0.08 + 0.02 * 0.5)
    assert metrics.Histogram().quantile(0.5) is None


def test_histogram_difference_keeps_only_what_happened_between_scrapes():
    before = metrics.parse_histogram(
        exposition([0.002] * 10), metrics.ROUND_TRIP_METRIC, {"mode": "tandem"}
    )
    after = metrics.parse_histogram(
        exposition([0.002] * 10 + [0.3] * 5), metrics.ROUND_TRIP_METRIC, {"mode": "tandem"}
    )
    delta = after - before
    assert delta.count == 5
    assert delta.quantile(0.5) == pytest.approx(0.25 + 0.25 * 2.5 / 5)
    times = (metrics.FrameTimes(delta, delta + delta, delta) - metrics.FrameTimes()).summary()
    assert times["round_trip_p50_s"] == pytest.approx(times["step_p50_s"])  # 10 frames, same p50
    assert times["transport_p99_s"] == pytest.approx(delta.quantile(0.99), abs=1e-5)


def test_keywords_are_whole_words_with_alternatives():
    assert questions.heard("A spider has 8 legs.", ("eight|8",))
    assert questions.heard("Paris, of course! It's the capital.", ("paris", "capital"))
    assert not questions.heard("Harris is the capital of France.", ("paris",))
    assert not questions.heard("Parisian food", ("paris",))
    assert questions.heard("Twenty-four hours.", ("24|twenty four",))
    assert not questions.heard("Twenty hours, four days.", ("24|twenty four",))


def test_runs_follow_the_checkpoint():
    assert [r.label for r in runs.plan_runs("")] == ["tandem", "cascade"]
    with_checkpoint = runs.plan_runs("/ckpt")
    assert [(r.label, r.engine) for r in with_checkpoint] == [
        ("tandem", "tts"),
        ("cascade", "tts"),
        ("tandem-kame", "kame"),
        ("s2s", "moshi"),
    ]
    with pytest.raises(ValueError, match=r"s2s.*need --checkpoint"):
        runs.select_runs(runs.plan_runs(""), "tandem,s2s")


def test_the_flags_parse_once_into_the_config_and_its_stack_options():
    assert parse_config([]) == BenchConfig()
    config = parse_config(
        ["--load", "", "--no-capacity-admission", "--late-ms", "120", "--out-dir", "o"]
    )
    assert config.load == () and not config.capacity_admission and config.late_s == 0.12
    assert config.scratch == Path("o/tmp/bench")
    assert parse_config(["--load", "2,16"]).load == (2, 16)
    with pytest.raises(SystemExit):
        parse_config(["--load", "0,4"])
    with_checkpoint = parse_config(["--checkpoint", "/ckpt", "--llm-model", "m"])
    options = options_from_args(with_checkpoint, Ports(), "kame", None)
    assert options.checkpoint == "/ckpt" and options.llm_model == "m"
    assert options_from_args(with_checkpoint, options.ports, "tts", None).checkpoint == ""


def test_question_file_takes_wavs_and_texts(tmp_path):
    tone = 0.3 * np.sin(np.arange(16_000) * 2 * np.pi * 440 / 16_000).astype(np.float32)
    say.write_wav(tmp_path / "waves" / "q1.wav", tone, 16_000)
    (tmp_path / "q.json").write_text(
        json.dumps(
            [
                {"wav": "waves/q1.wav", "keywords": ["beep"]},
                {"text": "What is the capital of Japan?", "keywords": ["tokyo"]},
            ]
        )
    )
    first, second = questions.load_questions(tmp_path / "q.json")
    assert len(first.audio) == SAMPLE_RATE and first.keywords == ("beep",)  # resampled to 24 kHz
    assert second.source == "piper" and len(second.audio) > SAMPLE_RATE
    (tmp_path / "bad.json").write_text(json.dumps([{"text": "hello"}]))
    with pytest.raises(ValueError, match="keywords"):
        questions.load_questions(tmp_path / "bad.json")


def test_frame_lag_counts_from_when_the_caller_frame_was_due():
    result = talk.TalkResult(caller=np.zeros(0, np.float32), speech_start_s=None, speech_end_s=None)
    arrivals = [0.085, 0.17, 0.40]  # frames 0, 1, 2 were due at 0.08, 0.16, 0.24
    result.agent_t = [t + np.arange(1920) / SAMPLE_RATE for t in arrivals]
    lags = conversation.frame_lags(result)
    assert lags == pytest.approx([0.005, 0.01, 0.16])
    stats = conversation.frame_lag_stats(lags, late_s=FRAME_SECONDS)
    assert stats["frames"] == 3 and stats["late_frames"] == 1


ESPEAK_QUESTIONS = Path(__file__).resolve().parents[2] / "bench/questions/espeak/questions.json"
QUESTION_TEXT = "What is the capital of Germany?"


def test_one_question_one_run_through_the_stack(tmp_path):
    """One espeak-ng question from the committed set, through the tandem run: the
    stack's cold call, one measured call and a load level of two sessions."""
    entry = next(e for e in json.loads(ESPEAK_QUESTIONS.read_text()) if e["text"] == QUESTION_TEXT)
    entry["wav"] = str(ESPEAK_QUESTIONS.parent / entry["wav"])
    (tmp_path / "q.json").write_text(json.dumps([entry]))
    command = [
        sys.executable,
        "-m",
        "kame_cli",
        "bench",
        "--questions",
        str(tmp_path / "q.json"),
        "--runs",
        "tandem",
        "--load",
        "2",
        "--warmup",
        "0",
        "--out-dir",
        str(tmp_path / "out"),
        "--name",
        "t",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    report = json.loads((tmp_path / "out" / "t.json").read_text())
    calls = json.loads((tmp_path / "out" / "t_calls.json").read_text())
    assert not {"conversations", "load_conversations"} & set(report), "calls in the summary"
    report |= calls
    assert report["command"].startswith("python -m kame_cli bench --questions")
    assert report["machine"]["cores"] >= 1 and report["machine"]["cpu"]
    keywords = tuple(entry["keywords"])
    (conversation,) = report["conversations"]
    assert conversation["status"] == "OK" and conversation["engine"] == "tts"
    # Whisper tiny.en on a robotic voice, on a busy machine: most words, not all.
    assert word_recall(QUESTION_TEXT, conversation["user_transcript"]) >= 0.5
    assert conversation["response_latency_s"] is not None
    assert conversation["oracle_first_update_s"] is not None
    assert conversation["stt_final_lag_s"] > 0
    assert conversation["frames"] > 20 and conversation["step_p50_s"] is not None
    assert conversation["agent_transcript"], "the agent's audio should hold speech"
    assert conversation["correct"] == questions.heard(conversation["agent_transcript"], keywords)
    assert conversation["text_correct"] == questions.heard(conversation["agent_text"], keywords)
    answer_words = [
        e for e in conversation["events"] if e["type"] == "agent_text" and e["generation"] != 0
    ]
    if answer_words:  # the answer's first word cannot come before the first audio
        assert conversation["answer_latency_s"] >= conversation["response_latency_s"] - 0.01
        assert all(e["heard_t"] is not None for e in answer_words[:1])
    else:
        assert conversation["answer_latency_s"] is None
    assert isinstance(conversation["coherent"], bool)
    assert conversation["coherent"] == (conversation["coherence_note"] == "")
    row = report["summary"]["tandem"]
    assert (
        row["ok"] == 1 and row["response_latency_s"]["median"] == conversation["response_latency_s"]
    )
    assert row["coherent"] == int(conversation["coherent"])

    (cold,) = report["cold_calls"]
    (cold_call,) = report["cold_conversations"]
    assert cold["engine"] == "tts" and cold["run"] == "tandem" and cold_call["cold"]
    assert cold["warm_calls"] == 1 and cold_call["session_id"] != conversation["session_id"]
    if cold["response_latency_s"] is not None and conversation["response_latency_s"]:
        assert cold["response_latency_vs_warm"] == pytest.approx(
            cold["response_latency_s"] / conversation["response_latency_s"], abs=1e-3
        )

    (level,) = report["load"]
    # Both answered, or one refused by the stack's capacity admission (stt measured
    # the machine, shared with the other tests, too busy for two): counted either way.
    assert level["sessions"] == 2 and level["ok"] >= 1, level["statuses"]
    assert level["ok"] + level["refused"] == 2, level["statuses"]
    assert set(level["statuses"]) <= {"OK", "RESOURCE_EXHAUSTED"}
    assert level["frames"] > 40 and level["frame_lag_p99_s"] is not None
    assert {c["session_id"] for c in report["load_conversations"]} != {""}

    markdown = (tmp_path / "out" / "t.md").read_text()
    assert report["command"] in markdown and report["machine"]["cpu"] in markdown
    assert "| tandem | tts | 1/1 |" in markdown
    assert "## Cold first call" in markdown
    for png in ("t.png", "t_timeline.png"):
        assert (tmp_path / "out" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
