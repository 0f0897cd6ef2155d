"""Oracle benchmark: tandem vs cascade on the embedded LLM (llama.cpp + Gemma 3 270M).

Each question is "spoken" as word-by-word partial transcripts at a speaking
rate (default 2.5 words/s), then the final. The oracle engine runs with the
reference policy (tandem) or finals only (cascade), and we measure:

- ttft_s: LLM stream start -> first non-blank chunk (every stream);
- final_to_reset_s: final transcript -> RESET of the stream that answers it
  (0 when the final was kept: the stream in flight or just finished was
  started from the same words, and its RESET came before the final);
  final_to_done_s likewise to that stream's DONE;
- kept: finals that started no new stream, for that reason;
- words_at_final: words of oracle text the front-end already holds when the
  final arrives (what tandem gains: the answer is under way before the caller
  stops);
- starts / cancellations per question, decode tokens/s, and whether the answer
  names the expected fact.

Usage: .venv/bin/python -m kame_cli.bench.oracle_bench [--threads 1] [--base-url URL]
Prints a table of medians and writes bench/results/oracle_bench.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import time
import uuid
from typing import Any

from prometheus_client import REGISTRY

from kame_cli import llm_server
from kame_cli.bench.paths import RESULTS_DIR
from kame_cli.bench.report import print_table, write_json
from kamepb import common_pb2, oracle_pb2
from services.oracle.config import ApiKeys, OracleSettings
from services.oracle.factory import SessionFactory

Event = oracle_pb2.OracleEvent
Update = common_pb2.OracleUpdate
QUESTIONS = {
    "What is the capital of France?": ("paris",),
    "Who wrote Romeo and Juliet?": ("shakespeare",),
    "How many legs does a spider have?": ("eight", "8"),
    "What is the largest planet in the solar system?": ("jupiter",),
    "Who painted the Mona Lisa?": ("leonardo", "vinci"),
    "What is the capital of Japan?": ("tokyo",),
}
RESULTS = RESULTS_DIR / "oracle_bench.json"


def finals_kept() -> float:
    return REGISTRY.get_sample_value("kame_oracle_finals_kept_total") or 0.0


def decode_rate_totals() -> tuple[float, float]:
    labels = {"backend": "openai"}
    return (
        REGISTRY.get_sample_value("kame_oracle_tokens_per_second_sum", labels) or 0.0,
        REGISTRY.get_sample_value("kame_oracle_tokens_per_second_count", labels) or 0.0,
    )


async def ask(
    factory: SessionFactory, question: str, policy: str, words_per_s: float
) -> dict[str, Any]:
    session = await factory.open(
        oracle_pb2.OracleConfig(
            session_id=f"bench-{uuid.uuid4().hex[:8]}", policy=oracle_pb2.OraclePolicy(name=policy)
        )
    )
    timeline: list[tuple[float, oracle_pb2.GuideResponse]] = []
    final_answered = asyncio.Event()
    final_at: float | None = None  # when the final went in
    kept = False  # whether the final kept the stream under way

    def final_generation() -> int | None:
        """The stream that answers the final: the one it started (the first start
        after it), or the latest one before it if the final kept that one."""
        assert final_at is not None
        starts = [
            (t, r.event.generation)
            for t, r in timeline
            if r.HasField("event") and r.event.kind == Event.REQUEST_START
        ]
        if kept:
            return max((g for t, g in starts if t < final_at), default=None)
        return next((g for t, g in starts if t >= final_at), None)

    def finished(generation: int | None) -> bool:
        return generation is not None and any(
            r.HasField("event")
            and r.event.generation == generation
            and r.event.kind in (Event.DONE, Event.ERROR, Event.CANCELLED)
            for _t, r in timeline
        )

    async def collect() -> None:
        async for response in session.responses():
            timeline.append((time.monotonic(), response))
            if final_at is not None and finished(final_generation()):
                final_answered.set()

    collector = asyncio.create_task(collect())
    words = question.split()
    for count in range(1, len(words) + 1):
        session.user_transcript(
            common_pb2.TranscriptEvent(utterance_id="u1", text=" ".join(words[:count]))
        )
        await asyncio.sleep(1 / words_per_s)
    kept_before = finals_kept()
    # No await from here until `kept` is set: collect() sees both or neither.
    final_at = time.monotonic()
    session.user_transcript(
        common_pb2.TranscriptEvent(utterance_id="u1", is_final=True, text=question)
    )
    kept = finals_kept() > kept_before  # decided as the final arrived

    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(final_answered.wait(), 60)
    await session.close()
    await collector
    return summarize(question, timeline, final_at, final_generation(), kept)


def summarize(
    question: str,
    timeline: list[tuple[float, oracle_pb2.GuideResponse]],
    final_at: float,
    generation: int | None,
    kept: bool,
) -> dict[str, Any]:
    events = [(t, r.event) for t, r in timeline if r.HasField("event")]
    updates = [(t, r.update) for t, r in timeline if r.HasField("update")]
    starts = {e.generation: t for t, e in events if e.kind == Event.REQUEST_START}
    firsts = {e.generation: t for t, e in events if e.kind == Event.FIRST_TOKEN}
    held = [u for t, u in updates if t <= final_at]
    current = max((u.generation for u in held if u.op == Update.RESET), default=None)
    # A candidate's words: its RESET's first words, then its APPENDs.
    answer = " ".join(u.text for _t, u in updates if u.generation == generation)
    reset_at = next(
        (t for t, u in updates if u.op == Update.RESET and u.generation == generation), None
    )
    done_at = next(
        (t for t, e in events if e.kind == Event.DONE and e.generation == generation), None
    )
    return {
        "question": question,
        "answer": answer,
        "correct": any(k in answer.lower() for k in QUESTIONS[question]),
        "ttft_s": [firsts[g] - starts[g] for g in firsts if g in starts],
        "final_to_reset_s": None if reset_at is None else max(0.0, reset_at - final_at),
        "final_to_done_s": None if done_at is None else max(0.0, done_at - final_at),
        "kept": kept,
        "words_at_final": sum(len(u.text.split()) for u in held if u.generation == current),
        "starts": len(starts),
        "cancellations": sum(e.kind == Event.CANCELLED for _t, e in events),
        "errors": [e.detail for _t, e in events if e.kind == Event.ERROR],
    }


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


async def bench(base_url: str, rounds: int, words_per_s: float) -> dict[str, Any]:
    factory = SessionFactory(OracleSettings(base_url=base_url), ApiKeys(), store=None)
    # As the oracle service does at start: the first request evaluates the few-shot
    # prefix, later ones reuse it (kame_cli/bench/llm_cold_start.py measures the cold call).
    await factory.warm_up()
    report = {}
    for policy in ("tandem", "cascade"):
        rate_sum, rate_count = decode_rate_totals()
        runs = [
            await ask(factory, q, policy, words_per_s) for _ in range(rounds) for q in QUESTIONS
        ]
        rate_sum2, rate_count2 = decode_rate_totals()
        resets = [r["final_to_reset_s"] for r in runs if r["final_to_reset_s"] is not None]
        report[policy] = {
            "runs": runs,
            "median_ttft_s": median([t for r in runs for t in r["ttft_s"]]),
            "median_final_to_reset_s": median(resets),
            "median_words_at_final": median([r["words_at_final"] for r in runs]),
            "mean_starts": statistics.mean(r["starts"] for r in runs),
            "mean_cancellations": statistics.mean(r["cancellations"] for r in runs),
            "kept": sum(r["kept"] for r in runs),
            "tokens_per_s": (
                (rate_sum2 - rate_sum) / (rate_count2 - rate_count)
                if rate_count2 > rate_count
                else None
            ),
            "correct": sum(r["correct"] for r in runs),
            "total": len(runs),
        }
    return report


def fmt(value: float | None, pattern: str = "{:.3f}") -> str:
    return "-" if value is None else pattern.format(value)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--base-url",
        default="",
        help="an OpenAI-compatible server to use (default: start the embedded one)",
    )
    parser.add_argument("--threads", type=int, default=1, help="llama.cpp threads if started here")
    parser.add_argument("--rounds", type=int, default=2, help="passes over the questions")
    parser.add_argument("--words-per-s", type=float, default=2.5, help="speaking rate")
    args = parser.parse_args()
    process = None
    base_url = args.base_url
    if not base_url:
        port = 18090
        process = llm_server.launch(port=port, threads=args.threads, quiet=True)
        base_url = llm_server.base_url("127.0.0.1", port)
        llm_server.wait_ready(base_url, process)
    try:
        report = asyncio.run(bench(base_url, args.rounds, args.words_per_s))
    finally:
        if process is not None:
            llm_server.stop(process)
    print_table(
        f"{'policy':8} {'ttft_s':>8} {'final->RESET_s':>15} {'words@final':>12} "
        f"{'starts':>7} {'cancels':>8} {'kept':>5} {'tok/s':>7} {'correct':>8}",
        (
            f"{policy:8} {fmt(row['median_ttft_s']):>8} "
            f"{fmt(row['median_final_to_reset_s']):>15} "
            f"{fmt(row['median_words_at_final'], '{:.1f}'):>12} "
            f"{row['mean_starts']:>7.1f} {row['mean_cancellations']:>8.1f} {row['kept']:>5} "
            f"{fmt(row['tokens_per_s'], '{:.1f}'):>7} {row['correct']:>4}/{row['total']:<3}"
            for policy, row in report.items()
        ),
    )
    write_json(
        RESULTS,
        {
            "machine_note": f"shared 2-core CPU; medians; llama.cpp threads={args.threads}",
            "words_per_s": args.words_per_s,
            "rounds": args.rounds,
            "results": report,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
