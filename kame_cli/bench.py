"""`kame bench`: tandem vs cascade vs s2s on the same spoken questions, through
the whole local stack (gateway, frontend, stt, oracle, LLM server, Redis) at
real time.

Runs. A run is a mode (the gateway's oracle policy) on a frontend engine.
Without --checkpoint: tandem and cascade on the tts engine. With one, also
tandem on kame ("tandem-kame") and s2s on moshi. A frontend replica serves one
engine, so the runs are grouped by engine and each group gets its own `kame up`
stack (`kame_cli.stack.Stack` on free ports, with its own Redis server so that
the frontend registry holds only this stack's replica). Inside a group every
question is asked once per run before the next question starts, the run order
flipping from one question to the next (ABBA), so slow drift on a shared
machine favours no run. Each stack first answers --warmup conversations that
are not recorded.

A conversation is `kame talk` (`kame_cli.talk.talk`): the question streamed at
real time in 80 ms chunks, then silence until the agent has answered and been
quiet for --tail-s. Measured per conversation:

- response latency: the caller's end of speech (measured on the WAV) -> the
  first agent audio at the client; negative when the agent started first;
- oracle first update: the first transcript event (partial, or the final if
  there was no partial) -> the first oracle update, both as the client saw them;
- STT final lag: the final transcript's `lag_s` (emission minus arrival of the
  last frame it covers, as the stt service measures it);
- frame lag (client): agent frame k received minus the moment caller frame k
  was due (its last sample spoken); a frame is late above --late-ms;
- per-frame timings from the services' histograms, the difference of two
  scrapes of /metrics around the conversation (the services hand per-frame
  figures to clients only through their metrics; quantiles are interpolated
  inside buckets, as Prometheus does): frontend step time
  (kame_frontend_step_seconds), gateway frame round trip
  (kame_gateway_frame_round_trip_seconds) and transport overhead per frame,
  the round trip minus the frontend's step time for the same frame
  (kame_gateway_frame_transport_seconds);
- correct: after the stacks stopped (so that it steals no CPU from them), the
  agent's audio is transcribed with the stt engine and every expected keyword
  must be heard (a keyword may list alternatives: "eight|8").

Load: --load 1,4,8 runs N concurrent sessions of one run (arrivals spread
over the first second) and reports late frames and per-frame timings.

Outputs in --out-dir: NAME.json (everything), NAME.md (tables, the machine and
the exact command), NAME.png (latency distributions, frame timings, load and an
annotated timeline of the first question in every run) and NAME_timeline.png
(`kame talk`'s timeline of one conversation). Scratch files (question and
answer WAVs, service logs) go to --out-dir/tmp/NAME/.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import math
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client.parser import text_string_to_metric_families
from tqdm import tqdm

from kame_cli import say, talk
from kame_cli.stack import Ports, Stack, StackError, StackOptions, free_ports
from kame_common.audio import FRAME_SECONDS, SAMPLE_RATE, resample

BUILTIN_QUESTIONS = (
    ("What is the capital of France?", ("paris",)),
    ("Who wrote Romeo and Juliet?", ("shakespeare",)),
    ("How many legs does a spider have?", ("eight|8",)),
    ("What is the largest planet in the solar system?", ("jupiter",)),
    ("Who painted the Mona Lisa?", ("leonardo|vinci",)),
    ("What is the capital of Japan?", ("tokyo",)),
)
CHUNK_MS = 80  # one internal frame per chunk, so client chunk k is gateway frame k
STEP_METRIC = "kame_frontend_step_seconds"
ROUND_TRIP_METRIC = "kame_gateway_frame_round_trip_seconds"
TRANSPORT_METRIC = "kame_gateway_frame_transport_seconds"
LOAD_SPREAD_S = 1.0
PACKAGES = (
    "grpcio",
    "faster-whisper",
    "ctranslate2",
    "llama_cpp_python",
    "piper-tts",
    "moshi",
    "torch",
    "redis",
)


# ---- questions and runs ---------------------------------------------------------------------


@dataclass(frozen=True)
class Question:
    text: str
    keywords: tuple[str, ...]
    audio: np.ndarray = field(repr=False, compare=False)  # float32 at 24 kHz
    source: str = ""  # the WAV it came from, or "piper"

    @property
    def speech_end_s(self) -> float | None:
        return talk.speech_region(self.audio)[1]


@dataclass(frozen=True)
class Run:
    label: str
    mode: str  # tandem, cascade or s2s
    engine: str  # the frontend engine: tts, kame or moshi


def plan_runs(checkpoint: str) -> list[Run]:
    runs = [Run("tandem", "tandem", "tts"), Run("cascade", "cascade", "tts")]
    if checkpoint:
        runs += [Run("tandem-kame", "tandem", "kame"), Run("s2s", "s2s", "moshi")]
    return runs


def select_runs(planned: list[Run], wanted: str) -> list[Run]:
    if not wanted:
        return planned
    by_label = {run.label: run for run in planned}
    labels = [label.strip() for label in wanted.split(",") if label.strip()]
    unknown = [label for label in labels if label not in by_label]
    if unknown:
        raise ValueError(
            f"--runs: unknown run(s) {', '.join(unknown)}; with these options the "
            f"runs are {', '.join(by_label)} (kame and s2s need --checkpoint)"
        )
    return [by_label[label] for label in labels]


def load_questions(path: Path | None) -> list[Question]:
    """The built-in questions, or a JSON list of {"wav": FILE or "text": TEXT,
    "keywords": [...]} (WAV paths relative to the JSON file; a text without
    a WAV is spoken by the piper voice)."""
    if path is None:
        return [
            Question(text, keywords, say.synthesize(text), "piper")
            for text, keywords in BUILTIN_QUESTIONS
        ]
    entries = json.loads(path.read_text())
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{path}: expected a non-empty JSON list of questions")
    questions = []
    for index, entry in enumerate(entries):
        keywords = entry.get("keywords") if isinstance(entry, dict) else None
        if not keywords or not isinstance(keywords, list):
            raise ValueError(f'{path}: question {index} needs a non-empty "keywords" list')
        if entry.get("wav"):
            wav = (path.parent / entry["wav"]).resolve()
            samples, rate = talk.read_wav(wav)
            audio, source = resample(samples, rate, SAMPLE_RATE), str(wav)
        elif entry.get("text"):
            audio, source = say.synthesize(entry["text"]), "piper"
        else:
            raise ValueError(f'{path}: question {index} needs "wav" or "text"')
        questions.append(
            Question(entry.get("text", Path(source).stem), tuple(keywords), audio, source)
        )
    return questions


def heard(transcript: str, keywords: tuple[str, ...]) -> bool:
    """Every keyword (each may list alternatives, "eight|8") is a word of the transcript."""
    words = set(re.findall(r"[a-z0-9']+", transcript.lower()))
    return all(any(alt.strip().lower() in words for alt in kw.split("|")) for kw in keywords)


# ---- Prometheus histograms ------------------------------------------------------------------


@dataclass
class Histogram:
    """Cumulative bucket counts (upper bound -> count), as /metrics exposes them."""

    buckets: dict[float, float] = field(default_factory=dict)
    total: float = 0.0
    count: float = 0.0

    def __sub__(self, earlier: Histogram) -> Histogram:
        return Histogram(
            {
                bound: value - earlier.buckets.get(bound, 0.0)
                for bound, value in self.buckets.items()
            },
            self.total - earlier.total,
            self.count - earlier.count,
        )

    def __add__(self, other: Histogram) -> Histogram:
        bounds = set(self.buckets) | set(other.buckets)
        return Histogram(
            {b: self.buckets.get(b, 0.0) + other.buckets.get(b, 0.0) for b in bounds},
            self.total + other.total,
            self.count + other.count,
        )

    def quantile(self, q: float) -> float | None:
        """Prometheus' histogram_quantile: linear inside the bucket that holds rank q."""
        if self.count <= 0:
            return None
        rank = q * self.count
        lower, below = 0.0, 0.0
        for bound in sorted(self.buckets):
            cumulative = self.buckets[bound]
            if cumulative >= rank:
                if math.isinf(bound):
                    return lower  # beyond the last finite bucket: its bound is all we know
                if cumulative == below:
                    return bound
                return lower + (bound - lower) * (rank - below) / (cumulative - below)
            lower, below = bound, cumulative
        return lower


def parse_histogram(text: str, name: str, labels: dict[str, str]) -> Histogram:
    """The histogram `name` summed over the series whose labels include `labels`."""
    histogram = Histogram()
    for family in text_string_to_metric_families(text):
        if family.name != name:
            continue
        for sample in family.samples:
            if any(sample.labels.get(key) != value for key, value in labels.items()):
                continue
            if sample.name.endswith("_bucket"):
                bound = float(sample.labels["le"])
                histogram.buckets[bound] = histogram.buckets.get(bound, 0.0) + sample.value
            elif sample.name.endswith("_sum"):
                histogram.total += sample.value
            elif sample.name.endswith("_count"):
                histogram.count += sample.value
    return histogram


@dataclass
class FrameTimes:
    """Per-frame histograms of one stretch of the bench (deltas of two scrapes)."""

    step: Histogram = field(default_factory=Histogram)
    round_trip: Histogram = field(default_factory=Histogram)
    transport: Histogram = field(default_factory=Histogram)

    KINDS = ("step", "round_trip", "transport")

    def __add__(self, other: FrameTimes) -> FrameTimes:
        return FrameTimes(*(getattr(self, k) + getattr(other, k) for k in self.KINDS))

    def __sub__(self, earlier: FrameTimes) -> FrameTimes:
        return FrameTimes(*(getattr(self, k) - getattr(earlier, k) for k in self.KINDS))

    def summary(self) -> dict[str, float | None]:
        """p50 and p99 of each kind: step_p50_s, ..., transport_p99_s."""
        return {
            f"{kind}_{tag}_s": _round(getattr(self, kind).quantile(q), 5)
            for kind in self.KINDS
            for q, tag in ((0.5, "p50"), (0.99, "p99"))
        }


class MetricsProbe:
    """Scrapes the frontend's and gateway's /metrics of one stack."""

    def __init__(self, ports: Ports, run: Run) -> None:
        self.frontend_url = f"http://127.0.0.1:{ports.frontend_metrics}/metrics"
        self.gateway_url = f"http://127.0.0.1:{ports.gateway_metrics}/metrics"
        self.run = run

    @staticmethod
    def _get(url: str) -> str:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.read().decode()

    async def snapshot(self) -> FrameTimes:
        frontend, gateway = await asyncio.gather(
            asyncio.to_thread(self._get, self.frontend_url),
            asyncio.to_thread(self._get, self.gateway_url),
        )
        mode = {"mode": self.run.mode}
        return FrameTimes(
            parse_histogram(frontend, STEP_METRIC, {"engine": self.run.engine}),
            parse_histogram(gateway, ROUND_TRIP_METRIC, mode),
            parse_histogram(gateway, TRANSPORT_METRIC, mode),
        )


# ---- one conversation ---------------------------------------------------------------------


def frame_lags(result: talk.TalkResult) -> np.ndarray:
    """Per agent frame: arrival at the client minus the moment its caller frame was due."""
    arrivals = np.array([times[0] for times in result.agent_t if len(times)])
    return arrivals - (np.arange(len(arrivals)) + 1) * FRAME_SECONDS


def first_time(events: list[dict], types: tuple[str, ...]) -> float | None:
    return next((e["t"] for e in events if e["type"] in types), None)


def timeline_marks(result: talk.TalkResult) -> dict[str, Any]:
    """The moments the annotated timeline shows (seconds from the stream start)."""
    events = result.events
    spans, start = [], None
    for event in events:
        if event["type"] == "agent_audio_start":
            start = event["t"]
        elif event["type"] == "agent_audio_stop" and start is not None:
            spans.append([start, event["t"]])
            start = None
    if start is not None:
        spans.append([start, round(len(result.agent_t) * FRAME_SECONDS, 3)])
    return {
        "speech_start_s": result.speech_start_s,
        "speech_end_s": result.speech_end_s,
        "first_transcript_t": first_time(events, ("user_partial", "user_final")),
        "final_t": first_time(events, ("user_final",)),
        "first_oracle_t": first_time(events, ("oracle_reset", "oracle_append")),
        "agent_spans": spans,
    }


def agent_speech(result: talk.TalkResult) -> np.ndarray:
    """The agent's audio from its first speaking frame to its last (plus a frame
    either side), so that whisper does not transcribe minutes of silence."""
    seqs = [e["seq"] for e in result.events if e["type"].startswith("agent_audio_")]
    if not seqs:
        return np.zeros(0, np.float32)
    first = max(0, (min(seqs) - 1) * int(FRAME_SECONDS * SAMPLE_RATE))
    last = (max(seqs) + 2) * int(FRAME_SECONDS * SAMPLE_RATE)
    return result.agent[first:last]


def conversation_record(
    question_index: int, question: Question, run: Run, result: talk.TalkResult, late_s: float
) -> dict[str, Any]:
    events = result.events
    first_transcript = first_time(events, ("user_partial", "user_final"))
    first_oracle = first_time(events, ("oracle_reset", "oracle_append"))
    final = next((e for e in events if e["type"] == "user_final"), None)
    turn = result.turns[0] if result.turns else {}
    return {
        "question": question_index,
        "text": question.text,
        "run": run.label,
        "mode": run.mode,
        "engine": result.started.get("engine", run.engine),
        "session_id": result.started.get("session_id", ""),
        "status": result.status,
        "status_details": result.status_details,
        "response_latency_s": _round(result.response_latency_s),
        "gateway_response_latency_s": _round(turn.get("response_latency_s")),
        "oracle_first_update_s": _round(first_oracle - first_transcript)
        if first_oracle is not None and first_transcript is not None
        else None,
        "stt_final_lag_s": _round(final["lag_s"]) if final else None,
        "final_after_speech_end_s": _round(final["t"] - result.speech_end_s)
        if final and result.speech_end_s is not None
        else None,
        "user_transcript": result.user_transcript,
        "agent_text": result.agent_text,
        "text_correct": heard(result.agent_text, question.keywords),
        **frame_lag_stats(frame_lags(result), late_s),
        "notices": result.notices,
        "timeline": timeline_marks(result),
        "events": [e for e in events if e["type"] != "started"],
    }


def frame_lag_stats(lags: np.ndarray, late_s: float) -> dict[str, Any]:
    return {
        "frames": len(lags),
        "late_frames": int(np.sum(lags > late_s)),
        "late_fraction": _round(float(np.mean(lags > late_s))) if len(lags) else None,
        "frame_lag_p50_s": _round(_percentile(lags, 50)),
        "frame_lag_p99_s": _round(_percentile(lags, 99)),
    }


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(float(value), digits)


def _percentile(values: Any, q: float) -> float | None:
    values = [v for v in values if v is not None]
    return float(np.percentile(values, q)) if len(values) else None


# ---- the bench ----------------------------------------------------------------------------


class BenchStack(Stack):
    """`kame up`'s stack, with enough frontend slots for the largest load level."""

    def __init__(self, options: StackOptions, frontend_slots: int) -> None:
        super().__init__(options)
        self.frontend_slots = frontend_slots

    def service_env(self, service: str) -> dict[str, str]:
        env = super().service_env(service)
        if service == "frontend":
            env["KAME_FRONTEND_BATCH_SLOTS"] = str(self.frontend_slots)
        return env


@dataclass
class Captured:
    """A finished conversation: its record, and the audio kept for transcription."""

    record: dict[str, Any]
    keywords: tuple[str, ...]
    agent_audio: np.ndarray
    lags: np.ndarray  # frame lags at the client
    frame_times: FrameTimes = field(default_factory=FrameTimes)
    result: talk.TalkResult | None = None


class Bench:
    def __init__(
        self,
        args: argparse.Namespace,
        questions: list[Question],
        runs: list[Run],
        load_run: Run | None,
    ) -> None:
        self.args = args
        self.questions = questions
        self.runs = runs
        self.load_run = load_run
        self.scratch = args.out_dir / "tmp" / args.name
        self.captured: list[Captured] = []
        self.load_levels: list[dict[str, Any]] = []
        self.load_captured: list[Captured] = []
        self.failures: list[dict[str, str]] = []
        total = (
            args.warmup * len(self.groups())
            + len(questions) * len(runs) * args.repeats
            + (sum(args.load) if load_run else 0)
        )
        self.progress = tqdm(total=total, unit="call", desc="kame bench", dynamic_ncols=True)

    def groups(self) -> dict[str, list[Run]]:
        """Runs by frontend engine (one stack each), in plan order."""
        groups: dict[str, list[Run]] = {}
        for run in self.runs + ([self.load_run] if self.load_run else []):
            if run not in groups.setdefault(run.engine, []):
                groups[run.engine].append(run)
        return groups

    def stack_options(self, engine: str) -> StackOptions:
        args = self.args
        redis_port = free_ports(1)[0]  # a free port: the stack starts its own Redis there
        ports = Ports.free(redis=redis_port)
        return StackOptions(
            ports=ports,
            frontend_engine=engine,
            checkpoint=args.checkpoint if engine != "tts" else "",
            device=args.device,
            redis_url=args.redis_url,
            llm_base_url=args.llm_base_url,
            llm_backend=args.llm_backend,
            llm_model=args.llm_model,
            startup_timeout_s=args.startup_timeout_s,
            log_dir=self.scratch / f"logs-{engine}",
        )

    def talk_options(self, gateway: str, run: Run) -> talk.TalkOptions:
        return talk.TalkOptions(
            gateway=gateway,
            mode=run.mode,
            chunk_ms=CHUNK_MS,
            tail_s=self.args.tail_s,
            max_wait_s=self.args.max_wait_s,
            oracle_updates=True,
        )

    async def run(self) -> None:
        """Every group on its own stack; a stack that fails costs its group only
        (recorded in `failures`), the other groups still run."""
        for engine, runs in self.groups().items():
            stack = BenchStack(self.stack_options(engine), max([4, *self.args.load]))
            self.progress.write(
                f"kame bench: starting the stack for engine {engine} (logs in {stack.log_dir}) ..."
            )
            try:
                await asyncio.to_thread(stack.start)
                await self.run_group(stack, [r for r in runs if r in self.runs])
                if self.load_run in runs:
                    for sessions in self.args.load:
                        await self.run_load(stack, self.load_run, sessions)
            except StackError as exc:
                self.progress.write(f"kame bench: the {engine} stack failed: {exc}")
                self.failures.append({"engine": engine, "error": str(exc)})
            finally:
                await asyncio.to_thread(stack.stop)

    async def run_group(self, stack: Stack, runs: list[Run]) -> None:
        if not runs:
            return
        for index in range(self.args.warmup):
            question = self.questions[index % len(self.questions)]
            self.progress.set_postfix_str(f"warm-up {runs[0].label}")
            await talk.talk(question.audio, self.talk_options(stack.gateway_address, runs[0]))
            self.progress.update()
        order = list(runs)
        for repeat in range(self.args.repeats):
            for index, question in enumerate(self.questions):
                for run in order:
                    self.progress.set_postfix_str(f"{run.label} q{index + 1} r{repeat + 1}")
                    captured = await self.converse(stack, run, index, question)
                    captured.record["repeat"] = repeat
                    self.captured.append(captured)
                    self.progress.update()
                order.reverse()  # ABBA: no run always goes first

    async def converse(self, stack: Stack, run: Run, index: int, question: Question) -> Captured:
        probe = MetricsProbe(stack.ports, run)
        before = await probe.snapshot()
        result = await talk.talk(question.audio, self.talk_options(stack.gateway_address, run))
        frames = await probe.snapshot() - before
        stack.check()
        record = conversation_record(index, question, run, result, self.args.late_ms / 1000)
        record.update(frames.summary())
        return Captured(
            record, question.keywords, agent_speech(result), frame_lags(result), frames, result
        )

    async def run_load(self, stack: Stack, run: Run, sessions: int) -> None:
        """`sessions` conversations at once, arrivals spread over LOAD_SPREAD_S."""
        self.progress.set_postfix_str(f"load {run.label} x{sessions}")
        probe = MetricsProbe(stack.ports, run)
        before = await probe.snapshot()

        async def one(slot: int) -> tuple[int, talk.TalkResult]:
            await asyncio.sleep(LOAD_SPREAD_S * slot / sessions)
            index = slot % len(self.questions)
            return index, await talk.talk(
                self.questions[index].audio, self.talk_options(stack.gateway_address, run)
            )

        results = await asyncio.gather(*(one(slot) for slot in range(sessions)))
        frames = await probe.snapshot() - before
        stack.check()
        late_s = self.args.late_ms / 1000
        records = []
        for index, result in results:
            record = conversation_record(index, self.questions[index], run, result, late_s)
            record["load"] = sessions  # per-frame histograms: per level, below
            self.load_captured.append(
                Captured(
                    record, self.questions[index].keywords, agent_speech(result), frame_lags(result)
                )
            )
            records.append(record)
        lags = np.concatenate([frame_lags(result) for _, result in results])
        latencies = [r["response_latency_s"] for r in records]
        self.load_levels.append(
            {
                "sessions": sessions,
                "run": run.label,
                "ok": sum(r["status"] == "OK" for r in records),
                "statuses": sorted({r["status"] for r in records}),
                **frame_lag_stats(lags, late_s),
                **frames.summary(),
                "response_latency_median_s": _round(_percentile(latencies, 50)),
                "response_latency_p90_s": _round(_percentile(latencies, 90)),
                "text_correct": sum(r["text_correct"] for r in records),
            }
        )
        self.progress.update(sessions)

    def transcribe(self) -> None:
        """Whisper (the stt engine) on every agent answer; sets `agent_transcript`
        and `correct`. Runs after the stacks stopped."""
        from services.stt.config import SttSettings
        from services.stt.engine import SttEngine

        everything = self.captured + self.load_captured
        engine = SttEngine(SttSettings(cpu_threads=os.cpu_count() or 1))
        try:
            for captured in tqdm(
                everything, unit="answer", desc="transcribing answers", dynamic_ncols=True
            ):
                text = (
                    engine.transcribe_clip(captured.agent_audio)
                    if len(captured.agent_audio)
                    else ""
                )
                captured.record["agent_transcript"] = text
                captured.record["correct"] = heard(text, captured.keywords)
        finally:
            engine.close()
        for level in self.load_levels:
            mine = [c.record for c in self.load_captured if c.record["load"] == level["sessions"]]
            level["correct"] = sum(r["correct"] for r in mine)

    def save_answers(self) -> None:
        for captured in self.captured:
            record = captured.record
            name = f"{record['run']}-q{record['question'] + 1}-r{record['repeat'] + 1}.wav"
            say.write_wav(self.scratch / name, captured.agent_audio, SAMPLE_RATE)


# ---- summary, report and plot ------------------------------------------------------------


def summarize(
    captured: list[Captured], runs: list[Run], late_s: float
) -> dict[str, dict[str, Any]]:
    """Median and p90 per run over its conversations; p50/p99 of the pooled frames."""
    summary = {}
    for run in runs:
        records = [c.record for c in captured if c.record["run"] == run.label]
        if not records:
            continue
        row: dict[str, Any] = {
            "mode": run.mode,
            "engine": run.engine,
            "conversations": len(records),
            "ok": sum(r["status"] == "OK" for r in records),
        }
        for key in (
            "response_latency_s",
            "oracle_first_update_s",
            "stt_final_lag_s",
            "final_after_speech_end_s",
        ):
            values = [r[key] for r in records]
            row[key] = {
                "median": _round(_percentile(values, 50)),
                "p90": _round(_percentile(values, 90)),
                "n": sum(v is not None for v in values),
            }
        mine = [c for c in captured if c.record["run"] == run.label]
        row.update(sum((c.frame_times for c in mine), FrameTimes()).summary())
        row.update(frame_lag_stats(np.concatenate([c.lags for c in mine]), late_s))
        row["correct"] = sum(bool(r.get("correct")) for r in records)
        row["text_correct"] = sum(r["text_correct"] for r in records)
        summary[run.label] = row
    return summary


def machine_description() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        names = re.findall(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
        cpu = names[0] if names else cpu
    memory_gib = None
    with contextlib.suppress(OSError, ValueError, AttributeError):
        memory_gib = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    gpu = "none"
    if shutil.which("nvidia-smi"):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            gpu = (
                subprocess.run(
                    ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                    capture_output=True,
                    text=True,
                    timeout=10,
                ).stdout.strip()
                or gpu
            )
    versions = {}
    for package in PACKAGES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[package] = metadata.version(package)
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": memory_gib,
        "gpu": gpu,
        "os": platform.platform(),
        "python": platform.python_version(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "packages": versions,
    }


def models_description(args: argparse.Namespace) -> dict[str, str]:
    return {
        "stt": "faster-whisper, Whisper tiny.en int8 (embedded)",
        "llm": args.llm_base_url or "Gemma 3 270M Q4_K_M on llama.cpp (embedded, kame llm-server)",
        "tts": "piper, joe voice (embedded)",
        "kame/moshi checkpoint": args.checkpoint or "none",
    }


def _fmt(value: float | None, scale: float = 1.0, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value * scale:.{digits}f}"


def _late(row: dict[str, Any]) -> str:
    return f"{row['late_frames']} ({_fmt(row['late_fraction'], 100, 1)}%)"


def _pair(stats: dict[str, Any]) -> str:
    return f"{_fmt(stats['median'])} / {_fmt(stats['p90'])}"


def render_markdown(report: dict[str, Any]) -> str:
    summary, machine = report["summary"], report["machine"]
    lines = [
        f"# kame bench: {report['name']}",
        "",
        f"- command: `{report['command']}`",
        f"- date: {report['started_at']}, {report['duration_s']:.0f} s",
        f"- machine: {machine['cpu']}, {machine['cores']} cores, {machine['memory_gib']} GiB, "
        f"GPU: {machine['gpu']}; {machine['os']}, Python {machine['python']}; load average at "
        f"start {machine['load_average']} (a shared machine: figures are noisy, quote medians)",
        "- models: " + "; ".join(f"{k}: {v}" for k, v in report["models"].items()),
        f"- inputs: {len(report['questions'])} questions x {report['settings']['repeats']} "
        f"repeat(s), the same audio in every run, runs alternating per question",
        "",
        "## Per run (seconds: median / p90 over conversations; frames in ms: p50 / p99)",
        "",
        "| run | engine | ok | response latency | vs tandem | oracle 1st update | "
        "STT final lag | step ms | transport ms | frame lag p99 ms | late frames | "
        "correct (audio / text) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    reference = summary.get("tandem", {}).get("response_latency_s", {}).get("median")
    for label, row in summary.items():
        median = row["response_latency_s"]["median"]
        ratio = f"{median / reference:.2f}x" if reference and median is not None else "n/a"
        lines.append(
            f"| {label} | {row['engine']} | {row['ok']}/{row['conversations']} | "
            f"{_pair(row['response_latency_s'])} | {ratio} | "
            f"{_pair(row['oracle_first_update_s'])} | {_pair(row['stt_final_lag_s'])} | "
            f"{_fmt(row['step_p50_s'], 1e3, 1)} / {_fmt(row['step_p99_s'], 1e3, 1)} | "
            f"{_fmt(row['transport_p50_s'], 1e3, 1)} / {_fmt(row['transport_p99_s'], 1e3, 1)} | "
            f"{_fmt(row['frame_lag_p99_s'], 1e3, 0)} | {_late(row)} | "
            f"{row['correct']} / {row['text_correct']} of {row['conversations']} |"
        )
    lines += [
        "",
        "## Per question (response latency s, correct)",
        "",
        "| question | " + " | ".join(summary) + " |",
        "|---|" + "---|" * len(summary),
    ]
    for index, question in enumerate(report["questions"]):
        cells = []
        for label in summary:
            mine = [
                r for r in report["conversations"] if r["run"] == label and r["question"] == index
            ]
            cells.append(
                ", ".join(
                    f"{_fmt(r['response_latency_s'])} {'ok' if r.get('correct') else 'wrong'}"
                    for r in mine
                )
            )
        lines.append(f"| {question['text']} | " + " | ".join(cells) + " |")
    if report["load"]:
        lines += [
            "",
            f"## Load ({report['load'][0]['run']}; late = agent frame more than "
            f"{report['settings']['late_ms']:g} ms after its caller frame was due)",
            "",
            "| sessions | ok | frames | late | frame lag p50 / p99 ms | step p50 / p99 ms | "
            "transport p50 / p99 ms | response latency median / p90 s | "
            "correct (audio / text) |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for level in report["load"]:
            lines.append(
                f"| {level['sessions']} | {level['ok']} | {level['frames']} | "
                f"{_late(level)} | "
                f"{_fmt(level['frame_lag_p50_s'], 1e3, 0)} / "
                f"{_fmt(level['frame_lag_p99_s'], 1e3, 0)} | "
                f"{_fmt(level['step_p50_s'], 1e3, 1)} / {_fmt(level['step_p99_s'], 1e3, 1)} | "
                f"{_fmt(level['transport_p50_s'], 1e3, 1)} / "
                f"{_fmt(level['transport_p99_s'], 1e3, 1)} | "
                f"{_fmt(level['response_latency_median_s'])} / "
                f"{_fmt(level['response_latency_p90_s'])} | "
                f"{level['correct']} / {level['text_correct']} of {level['sessions']} |"
            )
    for failure in report["failures"]:
        error = failure["error"].splitlines()
        lines += [
            "",
            f"**Missing: the {failure['engine']} runs; their stack failed:** "
            f"{error[0]} ... {error[-1]}",
        ]
    lines += [
        "",
        "Definitions: the docstring of kame_cli/bench.py. Step and transport "
        "(gateway frame round trip minus the frontend's step time, per frame) come "
        "from the services' histograms, interpolated inside buckets.",
        "",
    ]
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary, records = report["summary"], report["conversations"]
    labels = list(summary)
    fig = plt.figure(figsize=(14, 13))
    grid = fig.add_gridspec(3, 2, height_ratios=[1, 1, 1.2])
    _plot_distribution(fig.add_subplot(grid[0, 0]), labels, records)
    _plot_components(fig.add_subplot(grid[0, 1]), labels, summary)
    _plot_frames(fig.add_subplot(grid[1, 0]), labels, summary)
    _plot_load(fig.add_subplot(grid[1, 1]), report["load"])
    _plot_timelines(fig.add_subplot(grid[2, :]), labels, records)
    machine = report["machine"]
    fig.suptitle(
        f"kame bench: {machine['cpu']}, {machine['cores']} cores, GPU {machine['gpu']}"
        f"\n{report['command']}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_distribution(axis: Any, labels: list[str], records: list[dict]) -> None:
    data = [
        [
            r["response_latency_s"]
            for r in records
            if r["run"] == label and r["response_latency_s"] is not None
        ]
        for label in labels
    ]
    axis.boxplot([d or [np.nan] for d in data], tick_labels=labels, showfliers=False)
    for position, values in enumerate(data, start=1):
        jitter = np.linspace(-0.12, 0.12, len(values)) if len(values) > 1 else 0.0
        axis.scatter(position + np.zeros(len(values)) + jitter, values, s=18, alpha=0.7, zorder=3)
    axis.axhline(0, color="gray", lw=0.8, ls=":")
    axis.set_ylabel("seconds")
    axis.set_title("response latency (end of speech -> first agent audio at the client)")


def _plot_components(axis: Any, labels: list[str], summary: dict[str, dict]) -> None:
    keys = (
        ("response_latency_s", "response latency"),
        ("oracle_first_update_s", "oracle 1st update after 1st transcript"),
        ("stt_final_lag_s", "STT final lag"),
    )
    width = 0.8 / len(keys)
    for offset, (key, name) in enumerate(keys):
        medians = [summary[label][key]["median"] or 0.0 for label in labels]
        p90s = [summary[label][key]["p90"] or 0.0 for label in labels]
        positions = np.arange(len(labels)) + (offset - (len(keys) - 1) / 2) * width
        axis.bar(
            positions,
            medians,
            width,
            label=name,
            yerr=[np.zeros(len(labels)), np.maximum(0, np.subtract(p90s, medians))],
            capsize=3,
        )
    axis.set_xticks(np.arange(len(labels)), labels)
    axis.set_ylabel("seconds (bar: median, whisker: p90)")
    axis.set_title("latency breakdown per run")
    axis.legend(fontsize=8)


def _plot_frames(axis: Any, labels: list[str], summary: dict[str, dict]) -> None:
    keys = (
        ("step", "frontend step"),
        ("transport", "transport"),
        ("round_trip", "gateway round trip"),
    )
    width = 0.8 / len(keys)
    for offset, (key, name) in enumerate(keys):
        p50 = [max(summary[label][f"{key}_p50_s"] or 0.0, 1e-5) * 1e3 for label in labels]
        p99 = [max(summary[label][f"{key}_p99_s"] or 0.0, 1e-5) * 1e3 for label in labels]
        positions = np.arange(len(labels)) + (offset - (len(keys) - 1) / 2) * width
        axis.bar(
            positions,
            p50,
            width,
            label=name,
            yerr=[np.zeros(len(labels)), np.maximum(0, np.subtract(p99, p50))],
            capsize=3,
        )
    axis.axhline(FRAME_SECONDS * 1e3, color="red", lw=0.8, ls="--", label="80 ms frame")
    axis.set_yscale("log")  # p50 is often a fraction of a millisecond, p99 tens of them
    axis.set_xticks(np.arange(len(labels)), labels)
    axis.set_ylabel("ms, log scale (bar: p50, whisker: p99)")
    axis.set_title("per-frame timings")
    axis.legend(fontsize=8)


def _plot_load(axis: Any, levels: list[dict]) -> None:
    axis.set_title("load: concurrent sessions" + (f" ({levels[0]['run']})" if levels else ""))
    if not levels:
        axis.text(0.5, 0.5, "no load run", ha="center", transform=axis.transAxes)
        return
    positions = np.arange(len(levels))  # evenly spaced: levels are often 1, 8, 32
    for key, marker, name in (
        ("frame_lag_p99_s", "o-", "client frame lag p99"),
        ("transport_p99_s", "s-", "transport p99"),
        ("step_p99_s", "^-", "frontend step p99"),
    ):
        axis.plot(positions, [(level[key] or 0.0) * 1e3 for level in levels], marker, label=name)
    axis.set_xticks(positions, [str(level["sessions"]) for level in levels])
    axis.set_xlabel("sessions")
    axis.set_ylabel("ms")
    late = axis.twinx()
    late.bar(
        positions,
        [100 * (level["late_fraction"] or 0.0) for level in levels],
        alpha=0.25,
        color="tab:red",
        width=0.4,
        label="late frames (%)",
    )
    late.set_ylabel("late frames (%)")
    axis.legend(loc="upper left", fontsize=8)
    late.legend(loc="upper right", fontsize=8)


def _plot_timelines(axis: Any, labels: list[str], records: list[dict]) -> None:
    """The first question in every run, one lane per run, with its milestones."""
    axis.set_title("the first question in every run (annotated timeline)")
    shown: set[str] = set()

    def once(name: str) -> str | None:  # one legend entry per kind of mark
        if name in shown:
            return None
        shown.add(name)
        return name

    for lane, label in enumerate(labels):
        record = next((r for r in records if r["run"] == label and r["question"] == 0), None)
        if record is None:
            continue
        marks, y = record["timeline"], len(labels) - 1 - lane
        if marks["speech_start_s"] is not None:
            axis.barh(
                y + 0.18,
                marks["speech_end_s"] - marks["speech_start_s"],
                0.3,
                left=marks["speech_start_s"],
                color="tab:blue",
                alpha=0.5,
                label=once("caller speech"),
            )
            axis.text(
                marks["speech_start_s"],
                y + 0.38,
                f'"{record["user_transcript"]}"',
                fontsize=8,
                color="tab:blue",
            )
        for start, stop in marks["agent_spans"]:
            axis.barh(
                y - 0.18,
                stop - start,
                0.3,
                left=start,
                color="tab:green",
                alpha=0.6,
                label=once("agent audio"),
            )
        if marks["agent_spans"]:
            axis.text(
                marks["agent_spans"][0][0],
                y - 0.45,
                f'"{record["agent_text"][:70]}"',
                fontsize=8,
                color="tab:green",
            )
        for key, marker, color, name in (
            ("first_transcript_t", "v", "gray", "first transcript"),
            ("final_t", "D", "black", "final transcript"),
            ("first_oracle_t", "*", "tab:red", "first oracle update"),
        ):
            if marks[key] is not None:
                axis.plot(marks[key], y + 0.18, marker, color=color, ms=9, label=once(name))
        latency = record["response_latency_s"]
        if latency is not None and marks["speech_end_s"] is not None:
            end = marks["speech_end_s"]
            axis.annotate(
                "",
                (end + latency, y - 0.02),
                (end, y - 0.02),
                arrowprops={"arrowstyle": "->", "color": "tab:purple"},
            )
            axis.text(
                end + latency / 2,
                y + 0.02,
                f"response latency {latency:.2f} s",
                ha="center",
                fontsize=8,
                color="tab:purple",
            )
    axis.set_yticks(range(len(labels)), list(reversed(labels)))
    axis.set_ylim(-0.7, len(labels) - 0.3)
    axis.set_xlim(left=0)
    axis.set_xlabel("seconds since the stream started")
    axis.legend(loc="upper right", fontsize=8, ncol=3)


# ---- CLI ------------------------------------------------------------------------------------


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
    parser.add_argument(
        "--questions",
        type=Path,
        default=None,
        help='JSON list of {"wav": FILE or "text": TEXT, "keywords": [...]} '
        "(default: six built-in questions spoken by the piper voice)",
    )
    parser.add_argument(
        "--runs",
        default="",
        help="comma-separated subset of the runs (tandem, cascade, tandem-kame, "
        "s2s); default: every run the options allow",
    )
    parser.add_argument("--repeats", type=int, default=1, help="times each question is asked")
    parser.add_argument(
        "--warmup", type=int, default=1, help="unrecorded conversations per stack before measuring"
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


def _load_run(args: argparse.Namespace, planned: list[Run]) -> Run | None:
    if not args.load:
        return None
    label = args.load_run or ("tandem-kame" if args.checkpoint else "tandem")
    return select_runs(planned, label)[0]


def invoked_command() -> str:
    """This process's command line, as the user typed it (`kame bench ...`)."""
    program = Path(sys.argv[0]).name
    prefix = ["python", "-m", "kame_cli"] if program == "__main__.py" else [program]
    return shlex.join([*prefix, *sys.argv[1:]])


def run(args: argparse.Namespace) -> int:
    command = invoked_command()
    started_at = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    if args.repeats < 1 or args.warmup < 0:
        print("kame bench: --repeats must be >= 1 and --warmup >= 0", file=sys.stderr)
        return 2
    if args.checkpoint and not Path(args.checkpoint).exists():
        print(f"kame bench: --checkpoint {args.checkpoint} does not exist", file=sys.stderr)
        return 2
    try:
        planned = plan_runs(args.checkpoint)
        runs, load_run = select_runs(planned, args.runs), _load_run(args, planned)
        print("kame bench: speaking the questions with the piper voice ...", flush=True)
        questions = load_questions(args.questions)
    except (ValueError, OSError) as exc:
        print(f"kame bench: {exc}", file=sys.stderr)
        return 2
    machine = machine_description()
    began = time.monotonic()
    bench = Bench(args, questions, runs, load_run)
    try:
        asyncio.run(bench.run())
    finally:
        bench.progress.close()
    if not bench.captured:
        print("kame bench: no conversation ran; see the errors above", file=sys.stderr)
        return 1
    duration = time.monotonic() - began
    bench.transcribe()
    bench.save_answers()
    machine["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    report = {
        "name": args.name,
        "command": command,
        "started_at": started_at,
        "duration_s": round(duration, 1),
        "machine": machine,
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
        "questions": [
            {
                "text": q.text,
                "keywords": list(q.keywords),
                "source": q.source,
                "duration_s": round(len(q.audio) / SAMPLE_RATE, 3),
                "speech_end_s": q.speech_end_s,
            }
            for q in questions
        ],
        "runs": [vars(r) for r in runs],
        "summary": summarize(bench.captured, runs, args.late_ms / 1000),
        "conversations": [c.record for c in bench.captured],
        "load": bench.load_levels,
        "load_conversations": [c.record for c in bench.load_captured],
        "failures": bench.failures,
    }
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
    print(markdown)
    print(
        f"kame bench: wrote {stem}.json, .md, .png and {args.name}_timeline.png; "
        f"answers and logs in {bench.scratch}"
    )
    for failure in bench.failures:
        print(
            f"kame bench: the {failure['engine']} runs are missing: {failure['error']}",
            file=sys.stderr,
        )
    return 1 if bench.failures else 0
