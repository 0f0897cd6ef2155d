"""`kame bench`'s options, and the run: ask, transcribe, summarize, write the results."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from kame_cli import talk
from kame_cli.bench.machine import load_average, machine_description, models_description
from kame_cli.bench.plots import plot
from kame_cli.bench.questions import Question, load_questions
from kame_cli.bench.report import render_markdown
from kame_cli.bench.runner import CHUNK_MS, Bench
from kame_cli.bench.runs import Run, pick_load_run, plan_runs, select_runs
from kame_cli.bench.summary import cold_calls, summarize
from kame_cli.errors import USAGE, CliError, file_error, one_line
from kame_cli.stack import add_dtype_argument
from kame_common.audio import FRAME_SECONDS, SAMPLE_RATE


def _levels(text: str) -> list[int]:
    levels = [int(part) for part in text.split(",") if part.strip()] if text else []
    if any(level < 1 for level in levels):
        raise argparse.ArgumentTypeError("--load: session counts must be >= 1, e.g. 1,4,8")
    return levels


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--checkpoint",
        default="",
        help="KAME/Moshi checkpoint directory: adds the tandem-kame and s2s runs",
    )
    parser.add_argument("--device", default="cpu", help="torch device of the kame/moshi engines")
    add_dtype_argument(parser)
    parser.add_argument(
        "--questions",
        type=Path,
        default=None,
        help='JSON list of {"wav": FILE or "text": TEXT, "keywords": [...]}, e.g. '
        "bench/questions/espeak/questions.json (default: six built-in questions "
        "spoken by the piper voice)",
    )
    parser.add_argument(
        "--runs",
        default="",
        help="comma-separated subset of the runs (tandem, cascade, tandem-kame, "
        "s2s); default: every run the options allow",
    )
    parser.add_argument("--repeats", type=int, default=1, help="times each question is asked")
    parser.add_argument(
        "--warmup",
        type=int,
        default=0,
        help="unrecorded calls per stack after its cold first call (which is recorded "
        "apart) and before measuring",
    )
    parser.add_argument(
        "--load",
        type=_levels,
        default=[1, 4, 8],
        help="concurrent session counts of the load run, e.g. 1,8,32 "
        "('' = no load run; default 1,4,8)",
    )
    parser.add_argument(
        "--load-run",
        default="",
        help="run used for load (default: tandem-kame with a checkpoint, else tandem)",
    )
    parser.add_argument(
        "--late-ms",
        type=float,
        default=FRAME_SECONDS * 1e3,
        help="an agent frame later than this after its caller frame is late",
    )
    parser.add_argument(
        "--tail-s", type=float, default=1.5, help="the agent is done after this much quiet"
    )
    parser.add_argument(
        "--max-wait-s",
        type=float,
        default=20.0,
        help="give up waiting for an answer this long after the question",
    )
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=Path("bench/results"),
        help="where the results go (scratch files in OUT_DIR/tmp/NAME)",
    )
    parser.add_argument("--name", default="bench", help="file name stem of the results")
    parser.add_argument(
        "--redis-url",
        default="",
        help="use this Redis, whose frontend registry must list no other "
        "replica (default: each stack starts its own Redis)",
    )
    parser.add_argument(
        "--llm-base-url", default="", help="an OpenAI-compatible server instead of the embedded LLM"
    )
    parser.add_argument("--llm-backend", default="", help="oracle back-end: openai or anthropic")
    parser.add_argument("--llm-model", default="", help="model name for the oracle")
    parser.add_argument("--startup-timeout-s", type=float, default=300.0)
    parser.add_argument(
        "--no-capacity-admission",
        dest="capacity_admission",
        action="store_false",
        help="the stacks admit every call (by default the gateway refuses, with "
        "RESOURCE_EXHAUSTED, calls stt or the oracle cannot serve in time: the load "
        "levels count them as refused)",
    )


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
    args: argparse.Namespace,
    bench: Bench,
    runs: list[Run],
    questions: list[Question],
    header: dict[str, Any],
) -> dict[str, Any]:
    """Everything the run measured, as bench.json holds it."""
    return {
        "name": args.name,
        **header,
        "models": models_description(args),
        "settings": {
            "repeats": args.repeats,
            "warmup": args.warmup,
            "late_ms": args.late_ms,
            "tail_s": args.tail_s,
            "max_wait_s": args.max_wait_s,
            "load": args.load,
            "chunk_ms": CHUNK_MS,
        },
        "questions": [_question_entry(q) for q in questions],
        "runs": [vars(r) for r in runs],
        "summary": summarize(bench.captured, runs, args.late_ms / 1000),
        "cold_calls": cold_calls(bench.cold, bench.captured),
        "conversations": [c.record for c in bench.captured],
        "cold_conversations": [c.record for c in bench.cold],
        "load": bench.load_levels,
        "load_conversations": [c.record for c in bench.load_captured],
        "failures": bench.failures,
    }


def write_results(args: argparse.Namespace, bench: Bench, report: dict[str, Any]) -> str:
    """NAME.json, NAME.md, NAME.png and NAME_timeline.png; returns the markdown."""
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stem = args.out_dir / args.name
    stem.with_suffix(".json").write_text(json.dumps(report, indent=1))
    markdown = render_markdown(report)
    stem.with_suffix(".md").write_text(markdown)
    plot(report, stem.with_suffix(".png"))
    first = next((c for c in bench.captured if c.result is not None), None)
    if first is not None:
        talk.plot_timeline(
            first.result,
            args.out_dir / f"{args.name}_timeline.png",
            title=f"kame bench, {first.record['run']}: {first.record['text']}",
        )
    return markdown


def run(args: argparse.Namespace) -> int:
    command = invoked_command()
    started_at = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    if args.repeats < 1 or args.warmup < 0:
        raise CliError("--repeats must be >= 1 and --warmup >= 0", USAGE)
    if args.checkpoint and not Path(args.checkpoint).exists():
        raise file_error(args.checkpoint, "--checkpoint")
    try:
        planned = plan_runs(args.checkpoint)
        runs = select_runs(planned, args.runs)
        load_run = pick_load_run(planned, args.load, args.load_run, args.checkpoint)
        print("kame bench: loading the questions ...", flush=True)
        questions = load_questions(args.questions)
    except (ValueError, OSError) as exc:
        raise CliError(one_line(exc), USAGE) from None
    machine = machine_description()
    began = time.monotonic()
    bench = Bench(args, questions, runs, load_run)
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
    report = build_report(args, bench, runs, questions, header)
    print(write_results(args, bench, report))
    print(
        f"kame bench: wrote {args.out_dir / args.name}.json, .md, .png and "
        f"{args.name}_timeline.png; answers and logs in {bench.scratch}"
    )
    for failure in bench.failures:
        print(
            f"kame bench: the {failure['engine']} runs are missing: {failure['error']}",
            file=sys.stderr,
        )
    return 1 if bench.failures else 0
