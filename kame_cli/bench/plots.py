"""The report's figure: latency distributions, the latency breakdown, per-frame
timings, load, and an annotated timeline of the first question in every run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from kame_common.audio import FRAME_SECONDS

LATENCY_KINDS = (
    ("response_latency_s", "first audio", "tab:blue"),
    ("answer_latency_s", "answer", "tab:orange"),
)


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary, records = report["summary"], report["conversations"]
    labels = list(summary)
    fig = plt.figure(figsize=(14, 17))
    grid = fig.add_gridspec(4, 2, height_ratios=[1, 1, 1, 1.2])
    _plot_distribution(fig.add_subplot(grid[0, 0]), summary, records, report["cold_calls"])
    _plot_components(fig.add_subplot(grid[0, 1]), labels, summary)
    _plot_frames(fig.add_subplot(grid[1, 0]), labels, summary)
    _plot_load(fig.add_subplot(grid[1, 1]), report["load"])
    _plot_admission(fig.add_subplot(grid[2, :]), report["load"])
    _plot_timelines(fig.add_subplot(grid[3, :]), labels, records)
    machine = report["machine"]
    fig.suptitle(
        f"kame bench: {machine['cpu']}, {machine['cores']} cores, GPU {machine['gpu']}"
        f"\n{report['command']}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _run_label(label: str, row: dict[str, Any]) -> str:
    """The run's name with its correct and coherent counts, for a tick label."""
    coherent = (
        f"coherent {row['coherent']}/{row['coherence_scored']}"
        if row["coherence_scored"]
        else "coherent n/a"
    )
    return f"{label}\ncorrect {row['correct']}/{row['conversations']}\n{coherent}"


def _plot_distribution(
    axis: Any,
    summary: dict[str, dict[str, Any]],
    records: list[dict[str, Any]],
    cold: list[dict[str, Any]],
) -> None:
    """First audio and answer latency side by side per run; x marks the cold call."""
    labels = list(summary)
    width = 0.35
    for offset, (key, name, color) in enumerate(LATENCY_KINDS):
        shift = (offset - 0.5) * width
        data = [
            [r[key] for r in records if r["run"] == label and r[key] is not None]
            for label in labels
        ]
        positions = np.arange(len(labels)) + shift
        boxes = axis.boxplot(
            [d or [np.nan] for d in data],
            positions=positions,
            widths=width * 0.8,
            showfliers=False,
            patch_artist=True,
        )
        for box in boxes["boxes"]:
            box.set(facecolor=color, alpha=0.25)
        for position, values in zip(positions, data, strict=True):
            jitter = np.linspace(-0.06, 0.06, len(values)) if len(values) > 1 else 0.0
            axis.scatter(
                position + np.zeros(len(values)) + jitter, values, s=14, color=color, zorder=3
            )
        axis.scatter([], [], color=color, label=name)  # one legend entry per kind
        for row in cold:
            if row["run"] in labels and row[key] is not None:
                axis.scatter(
                    labels.index(row["run"]) + shift,
                    row[key],
                    marker="x",
                    s=60,
                    color="tab:red",
                    zorder=4,
                    label="cold first call" if offset == 0 and row is cold[0] else None,
                )
    axis.set_xticks(np.arange(len(labels)), [_run_label(lb, summary[lb]) for lb in labels])
    axis.axhline(0, color="gray", lw=0.8, ls=":")
    axis.set_ylabel("seconds after the caller's end of speech")
    axis.set_title("first audio and answer latency per call")
    axis.legend(fontsize=8)


def _grouped_bars(
    axis: Any, labels: list[str], groups: list[tuple[str, list[float], list[float]]]
) -> None:
    """Per run, one bar per (name, centres, tails) group side by side: the bar up to
    the centre (a median), its whisker up to the tail (a p90 or p99)."""
    width = 0.8 / len(groups)
    for offset, (name, centres, tails) in enumerate(groups):
        positions = np.arange(len(labels)) + (offset - (len(groups) - 1) / 2) * width
        axis.bar(
            positions,
            centres,
            width,
            label=name,
            yerr=[np.zeros(len(labels)), np.maximum(0, np.subtract(tails, centres))],
            capsize=3,
        )
    axis.set_xticks(np.arange(len(labels)), labels)


def _plot_components(axis: Any, labels: list[str], summary: dict[str, dict[str, Any]]) -> None:
    keys = (
        ("response_latency_s", "first audio"),
        ("answer_latency_s", "answer"),
        ("oracle_first_update_s", "oracle 1st update after 1st transcript"),
        ("stt_final_lag_s", "STT final lag"),
    )
    groups = [
        (
            name,
            [summary[label][key]["median"] or 0.0 for label in labels],
            [summary[label][key]["p90"] or 0.0 for label in labels],
        )
        for key, name in keys
    ]
    _grouped_bars(axis, labels, groups)
    axis.set_ylabel("seconds (bar: median, whisker: p90)")
    axis.set_title("latency breakdown per run")
    axis.legend(fontsize=8)


def _plot_frames(axis: Any, labels: list[str], summary: dict[str, dict[str, Any]]) -> None:
    keys = (
        ("step", "frontend step"),
        ("transport", "transport"),
        ("round_trip", "gateway round trip"),
    )

    def ms(label: str, key: str) -> float:  # floored: the axis is logarithmic
        return max(summary[label][key] or 0.0, 1e-5) * 1e3

    groups = [
        (
            name,
            [ms(label, f"{key}_p50_s") for label in labels],
            [ms(label, f"{key}_p99_s") for label in labels],
        )
        for key, name in keys
    ]
    _grouped_bars(axis, labels, groups)
    axis.axhline(FRAME_SECONDS * 1e3, color="red", lw=0.8, ls="--", label="80 ms frame")
    axis.set_yscale("log")  # p50 is often a fraction of a millisecond, p99 tens of them
    axis.set_ylabel("ms, log scale (bar: p50, whisker: p99)")
    axis.set_title("per-frame timings")
    axis.legend(fontsize=8)


def _plot_load(axis: Any, levels: list[dict[str, Any]]) -> None:
    axis.set_title("load: concurrent sessions" + (f" ({levels[0]['run']})" if levels else ""))
    if not levels:
        axis.text(0.5, 0.5, "no load run", ha="center", transform=axis.transAxes)
        return
    positions = np.arange(len(levels))  # evenly spaced: levels are often 1, 8, 32
    for key, marker, name in (
        ("frame_lag_p99_s", "o-", "client frame lag p99"),
        ("transport_p99_s", "s-", "transport p99"),
        ("step_p99_s", "^-", "frontend step p99"),
    ):
        axis.plot(positions, [(level[key] or 0.0) * 1e3 for level in levels], marker, label=name)
    axis.set_xticks(positions, [str(level["sessions"]) for level in levels])
    axis.set_xlabel("sessions")
    axis.set_ylabel("ms")
    late = axis.twinx()
    late.bar(
        positions,
        [100 * (level["late_fraction"] or 0.0) for level in levels],
        alpha=0.25,
        color="tab:red",
        width=0.4,
        label="late frames (%)",
    )
    late.set_ylabel("late frames (%)")
    axis.legend(loc="upper left", fontsize=8)
    late.legend(loc="upper right", fontsize=8)


def _plot_admission(axis: Any, levels: list[dict[str, Any]]) -> None:
    """Per load level: the admitted calls' answer median and p90, the 1.5x bound on
    one call's median, and (right axis) the calls admitted and refused."""
    axis.set_title("load: answer time of the admitted calls, and admissions")
    if not levels:
        axis.text(0.5, 0.5, "no load run", ha="center", transform=axis.transAxes)
        return
    positions = np.arange(len(levels))
    for key, marker, name in (
        ("answer_latency_median_s", "o-", "answer median"),
        ("answer_latency_p90_s", "s--", "answer p90"),
    ):
        axis.plot(positions, [level[key] or np.nan for level in levels], marker, label=name)
    if one_call := levels[0].get("one_call_answer_s"):
        axis.axhline(1.5 * one_call, color="grey", linestyle=":", label="1.5x one call")
    for position, level in zip(positions, levels, strict=True):
        if level.get("answer_ratio") is not None and level["answer_latency_median_s"]:
            axis.annotate(
                f"{level['answer_ratio']:.2f}x",
                (position, level["answer_latency_median_s"]),
                textcoords="offset points",
                xytext=(6, -12),
                fontsize=8,
            )
    axis.set_xticks(positions, [f"{level['sessions']} offered" for level in levels])
    axis.set_ylabel("s")
    calls = axis.twinx()
    width = 0.2
    calls.bar(positions - width / 2, [lv["ok"] for lv in levels], width, alpha=0.3, label="ok")
    calls.bar(
        positions + width / 2,
        [lv.get("refused", 0) for lv in levels],
        width,
        alpha=0.3,
        color="tab:red",
        label="refused",
    )
    calls.set_ylabel("calls")
    axis.legend(loc="upper left", fontsize=8)
    calls.legend(loc="upper right", fontsize=8)


def _latency_arrow(
    axis: Any, y: float, start: float, latency: float, name: str, above: bool
) -> None:
    axis.annotate(
        "", (start + latency, y), (start, y), arrowprops={"arrowstyle": "->", "color": "tab:purple"}
    )
    axis.text(
        start + latency / 2,
        y + (0.02 if above else -0.02),
        f"{name} {latency:.2f} s",
        ha="center",
        va="bottom" if above else "top",
        fontsize=8,
        color="tab:purple",
    )


def _plot_timelines(axis: Any, labels: list[str], records: list[dict[str, Any]]) -> None:
    """The first question in every run, one lane per run, with its milestones."""
    axis.set_title("the first question in every run (annotated timeline)")
    shown: set[str] = set()

    def once(name: str) -> str | None:  # one legend entry per kind of mark
        if name in shown:
            return None
        shown.add(name)
        return name

    for lane, label in enumerate(labels):
        record = next((r for r in records if r["run"] == label and r["question"] == 0), None)
        if record is None:
            continue
        marks, y = record["timeline"], len(labels) - 1 - lane
        if marks["speech_start_s"] is not None:
            axis.barh(
                y + 0.18,
                marks["speech_end_s"] - marks["speech_start_s"],
                0.3,
                left=marks["speech_start_s"],
                color="tab:blue",
                alpha=0.5,
                label=once("caller speech"),
            )
            axis.text(
                marks["speech_start_s"],
                y + 0.38,
                f'"{record["user_transcript"]}"',
                fontsize=8,
                color="tab:blue",
            )
        for start, stop in marks["agent_spans"]:
            axis.barh(
                y - 0.18,
                stop - start,
                0.3,
                left=start,
                color="tab:green",
                alpha=0.6,
                label=once("agent audio"),
            )
        if marks["agent_spans"]:
            axis.text(
                marks["agent_spans"][0][0],
                y - 0.45,
                f'"{record["agent_text"][:70]}"',
                fontsize=8,
                color="tab:green",
            )
        for key, marker, color, name in (
            ("first_transcript_t", "v", "gray", "first transcript"),
            ("final_t", "D", "black", "final transcript"),
            ("first_oracle_t", "*", "tab:red", "first oracle update"),
            ("answer_t", "P", "tab:orange", "first answer word"),
        ):
            if marks.get(key) is not None:
                axis.plot(marks[key], y + 0.18, marker, color=color, ms=9, label=once(name))
        end = marks["speech_end_s"]
        if end is not None:
            for key, offset, name, above in (
                ("response_latency_s", 0.0, "first audio", True),
                ("answer_latency_s", -0.06, "answer", False),
            ):
                if record[key] is not None:
                    _latency_arrow(axis, y + offset, end, record[key], name, above)
    axis.set_yticks(range(len(labels)), list(reversed(labels)))
    axis.set_ylim(-0.7, len(labels) - 0.3)
    axis.set_xlim(left=0)
    axis.set_xlabel("seconds since the stream started")
    axis.legend(loc="upper right", fontsize=8, ncol=3)
