"""Ask the KAME stack a spoken question through LiveKit's NVIDIA PersonaPlex
plugin, which speaks the Moshi protocol (the stack's WS /api/chat): its
`RealtimeModel`, the model an `AgentSession` runs inside a LiveKit room, its
session driven here directly (no LiveKit server needed).

    pip install "livekit-plugins-nvidia[personaplex]==1.8.9"
    kame say "What is the capital of France?" --out question.wav
    python examples/livekit_personaplex.py --url ws://127.0.0.1:8088 \
        --wav question.wav --out answer.wav

The question (a 16-bit WAV; the plugin resamples it to 24 kHz) goes in as a
room's microphone track would: 20 ms frames at real time, then silence (a
Moshi server steps with its caller's audio). The agent's speech comes as
`generation_created` events with its words and audio (the plugin ends one
after 0.5 s without audio; the stack sends audio all along, silence
included, so here one lasts the call). The agent's voice is saved to --out
once it has been quiet for --quiet-s, and its words are printed as JSON
lines: {"agent": "..."} (the Moshi protocol carries no caller transcript).
The plugin adds `/api/chat?voice_prompt=...&text_prompt=...` to --url (the
stack keeps its own voice and persona); the gateway's caller token, if it
wants one, goes as the HTTP session's `Authorization` header.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import wave

import aiohttp
import numpy as np
from livekit import rtc
from livekit.agents import llm
from livekit.plugins.nvidia.experimental import realtime

RATE = 24000  # the plugin's output: PCM16 mono at 24 kHz
FRAME_S = 0.02
AUDIBLE = 328  # a sample above 1% of full scale: the agent is speaking


def say(**line: str) -> None:
    print(json.dumps(line), flush=True)


async def microphone(session: llm.RealtimeSession, path: str) -> None:
    """The WAV, then silence, in 20 ms frames at real time."""
    with wave.open(path) as wav:
        rate, channels = wav.getframerate(), wav.getnchannels()
        pcm = wav.readframes(wav.getnframes())
    samples = int(rate * FRAME_S)
    size = samples * channels * 2
    loop = asyncio.get_running_loop()
    start, sent = loop.time(), 0
    while True:
        chunk = pcm[sent * size : (sent + 1) * size].ljust(size, b"\0")
        session.push_audio(rtc.AudioFrame(chunk, rate, channels, samples))
        sent += 1
        await asyncio.sleep(max(0.0, start + sent * FRAME_S - loop.time()))


class Answer:
    """The agent's voice, and when it was last heard."""

    def __init__(self) -> None:
        self.audio = bytearray()
        self.spoke_at: float | None = None

    async def hear(self, generation: llm.GenerationCreatedEvent) -> None:
        """One generation: its audio kept, its words printed when it ends."""
        async for message in generation.message_stream:
            words, _ = await asyncio.gather(join(message.text_stream), self.keep(message))
            if words.strip():
                say(agent=words.strip())

    async def keep(self, message: llm.MessageGeneration) -> None:
        async for frame in message.audio_stream:
            self.audio += frame.data
            if np.abs(np.frombuffer(frame.data, np.int16)).max(initial=0) > AUDIBLE:
                self.spoke_at = asyncio.get_running_loop().time()

    async def quiet(self, quiet_s: float, max_s: float) -> None:
        """Returns once the agent has spoken and then been quiet for quiet_s (or after max_s)."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + max_s
        while loop.time() < give_up:
            await asyncio.sleep(0.2)
            if self.spoke_at is not None and loop.time() - self.spoke_at > quiet_s:
                return


async def join(stream) -> str:
    return "".join([piece async for piece in stream])


async def converse(args: argparse.Namespace) -> bytes:
    """The agent's voice (PCM16 at 24 kHz) in answer to the question in args.wav."""
    answer, hearing = Answer(), set()
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    async with aiohttp.ClientSession(headers=headers) as http:
        model = realtime.RealtimeModel(base_url=args.url, http_session=http)
        session = model.session()

        @session.on("generation_created")
        def on_generation(event: llm.GenerationCreatedEvent) -> None:
            task = asyncio.create_task(answer.hear(event))
            hearing.add(task)
            task.add_done_callback(hearing.discard)

        @session.on("error")
        def on_error(event: llm.RealtimeModelError) -> None:
            say(error=str(event.error))

        talking = asyncio.create_task(microphone(session, args.wav))
        await answer.quiet(args.quiet_s, args.max_s)
        talking.cancel()
        await session.aclose()  # ends the generation under way: its words print
        await asyncio.gather(*hearing, return_exceptions=True)
    return bytes(answer.audio)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="ws://127.0.0.1:8088", help="the stack's web service")
    parser.add_argument("--api-key", default="", help="the gateway's caller token, if any")
    parser.add_argument("--wav", required=True, help="the question: a 16-bit WAV")
    parser.add_argument("--out", required=True, help="where to save the agent's voice")
    parser.add_argument("--quiet-s", type=float, default=5.0, help="stop after this much quiet")
    parser.add_argument("--max-s", type=float, default=60.0, help="stop after this long anyway")
    args = parser.parse_args()
    answer = asyncio.run(converse(args))
    with wave.open(args.out, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(RATE)
        out.writeframes(answer)


if __name__ == "__main__":
    main()
