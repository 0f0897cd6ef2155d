"""Startup race: a call placed the moment `kame up`'s gateway accepts connections.

Runs `kame up --free-ports` --runs times. Each time, as soon as the gateway
that kame up names on its first line accepts a TCP connection, one espeak-ng
question (a different one each run) is streamed through `kame talk`'s client;
the call must be refused with a retry hint or answered with the whole question
in its transcript (kame_cli.bench.startup). Then the stack is stopped (SIGINT,
as Ctrl-C) and the next run starts from nothing.

    .venv/bin/python -m kame_cli.bench.startup_race [--runs 10]

Prints a table and writes bench/results/startup_race.json (or --out).
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kame_cli.bench import startup
from kame_cli.bench.paths import ESPEAK_QUESTIONS, RESULTS_DIR
from kame_cli.bench.questions import load_questions
from kame_cli.bench.report import write_json


def one_run(index: int, question: Any) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="kame-race-") as log_dir:
        process = subprocess.Popen(
            [sys.executable, "-m", "kame_cli", "up", "--free-ports", "--log-dir", log_dir],
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            assert process.stdout is not None
            first_line = process.stdout.readline()
            began = time.monotonic()
            result, waited_s = startup.call_at_first_accept(
                startup.gateway_named(first_line), question.audio
            )
            return {
                "run": index + 1,
                "question": question.text,
                "outcome": startup.outcome(result, question.text),
                "status": result.status,
                "details": result.status_details,
                "finals": result.finals,
                "answer": result.agent_text,
                "port_open_after_s": round(waited_s, 2),
                "call_took_s": round(time.monotonic() - began - waited_s, 2),
            }
        finally:
            os.killpg(process.pid, signal.SIGINT)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "startup_race.json")
    args = parser.parse_args()
    questions = load_questions(ESPEAK_QUESTIONS)
    runs = []
    for index in range(args.runs):
        row = one_run(index, questions[index % len(questions)])
        runs.append(row)
        print(
            f"run {row['run']:>2}: {row['outcome']:<26} port open after "
            f"{row['port_open_after_s']:>5.2f} s  {row['status']}: {row['details'][:60]!r} "
            f"finals {row['finals']}",
            flush=True,
        )
    counts = {
        name: sum(r["outcome"] == name for r in runs)
        for name in (startup.REFUSED, startup.ANSWERED, startup.LOST)
    }
    print("\noutcome                     runs")
    for name, count in counts.items():
        print(f"{name:<27} {count:>4}")
    write_json(
        args.out,
        {"machine": platform.node(), "runs": runs, "counts": counts},
    )
    return 0 if counts[startup.LOST] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
