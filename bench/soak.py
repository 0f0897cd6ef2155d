"""Soak: N long calls at once for M minutes on one `kame up` stack.

Each of --sessions callers holds ONE Converse call for --minutes, asking the
bench's questions one after another (each caller starts at a different
question) with --gap-s of silence after each, at real time, as a phone line
would. Meanwhile the resident memory of every process of the stack (with its
child processes) is sampled every --sample-s. Reported:

- per service: RSS after warm-up, at the end, its growth and its peak;
- per call: status, agent frames, late frames (an agent frame more than
  --late-ms after its caller frame was due, as `kame bench` counts them),
  frame lag p50/p99, turns answered (TurnSummary) and notices.

Growth that keeps pace with the calls' length is a leak; a plateau is a cache.

    .venv/bin/python bench/soak.py [--sessions 8] [--minutes 10]

Prints a table and writes bench/results/soak.json (or --out).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np

from kame_cli import talk
from kame_cli.bench.conversation import frame_lag_stats, frame_lags
from kame_cli.bench.questions import Question, load_questions
from kame_cli.bench.report import write_json
from kame_cli.bench.stacks import BenchStack
from kame_cli.stack import Ports, Stack, add_arguments, free_ports, options_from_args
from kame_common.audio import SAMPLE_RATE

ROOT = Path(__file__).resolve().parent.parent
QUESTIONS = ROOT / "bench" / "questions" / "espeak" / "questions.json"
MIB = 1024 * 1024


def process_tree_rss(pid: int) -> int:
    """Resident bytes of `pid` and all its descendants (0 for what has gone)."""
    total, pending = 0, [pid]
    while pending:
        current = pending.pop()
        with contextlib.suppress(OSError, ValueError):
            for line in Path(f"/proc/{current}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
            for task in Path(f"/proc/{current}/task").iterdir():
                pending += [int(p) for p in (task / "children").read_text().split()]
    return total


def stack_rss(stack: Stack) -> dict[str, int]:
    return {
        child.name: process_tree_rss(child.process.pid)
        for child in stack.children
        if child.process is not None
    }


def caller_audio(questions: list[Question], first: int, seconds: float, gap_s: float) -> np.ndarray:
    """Questions from `first` on, each followed by `gap_s` of silence, up to `seconds`."""
    gap = np.zeros(int(gap_s * SAMPLE_RATE), np.float32)
    pieces, length, index = [], 0, first
    while length < seconds * SAMPLE_RATE:
        question = questions[index % len(questions)].audio.astype(np.float32)
        pieces += [question, gap]
        length += len(question) + len(gap)
        index += 1
    return np.concatenate(pieces)[: int(seconds * SAMPLE_RATE)]


async def sample_memory(stack: Stack, every_s: float, samples: list[dict[str, Any]]) -> None:
    start = time.monotonic()
    while True:
        samples.append({"t_s": round(time.monotonic() - start, 1), **stack_rss(stack)})
        await asyncio.sleep(every_s)


async def soak(args: argparse.Namespace, stack: Stack, questions: list[Question]) -> dict[str, Any]:
    options = talk.TalkOptions(
        gateway=stack.gateway_address,
        mode="tandem",
        tail_s=2.0,
        max_wait_s=30.0,
        oracle_updates=False,
    )
    # One unrecorded call warms every model before the baseline is taken.
    await talk.talk(questions[0].audio, options)
    baseline = stack_rss(stack)
    samples: list[dict[str, Any]] = []
    sampler = asyncio.create_task(sample_memory(stack, args.sample_s, samples))
    seconds = args.minutes * 60

    async def caller(slot: int) -> talk.TalkResult:
        await asyncio.sleep(slot * args.gap_s / args.sessions)  # arrivals spread over a gap
        return await talk.talk(caller_audio(questions, slot, seconds, args.gap_s), options)

    started = time.monotonic()
    try:
        results = await asyncio.gather(*(caller(slot) for slot in range(args.sessions)))
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
    end = stack_rss(stack)
    late_s = args.late_ms / 1000
    calls = [
        {
            "status": result.status,
            "status_details": result.status_details,
            **frame_lag_stats(frame_lags(result), late_s),
            "turns": len(result.turns),
            "notices": [notice.get("kind", "") for notice in result.notices],
        }
        for result in results
    ]
    lags = np.concatenate([frame_lags(result) for result in results])
    return {
        "sessions": args.sessions,
        "minutes": args.minutes,
        "wall_s": round(time.monotonic() - started, 1),
        "all_frames": frame_lag_stats(lags, late_s),
        "calls": calls,
        "memory": {
            name: {
                "start_mib": _mib(baseline[name]),
                "end_mib": _mib(end.get(name, 0)),
                "growth_mib": _mib(end.get(name, 0) - baseline[name]),
                "peak_mib": _mib(max(s.get(name, 0) for s in samples)),
            }
            for name in baseline
        },
        "memory_samples": samples,
    }


def _mib(size: int) -> float:
    return round(size / MIB, 1)


def print_report(report: dict[str, Any]) -> None:
    print(f"\nsoak: {report['sessions']} calls x {report['minutes']} min ({report['wall_s']} s)")
    print("\n| service | RSS start MiB | RSS end MiB | growth MiB | peak MiB |")
    print("|---|---|---|---|---|")
    for name, memory in report["memory"].items():
        print(
            f"| {name} | {memory['start_mib']} | {memory['end_mib']} | "
            f"{memory['growth_mib']} | {memory['peak_mib']} |"
        )
    print("\n| call | status | frames | late | lag p50 / p99 ms | turns | notices |")
    print("|---|---|---|---|---|---|---|")
    for index, call in enumerate(report["calls"]):
        print(
            f"| {index + 1} | {call['status']} | {call['frames']} | {call['late_frames']} | "
            f"{_ms(call['frame_lag_p50_s'])} / {_ms(call['frame_lag_p99_s'])} | "
            f"{call['turns']} | {', '.join(call['notices']) or '-'} |"
        )
    frames = report["all_frames"]
    late_percent = 100 * (frames["late_fraction"] or 0)
    print(
        f"\nall calls: {frames['frames']} frames, {frames['late_frames']} late "
        f"({late_percent:.2f} %), lag p99 {_ms(frames['frame_lag_p99_s'])} ms"
    )


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1000 * seconds:.0f}"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--gap-s", type=float, default=10.0, help="silence after each question")
    parser.add_argument("--questions", type=Path, default=QUESTIONS)
    parser.add_argument("--sample-s", type=float, default=15.0, help="memory sampling period")
    parser.add_argument("--late-ms", type=float, default=80.0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "soak.json")
    add_arguments(parser)  # kame up's stack options (engine, checkpoint, LLM, ...)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    questions = load_questions(args.questions)
    ports = Ports.free(redis=free_ports(1)[0])  # its own Redis, beside any other stack
    options = options_from_args(args, ports, args.frontend_engine, args.log_dir)
    stack = BenchStack(options, frontend_slots=max(args.sessions, 1))
    print(f"soak: starting the stack (logs in {stack.log_dir}) ...", flush=True)
    with stack:
        print(
            f"soak: {args.sessions} calls of {args.minutes:g} min each, "
            f"memory every {args.sample_s:g} s ...",
            flush=True,
        )
        report = asyncio.run(soak(args, stack, questions))
        stack.check()
    report["machine"] = f"{platform.processor() or platform.machine()}, {platform.platform()}"
    report["command"] = "bench/soak.py " + " ".join(
        f"--{k} {v}" for k, v in (("sessions", args.sessions), ("minutes", args.minutes))
    )
    print_report(report)
    write_json(args.out, report)


if __name__ == "__main__":
    main()
