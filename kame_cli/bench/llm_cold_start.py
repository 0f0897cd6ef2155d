"""The first oracle call after a fresh LLM server start: cold vs warmed up.

For each trial, a fresh embedded LLM server (llama.cpp + Gemma 3 270M) is
started and, depending on the mode, warmed up the way the stack does it:

- none:       no warm-up (what `kame up` did before: it waited for GET /models);
- llm-server: `kame llm-server`'s warm-up (llm_server.warm_up) before ready;
- oracle:     the oracle service's warm-up of its default back-end at start.

Then one oracle session asks a question (a final transcript) and we time the
LLM stream start -> first token (ttft_s) and the final -> RESET of its answer,
for the first call and for a second question right after it.

Usage: .venv/bin/python -m kame_cli.bench.llm_cold_start [--trials 3] [--threads 0]
Prints medians per mode and writes bench/results/llm_cold_start.json.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from typing import Any

from kame_cli import llm_server
from kame_cli.bench.paths import RESULTS_DIR
from kame_cli.bench.report import print_table, write_json
from kame_cli.stack_options import free_ports
from kamepb import common_pb2, oracle_pb2
from services.oracle.config import ApiKeys, OracleSettings
from services.oracle.factory import SessionFactory

Event = oracle_pb2.OracleEvent
Update = common_pb2.OracleUpdate
MODES = ("none", "llm-server", "oracle")
QUESTIONS = ("What is the capital of France?", "Who wrote Romeo and Juliet?")
RESULTS = RESULTS_DIR / "llm_cold_start.json"


async def ask(factory: SessionFactory, question: str) -> dict[str, float]:
    """One session, one final transcript: (ttft_s, final_to_reset_s)."""
    session = await factory.open(oracle_pb2.OracleConfig(session_id=f"cold-{uuid.uuid4().hex[:8]}"))
    final_at = time.monotonic()
    session.user_transcript(
        common_pb2.TranscriptEvent(utterance_id="u1", is_final=True, text=question)
    )
    times: dict[str, float] = {}
    async for response in session.responses():
        now = time.monotonic()
        if response.HasField("event"):
            kind = response.event.kind
            if kind == Event.REQUEST_START:
                times["start"] = now
            elif kind == Event.FIRST_TOKEN:
                times["first_token"] = now
            elif kind == Event.ERROR:
                raise RuntimeError(f"the oracle's LLM stream failed: {response.event.detail}")
            elif kind == Event.DONE:
                break
        elif response.update.op == Update.RESET:
            times["reset"] = now
    await session.close()
    return {
        "ttft_s": times["first_token"] - times["start"],
        "final_to_reset_s": times["reset"] - final_at,
    }


async def trial(mode: str, threads: int) -> dict[str, Any]:
    port = free_ports(1)[0]
    process = llm_server.launch(port=port, threads=threads, quiet=True)
    url = llm_server.base_url("127.0.0.1", port)
    try:
        started = time.monotonic()
        models = llm_server.wait_ready(url, process)
        answers_at = time.monotonic() - started
        # Generous limits: a cold first call on a busy machine can take over 10 s.
        settings = OracleSettings(base_url=url, warmup_timeout_s=120, request_timeout_s=120)
        factory = SessionFactory(settings, ApiKeys(), store=None)
        if mode == "llm-server":
            llm_server.warm_up(url, models[0])
        elif mode == "oracle":
            await factory.warm_up()
        ready_s = time.monotonic() - started
        first = await ask(factory, QUESTIONS[0])
        second = await ask(factory, QUESTIONS[1])
    finally:
        llm_server.stop(process)
    return {"answers_s": answers_at, "ready_s": ready_s, "first": first, "second": second}


def median(runs: list[dict[str, Any]], *keys: str) -> float:
    """The median of a figure down `keys` in each run (run["first"]["ttft_s"])."""
    values: list[float] = []
    for run in runs:
        value: Any = run
        for key in keys:
            value = value[key]
        values.append(float(value))
    return statistics.median(values)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=3, help="fresh server starts per mode")
    parser.add_argument(
        "--threads", type=int, default=0, help="llama.cpp threads (0: its choice, as kame up)"
    )
    args = parser.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    for _ in range(args.trials):
        for mode in MODES:  # interleaved, so load on the machine hits every mode alike
            runs[mode].append(asyncio.run(trial(mode, args.threads)))
    print_table(
        f"{'mode':11} {'ready_s':>8} {'1st ttft_s':>11} {'1st final->RESET_s':>19} "
        f"{'2nd ttft_s':>11}",
        (
            f"{mode:11} {median(mode_runs, 'ready_s'):>8.2f} "
            f"{median(mode_runs, 'first', 'ttft_s'):>11.3f} "
            f"{median(mode_runs, 'first', 'final_to_reset_s'):>19.3f} "
            f"{median(mode_runs, 'second', 'ttft_s'):>11.3f}"
            for mode, mode_runs in runs.items()
        ),
    )
    write_json(
        RESULTS,
        {
            "machine_note": "shared 2-core CPU; medians over trials; "
            f"llama.cpp threads={args.threads or 'default'}",
            "trials": args.trials,
            "runs": runs,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
