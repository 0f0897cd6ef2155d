"""Tool bench: what a tool that takes 300 ms adds to the answer, through `kame up`'s
stack (issue #33 bounds it at 400 ms).

The oracle is given one MCP server (written here with the `mcp` SDK, served on
streamable HTTP on loopback: `--mcp-server rail=http://...`) whose one tool,
next_train, sleeps --tool-ms before it answers. The LLM is a local fake of
OpenAI's chat-completions wire (a vendor cannot be reached here, and a real
model's own time would drown the tool's): asked to look the train up, it calls
next_train with no words before the call, then says "Here you go: " and the
tool's result; asked without "look it up", it says the same words at once.
So both ways the answer is the same words from the same fake, and the only
difference is the tool round: the tool's time, the oracle's MCP call and a
second LLM round.

Each way is asked with the gateway's default hold (tandem: the agent says
"Hmm," or "Let me see," while it holds the floor, and the answer follows the
phrase: what a caller hears by default) and with a silent hold
(`HoldConfig.silent`: nothing hides the tool's time, the answer is said as
soon as it is in).

Each call types its question (`ConverseClient.send_text`: no speech
recognition in the measure) and streams silence, the frames the agent speaks
in, until the answer is said. The two questions alternate, --rounds times each
per hold.
Per call, from when the question was sent:
- answer word: the first agent_text word of an oracle generation (the answer
  itself, after any hold phrase: kame_cli/bench/answer.py's definition), as
  it reached the caller with its audio;
- oracle text: the first oracle update carrying a word of the answer (the
  oracle's side, before the front-end's synthesis and pacing).
The bound is on the difference of the answer word's medians (tool minus none),
with each hold.

    .venv/bin/python -m kame_cli.bench.tool_bench [--rounds 8] [--tool-ms 300]

Starts the stack (tts engine, its own Redis, free ports), prints a table and
writes bench/results/tool_bench.json (or --out).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import platform
import socket
import statistics
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import uvicorn
from mcp.server import MCPServer
from mcp_types import ToolAnnotations
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from kame_cli.bench.paths import RESULTS_DIR
from kame_cli.bench.report import print_table, write_json
from kame_cli.bench.stacks import BenchStack
from kame_cli.stack_options import Ports, add_arguments, free_ports, options_from_args
from kame_client.client import ConverseClient
from kame_client.codecs import AudioFormat, Encoder
from kame_client.events import AgentText, ConverseEvent, OracleAppend, OracleReset, ToolFinished
from kame_client.microphone import Microphone
from kame_common.audio import FRAME_SAMPLES, FRAME_SECONDS, SAMPLE_RATE
from kame_common.words import normalize_words
from kamepb import gateway_pb2

OUT = RESULTS_DIR / "tool_bench.json"
MODEL = "stub-model"
TOOL_RESULT = "The next train to Paris leaves from platform nine."
ANSWER = f"Here you go: {TOOL_RESULT}"
LOOK_IT_UP = "look it up"  # the fake calls the tool when the question says this
QUESTIONS = {
    "tool": f"When is the next train to Paris? Please {LOOK_IT_UP}.",
    "none": "When is the next train to Paris?",
}
HOLDS = {
    "phrases": gateway_pb2.HoldConfig(),  # the gateway's defaults
    "silent": gateway_pb2.HoldConfig(silent=True),
}
SILENCE = np.zeros(FRAME_SAMPLES, dtype=np.float32)
SETTLE_S = 1.0  # silence before the question: the call's start is out of the measure
MAX_WAIT_S = 30.0  # after the question, for the whole answer
BOUND_S = 0.4  # issue #33: what a 300 ms tool may add to the answer word


def rail_tools(tool_s: float) -> MCPServer:
    server = MCPServer("kame-bench-rail")

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def next_train(city: str) -> str:
        """When the next train to a city leaves."""
        await asyncio.sleep(tool_s)
        return TOOL_RESULT.replace("Paris", city)

    return server


def _chunk(delta: dict[str, Any], finish_reason: str | None = None) -> str:
    choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
    chunk = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 0}
    return f"data: {json.dumps({**chunk, 'model': MODEL, 'choices': [choice]})}\n\n"


async def _fake_stream(body: dict[str, Any]) -> AsyncIterator[str]:
    """The fake model: the tool's result once it has one, a call of next_train when
    asked to look it up (and offered it), else the answer itself; in 5-character
    pieces, as a model streams tokens."""
    results = [m["content"] for m in body["messages"] if m["role"] == "tool"]
    question = [m["content"] for m in body["messages"] if m["role"] == "user"][-1]
    offered = {tool["function"]["name"] for tool in body.get("tools", [])}
    if not results and LOOK_IT_UP in question and "next_train" in offered:
        call = {"index": 0, "id": "call_bench", "type": "function"}
        call["function"] = {"name": "next_train", "arguments": json.dumps({"city": "Paris"})}
        yield _chunk({"tool_calls": [call]})
        yield _chunk({}, "tool_calls")
    else:
        text = f"Here you go: {results[-1]}" if results else ANSWER
        for start in range(0, len(text), 5):
            yield _chunk({"content": text[start : start + 5]})
        yield _chunk({}, "stop")
    yield "data: [DONE]\n\n"


async def _chat(request: Request) -> Response:
    body = await request.json()
    if not body.get("stream"):  # the oracle's warm-up of its prompt (max_tokens 1)
        return JSONResponse({"id": "warm", "object": "chat.completion", "choices": []})
    return StreamingResponse(_fake_stream(body), media_type="text/event-stream")


async def _models(_request: Request) -> Response:
    return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model"}]})


def fake_llm() -> Starlette:
    return Starlette(
        routes=[
            Route("/v1/chat/completions", _chat, methods=["POST"]),
            Route("/v1/models", _models, methods=["GET"]),
        ]
    )


@contextlib.asynccontextmanager
async def serve(app: Any) -> AsyncIterator[str]:
    """An ASGI app on a loopback port, in this event loop: its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if serving.done():
                serving.result()  # raises what stopped it
            await asyncio.sleep(0.02)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await serving
        sock.close()


@dataclass
class Call:
    """One question, its latencies from when it was sent (seconds) and what was said."""

    way: str  # "tool" or "none"
    hold: str  # a key of HOLDS
    answer_word_s: float | None
    oracle_text_s: float | None
    tool_s: float | None  # the tool's own time, as the oracle reported it
    said: str


def answer_started(event: ConverseEvent) -> str:
    """Which of the answer's firsts `event` is ("agent": an agent word of a
    generation, "oracle": an oracle update with a word of the answer), "" if none."""
    match event:
        case AgentText(text=text, generation=generation) if generation and text.strip():
            return "agent"
        case OracleReset(text=text) | OracleAppend(text=text):
            return "oracle" if set(normalize_words(text)) & set(normalize_words(ANSWER)) else ""
    return ""


async def ask(gateway: str, way: str, hold: str) -> Call:
    """One call: silence, the question typed, silence until the answer was said."""
    sent_at: float | None = None
    firsts: dict[str, float] = {}
    said: list[str] = []
    tool_s: float | None = None
    done = asyncio.Event()
    last_word = normalize_words(ANSWER)[-1]
    async with ConverseClient.connect(gateway) as client:

        async def read() -> None:
            nonlocal tool_s
            async for event in client.events():
                now = time.monotonic()
                if sent_at is None:
                    continue
                if first := answer_started(event):
                    firsts.setdefault(first, now)
                match event:
                    case AgentText(text=text):
                        said.append(text)
                        if last_word in normalize_words(text):
                            done.set()
                    case ToolFinished(elapsed_s=elapsed_s):
                        tool_s = elapsed_s

        reader = asyncio.create_task(read())
        config = gateway_pb2.ConverseConfig(include_oracle_updates=True, hold=HOLDS[hold])
        await client.start(config)
        await client.wait_started(reader)
        microphone = Microphone(client, Encoder(AudioFormat("pcm16", SAMPLE_RATE)))
        for index in range(1_000_000):
            if done.is_set() or reader.done():
                break
            if sent_at is None and index * FRAME_SECONDS >= SETTLE_S:
                await client.send_text(QUESTIONS[way])
                sent_at = time.monotonic()
            elif sent_at is not None and time.monotonic() - sent_at > MAX_WAIT_S:
                break
            await microphone.stream(SILENCE)  # the agent speaks in the caller's frames
        await client.done_writing()
        await asyncio.wait_for(reader, 60)  # the call ends OK, or the bench says why
    start = sent_at or 0.0

    def since(kind: str) -> float | None:
        return round(firsts[kind] - start, 4) if kind in firsts else None

    return Call(way, hold, since("agent"), since("oracle"), tool_s, " ".join(said))


async def run(gateway: str, rounds: int) -> list[Call]:
    print("tool bench: a warm-up call each way ...", flush=True)
    for way in QUESTIONS:
        await ask(gateway, way, "phrases")
    calls = []
    for hold in HOLDS:
        for index in range(rounds):
            ways = list(QUESTIONS) if index % 2 == 0 else list(reversed(QUESTIONS))
            for way in ways:
                call = await ask(gateway, way, hold)
                calls.append(call)
                print_call(call, index, rounds)
    return calls


def print_call(call: Call, index: int, rounds: int) -> None:
    print(
        f"  {call.hold} {index + 1}/{rounds} {call.way:4}: "
        f"answer word {ms(call.answer_word_s)} ms, oracle text {ms(call.oracle_text_s)} ms, "
        f"tool {ms(call.tool_s)} ms; said {call.said!r}",
        flush=True,
    )


def median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 4) if present else None


def ms(value: float | None) -> str:
    return "-" if value is None else str(round(value * 1000))


KINDS = (("answer word", "answer_word_s"), ("oracle text", "oracle_text_s"))


def hold_summary(calls: list[Call]) -> dict[str, Any]:
    """One hold's medians each way, and what the tool added to them."""
    result: dict[str, Any] = {}
    for _name, kind in KINDS:
        tool = median([getattr(c, kind) for c in calls if c.way == "tool"])
        none = median([getattr(c, kind) for c in calls if c.way == "none"])
        added = None if tool is None or none is None else round(tool - none, 4)
        result[kind] = {"tool_median": tool, "none_median": none, "added_median": added}
    result["tool_s_median"] = median([c.tool_s for c in calls if c.way == "tool"])
    result["answered"] = sum(c.answer_word_s is not None for c in calls)
    result["calls"] = len(calls)
    added = result["answer_word_s"]["added_median"]
    result["within_bound"] = added is not None and added <= BOUND_S
    return result


def summary(calls: list[Call]) -> dict[str, Any]:
    return {hold: hold_summary([c for c in calls if c.hold == hold]) for hold in HOLDS}


def print_summary(result: dict[str, Any], rounds: int) -> None:
    print()
    print_table(
        f"| hold | from the question sent ({rounds} calls each) | with the tool, median ms "
        "| without, median ms | added by the tool, ms |",
        [
            f"| {hold} | {name} | {ms(row[kind]['tool_median'])} | "
            f"{ms(row[kind]['none_median'])} | {ms(row[kind]['added_median'])} |"
            for hold, row in result.items()
            for name, kind in KINDS
        ],
    )
    for hold, row in result.items():
        bound = "within" if row["within_bound"] else "NOT within"
        print(
            f"{hold} hold, answer word: {bound} the {BOUND_S * 1000:.0f} ms bound "
            f"(the tool itself took {ms(row['tool_s_median'])} ms at the median; "
            f"{row['answered']} of {row['calls']} calls answered)"
        )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8, help="calls each way")
    parser.add_argument("--tool-ms", type=int, default=300, help="how long the tool takes")
    parser.add_argument("--out", type=Path, default=OUT)
    add_arguments(parser)  # kame up's stack options (engine, Redis, startup timeout, ...)
    return parser.parse_args()


async def bench(args: argparse.Namespace) -> tuple[list[Call], dict[str, Any]]:
    """The fakes in this loop, the stack started beside them (its oracle lists the
    MCP server's tools and warms its prompt at start), then the calls."""
    rail = rail_tools(args.tool_ms / 1000).streamable_http_app()
    async with serve(fake_llm()) as llm_url, serve(rail) as mcp_url:
        args.llm_base_url, args.llm_model = f"{llm_url}/v1", MODEL
        args.mcp_servers, args.tools_allowed = [f"rail={mcp_url}/mcp"], ["rail.next_train:readonly"]
        ports = Ports.free(redis=free_ports(1)[0])  # its own Redis, beside any other stack
        options = options_from_args(args, ports, args.frontend_engine, args.log_dir)
        stack = BenchStack(options, frontend_slots=2)  # the last call may still hold one
        print(f"tool bench: starting the stack (logs in {stack.log_dir}) ...", flush=True)
        try:
            await asyncio.to_thread(stack.start)
            print(f"tool bench: the oracle offers {stack.offered_tools()}", flush=True)
            calls = await run(stack.gateway_address, args.rounds)
            stack.check()
        finally:
            await asyncio.to_thread(stack.stop)
    return calls, {"engine": args.frontend_engine}


def main() -> None:
    args = parse_args()
    started = time.monotonic()
    calls, facts = asyncio.run(bench(args))
    result = summary(calls)
    print_summary(result, args.rounds)
    write_json(
        args.out,
        {
            "summary": result,
            "calls": [asdict(call) for call in calls],
            "questions": QUESTIONS,
            "tool_ms": args.tool_ms,
            **facts,
            "wall_s": round(time.monotonic() - started, 1),
            "machine": f"{platform.processor() or platform.machine()}, {platform.platform()}",
            "command": "python -m kame_cli.bench.tool_bench"
            f" --rounds {args.rounds} --tool-ms {args.tool_ms}",
        },
    )


if __name__ == "__main__":
    main()
