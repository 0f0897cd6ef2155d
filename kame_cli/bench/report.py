"""The reports a bench writes: its results as JSON, and the markdown tables a reader
compares runs with, plus how it was run."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

REFERENCE_RUN = "tandem"


def print_table(header: str, rows: Iterable[str]) -> None:
    """A bench script's console table: the header, a rule as wide, the rows."""
    print(header)
    print("-" * len(header))
    for row in rows:
        print(row)


def write_json(path: Path, results: dict[str, Any]) -> None:
    """Write a bench's results (making the folder) and say where they went."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"wrote {path}")


def run_header(report: dict[str, Any], load_note: str) -> list[str]:
    """The first lines of a section's markdown: its name, the command, when and
    where it ran (`load_note` says how the machine's load bears on it)."""
    machine = report["machine"]
    return [
        f"# kame bench: {report['name']}",
        "",
        f"- command: `{report['command']}`",
        f"- date: {report['started_at']}, {report['duration_s']:.0f} s",
        f"- machine: {machine['cpu']}, {machine['cores']} cores; load average at start "
        f"{machine['load_average']}, at the end {machine['load_average_end']} ({load_note})",
    ]


def _fmt(value: float | None, scale: float = 1.0, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value * scale:.{digits}f}"


def _pair(stats: dict[str, Any]) -> str:
    return f"{_fmt(stats['median'])} / {_fmt(stats['p90'])}"


def _ms_pair(row: dict[str, Any], kind: str) -> str:
    return f"{_fmt(row[f'{kind}_p50_s'], 1e3, 1)} / {_fmt(row[f'{kind}_p99_s'], 1e3, 1)}"


def _late(row: dict[str, Any]) -> str:
    return f"{row['late_frames']} ({_fmt(row['late_fraction'], 100, 1)}%)"


def _ratio(value: float | None, reference: float | None) -> str:
    return f"{value / reference:.2f}x" if value is not None and reference else "n/a"


def _coherent(row: dict[str, Any]) -> str:
    if not row["coherence_scored"]:
        return "n/a"
    return (
        f"{row['coherent']}/{row['coherence_scored']} ({_fmt(row['coherent_fraction'], 100, 0)}%)"
    )


def _table(title: str, header: str, rows: Iterable[str]) -> list[str]:
    """A section's title and its markdown table; `header` and each row hold their
    cells separated by " | "."""
    columns = header.count(" | ") + 1
    return [
        "",
        f"## {title}",
        "",
        f"| {header} |",
        "|---" * columns + "|",
        *(f"| {row} |" for row in rows),
    ]


def _header(report: dict[str, Any]) -> list[str]:
    machine, settings = report["machine"], report["settings"]
    return [
        f"# kame bench: {report['name']}",
        "",
        f"- command: `{report['command']}`",
        f"- date: {report['started_at']}, {report['duration_s']:.0f} s",
        f"- machine: {machine['cpu']}, {machine['cores']} cores, {machine['memory_gib']} GiB, "
        f"GPU: {machine['gpu']}; {machine['os']}, Python {machine['python']}; load average at "
        f"start {machine['load_average']} (a shared machine: figures are noisy, quote medians)",
        "- models: " + "; ".join(f"{k}: {v}" for k, v in report["models"].items()),
        f"- inputs: {len(report['questions'])} questions ({_sources(report)}) x "
        f"{settings['repeats']} repeat(s), the same audio in every run, runs alternating "
        f"per question; each stack's cold first call reported apart",
    ]


def _sources(report: dict[str, Any]) -> str:
    piper = sum(q["source"] == "piper" for q in report["questions"])
    wavs = len(report["questions"]) - piper
    parts = [f"{piper} spoken by piper"] if piper else []
    return ", ".join([*parts, f"{wavs} from WAVs"] if wavs else parts)


def _answers_table(summary: dict[str, dict[str, Any]]) -> list[str]:
    reference = summary.get(REFERENCE_RUN, {})
    return _table(
        "Answers per run (seconds: median / p90 over the measured calls)",
        "run | engine | ok | first audio | answer | vs tandem (first audio / answer) | "
        "correct (audio / text) | coherent | held / repaired",
        (_answers_row(label, row, reference) for label, row in summary.items()),
    )


def _answers_row(label: str, row: dict[str, Any], reference: dict[str, Any]) -> str:
    ratios = " / ".join(
        _ratio(row[key]["median"], reference.get(key, {}).get("median"))
        for key in ("response_latency_s", "answer_latency_s")
    )
    return (
        f"{label} | {row['engine']} | {row['ok']}/{row['conversations']} | "
        f"{_pair(row['response_latency_s'])} | {_pair(row['answer_latency_s'])} | "
        f"{ratios} | {row['correct']} / {row['text_correct']} of {row['conversations']} | "
        f"{_coherent(row)} | {row['held']} / {row['repaired']}"
    )


def _pipeline_table(summary: dict[str, dict[str, Any]]) -> list[str]:
    return _table(
        "Pipeline and frames per run (seconds: median / p90; frames in ms: p50 / p99)",
        "run | oracle 1st update | STT final lag | step ms | transport ms | "
        "frame lag p99 ms | late frames",
        (
            f"{label} | {_pair(row['oracle_first_update_s'])} | "
            f"{_pair(row['stt_final_lag_s'])} | {_ms_pair(row, 'step')} | "
            f"{_ms_pair(row, 'transport')} | {_fmt(row['frame_lag_p99_s'], 1e3, 0)} | "
            f"{_late(row)}"
            for label, row in summary.items()
        ),
    )


def _with_ratio(value: float | None, ratio: float | None) -> str:
    return f"{_fmt(value)} ({'n/a' if ratio is None else f'{ratio:.2f}x'})"


def _yes_no(value: bool | None) -> str:
    return "n/a" if value is None else ("yes" if value else "no")


def _cold_table(cold: list[dict[str, Any]]) -> list[str]:
    if not cold:
        return []
    return _table(
        "Cold first call per stack (seconds, and the ratio to the same run's warm median)",
        "engine | run | question | first audio | answer | correct | coherent",
        (
            f"{row['engine']} | {row['run']} | {row['text']} | "
            f"{_with_ratio(row['response_latency_s'], row['response_latency_vs_warm'])} | "
            f"{_with_ratio(row['answer_latency_s'], row['answer_latency_vs_warm'])} | "
            f"{_yes_no(row['correct'])} | {_yes_no(row['coherent'])}"
            for row in cold
        ),
    )


def _call_cell(record: dict[str, Any]) -> str:
    verdict = "ok" if record.get("correct") else "wrong"
    if record["coherent"] is False:
        verdict += ", incoherent"
    return f"{_fmt(record['response_latency_s'])} / {_fmt(record['answer_latency_s'])} {verdict}"


def _question_table(report: dict[str, Any]) -> list[str]:
    summary = report["summary"]

    def cells(index: int) -> str:
        """Each run's calls of question `index`."""
        return " | ".join(
            ", ".join(
                _call_cell(r)
                for r in report["conversations"]
                if r["run"] == label and r["question"] == index
            )
            for label in summary
        )

    return _table(
        "Per question (first audio / answer latency in s; correct by audio)",
        " | ".join(["question", *summary]),
        (f"{q['text']} | {cells(index)}" for index, q in enumerate(report["questions"])),
    )


def _load_table(report: dict[str, Any]) -> list[str]:
    levels = report["load"]
    if not levels:
        return []
    return _table(
        f"Load ({levels[0]['run']}; late = agent frame more than "
        f"{report['settings']['late_ms']:g} ms after its caller frame was due; one call's "
        f"answer: {_fmt(levels[0].get('one_call_answer_s'))} s, the median of the run's "
        "calls made one at a time)",
        "sessions | ok | frames | late | frame lag p50 / p99 ms | step p50 / p99 ms | "
        "transport p50 / p99 ms | first audio median / p90 s | answer median / p90 s | "
        "answer x 1 call | retry after s | correct (audio / text) | coherent",
        (_load_row(level) for level in levels),
    )


def _load_row(level: dict[str, Any]) -> str:
    return (
        f"{level['sessions']} | {_ok_cell(level)} | {level['frames']} | {_late(level)} | "
        f"{_fmt(level['frame_lag_p50_s'], 1e3, 0)} / "
        f"{_fmt(level['frame_lag_p99_s'], 1e3, 0)} | "
        f"{_ms_pair(level, 'step')} | {_ms_pair(level, 'transport')} | "
        f"{_fmt(level['response_latency_median_s'])} / "
        f"{_fmt(level['response_latency_p90_s'])} | "
        f"{_fmt(level['answer_latency_median_s'])} / {_fmt(level['answer_latency_p90_s'])} | "
        f"{_fmt(level.get('answer_ratio'))} | {_retry_cell(level)} | "
        f"{level['correct']} / {level['text_correct']} of {level['sessions']} | "
        f"{level['coherent']} of {level['sessions']}"
    )


def _ok_cell(level: dict[str, Any]) -> str:
    """Calls that ended OK, and those the gateway refused for want of capacity."""
    refused = level.get("refused", 0)  # reports written before admission by capacity
    return f"{level['ok']} ({refused} refused)" if refused else str(level["ok"])


def _retry_cell(level: dict[str, Any]) -> str:
    """The retry-after hints the refused calls got: the range, or - without any."""
    hints = level.get("retry_after_s") or []  # reports written before the hints were kept
    if not hints:
        return "-"
    low, high = min(hints), max(hints)
    return f"{low:g}" if low == high else f"{low:g}-{high:g}"


def _failures(report: dict[str, Any]) -> list[str]:
    lines = []
    for failure in report["failures"]:
        error = failure["error"].splitlines()
        lines += [
            "",
            f"**Missing: the {failure['engine']} runs; their stack failed:** "
            f"{error[0]} ... {error[-1]}",
        ]
    return lines


DEFINITIONS = """\
Definitions (in full: the docstring of kame_cli/bench/__init__.py). First audio:
the caller's end of speech (measured on the WAV) -> the first agent audio at the
client. Answer: the caller's end of speech -> the first word of the answer itself
(the first agent word of an oracle generation, after any hold phrase), placed
where its audio reached the client. Correct: every keyword heard by Whisper in
the agent's audio (text: in the words the frontend says it spoke). Coherent: the
answer's words are, after an optional hold phrase, a prefix of ONE generation's
text; held / repaired: answers that began with a hold phrase / had generation-0
words in the middle. Step and transport (gateway frame round trip minus the
frontend's step time, per frame) come from the services' histograms,
interpolated inside buckets."""


def render_markdown(report: dict[str, Any]) -> str:
    summary = report["summary"]
    lines = [
        *_header(report),
        *_answers_table(summary),
        *_pipeline_table(summary),
        *_cold_table(report["cold_calls"]),
        *_question_table(report),
        *_load_table(report),
        *_failures(report),
        "",
        DEFINITIONS,
        "",
    ]
    return "\n".join(lines)
