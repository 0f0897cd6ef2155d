"""Per-run figures over the measured calls, and each stack's cold call against them."""

from __future__ import annotations

from typing import Any

import numpy as np

from kame_cli.bench.conversation import frame_lag_stats
from kame_cli.bench.metrics import FrameTimes
from kame_cli.bench.runner import Captured
from kame_cli.bench.runs import Run
from kame_cli.bench.stats import median_p90, percentile, rounded

LATENCIES = (
    "response_latency_s",
    "answer_latency_s",
    "oracle_first_update_s",
    "stt_final_lag_s",
    "final_after_speech_end_s",
)
COLD_LATENCIES = ("response_latency_s", "answer_latency_s")


def summarize(
    captured: list[Captured], runs: list[Run], late_s: float
) -> dict[str, dict[str, Any]]:
    """Median and p90 per run over its calls; p50/p99 of the pooled frames;
    correct, coherent and repair counts."""
    summary = {}
    for run in runs:
        mine = [c for c in captured if c.record["run"] == run.label]
        if not mine:
            continue
        records = [c.record for c in mine]
        row: dict[str, Any] = {
            "mode": run.mode,
            "engine": run.engine,
            "conversations": len(records),
            "ok": sum(r["status"] == "OK" for r in records),
        }
        for key in LATENCIES:
            row[key] = median_p90(r[key] for r in records)
        row.update(sum((c.frame_times for c in mine), FrameTimes()).summary())
        row.update(frame_lag_stats(np.concatenate([c.lags for c in mine]), late_s))
        row["correct"] = sum(bool(r.get("correct")) for r in records)
        row["text_correct"] = sum(r["text_correct"] for r in records)
        row.update(coherence_counts(records))
        summary[run.label] = row
    return summary


def coherence_counts(records: list[dict[str, Any]]) -> dict[str, Any]:
    """How many answers were one generation's text, and how many held or repaired."""
    scored = [r for r in records if r["coherent"] is not None]
    coherent = sum(r["coherent"] for r in scored)
    return {
        "coherence_scored": len(scored),
        "coherent": coherent,
        "coherent_fraction": rounded(coherent / len(scored)) if scored else None,
        "held": sum(r["answer_hold_words"] > 0 for r in scored),
        "repaired": sum(r["answer_repairs"] > 0 for r in scored),
        "repair_words": sum(r["answer_repairs"] for r in scored),
    }


def cold_calls(cold: list[Captured], captured: list[Captured]) -> list[dict[str, Any]]:
    """Each stack's cold call: its latencies and their ratio to the warm median of
    the same run (the measured calls)."""
    rows = []
    for call in cold:
        record = call.record
        warm = [c.record for c in captured if c.record["run"] == record["run"]]
        row: dict[str, Any] = {
            "run": record["run"],
            "engine": record["engine"],
            "question": record["question"],
            "text": record["text"],
            "status": record["status"],
            "correct": record.get("correct"),
            "coherent": record["coherent"],
            "warm_calls": len(warm),
        }
        for key in COLD_LATENCIES:
            median = percentile((r[key] for r in warm), 50)
            row[key] = record[key]
            row[f"warm_median_{key}"] = rounded(median)
            row[f"{key.removesuffix('_s')}_vs_warm"] = (
                rounded(record[key] / median, 3)
                if record[key] is not None and median  # a median of 0 has no ratio
                else None
            )
        rows.append(row)
    return rows


def with_answer_ratios(
    levels: list[dict[str, Any]], alone: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Each load level with `one_call_answer_s` and `answer_ratio`: its admitted calls'
    answer median over one call's, the median over the load run's calls made one at a
    time (`alone`, the run's measured calls, and the 1-session level's), so that one
    noisy call does not set the scale; None without any."""
    run = levels[0]["run"] if levels else ""
    one_call = percentile(
        [r["answer_latency_s"] for r in alone if r["run"] == run and r.get("load", 1) == 1], 50
    )
    return [
        {
            **level,
            "one_call_answer_s": rounded(one_call),
            "answer_ratio": (
                rounded(level["answer_latency_median_s"] / one_call)
                if one_call and level["answer_latency_median_s"] is not None
                else None
            ),
        }
        for level in levels
    ]
