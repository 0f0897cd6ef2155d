"""`kame bench`'s run: ask, transcribe, summarize, write the results (the options: config.py)."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kame_cli import talk
from kame_cli.bench import stt_wer
from kame_cli.bench.config import BenchConfig, config_from_namespace
from kame_cli.bench.machine import load_average, machine_description, models_description
from kame_cli.bench.plots import plot
from kame_cli.bench.questions import Question, load_questions
from kame_cli.bench.report import render_markdown
from kame_cli.bench.runner import CHUNK_MS, Bench
from kame_cli.bench.runs import Run, pick_load_run, plan_runs, select_runs
from kame_cli.bench.summary import cold_calls, summarize, with_answer_ratios
from kame_cli.bench.turn_taking import DEFAULT_SET, FULL_SET, measure_turn_taking
from kame_cli.bench.turn_taking import render_markdown as render_turn_taking
from kame_cli.errors import USAGE, CliError, file_error, one_line
from kame_common.audio import SAMPLE_RATE


def invoked_command() -> str:
    """This process's command line, as the user typed it (`kame bench ...`)."""
    program = Path(sys.argv[0]).name
    prefix = ["python", "-m", "kame_cli"] if program == "__main__.py" else [program]
    return shlex.join([*prefix, *sys.argv[1:]])


def _question_entry(question: Question) -> dict[str, Any]:
    return {
        "text": question.text,
        "keywords": list(question.keywords),
        "source": question.source,
        "duration_s": round(len(question.audio) / SAMPLE_RATE, 3),
        "speech_end_s": question.speech_end_s,
    }


def build_report(
    config: BenchConfig,
    bench: Bench,
    runs: list[Run],
    questions: list[Question],
    header: dict[str, Any],
) -> dict[str, Any]:
    """Everything the run measured, as bench.json holds it."""
    return {
        "name": config.name,
        **header,
        "models": models_description(config),
        "settings": {
            "repeats": config.repeats,
            "warmup": config.warmup,
            "late_ms": config.late_ms,
            "tail_s": config.tail_s,
            "max_wait_s": config.max_wait_s,
            "load": list(config.load),
            "chunk_ms": CHUNK_MS,
        },
        "questions": [_question_entry(q) for q in questions],
        "runs": [vars(r) for r in runs],
        "summary": summarize(bench.captured, runs, config.late_s),
        "cold_calls": cold_calls(bench.cold, bench.captured),
        "conversations": [c.record for c in bench.captured],
        "cold_conversations": [c.record for c in bench.cold],
        "load": with_answer_ratios(
            bench.load_levels, [c.record for c in bench.captured + bench.load_captured]
        ),
        "load_conversations": [c.record for c in bench.load_captured],
        "failures": bench.failures,
    }


# The report's per-call records (every event of every call): NAME_calls.json, which
# the bench regenerates and the repository does not keep (.gitignore); NAME.json
# keeps the rest, the summary the docs quote.
CALL_RECORDS = ("conversations", "cold_conversations", "load_conversations")


def write_results(config: BenchConfig, bench: Bench, report: dict[str, Any]) -> str:
    """NAME.json (the summary), NAME_calls.json (the calls), NAME.md, NAME.png and
    NAME_timeline.png; returns the markdown."""
    config.out_dir.mkdir(parents=True, exist_ok=True)
    stem = config.out_dir / config.name
    summary = {key: value for key, value in report.items() if key not in CALL_RECORDS}
    stem.with_suffix(".json").write_text(json.dumps(summary, indent=1))
    calls = {"name": config.name, **{key: report[key] for key in CALL_RECORDS}}
    (config.out_dir / f"{config.name}_calls.json").write_text(json.dumps(calls, indent=1))
    markdown = render_markdown(report)
    stem.with_suffix(".md").write_text(markdown)
    plot(report, stem.with_suffix(".png"))
    first = next(((c.record, c.result) for c in bench.captured if c.result is not None), None)
    if first is not None:
        record, result = first
        talk.plot_timeline(
            result,
            config.out_dir / f"{config.name}_timeline.png",
            title=f"kame bench, {record['run']}: {record['text']}",
        )
    return markdown


def run(args: argparse.Namespace) -> int:
    """`kame bench` (kame_cli.main): its flags become a `BenchConfig` here, once."""
    return run_bench(config_from_namespace(args))


def run_bench(config: BenchConfig) -> int:
    if config.turn_taking or config.turn_taking_full:
        return run_turn_taking(config)
    if config.stt_wer:
        return run_stt_wer(config)
    command = invoked_command()
    started_at = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    if config.repeats < 1 or config.warmup < 0:
        raise CliError("--repeats must be >= 1 and --warmup >= 0", USAGE)
    if config.checkpoint and not Path(config.checkpoint).exists():
        raise file_error(config.checkpoint, "--checkpoint")
    try:
        planned = plan_runs(config.checkpoint)
        runs = select_runs(planned, config.runs)
        load_run = pick_load_run(planned, config.load, config.load_run, config.checkpoint)
        print("kame bench: loading the questions ...", flush=True)
        questions = load_questions(config.questions)
    except (ValueError, OSError) as exc:
        raise CliError(one_line(exc), USAGE) from None
    machine = machine_description()
    began = time.monotonic()
    bench = Bench(config, questions, runs, load_run)
    try:
        asyncio.run(bench.run())
    finally:
        bench.progress.close()
    if not bench.captured:
        raise CliError("no conversation ran; see the errors above")
    duration = time.monotonic() - began
    bench.transcribe()
    bench.save_answers()
    machine["load_average_end"] = load_average()
    header = {
        "command": command,
        "started_at": started_at,
        "duration_s": round(duration, 1),
        "machine": machine,
    }
    report = build_report(config, bench, runs, questions, header)
    print(write_results(config, bench, report))
    print(
        f"kame bench: wrote {config.out_dir / config.name}.json, .md, .png and "
        f"{config.name}_timeline.png; answers and logs in {bench.scratch}"
    )
    for failure in bench.failures:
        print(
            f"kame bench: the {failure['engine']} runs are missing: {failure['error']}",
            file=sys.stderr,
        )
    return 1 if bench.failures else 0


def run_turn_taking(config: BenchConfig) -> int:
    """`kame bench --turn-taking`: the section alone, in this process (no stack)."""
    chosen = FULL_SET if config.turn_taking_full else DEFAULT_SET
    return run_in_process(
        config, lambda: {"turn_taking": measure_turn_taking(chosen)}, render_turn_taking
    )


def run_stt_wer(config: BenchConfig) -> int:
    """`kame bench --stt-wer`: the stt's options on the dictation set, in this process."""
    try:
        options = stt_wer.select_options(config.stt_options)
        clips = stt_wer.load_clips(config.stt_set)
    except (ValueError, OSError) as exc:
        raise CliError(one_line(exc), USAGE) from None
    if config.stt_demo_renderings < 0:
        raise CliError("--stt-demo-renderings must be >= 0", USAGE)

    def measure() -> dict[str, Any]:
        demo = stt_wer.demo_renderings(config.stt_demo_renderings)
        return {
            "set": stt_wer.set_description(config.stt_set, clips),
            "demo_renderings": len(demo),
            "options": stt_wer.measure(options, clips, demo),
        }

    return run_in_process(config, measure, stt_wer.render_markdown)


def run_in_process(
    config: BenchConfig,
    measure: Callable[[], dict[str, Any]],
    render: Callable[[dict[str, Any]], str],
) -> int:
    """A section measured in this process, without a stack: the report (the run's
    header, the machine, what `measure` returns) as NAME.json and, rendered, NAME.md."""
    header = {
        "name": config.name,
        "command": invoked_command(),
        "started_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    machine = machine_description()
    began = time.monotonic()
    measured = measure()
    machine["load_average_end"] = load_average()
    report = header | {
        "duration_s": round(time.monotonic() - began, 1),
        "machine": machine,
        **measured,
    }
    config.out_dir.mkdir(parents=True, exist_ok=True)
    stem = config.out_dir / config.name
    stem.with_suffix(".json").write_text(json.dumps(report, indent=1))
    markdown = render(report)
    stem.with_suffix(".md").write_text(markdown)
    print(markdown)
    print(f"kame bench: wrote {stem}.json and .md")
    return 0
