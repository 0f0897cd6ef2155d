"""Ask the KAME stack a spoken question with the OpenAI Agents SDK: a
`RealtimeAgent` run by a `RealtimeRunner` whose model config's `url` points at
the stack's OpenAI Realtime endpoint instead of OpenAI's.

    pip install openai-agents==0.24.0
    kame say "What is the capital of France?" --out question.wav
    python examples/openai_agents_realtime.py \
        --url "ws://127.0.0.1:8088/v1/realtime?model=kame-tandem" \
        --wav question.wav --out answer.wav

The question (16-bit mono WAV at 24 kHz) is streamed at real time, as a
microphone would; the agent's voice is saved to --out once it has been quiet
for --quiet-s, and what each side said is printed as JSON lines:
{"you": "..."} for the caller's transcript, {"agent": "..."} for each answer.
The API key is the gateway's caller token (anything when it has none).

With --door-code CODE the agent also has a function tool, `door_code(office)`,
that this program runs when the stack's model calls it (the call comes over
the Realtime socket, the SDK runs the function and sends its output back) and
that answers CODE; each call is printed as {"tool": "door_code", "office": ...}.
Ask "What is the door code for the Paris office?" to have it called.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import wave

from agents import FunctionTool, function_tool
from agents.realtime import RealtimeAgent, RealtimeRunner, RealtimeSession

RATE = 24000  # the session's audio: PCM16 mono at 24 kHz, both ways
CHUNK_S = 0.1


async def stream_question(session: RealtimeSession, pcm: bytes) -> None:
    """The question at real time, in chunks of 100 ms, as a microphone sends it."""
    loop = asyncio.get_running_loop()
    start, step = loop.time(), int(RATE * CHUNK_S) * 2
    for index, offset in enumerate(range(0, len(pcm), step)):
        await session.send_audio(pcm[offset : offset + step])
        await asyncio.sleep(max(0.0, start + (index + 1) * CHUNK_S - loop.time()))


def say(**line: str) -> None:
    print(json.dumps(line), flush=True)


def door_code_tool(code: str) -> FunctionTool:
    """A function the agent may call: it answers `code` for any office."""

    @function_tool
    def door_code(office: str) -> str:
        """The code that opens the front door of one of our offices."""
        say(tool="door_code", office=office)
        return code

    return door_code


class Transcripts:
    """Prints each finished transcript of the session's history once."""

    def __init__(self) -> None:
        self.printed: set[str] = set()

    def update(self, items: list) -> None:
        for item in items:
            if item.type != "message" or item.item_id in self.printed:
                continue
            if item.role == "user":
                text = " ".join(
                    part.transcript or "" for part in item.content if part.type == "input_audio"
                )
                if text.strip():
                    self.printed.add(item.item_id)
                    say(you=text.strip())
            elif item.role == "assistant" and item.status == "completed":
                self.printed.add(item.item_id)
                say(agent=" ".join(part.transcript or "" for part in item.content).strip())


async def converse(
    url: str, api_key: str, question: bytes, quiet_s: float, max_s: float, door_code: str
) -> bytes:
    """The agent's voice (PCM16 at 24 kHz) in answer to `question`."""
    tools = [door_code_tool(door_code)] if door_code else []
    agent = RealtimeAgent(
        name="KAME caller", instructions="Answer the caller briefly.", tools=tools
    )
    runner = RealtimeRunner(agent)
    answer, transcripts = bytearray(), Transcripts()
    loop = asyncio.get_running_loop()
    give_up = loop.time() + max_s
    async with await runner.run(model_config={"url": url, "api_key": api_key}) as session:
        sending = asyncio.create_task(stream_question(session, question))
        try:
            async with asyncio.timeout_at(give_up) as deadline:
                async for event in session:
                    if event.type == "audio":
                        answer += event.audio.data
                        # Done once the agent has been quiet for quiet_s.
                        deadline.reschedule(min(give_up, loop.time() + quiet_s))
                    elif event.type == "history_updated":
                        transcripts.update(event.history)
                    elif event.type == "history_added":
                        transcripts.update([event.item])
                    elif event.type == "error":
                        say(error=str(event.error))
        except TimeoutError:
            pass
        finally:
            sending.cancel()
    return bytes(answer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="ws://127.0.0.1:8088/v1/realtime?model=kame-tandem")
    parser.add_argument("--api-key", default="no-auth", help="the gateway's caller token")
    parser.add_argument("--wav", required=True, help="the question: 16-bit mono at 24 kHz")
    parser.add_argument("--out", required=True, help="where to save the agent's voice")
    parser.add_argument("--quiet-s", type=float, default=5.0, help="stop after this much quiet")
    parser.add_argument("--max-s", type=float, default=60.0, help="stop after this long anyway")
    parser.add_argument("--door-code", default="", help="give the agent a door_code tool")
    args = parser.parse_args()
    with wave.open(args.wav) as wav:
        if (wav.getframerate(), wav.getsampwidth(), wav.getnchannels()) != (RATE, 2, 1):
            parser.error(f"{args.wav}: 16-bit mono at {RATE} Hz, please")
        question = wav.readframes(wav.getnframes())
    answer = asyncio.run(
        converse(args.url, args.api_key, question, args.quiet_s, args.max_s, args.door_code)
    )
    with wave.open(args.out, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(RATE)
        out.writeframes(answer)


if __name__ == "__main__":
    main()
