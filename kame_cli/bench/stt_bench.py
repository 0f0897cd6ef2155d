"""STT latency at real-time pacing, and how many real-time sessions one replica carries.

For each concurrency level N, N clients stream the same spoken script (piper voice,
four sentences, or the first --sentences, with 1.5 s pauses, --rounds times over)
into one in-process STT server over loopback gRPC, each paced at real time and
started at a random offset. Measured
on the client side:

- partial lag: a partial's arrival minus when the client sent the last frame it covers;
- final lag after end of speech: a final's arrival minus when the client sent the frame
  in which the sentence's speech really ended (includes the endpoint pause, 0.5 s).

A level "fits" while the final lag stays under --limit-s (1 s): the table says the
largest N whose median, and whose p90, do. Also shown: partials per utterance,
partials skipped under load, the mean Whisper decode time (partial/final) and the
machine's load average before and after the level.

    .venv/bin/python -m kame_cli.bench.stt_bench [--sessions 1,2,4,8] [--decode-workers 1]
    .venv/bin/python -m kame_cli.bench.stt_bench --option tiny.en-old   # a --stt-wer option

Writes bench/results/stt.json (or --out).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from prometheus_client import REGISTRY

from kame_cli.bench import stt_wer
from kame_cli.bench.paths import RESULTS_DIR
from kame_cli.bench.report import write_json
from kame_common.audio import FRAME_BYTES, FRAME_SECONDS, SAMPLE_RATE, Samples, float_to_pcm16
from kame_common.voice import load_voice
from kamepb import common_pb2, stt_pb2, stt_pb2_grpc
from services.stt.config import SttSettings
from services.stt.engine import SttEngine
from services.stt.server import serve

SENTENCES = [
    "What is twelve times four?",
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "I would like to book a table for two people at seven tonight.",
    "Can you tell me the weather in Paris tomorrow morning?",
]
GAP_S = 1.5
SKIP_REASONS = ("superseded", "finalized", "output_full")


@dataclass
class Script:
    frames: list[bytes]
    speech_ends_s: list[float]
    duration_s: float


def build_script(rounds: int, sentences: int = len(SENTENCES)) -> Script:
    """The first `sentences` sentences `rounds` times over, with a pause after each."""
    voice = load_voice()
    speeches = [voice.synthesize(text) for text in SENTENCES[:sentences]]
    parts: list[Samples] = [np.zeros(SAMPLE_RATE // 2, dtype=np.float32)]
    ends, position = [], len(parts[0])
    for speech in speeches * rounds:
        loud = np.flatnonzero(np.abs(speech) > 0.01)
        ends.append((position + loud[-1] + 1) / SAMPLE_RATE)
        gap = np.zeros(int(GAP_S * SAMPLE_RATE), dtype=np.float32)
        parts += [speech, gap]
        position += len(speech) + len(gap)
    pcm = float_to_pcm16(np.concatenate(parts))
    pcm += b"\0" * (-len(pcm) % FRAME_BYTES)
    frames = [pcm[i : i + FRAME_BYTES] for i in range(0, len(pcm), FRAME_BYTES)]
    return Script(frames, ends, len(frames) * FRAME_SECONDS)


@dataclass
class ClientResult:
    partial_lags: list[float] = field(default_factory=list)
    final_lags: list[float] = field(default_factory=list)
    partials_per_utterance: list[int] = field(default_factory=list)
    finals: int = 0


async def run_client(
    stub: stt_pb2_grpc.SttAsyncStub, script: Script, name: str, delay_s: float
) -> ClientResult:
    await asyncio.sleep(delay_s)
    sent_at: list[float] = []
    result = ClientResult()

    async def requests() -> AsyncIterator[stt_pb2.TranscribeRequest]:
        yield stt_pb2.TranscribeRequest(config=stt_pb2.SttConfig(session_id=name))
        start = time.monotonic()
        for seq, pcm in enumerate(script.frames):
            await asyncio.sleep(max(0.0, start + seq * FRAME_SECONDS - time.monotonic()))
            sent_at.append(time.monotonic())
            yield stt_pb2.TranscribeRequest(
                audio=common_pb2.AudioFrame(
                    pcm=pcm,
                    sample_rate_hz=SAMPLE_RATE,
                    seq=seq,
                    capture_time_us=time.time_ns() // 1000,
                )
            )

    def sent(stream_s: float) -> float:
        return sent_at[min(int(max(stream_s - 1e-6, 0) / FRAME_SECONDS), len(sent_at) - 1)]

    partials: dict[str, int] = {}
    async for response in stub.Transcribe(requests()):
        now = time.monotonic()
        if not response.HasField("transcript"):
            continue
        event = response.transcript
        if not event.is_final:
            partials[event.utterance_id] = partials.get(event.utterance_id, 0) + 1
            result.partial_lags.append(now - sent(event.span.end_s))
            continue
        result.finals += 1
        result.partials_per_utterance.append(partials.get(event.utterance_id, 0))
        # The sentence whose speech ended inside this final's span.
        ends = [e for e in script.speech_ends_s if event.span.start_s < e <= event.span.end_s]
        if ends:
            result.final_lags.append(now - sent(ends[-1]))
    return result


def percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def decode_totals(kind: str) -> tuple[float, float]:
    """(seconds, count) of the decodes of `kind` so far, from the service's histogram."""
    labels = {"kind": kind}
    return (
        REGISTRY.get_sample_value("kame_stt_decode_seconds_sum", labels) or 0.0,
        REGISTRY.get_sample_value("kame_stt_decode_seconds_count", labels) or 0.0,
    )


def mean_decode_s(before: tuple[float, float], after: tuple[float, float]) -> float | None:
    count = after[1] - before[1]
    return (after[0] - before[0]) / count if count else None


def skipped_partials() -> float:
    return sum(
        REGISTRY.get_sample_value("kame_stt_partials_skipped_total", {"reason": r}) or 0
        for r in SKIP_REASONS
    )


async def run_level(
    stub: stt_pb2_grpc.SttAsyncStub, script: Script, sessions: int, rng: random.Random
) -> dict[str, Any]:
    """N clients at once; the figures pool every utterance of every client."""
    skipped_before = skipped_partials()
    decodes_before = {kind: decode_totals(kind) for kind in ("partial", "final")}
    load_before = os.getloadavg()[0]
    # Random starts within one sentence's length: callers do not speak in lockstep.
    delays = [0.0] + [rng.uniform(0.0, 3.0) for _ in range(sessions - 1)]
    results = await asyncio.gather(
        *(
            run_client(stub, script, f"bench-{sessions}-{i}", delay)
            for i, delay in enumerate(delays)
        )
    )
    partial_lags = [lag for r in results for lag in r.partial_lags]
    final_lags = [lag for r in results for lag in r.final_lags]
    per_utterance = [n for r in results for n in r.partials_per_utterance]
    return {
        "sessions": sessions,
        "utterances": len(script.speech_ends_s) * sessions,
        "finals": sum(r.finals for r in results),
        "partials": len(partial_lags),
        "partials_per_utterance": statistics.mean(per_utterance) if per_utterance else 0.0,
        "partials_skipped": skipped_partials() - skipped_before,
        "partial_lag_median_s": percentile(partial_lags, 50),
        "partial_lag_p90_s": percentile(partial_lags, 90),
        "final_lag_median_s": percentile(final_lags, 50),
        "final_lag_p90_s": percentile(final_lags, 90),
        "mean_decode_s": {
            kind: mean_decode_s(decodes_before[kind], decode_totals(kind))
            for kind in ("partial", "final")
        },
        "load_average_1m": [load_before, os.getloadavg()[0]],
    }


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def print_header() -> None:
    print(
        f"{'sessions':>8} {'finals':>9} {'partials/utt':>12} {'skipped':>8} "
        f"{'partial lag med/p90 (s)':>24} {'final lag med/p90 (s)':>22} "
        f"{'decode (s)':>10} {'load':>10}"
    )


def print_row(row: dict[str, Any]) -> None:
    print(
        f"{row['sessions']:>8} {row['finals']:>4}/{row['utterances']:<4} "
        f"{row['partials_per_utterance']:>12.1f} {row['partials_skipped']:>8.0f} "
        f"{_fmt(row['partial_lag_median_s']):>15} / {_fmt(row['partial_lag_p90_s']):<6} "
        f"{_fmt(row['final_lag_median_s']):>13} / {_fmt(row['final_lag_p90_s']):<6} "
        f"{_fmt(row['mean_decode_s']['partial']):>4}/{_fmt(row['mean_decode_s']['final']):<5} "
        f"{row['load_average_1m'][0]:>4.1f}-{row['load_average_1m'][1]:<4.1f}",
        flush=True,
    )


def fits(rows: list[dict[str, Any]], key: str, limit_s: float) -> int:
    """The largest session count up to which every level kept `key` under the limit."""
    best = 0
    for row in rows:
        if row[key] is None or row[key] > limit_s or row["finals"] < row["utterances"]:
            break
        best = row["sessions"]
    return best


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    flags = {
        "device": args.device,
        "compute_type": args.compute_type,
        "decode_workers": args.decode_workers,
        "cpu_threads": args.cpu_threads,
        "beam_size": args.beam_size,
        "max_batch": args.max_batch,
        "window_pad_s": args.window_pad_s,
    }
    option = stt_wer.select_options(args.option)[0].settings if args.option else {}
    settings = SttSettings(host="127.0.0.1", port=0, metrics_port=0, **(flags | option))
    engine = await asyncio.to_thread(SttEngine, settings)
    script = await asyncio.to_thread(build_script, args.rounds, args.sentences)
    runtime = await serve(settings, engine)
    rows = []
    rng = random.Random(args.seed)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{runtime.port}") as channel:
            stub = stt_pb2_grpc.SttStub(channel)
            print_header()
            for sessions in args.sessions:
                rows.append(await run_level(stub, script, sessions, rng))
                print_row(rows[-1])
                median = rows[-1]["final_lag_median_s"]
                if median is None or median > args.stop_above_s:
                    break  # far past the limit: more sessions only take longer
    finally:
        await runtime.stop()
        engine.close()
    return {
        "bench": "stt",
        "script": {
            "sentences": SENTENCES[: args.sentences],
            "rounds": args.rounds,
            "gap_s": GAP_S,
            "duration_s": script.duration_s,
        },
        "settings": {
            k: getattr(settings, k)
            for k in (
                "model",
                "device",
                "compute_type",
                "decode_workers",
                "cpu_threads",
                "beam_size",
                "max_batch",
                "window_pad_s",
                "pre_roll_s",
                "temperature_fallback",
                "partial_interval_s",
                "endpoint_silence_s",
                "word_timestamps",
            )
        },
        "option": args.option,
        "model_dir": str(engine.model_dir),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
        },
        "limit_s": args.limit_s,
        "levels": rows,
        "max_sessions_median_final_lag_under_limit": fits(rows, "final_lag_median_s", args.limit_s),
        "max_sessions_p90_final_lag_under_limit": fits(rows, "final_lag_p90_s", args.limit_s),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--sessions",
        default="1,2,4,8",
        type=lambda s: [int(n) for n in s.split(",")],
        help="concurrency levels, in increasing order",
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--compute-type", default="")
    parser.add_argument("--decode-workers", type=int, default=1)
    parser.add_argument("--cpu-threads", type=int, default=0)
    parser.add_argument("--beam-size", type=int, default=SttSettings.beam_size)
    parser.add_argument(
        "--max-batch",
        type=int,
        default=SttSettings.max_batch,
        help="utterances one decode may take together (1 = no batching)",
    )
    parser.add_argument(
        "--window-pad-s",
        type=float,
        default=SttSettings.window_pad_s,
        help="silence after the audio in Whisper's window (30 = the full 30 s window)",
    )
    parser.add_argument(
        "--limit-s",
        type=float,
        default=1.0,
        help="final lag after end of speech that still counts as fitting",
    )
    parser.add_argument(
        "--stop-above-s",
        type=float,
        default=3.0,
        help="stop the sweep once the median final lag passes this",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="times each client speaks the sentences (more samples)",
    )
    parser.add_argument(
        "--sentences",
        type=int,
        choices=range(1, len(SENTENCES) + 1),
        default=len(SENTENCES),
        metavar=f"1-{len(SENTENCES)}",
        help="speak only the first N of the script's sentences (a shorter run)",
    )
    parser.add_argument(
        "--option",
        default="",
        help="one of kame bench --stt-wer's options (its settings override the flags above), "
        "e.g. tiny.en-old",
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", default=str(RESULTS_DIR / "stt.json"))
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = asyncio.run(main_async(args))
    limit = report["limit_s"]
    print(
        f"\nreal-time sessions with final lag under {limit:g} s: "
        f"median {report['max_sessions_median_final_lag_under_limit']}, "
        f"p90 {report['max_sessions_p90_final_lag_under_limit']}"
    )
    write_json(Path(args.out), report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
