"""GPT-Live endpoint bench: what the web service's /v1/live/sessions adds to a
conversation's latency, against `kame talk`'s own client path on the same WAVs
in one run of one stack (as realtime_bench.py does for /v1/realtime, whose
timing rules and summary it shares), and how soon a client back-end's answer
is spoken.

Each question (piper's built-in ones and the espeak-ng set) is asked three
ways, the first two in alternating order, each caller streaming the WAV as a
microphone does (80 ms at a time at real time, then silence):
- `kame talk`: kame_client.caller.talk;
- live: the `openai` SDK's `client.live.connect()`, responses delegation (the
  stack's own oracle answers, as for `kame talk`). First audio is the first
  session.output_audio.delta with sound in it (the front-end's silence is
  digital zero), answer the output transcript delta that completes the
  question's keywords, both from the end of the question's speech;
- client delegation: the bench is the back-end, and answers each
  session.delegation.created at once with a commentary; commentary-to-speech
  is the time from that session.commentary.append to the first output
  transcript delta of its words (the agent saying them).

    .venv/bin/python -m kame_cli.bench.live_bench [--piper 4] [--espeak 4]

Starts `kame up`'s stack (its own Redis, free ports), prints a table and
writes bench/results/live_bench.json (or --out).
"""

from __future__ import annotations

import asyncio
import base64
import platform
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
from openai import AsyncOpenAI
from openai.types.live.session_config_param import DelegationResponses

from kame_cli.bench.paths import RESULTS_DIR
from kame_cli.bench.questions import Question
from kame_cli.bench.realtime_bench import (
    CHUNK_S,
    MAX_WAIT_S,
    Call,
    Clock,
    answer_time,
    ask_talk,
    median,
    ms,
    parse_args,
    print_summary,
    questions_and_stack,
    stream,
    summary,
)
from kame_cli.bench.report import write_json
from kame_client.caller import speech_region
from kame_common.audio import SAMPLE_RATE
from kame_common.words import normalize_words

OUT = RESULTS_DIR / "live_bench.json"
# The bench's back-end answer: words no model would say unasked.
COMMENTARY = "Certainly, the answer you asked for is ready."
RESPONSES: DelegationResponses = {"type": "responses", "responses": {"model": "default"}}


def audible(delta: str) -> bool:
    """Whether a session.output_audio.delta (PCM16) carries sound: any sample not zero."""
    return bool(np.any(np.frombuffer(base64.b64decode(delta), np.int16)))


async def ask_live(question: Question, base_url: str, model: str) -> Call:
    """The question asked through /v1/live/sessions with responses delegation."""
    start, end = speech_region(question.audio)
    clock = Clock(start or 0.0, end or 0.0)
    client = AsyncOpenAI(base_url=base_url, api_key="bench")
    first_audio_t: float | None = None
    words: list[tuple[float, str]] = []
    async with client.live.connect() as connection:
        await connection.session.start(session={"model": model, "delegation": RESPONSES})
        await connection.recv()  # session.started
        clock.t0 = time.monotonic()
        sender = asyncio.ensure_future(
            stream(connection.session.input_audio.append, question, clock)
        )
        try:
            async with asyncio.timeout(clock.speech_end_s + MAX_WAIT_S):
                async for event in connection:
                    t = clock.now()
                    if t <= clock.speech_start_s:
                        continue
                    if event.type == "session.output_audio.delta":
                        if first_audio_t is None and audible(event.delta):
                            first_audio_t = t
                    elif event.type == "session.output_transcript.delta":
                        words.append((t, event.delta))
                        if answer_time(words, question.keywords) is not None:
                            break
        except TimeoutError:
            pass
        finally:
            sender.cancel()
    answer_t = answer_time(words, question.keywords)
    return Call(
        "live",
        None if first_audio_t is None else first_audio_t - clock.speech_end_s,
        None if answer_t is None else answer_t - clock.speech_end_s,
        "".join(text for _, text in words).strip(),
    )


async def commentary_to_speech(question: Question, base_url: str, model: str) -> float | None:
    """Client delegation: seconds from the bench's commentary to the agent's first word of it."""
    clock = Clock(0.0, 0.0)
    client = AsyncOpenAI(base_url=base_url, api_key="bench")
    first_word = normalize_words(COMMENTARY)[0]
    sent_at: float | None = None
    async with client.live.connect() as connection:
        await connection.session.start(session={"model": model})  # client delegation
        await connection.recv()  # session.started
        clock.t0 = time.monotonic()
        sender = asyncio.ensure_future(
            stream(connection.session.input_audio.append, question, clock)
        )
        try:
            async with asyncio.timeout(MAX_WAIT_S + len(question.audio) / SAMPLE_RATE):
                async for event in connection:
                    if event.type == "session.delegation.created" and sent_at is None:
                        sent_at = clock.now()
                        await connection.session.commentary.append(
                            content=COMMENTARY, delegation_id=event.delegation.id
                        )
                    elif event.type == "session.output_transcript.delta" and sent_at is not None:
                        if first_word in normalize_words(event.delta):
                            return clock.now() - sent_at
        except TimeoutError:
            return None
        finally:
            sender.cancel()
    return None


async def run(questions: list[Question], gateway: str, web_url: str, mode: str) -> dict[str, Any]:
    base_url = web_url.rstrip("/") + "/v1"
    model = f"kame-{mode}"
    print("live bench: a warm-up question each way ...", flush=True)
    await ask_talk(questions[0], gateway, mode)
    await ask_live(questions[0], base_url, model)
    rows, spoken = [], []
    for index, question in enumerate(questions):
        ways = [ask_talk(question, gateway, mode), ask_live(question, base_url, model)]
        if index % 2:
            ways.reverse()
        by_way = {call.way: call for call in [await way for way in ways]}
        spoken_s = await commentary_to_speech(question, base_url, model)
        spoken.append(spoken_s)
        rows.append(
            {
                "question": question.text,
                "source": Path(question.source).name,
                **{way: asdict(call) for way, call in by_way.items()},
                "commentary_to_speech_s": None if spoken_s is None else round(spoken_s, 4),
            }
        )
        talk_call, live_call = by_way["talk"], by_way["live"]
        print(
            f"  {question.text}: first audio {ms(talk_call.first_audio_s)} / "
            f"{ms(live_call.first_audio_s)} ms, answer {ms(talk_call.answer_s)} / "
            f"{ms(live_call.answer_s)} ms (talk / live); commentary to speech "
            f"{ms(spoken_s)} ms",
            flush=True,
        )
    result = summary(rows, "live")
    result["commentary_to_speech_s"] = {
        "median": median(spoken),
        "answered": len([s for s in spoken if s is not None]),
    }
    return {"summary": result, "questions": rows}


def main() -> None:
    args = parse_args(__doc__.split("\n\n")[0], OUT, ("tandem", "cascade"))
    questions, stack = questions_and_stack(args, "live bench")
    started = time.monotonic()
    with stack:
        measured = asyncio.run(run(questions, stack.gateway_address, stack.web_url, args.mode))
        stack.check()
    result = measured["summary"]
    print_summary(result, "live", "GPT-Live endpoint")
    spoken = result["commentary_to_speech_s"]
    print(
        f"client delegation: commentary.append to its first spoken word, median "
        f"{ms(spoken['median'])} ms ({spoken['answered']} of {len(questions)} answered)"
    )
    write_json(
        args.out,
        {
            **measured,
            "mode": args.mode,
            "engine": args.frontend_engine,
            "chunk_s": CHUNK_S,
            "wall_s": round(time.monotonic() - started, 1),
            "machine": f"{platform.processor() or platform.machine()}, {platform.platform()}",
            "command": "python -m kame_cli.bench.live_bench"
            f" --piper {args.piper} --espeak {args.espeak}",
        },
    )


if __name__ == "__main__":
    main()
