"""Frontend `tts` engine speed on this machine: synthesis real-time factor and first-audio latency.

    .venv/bin/python -m kame_cli.bench.frontend_tts_bench [--repeats 5] [--sessions 1 4]

1. Synthesis RTF: the piper voice (24 kHz, as the engine uses it) on phrases of
   the sizes the engine cuts (3, 6, 12 words) and a whole answer; median of
   `--repeats` runs.
2. First audio: calls through a real frontend server on loopback, paced at
   real time (80 ms per frame), `--sessions` calls at once. A 3 s question,
   then silence; the turn ends after the default 0.4 s pause (5 frames).
   - tandem: the final transcript and the oracle's answer to it arrive just
     after the caller's last voiced frame, before the turn end (the engine
     synthesizes the first phrase ahead).
   - cascade: the answer arrives on the turn-end frame (nothing ahead).
   Reported: frames from the caller's last voiced frame (the last one above
   the VAD's -50 dBFS; the question lies on digital silence) to the agent's
   first sounding frame, and wall ms from sending the turn-end frame (5 frames
   later) to receiving that agent frame; plus the engine's step time per frame.

Prints a table and writes bench/results/frontend_tts_bench.json. The machine
is shared and noisy: figures are medians.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from kame_cli.bench.paths import RESULTS_DIR
from kame_cli.bench.report import write_json
from kame_common.audio import (
    FRAME_SAMPLES,
    FRAME_SECONDS,
    SAMPLE_RATE,
    Samples,
    float_to_pcm16,
    pcm16_to_float,
    rms_dbfs,
)
from kame_common.voice import load_voice
from kamepb import common_pb2, frontend_pb2, frontend_pb2_grpc
from services.frontend.config import FrontendSettings
from services.frontend.server import serve

PHRASES = {
    "3 words": "Tomorrow in Paris",
    "6 words": "It will be sunny and mild,",
    "12 words": "with a light breeze from the west and clear skies until the evening.",
    "answer (27 words)": (
        "Tomorrow in Paris it will be sunny and mild, with a light breeze from the west "
        "and clear skies until the evening, so take a light jacket."
    ),
}
QUESTION = "Can you tell me what the weather will be like in Paris tomorrow morning?"
ANSWER = "Tomorrow morning in Paris will be sunny and mild, with a light breeze."
TURN_END_FRAMES = 5  # the default 0.4 s pause
VOICED_DB = -50.0  # the VAD's absolute threshold (over digital silence)
SILENT_DB = -60.0  # an agent frame above this carries sound


def synthesis_rtf(repeats: int) -> list[dict[str, Any]]:
    voice = load_voice()
    voice.synthesize("Warm up.")
    rows = []
    for label, text in PHRASES.items():
        seconds, durations = [], []
        for _ in range(repeats):
            started = time.perf_counter()
            audio = voice.synthesize(text)
            seconds.append(time.perf_counter() - started)
            durations.append(len(audio) / SAMPLE_RATE)
        rtfs = [s / d for s, d in zip(seconds, durations, strict=True)]
        rows.append(
            {
                "phrase": label,
                "audio_s": statistics.median(durations),
                "synthesis_ms": 1000 * statistics.median(seconds),
                "rtf": statistics.median(rtfs),
            }
        )
    return rows


def frames_of(signal: Samples) -> list[Samples]:
    count = -(-len(signal) // FRAME_SAMPLES)
    padded = np.zeros(count * FRAME_SAMPLES, dtype=np.float32)
    padded[: len(signal)] = signal
    return list(padded.reshape(count, FRAME_SAMPLES))


async def one_call(
    stub: frontend_pb2_grpc.FrontendAsyncStub,
    caller: list[Samples],
    oracle: dict[int, list[frontend_pb2.FrontendRequest]],
    turn_end: int,
) -> dict[str, Any]:
    sent_at: dict[int, float] = {}

    async def requests() -> AsyncIterator[frontend_pb2.FrontendRequest]:
        yield frontend_pb2.FrontendRequest(
            config=frontend_pb2.FrontendConfig(session_id=f"bench-{uuid.uuid4().hex[:8]}")
        )
        started = time.monotonic()
        for i, frame in enumerate(caller):
            for message in oracle.get(i, []):
                yield message
            sent_at[i] = time.monotonic()
            yield frontend_pb2.FrontendRequest(
                audio=common_pb2.AudioFrame(
                    pcm=float_to_pcm16(frame), sample_rate_hz=SAMPLE_RATE, seq=i
                )
            )
            await asyncio.sleep(max(0.0, started + (i + 1) * FRAME_SECONDS - time.monotonic()))

    first: tuple[int, float] | None = None  # the agent's first audible frame, and when
    steps: list[float] = []
    async for response in stub.Stream(requests()):
        if response.WhichOneof("msg") != "audio":
            continue
        steps.append(response.audio.step_s)
        pcm = pcm16_to_float(response.audio.frame.pcm)
        if first is None and rms_dbfs(pcm) > SILENT_DB:
            first = response.audio.frame.seq, time.monotonic()
    if first is None:
        raise RuntimeError("the agent never spoke")
    first_audio, first_audio_at = first
    return {
        "first_audio_frame": first_audio,
        "latency_ms": 1000 * (first_audio_at - sent_at[turn_end]),
        "steps": steps,
    }


async def first_audio(repeats: int, session_counts: list[int]) -> list[dict[str, Any]]:
    voice = load_voice()
    question = voice.synthesize(QUESTION)
    lead = 6
    caller = frames_of(
        np.concatenate(
            [
                np.zeros(lead * FRAME_SAMPLES, np.float32),
                question,
                np.zeros(round(2.0 * SAMPLE_RATE), np.float32),
            ]
        )
    )
    voiced = [i for i, f in enumerate(frames_of(question)) if rms_dbfs(f) >= VOICED_DB]
    speech_end = lead + voiced[-1]
    turn_end = speech_end + TURN_END_FRAMES
    # What the gateway relays: stt's final transcript of the question (here as soon
    # as the speech ends), then the oracle's RESET carrying the answer and the
    # transcript it answers; the engine speaks only an answer to what was said.
    final = common_pb2.TranscriptEvent(
        utterance_id="u1",
        is_final=True,
        text=QUESTION,
        span=common_pb2.AudioSpan(start_s=0.0, end_s=(speech_end + 1) * FRAME_SECONDS),
    )
    source = common_pb2.CandidateSource(utterance_id="u1", is_final=True, text=QUESTION)
    answer = [
        frontend_pb2.FrontendRequest(user_transcript=final),
        frontend_pb2.FrontendRequest(
            oracle=common_pb2.OracleUpdate(
                op=common_pb2.OracleUpdate.RESET, generation=1, text=ANSWER, source=source
            )
        ),
    ]
    scenarios = {"tandem": {speech_end + 1: answer}, "cascade": {turn_end: answer}}
    settings = FrontendSettings(
        host="127.0.0.1",
        port=0,
        metrics_port=0,
        batch_slots=max(session_counts),
        replica_id=f"bench-{os.getpid()}",
    )
    runtime = await serve(settings)
    rows = []
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{runtime.port}") as channel:
            stub = frontend_pb2_grpc.FrontendStub(channel)
            for mode, oracle in scenarios.items():
                for sessions in session_counts:
                    calls = []
                    for _ in range(repeats):
                        calls += await asyncio.gather(
                            *[one_call(stub, caller, oracle, turn_end) for _ in range(sessions)]
                        )
                    frames = [c["first_audio_frame"] - speech_end for c in calls]
                    steps = sorted(s for c in calls for s in c["steps"])
                    rows.append(
                        {
                            "mode": mode,
                            "sessions": sessions,
                            "calls": len(calls),
                            "frames_after_speech_median": statistics.median(frames),
                            "frames_after_speech_max": max(frames),
                            "latency_after_turn_end_ms_median": statistics.median(
                                c["latency_ms"] for c in calls
                            ),
                            "latency_after_turn_end_ms_max": max(c["latency_ms"] for c in calls),
                            "step_ms_median": 1000 * statistics.median(steps),
                            "step_ms_p99": 1000 * steps[int(0.99 * (len(steps) - 1))],
                        }
                    )
    finally:
        await runtime.stop()
    return rows


def print_tables(rtf_rows: list[dict[str, Any]], latency_rows: list[dict[str, Any]]) -> None:
    print("\nSynthesis (piper joe medium, resampled to 24 kHz)")
    print(f"{'phrase':<20}{'audio s':>9}{'synth ms':>10}{'RTF':>8}")
    for row in rtf_rows:
        print(
            f"{row['phrase']:<20}{row['audio_s']:>9.2f}{row['synthesis_ms']:>10.1f}"
            f"{row['rtf']:>8.3f}"
        )
    print("\nFirst agent audio (the turn ends after 5 frames of pause = 0.4 s)")
    print(
        f"{'mode':<9}{'sessions':>9}{'calls':>7}{'frames after voice':>21}"
        f"{'ms after turn end':>19}{'step ms p50/p99':>17}"
    )
    for row in latency_rows:
        frames = f"{row['frames_after_speech_median']:.0f} (max {row['frames_after_speech_max']})"
        latency = (
            f"{row['latency_after_turn_end_ms_median']:.0f} "
            f"(max {row['latency_after_turn_end_ms_max']:.0f})"
        )
        steps = f"{row['step_ms_median']:.2f}/{row['step_ms_p99']:.2f}"
        print(
            f"{row['mode']:<9}{row['sessions']:>9}{row['calls']:>7}{frames:>21}{latency:>19}"
            f"{steps:>17}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "frontend_tts_bench.json")
    args = parser.parse_args()
    rtf_rows = synthesis_rtf(args.repeats)
    latency_rows = asyncio.run(first_audio(args.repeats, args.sessions))
    print_tables(rtf_rows, latency_rows)
    write_json(
        args.out,
        {
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
            "synthesis": rtf_rows,
            "first_audio": latency_rows,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
