"""Realtime endpoint bench: what the OpenAI Realtime endpoint (the web service's
/v1/realtime) adds to a conversation's latency, against `kame talk`'s own
client path (kame_client/caller.py, straight to Gateway.Converse), on the same
WAVs in one run of one stack.

Each question (piper's built-in ones and the espeak-ng set, bench/questions/)
is asked once each way, the two in alternating order. Both callers stream the
WAV as a microphone does, 80 ms at a time at real time, then silence until
the agent has answered:
- `kame talk`: kame_client.caller.talk;
- Realtime: the official `openai` SDK (`AsyncOpenAI(base_url=...)
  .realtime.connect`), input_audio_buffer.append every 80 ms.
Per call, on the caller's clock, from the end of the question's speech
(measured on the WAV):
- first audio: to the agent's first audio after the caller began (talk: its
  first speaking chunk; Realtime: the first response.output_audio.delta);
- answer: to the agent's word that completes the question's keywords (talk:
  agent_text events; Realtime: response.output_audio_transcript.delta).
The endpoint's cost is the median of the per-question differences (Realtime
minus talk); issue #31 bounds it at 15 ms for first audio.

    .venv/bin/python -m kame_cli.bench.realtime_bench [--piper 4] [--espeak 4]

Starts `kame up`'s stack (its own Redis, free ports; the web service is one
of its children, as deployed), prints a table and writes
bench/results/realtime_bench.json (or --out).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import platform
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from openai import AsyncOpenAI

from kame_cli.bench.paths import ESPEAK_QUESTIONS, RESULTS_DIR
from kame_cli.bench.questions import Question, heard, load_questions
from kame_cli.bench.report import print_table, write_json
from kame_cli.bench.stacks import BenchStack
from kame_cli.stack_options import Ports, add_arguments, free_ports, options_from_args
from kame_client.caller import TalkOptions, speech_region, talk
from kame_client.events import AgentText
from kame_common.audio import SAMPLE_RATE, float_to_pcm16

OUT = RESULTS_DIR / "realtime_bench.json"
CHUNK_S = 0.08  # what each caller sends at a time (kame talk's default chunk)
MAX_WAIT_S = 25.0  # after the question, for the answer
TAIL_S = 1.0  # kame talk: quiet after the answer before it hangs up
BOUND_S = 0.015  # issue #31: what the endpoint may add at the median


@dataclass
class Call:
    """One question asked one way: latencies from the end of its speech, seconds."""

    way: str  # "talk" or "realtime"
    first_audio_s: float | None
    answer_s: float | None
    said: str  # the agent's words


@dataclass
class Clock:
    """Seconds since the caller began streaming, and the question's speech on it."""

    speech_start_s: float
    speech_end_s: float
    t0: float = 0.0

    def now(self) -> float:
        return time.monotonic() - self.t0


def answer_time(words: list[tuple[float, str]], keywords: tuple[str, ...]) -> float | None:
    """When the words said so far first hold every keyword."""
    said = ""
    for t, text in words:
        said += " " + text
        if heard(said, keywords):
            return t
    return None


async def ask_talk(question: Question, gateway: str, mode: str) -> Call:
    options = TalkOptions(
        gateway=gateway,
        mode=mode,
        chunk_ms=round(CHUNK_S * 1000),
        wait_for_answer=True,
        max_wait_s=MAX_WAIT_S,
        tail_s=TAIL_S,
        oracle_updates=False,
    )
    result = await talk(question.audio, options)
    start, end = result.speech_start_s or 0.0, result.speech_end_s or 0.0
    words = [(said.t, said.event.text) for said in result.of(AgentText) if said.t > start]
    answer_t = answer_time(words, question.keywords)
    return Call(
        "talk",
        result.response_latency_s,
        None if answer_t is None else answer_t - end,
        result.agent_text,
    )


async def ask_realtime(question: Question, base_url: str, mode: str) -> Call:
    start, end = speech_region(question.audio)
    clock = Clock(start or 0.0, end or 0.0)
    client = AsyncOpenAI(base_url=base_url, api_key="bench")
    async with client.realtime.connect(model=f"kame-{mode}") as connection:
        await connection.recv()  # session.created
        clock.t0 = time.monotonic()
        append = connection.input_audio_buffer.append
        sender = asyncio.ensure_future(stream(append, question, clock))
        try:
            return await listen(connection, question, clock)
        finally:
            sender.cancel()


async def stream(append: Callable[..., Awaitable[None]], question: Question, clock: Clock) -> None:
    """The question, then silence, 80 ms at a time at real time (a microphone), each
    chunk to `append(audio=BASE64)`: a protocol's append of caller audio."""
    pcm = float_to_pcm16(question.audio)
    step = int(CHUNK_S * SAMPLE_RATE) * 2
    index = 0
    while True:
        chunk = pcm[index * step : (index + 1) * step]
        chunk += bytes(step - len(chunk))
        await asyncio.sleep(max(0.0, (index + 1) * CHUNK_S - clock.now()))
        await append(audio=base64.b64encode(chunk).decode())
        index += 1


async def listen(connection: Any, question: Question, clock: Clock) -> Call:
    """The agent's audio and words until its words answer the question (or time runs out)."""
    first_audio_t: float | None = None
    words: list[tuple[float, str]] = []
    deadline_s = clock.speech_end_s + MAX_WAIT_S
    try:
        async with asyncio.timeout(deadline_s - clock.now()):
            async for event in connection:
                t = clock.now()
                if t <= clock.speech_start_s:
                    continue
                if event.type == "response.output_audio.delta" and first_audio_t is None:
                    first_audio_t = t
                elif event.type == "response.output_audio_transcript.delta":
                    words.append((t, event.delta))
                    if answer_time(words, question.keywords) is not None:
                        break
    except TimeoutError:
        pass
    answer_t = answer_time(words, question.keywords)
    return Call(
        "realtime",
        None if first_audio_t is None else first_audio_t - clock.speech_end_s,
        None if answer_t is None else answer_t - clock.speech_end_s,
        "".join(text for _, text in words).strip(),
    )


async def run(
    questions: list[Question], gateway: str, web_url: str, mode: str
) -> list[dict[str, Any]]:
    base_url = web_url.rstrip("/") + "/v1"
    print("realtime bench: a warm-up question each way ...", flush=True)
    await ask_talk(questions[0], gateway, mode)
    await ask_realtime(questions[0], base_url, mode)
    rows = []
    for index, question in enumerate(questions):
        ways = [ask_talk(question, gateway, mode), ask_realtime(question, base_url, mode)]
        if index % 2:
            ways.reverse()
        calls = [await way for way in ways]
        by_way = {call.way: call for call in calls}
        rows.append(
            {
                "question": question.text,
                "source": Path(question.source).name,
                **{way: asdict(call) for way, call in by_way.items()},
            }
        )
        talk_call, realtime_call = by_way["talk"], by_way["realtime"]
        print(
            f"  {question.text}: first audio {ms(talk_call.first_audio_s)} / "
            f"{ms(realtime_call.first_audio_s)} ms, answer {ms(talk_call.answer_s)} / "
            f"{ms(realtime_call.answer_s)} ms (talk / realtime)",
            flush=True,
        )
    return rows


def summary(rows: list[dict[str, Any]], way: str = "realtime") -> dict[str, Any]:
    """Medians per way, and the median of each question's difference (`way` minus talk)."""
    result: dict[str, Any] = {}
    for kind in ("first_audio_s", "answer_s"):
        talk_values = [row["talk"][kind] for row in rows]
        way_values = [row[way][kind] for row in rows]
        paired = [r - t for t, r in zip(talk_values, way_values, strict=True) if None not in (t, r)]
        result[kind] = {
            "talk_median": median(talk_values),
            f"{way}_median": median(way_values),
            "added_median": median(paired),
            "added_all": [round(d, 4) for d in paired],
            "pairs": len(paired),
        }
    added = result["first_audio_s"]["added_median"]
    result["first_audio_within_bound"] = added is not None and added <= BOUND_S
    return result


def median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 4) if present else None


def ms(value: float | None) -> str:
    return "-" if value is None else str(round(value * 1000))  # no "-0"


def print_summary(
    result: dict[str, Any], way: str = "realtime", endpoint: str = "Realtime endpoint"
) -> None:
    print()
    print_table(
        "| latency from the end of the question | kame talk, median ms "
        f"| {endpoint}, median ms | added by the endpoint, median ms (pairs) |",
        [
            f"| {name} | {ms(result[kind]['talk_median'])} | "
            f"{ms(result[kind][f'{way}_median'])} | "
            f"{ms(result[kind]['added_median'])} ({result[kind]['pairs']}) |"
            for name, kind in (("first audio", "first_audio_s"), ("answer", "answer_s"))
        ],
    )
    bound = "within" if result["first_audio_within_bound"] else "NOT within"
    print(f"first audio: {bound} the {BOUND_S * 1000:.0f} ms bound at the median")


def parse_args(
    description: str, out: Path, modes: tuple[str, ...] = ("tandem", "cascade", "s2s")
) -> argparse.Namespace:
    """An endpoint bench's flags (this one's and live_bench's)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--piper", type=int, default=4, help="built-in piper questions to ask")
    parser.add_argument("--espeak", type=int, default=4, help="espeak-ng questions to ask")
    parser.add_argument("--mode", default="tandem", choices=modes)
    parser.add_argument("--out", type=Path, default=out)
    add_arguments(parser)  # kame up's stack options (engine, checkpoint, LLM, ...)
    return parser.parse_args()


def questions_and_stack(args: argparse.Namespace, name: str) -> tuple[list[Question], BenchStack]:
    """The questions `args` asks for, and `kame up`'s stack to ask them of (its own
    Redis, free ports: beside any other stack), not started yet."""
    questions = load_questions(None)[: args.piper] + load_questions(ESPEAK_QUESTIONS)[: args.espeak]
    ports = Ports.free(redis=free_ports(1)[0])
    options = options_from_args(args, ports, args.frontend_engine, args.log_dir)
    stack = BenchStack(options, frontend_slots=2)  # the last call may still hold one
    print(f"{name}: starting the stack (logs in {stack.log_dir}) ...", flush=True)
    return questions, stack


def main() -> None:
    args = parse_args(__doc__.split("\n\n")[0], OUT)
    questions, stack = questions_and_stack(args, "realtime bench")
    started = time.monotonic()
    with stack:
        rows = asyncio.run(run(questions, stack.gateway_address, stack.web_url, args.mode))
        stack.check()
    result = summary(rows)
    print_summary(result)
    write_json(
        args.out,
        {
            "summary": result,
            "questions": rows,
            "mode": args.mode,
            "engine": args.frontend_engine,
            "chunk_s": CHUNK_S,
            "wall_s": round(time.monotonic() - started, 1),
            "machine": f"{platform.processor() or platform.machine()}, {platform.platform()}",
            "command": "python -m kame_cli.bench.realtime_bench"
            f" --piper {args.piper} --espeak {args.espeak}",
        },
    )


if __name__ == "__main__":
    main()
