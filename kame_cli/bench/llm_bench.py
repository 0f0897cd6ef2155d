"""LLM server benchmark: the oracle's concurrency and cancellation on each embedded server.

For each engine of `kame llm-server` (llama.cpp's llama-server with parallel
slots, and llama-cpp-python's Python server), started here with the embedded
Gemma 3 270M and warmed up as `kame llm-server` does:

- concurrency: N oracle sessions (the real oracle engine, tandem policy) speak
  N different questions at once, word by word at a speaking rate, so every
  session also starts and cancels its speculative streams as in a call. Per
  session: final transcript -> RESET of the stream that answers it
  (final_to_reset_s, what the caller waits for), final -> that stream's DONE
  (final_to_done_s), time to first token of every stream, and whether the
  answer names the expected fact.
- cancellation: a stream with a long prompt nobody has sent before is closed
  while the server is still evaluating it (in prefill) or after its first
  token (in decode); a short request sent right after it measures how long the
  server goes on working for a client that left (its time to first token,
  against the same request on an idle server).

Usage: .venv/bin/python -m kame_cli.bench.llm_bench [--sessions 1,2,4,8] [--threads 2]
Prints a table of medians and writes bench/results/llm_bench.json.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from openai import AsyncOpenAI

from kame_cli import llm_server
from kame_cli.bench.oracle_bench import QUESTIONS, ask, median
from kame_cli.bench.paths import RESULTS_DIR
from kame_cli.bench.report import print_table, write_json
from services.oracle.config import ApiKeys, OracleSettings
from services.oracle.factory import SessionFactory
from services.oracle.prompts import gemma_prefix

RESULTS = RESULTS_DIR / "llm_bench.json"
PORT = 18091


def p90(values: list[float]) -> float | None:
    return statistics.quantiles(values, n=10)[-1] if len(values) >= 2 else median(values)


async def concurrent_sessions(
    factory: SessionFactory, sessions: int, words_per_s: float
) -> dict[str, Any]:
    questions = list(QUESTIONS)
    asked = [questions[i % len(questions)] for i in range(sessions)]
    started = time.monotonic()
    runs = await asyncio.gather(*(ask(factory, q, "tandem", words_per_s) for q in asked))
    resets = [r["final_to_reset_s"] for r in runs if r["final_to_reset_s"] is not None]
    dones = [r["final_to_done_s"] for r in runs if r["final_to_done_s"] is not None]
    return {
        "sessions": sessions,
        "wall_s": time.monotonic() - started,
        "median_final_to_reset_s": median(resets),
        "p90_final_to_reset_s": p90(resets),
        "median_final_to_done_s": median(dones),
        "median_ttft_s": median([t for r in runs for t in r["ttft_s"]]),
        "cancellations": sum(r["cancellations"] for r in runs),
        "unanswered": sum(r["final_to_reset_s"] is None for r in runs),
        "correct": sum(r["correct"] for r in runs),
        "errors": [e for r in runs for e in r["errors"]],
        "runs": runs,
    }


def completion(prompt: str, max_tokens: int) -> dict[str, Any]:
    return {
        "model": llm_server.EMBEDDED_ALIAS,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
    }


def unseen_prompt(words: int) -> str:
    """A long prompt no earlier request shares beyond the few-shot prefix."""
    tag = uuid.uuid4().hex
    filler = " ".join(f"note{tag[i % 32]}{i}" for i in range(words))
    return f"{gemma_prefix()}User: {tag} {filler}\nAssistant:"


async def first_token_s(client: AsyncOpenAI, body: dict[str, Any]) -> float:
    """Seconds to the first streamed chunk; the stream is then closed."""
    started = time.monotonic()
    stream = await client.completions.create(stream=True, **body)
    try:
        async for _chunk in stream:
            break
    finally:
        await stream.close()
    return time.monotonic() - started


async def abandon(client: AsyncOpenAI, body: dict[str, Any], when: str) -> None:
    """Send a stream and leave: after 0.1 s (the prompt is still being
    evaluated) or at its first token."""

    async def read() -> None:
        stream = await client.completions.create(stream=True, **body)
        try:
            async for _chunk in stream:
                return
        finally:
            await stream.close()  # closes the connection

    if when == "prefill":
        task = asyncio.create_task(read())
        await asyncio.sleep(0.1)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    else:
        await read()


async def cancellation(url: str, repeats: int, prompt_words: int) -> dict[str, Any]:
    probe = completion(f"{gemma_prefix()}User: What is the capital of Italy?\nAssistant:", 8)
    report: dict[str, list[float]] = {"idle": [], "prefill": [], "decode": []}
    client = AsyncOpenAI(base_url=url, api_key="unused", timeout=120, max_retries=0)
    async with client:
        for _ in range(repeats):
            report["idle"].append(await first_token_s(client, probe))
            for when in ("prefill", "decode"):
                await abandon(client, completion(unseen_prompt(prompt_words), 400), when)
                report[when].append(await first_token_s(client, probe))
                await asyncio.sleep(3)  # let a server that did not stop finish
    return {f"probe_ttft_after_{k}_s": median(v) for k, v in report.items()} | {"raw": report}


async def bench_engine(
    url: str, sessions: list[int], words_per_s: float, args: argparse.Namespace
) -> dict[str, Any]:
    factory = SessionFactory(OracleSettings(base_url=url), ApiKeys(), store=None)
    await factory.warm_up()
    levels = [await concurrent_sessions(factory, n, words_per_s) for n in sessions]
    cancel = await cancellation(url, args.cancel_repeats, args.prompt_words)
    return {"levels": levels, "cancellation": cancel}


def run_engine(engine: str, args: argparse.Namespace) -> dict[str, Any]:
    process = llm_server.launch(
        port=PORT, threads=args.threads, quiet=True, engine=engine, parallel=args.parallel
    )
    url = llm_server.base_url("127.0.0.1", PORT)
    try:
        models = llm_server.wait_ready(url, process)
        llm_server.warm_up(url, models[0])
        sessions = [int(n) for n in args.sessions.split(",")]
        return asyncio.run(bench_engine(url, sessions, args.words_per_s, args))
    finally:
        llm_server.stop(process)


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def print_tables(report: dict[str, Any]) -> None:
    print_table(
        f"{'engine':17} {'sessions':>8} {'final->RESET med':>17} {'p90':>6} "
        f"{'final->DONE med':>16} {'ttft med':>9} {'cancels':>8} {'correct':>8}",
        (
            f"{engine:17} {level['sessions']:>8} "
            f"{fmt(level['median_final_to_reset_s']):>17} "
            f"{fmt(level['p90_final_to_reset_s']):>6} "
            f"{fmt(level['median_final_to_done_s']):>16} "
            f"{fmt(level['median_ttft_s']):>9} {level['cancellations']:>8} "
            f"{level['correct']:>4}/{level['sessions']:<3}"
            for engine, result in report.items()
            for level in result["levels"]
        ),
    )
    print()
    print_table(
        f"{'engine':17} {'probe ttft: idle':>17} {'after prefill cancel':>21} "
        f"{'after decode cancel':>20}",
        (
            f"{engine:17} {fmt(result['cancellation']['probe_ttft_after_idle_s']):>17} "
            f"{fmt(result['cancellation']['probe_ttft_after_prefill_s']):>21} "
            f"{fmt(result['cancellation']['probe_ttft_after_decode_s']):>20}"
            for engine, result in report.items()
        ),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engines", default=",".join(llm_server.ENGINES))
    parser.add_argument("--sessions", default="1,2,4,8", help="concurrent oracle sessions")
    parser.add_argument(
        "--threads", type=int, default=1, help="llama.cpp threads (kame up: half the cores)"
    )
    parser.add_argument(
        "--parallel", type=int, default=llm_server.DEFAULT_PARALLEL, help="llama-server slots"
    )
    parser.add_argument("--words-per-s", type=float, default=2.5, help="speaking rate")
    parser.add_argument("--cancel-repeats", type=int, default=3)
    parser.add_argument(
        "--prompt-words", type=int, default=150, help="length of the abandoned prompts"
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    report = {}
    for engine in args.engines.split(","):
        print(f"llm_bench: {engine} ...", file=sys.stderr, flush=True)
        report[engine] = run_engine(engine, args)
    print_tables(report)
    write_json(
        args.out,
        {
            "machine_note": f"shared 2-core CPU; one run; llama.cpp threads={args.threads}",
            "parallel": args.parallel,
            "words_per_s": args.words_per_s,
            "results": report,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
