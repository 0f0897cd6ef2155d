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
Open file descriptors, Redis keys and each service's metric series are sampled
with the memory: they too must level off.

With --kill-every-s, a process of the stack is killed (SIGKILL) that often, in
turn (--kills: stt, oracle, frontend, gateway, llm, redis), and `kame up`'s
supervisor starts it again (kame_cli.supervise); the gateway has a resume
secret, so calls continue on the restarted gateway or frontend. Each question
asked is then "answered" (an oracle answer word reached the caller before the
next question) or not, and a question left unanswered counts against the kill
whose window it falls in (from 5 s before the question to the next one), or as
unexplained: a kill may cost the turn it hit, nothing else. A call continued
after a kill sends the caller's audio again from where the broken call left
off (kame_client/caller.py), so the caller runs behind the WAV until it catches
up in the silences: a question's window is from when it was last sent to when
the next one was, and frame lags from then on include that delay (with
kills, read the questions, not the late frames).

    .venv/bin/python -m kame_cli.bench.soak [--sessions 8] [--minutes 10]
    .venv/bin/python -m kame_cli.bench.soak --sessions 4 --minutes 60 --kill-every-s 300

Prints a table and writes bench/results/soak.json (or --out).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import signal
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import redis

from kame_cli import talk
from kame_cli.bench.conversation import frame_lag_stats, frame_lags
from kame_cli.bench.paths import ESPEAK_QUESTIONS, RESULTS_DIR
from kame_cli.bench.questions import Question, load_questions
from kame_cli.bench.report import write_json
from kame_cli.bench.stacks import BenchStack
from kame_cli.stack import Stack
from kame_cli.stack_options import Ports, add_arguments, free_ports, options_from_args
from kame_cli.supervise import Supervisor
from kame_client.events import AgentText, Resumed
from kame_common.audio import SAMPLE_RATE, Samples

MIB = 1024 * 1024


KILL_ORDER = ("stt", "oracle", "frontend", "gateway", "llm", "redis")
KILL_WINDOW_LEAD_S = 5.0  # a kill this long before a question may still cost it


def process_tree(pid: int) -> list[int]:
    """`pid` and all its descendants (what has gone is left out)."""
    found, pending = [], [pid]
    while pending:
        current = pending.pop()
        with contextlib.suppress(OSError, ValueError):
            for task in Path(f"/proc/{current}/task").iterdir():
                pending += [int(p) for p in (task / "children").read_text().split()]
            found.append(current)
    return found


def process_tree_rss(pid: int) -> int:
    """Resident bytes of `pid` and all its descendants (0 for what has gone)."""
    total = 0
    for current in process_tree(pid):
        with contextlib.suppress(OSError, ValueError):
            for line in Path(f"/proc/{current}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
    return total


def process_tree_fds(pid: int) -> int:
    total = 0
    for current in process_tree(pid):
        with contextlib.suppress(OSError):
            total += len(os.listdir(f"/proc/{current}/fd"))
    return total


def stack_rss(stack: Stack) -> dict[str, int]:
    return {
        child.name: process_tree_rss(child.process.pid)
        for child in stack.children
        if child.process is not None
    }


def metric_series(url: str) -> int | None:
    """Time series a /metrics endpoint exposes now (None: it did not answer)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            text = reply.read().decode()
    except OSError:
        return None
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


def redis_keys(url: str) -> int | None:
    try:
        with redis.Redis.from_url(url, socket_timeout=2) as client:
            return int(client.dbsize())
    except redis.RedisError:
        return None


def resources(stack: Stack) -> dict[str, Any]:
    """File descriptors per process, Redis keys, metric series per gRPC service."""
    return {
        "fds": {
            child.name: process_tree_fds(child.process.pid)
            for child in stack.children
            if child.process is not None
        },
        "redis_keys": redis_keys(stack.redis_url),
        "metric_series": {
            name: metric_series(stack.metrics_url(name))
            for name in ("gateway", "frontend", "stt", "oracle")
        },
    }


def caller_audio(
    questions: list[Question], first: int, seconds: float, gap_s: float
) -> tuple[Samples, list[float]]:
    """Questions from `first` on, each followed by `gap_s` of silence, up to
    `seconds`; and where each question that fits whole (with its gap) starts."""
    gap = np.zeros(int(gap_s * SAMPLE_RATE), np.float32)
    pieces, starts, length, index = [], [], 0, first
    while length < seconds * SAMPLE_RATE:
        question = questions[index % len(questions)].audio.astype(np.float32)
        if length + len(question) + len(gap) <= seconds * SAMPLE_RATE:
            starts.append(length / SAMPLE_RATE)
        pieces += [question, gap]
        length += len(question) + len(gap)
        index += 1
    return np.concatenate(pieces)[: int(seconds * SAMPLE_RATE)], starts


async def sample_memory(stack: Stack, every_s: float, samples: list[dict[str, Any]]) -> None:
    start = time.monotonic()
    while True:
        sample = {"t_s": round(time.monotonic() - start, 1), **stack_rss(stack)}
        samples.append({**sample, **await asyncio.to_thread(resources, stack)})
        await asyncio.sleep(every_s)


async def kill_in_turn(
    stack: Stack, every_s: float, order: list[str], kills: list[dict[str, Any]]
) -> None:
    """SIGKILL the next process of `order` every `every_s` (the supervisor restarts it)."""
    start = time.monotonic()
    for turn in range(1_000_000):
        await asyncio.sleep(every_s)
        name = order[turn % len(order)]
        process = next((c for c in stack.children if c.name == name and c.running()), None)
        if process is None:  # not ours (an external Redis or LLM), or still restarting
            continue
        process.signal(signal.SIGKILL)
        kills.append({"t": time.monotonic(), "service": name})
        print(f"soak: killed {name} at {time.monotonic() - start:.0f} s", flush=True)


def sent_at(result: talk.TalkResult, wav_s: float, chunk: int) -> float:
    """When the caller last sent the audio at `wav_s` of its WAV (the call's clock);
    the WAV's own time if it never did."""
    return result.sent_t.get(int(wav_s * SAMPLE_RATE) // chunk, wav_s)


def question_outcomes(
    result: talk.TalkResult,
    starts_s: list[float],
    call_t0: float,
    kills: list[dict[str, Any]],
    chunk: int,
) -> list[dict[str, Any]]:
    """Per question asked: answered or not, and the kills whose window holds it."""
    outcomes = []
    asked_s = [sent_at(result, start, chunk) for start in starts_s]
    for index, start in enumerate(asked_s):
        end = asked_s[index + 1] if index + 1 < len(asked_s) else float("inf")
        answered = any(
            said.event.generation and start <= said.t < end for said in result.of(AgentText)
        )
        hit = [
            number
            for number, k in enumerate(kills)
            if start - KILL_WINDOW_LEAD_S <= k["t"] - call_t0 < min(end, start + 60.0)
        ]
        outcomes.append(
            {
                "start_s": round(starts_s[index], 1),
                "asked_s": round(start, 1),
                "answered": answered,
                "kills": [kills[number]["service"] for number in hit],
                "kill_indexes": hit,  # a service killed twice is two kills
            }
        )
    return outcomes


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
    kills: list[dict[str, Any]] = []
    background = [asyncio.create_task(sample_memory(stack, args.sample_s, samples))]
    if args.kill_every_s:
        order = args.kills.split(",")
        background.append(asyncio.create_task(kill_in_turn(stack, args.kill_every_s, order, kills)))
    seconds = args.minutes * 60
    call_t0: dict[int, float] = {}
    starts: dict[int, list[float]] = {}

    async def caller(slot: int) -> talk.TalkResult:
        await asyncio.sleep(slot * args.gap_s / args.sessions)  # arrivals spread over a gap
        audio, starts[slot] = caller_audio(questions, slot, seconds, args.gap_s)
        call_t0[slot] = time.monotonic()
        return await talk.talk(audio, options)

    started = time.monotonic()
    load_at_start = os.getloadavg()[0]
    try:
        results = await asyncio.gather(*(caller(slot) for slot in range(args.sessions)))
    finally:
        for task in background:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    end = stack_rss(stack)
    late_s = args.late_ms / 1000
    calls = []
    for slot, result in enumerate(results):
        chunk = int(options.chunk_ms * SAMPLE_RATE / 1000)
        asked = question_outcomes(result, starts[slot], call_t0[slot], kills, chunk)
        calls.append(
            {
                "status": result.status,
                "status_details": result.status_details,
                **frame_lag_stats(frame_lags(result), late_s),
                "turns": len(result.turns),
                "notices": [notice.kind for notice in result.notices],
                "resumed": len(result.of(Resumed)),
                "questions": len(asked),
                "answered": sum(q["answered"] for q in asked),
                "lost_to_a_kill": sum(1 for q in asked if not q["answered"] and q["kills"]),
                "lost_unexplained": sum(1 for q in asked if not q["answered"] and not q["kills"]),
                "question_outcomes": asked,
            }
        )
    served = [call for call, result in zip(calls, results, strict=True) if result.started]
    lost_per_kill = {
        index: sum(
            1
            for call in served
            for q in call["question_outcomes"]
            if not q["answered"] and index in q["kill_indexes"]
        )
        for index in range(len(kills))
    }
    lags = np.concatenate([frame_lags(result) for result in results])
    return {
        "sessions": args.sessions,
        "minutes": args.minutes,
        "wall_s": round(time.monotonic() - started, 1),
        # The 1-minute load average at the start and the end: other jobs sharing
        # the cores slow every service down (and restarts most).
        "load_average": [round(load_at_start, 2), round(os.getloadavg()[0], 2)],
        "all_frames": frame_lag_stats(lags, late_s),
        "calls": calls,
        "kills": [
            {
                "service": kill["service"],
                "at_s": round(kill["t"] - started, 1),
                "questions_lost": lost_per_kill[index],
            }
            for index, kill in enumerate(kills)
        ],
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
    print(
        f"\nsoak: {report['sessions']} calls x {report['minutes']} min ({report['wall_s']} s, "
        f"load average {report['load_average'][0]} -> {report['load_average'][1]})"
    )
    print("\n| service | RSS start MiB | RSS end MiB | growth MiB | peak MiB |")
    print("|---|---|---|---|---|")
    for name, memory in report["memory"].items():
        print(
            f"| {name} | {memory['start_mib']} | {memory['end_mib']} | "
            f"{memory['growth_mib']} | {memory['peak_mib']} |"
        )
    print(
        "\n| call | status | frames | late | lag p50 / p99 ms | questions | answered | "
        "lost to a kill | lost, no kill | resumed | notices |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for index, call in enumerate(report["calls"]):
        notices = sorted(set(call["notices"]))
        print(
            f"| {index + 1} | {call['status']} | {call['frames']} | {call['late_frames']} | "
            f"{_ms(call['frame_lag_p50_s'])} / {_ms(call['frame_lag_p99_s'])} | "
            f"{call['questions']} | {call['answered']} | {call['lost_to_a_kill']} | "
            f"{call['lost_unexplained']} | {call['resumed']} | {', '.join(notices) or '-'} |"
        )
    if report["kills"]:
        print("\n| kill | service | at s | questions lost (all calls that started) |")
        print("|---|---|---|---|")
        for index, kill in enumerate(report["kills"]):
            print(
                f"| {index + 1} | {kill['service']} | {kill['at_s']} | {kill['questions_lost']} |"
            )
    print_resources(report["memory_samples"])
    frames = report["all_frames"]
    late_percent = 100 * (frames["late_fraction"] or 0)
    print(
        f"\nall calls: {frames['frames']} frames, {frames['late_frames']} late "
        f"({late_percent:.2f} %), lag p99 {_ms(frames['frame_lag_p99_s'])} ms"
    )


def print_resources(samples: list[dict[str, Any]]) -> None:
    """File descriptors, Redis keys and metric series at the first, middle and last sample."""
    if not samples:
        return
    picked = [samples[0], samples[len(samples) // 2], samples[-1]]
    print(
        "\n| at s | "
        + " | ".join(f"fds {name}" for name in picked[0]["fds"])
        + " | redis keys | "
        + " | ".join(f"series {name}" for name in picked[0]["metric_series"])
        + " |"
    )
    print("|---" * (2 + len(picked[0]["fds"]) + len(picked[0]["metric_series"])) + "|")
    for sample in picked:
        fds = " | ".join(str(sample["fds"].get(name, "-")) for name in picked[0]["fds"])
        series = " | ".join(
            str(sample["metric_series"].get(name)) for name in picked[0]["metric_series"]
        )
        print(f"| {sample['t_s']} | {fds} | {sample['redis_keys']} | {series} |")


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1000 * seconds:.0f}"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--gap-s", type=float, default=10.0, help="silence after each question")
    parser.add_argument("--questions", type=Path, default=ESPEAK_QUESTIONS)
    parser.add_argument("--sample-s", type=float, default=15.0, help="memory sampling period")
    parser.add_argument("--late-ms", type=float, default=80.0)
    parser.add_argument(
        "--kill-every-s", type=float, default=0.0, help="SIGKILL a process this often (0: none)"
    )
    parser.add_argument(
        "--kills", default=",".join(KILL_ORDER), help="the processes to kill, in turn"
    )
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "soak.json")
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
        with Supervisor(stack, say=lambda line: print(line, flush=True)).running():
            report = asyncio.run(soak(args, stack, questions))
        if not args.kill_every_s:
            stack.check()
    report["machine"] = f"{platform.processor() or platform.machine()}, {platform.platform()}"
    report["command"] = "python -m kame_cli.bench.soak " + " ".join(
        f"--{k} {v}"
        for k, v in (
            ("sessions", args.sessions),
            ("minutes", args.minutes),
            ("kill-every-s", args.kill_every_s),
        )
    )
    print_report(report)
    write_json(args.out, report)


if __name__ == "__main__":
    main()
