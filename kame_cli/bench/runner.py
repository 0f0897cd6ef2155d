"""The runner: every question through every run, stack by stack, at real time.

Each stack first answers its cold call: the first call it ever serves (the
first question, on the group's first run), recorded apart from the measured
calls. Then --warmup unrecorded calls, then the measured ones: every question
is asked once per run before the next question starts, the run order flipping
from one question to the next (ABBA), so slow drift on a shared machine
favours no run. Then the load levels, if this stack serves the load run.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from tqdm import tqdm

from kame_cli import say, talk
from kame_cli.bench.config import BenchConfig
from kame_cli.bench.conversation import (
    agent_speech,
    conversation_record,
    frame_lag_stats,
    frame_lags,
)
from kame_cli.bench.metrics import FrameTimes, MetricsProbe
from kame_cli.bench.questions import Question, heard
from kame_cli.bench.runs import Run
from kame_cli.bench.stacks import BenchStack, engine_stack, group_by_engine
from kame_cli.bench.stats import percentile, rounded
from kame_cli.child import StackError
from kame_cli.stack import Stack
from kame_common.audio import SAMPLE_RATE, Samples

CHUNK_MS = 80  # one internal frame per chunk, so client chunk k is gateway frame k
LOAD_SPREAD_S = 1.0


@dataclass
class Captured:
    """A finished conversation: its record, and the audio kept for transcription."""

    record: dict[str, Any]
    keywords: tuple[str, ...]
    agent_audio: Samples
    lags: npt.NDArray[np.float64]  # frame lags at the client
    frame_times: FrameTimes = field(default_factory=FrameTimes)
    result: talk.TalkResult | None = None


class Bench:
    def __init__(
        self,
        config: BenchConfig,
        questions: list[Question],
        runs: list[Run],
        load_run: Run | None,
    ) -> None:
        self.config = config
        self.questions = questions
        self.runs = runs
        self.load_run = load_run
        self.scratch = config.scratch
        self.captured: list[Captured] = []
        self.cold: list[Captured] = []
        self.load_levels: list[dict[str, Any]] = []
        self.load_captured: list[Captured] = []
        self.failures: list[dict[str, str]] = []
        total = (
            (1 + config.warmup) * len(self.groups())
            + len(questions) * len(runs) * config.repeats
            + (sum(config.load) if load_run else 0)
        )
        self.progress = tqdm(total=total, unit="call", desc="kame bench", dynamic_ncols=True)

    def groups(self) -> dict[str, list[Run]]:
        return group_by_engine(self.runs + ([self.load_run] if self.load_run else []))

    def talk_options(self, gateway: str, run: Run) -> talk.TalkOptions:
        return talk.TalkOptions(
            gateway=gateway,
            mode=run.mode,
            chunk_ms=CHUNK_MS,
            tail_s=self.config.tail_s,
            max_wait_s=self.config.max_wait_s,
            oracle_updates=True,  # coherence compares the agent's words with them
            wait_for_answer=run.has_oracle,  # a hold phrase alone does not end the call
        )

    async def run(self) -> None:
        """Every group on its own stack; a stack that fails costs its group only
        (recorded in `failures`), the other groups still run."""
        for engine, runs in self.groups().items():
            stack = engine_stack(self.config, engine)
            self.progress.write(
                f"kame bench: starting the stack for engine {engine} (logs in {stack.log_dir}) ..."
            )
            try:
                await asyncio.to_thread(stack.start)
                await self.warm_up(stack, runs[0])
                await self.run_group(stack, [r for r in runs if r in self.runs])
                if self.load_run in runs:
                    for sessions in self.config.load:
                        await self.run_load(stack, self.load_run, sessions)
            except StackError as exc:
                self.progress.write(f"kame bench: the {engine} stack failed: {exc}")
                self.failures.append({"engine": engine, "error": str(exc)})
            finally:
                await asyncio.to_thread(stack.stop)

    async def warm_up(self, stack: BenchStack, run: Run) -> None:
        """The stack's cold call (recorded apart), then --warmup unrecorded calls."""
        self.progress.set_postfix_str(f"cold call {run.label}")
        captured = await self.converse(stack, run, 0, self.questions[0])
        captured.record.update(cold=True, repeat=None)
        self.cold.append(captured)
        self.progress.update()
        for index in range(self.config.warmup):
            question = self.questions[index % len(self.questions)]
            self.progress.set_postfix_str(f"warm-up {run.label}")
            await talk.talk(question.audio, self.talk_options(stack.gateway_address, run))
            self.progress.update()

    async def run_group(self, stack: Stack, runs: list[Run]) -> None:
        order = list(runs)
        for repeat in range(self.config.repeats):
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
        record = conversation_record(index, question, run, result, self.config.late_s)
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
        late_s = self.config.late_s
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
        answers = [r["answer_latency_s"] for r in records]
        self.load_levels.append(
            {
                "sessions": sessions,
                "run": run.label,
                "ok": sum(r["status"] == "OK" for r in records),
                "refused": sum(r["status"] == "RESOURCE_EXHAUSTED" for r in records),
                "statuses": sorted({r["status"] for r in records}),
                **frame_lag_stats(lags, late_s),
                **frames.summary(),
                "response_latency_median_s": rounded(percentile(latencies, 50)),
                "response_latency_p90_s": rounded(percentile(latencies, 90)),
                "answer_latency_median_s": rounded(percentile(answers, 50)),
                "answer_latency_p90_s": rounded(percentile(answers, 90)),
                "coherent": sum(r["coherent"] is True for r in records),
                "text_correct": sum(r["text_correct"] for r in records),
                # When the refused calls were told to call again.
                "retry_after_s": sorted(
                    r["retry_after_s"] for r in records if r["retry_after_s"] is not None
                ),
            }
        )
        self.progress.update(sessions)

    def transcribe(self) -> None:
        """Whisper (the stt engine) on every agent answer; sets `agent_transcript`
        and `correct`. Runs after the stacks stopped, so it steals no CPU from them."""
        from services.stt.config import SttSettings
        from services.stt.engine import SttEngine

        everything = self.cold + self.captured + self.load_captured
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
        for captured in self.cold + self.captured:
            record = captured.record
            repeat = "cold" if record["cold"] else f"r{record['repeat'] + 1}"
            name = f"{record['run']}-q{record['question'] + 1}-{repeat}.wav"
            say.write_wav(self.scratch / name, captured.agent_audio, SAMPLE_RATE)
