"""Ask the KAME stack a spoken question through LiveKit Agents' GPT-Live model:
`openai.realtime.GPTLiveModel(base_url=...)`, the duplex model an
`AgentSession` runs inside a LiveKit room, its session driven here directly
(no LiveKit server needed).

    pip install "livekit-agents[openai]==1.8.9"
    kame say "What is the capital of France?" --out question.wav
    python examples/livekit_live.py --url http://127.0.0.1:8088/v1 \
        --wav question.wav --out answer.wav
    python examples/livekit_live.py --url http://127.0.0.1:8088/v1 \
        --wav question.wav --out answer.wav --answer "It is Paris, since 508."

Without --answer the stack's own back-end answers (`delegation="responses"`,
its model `default`: the operator's); with it this program is the back-end
(`delegation="client"`): it answers each `delegation_created` with
`append_commentary(ANSWER)`, and the agent says that. The framework configures
a session once with its `_update_session` (the plugin waits for it before it
sends session.start); without an `AgentSession` it is called here. The
question (a 16-bit WAV; the plugin resamples it to 24 kHz) goes in as a
room's microphone track would: 20 ms frames at real time, then silence. The
agent's voice (the model's stream, silence included) is saved to --out once
the agent has said nothing for --quiet-s, and what each side said is printed
as JSON lines: {"you": "..."} for the caller's turns, {"agent": "..."} for
the agent's words, {"backend": "..."} for each answer given. The plugin adds
`/live/sessions` to --url; the API key is the gateway's caller token
(anything when it has none).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import wave

import aiohttp
from livekit import rtc
from livekit.agents import llm
from livekit.plugins.openai import realtime

RATE = 24000  # the plugin's output: PCM16 mono at 24 kHz
FRAME_S = 0.02


def say(**line: str) -> None:
    print(json.dumps(line), flush=True)


async def microphone(session: realtime.GPTLiveSession, path: str) -> None:
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


class Agent:
    """The agent's voice and words, and when it last said a word."""

    def __init__(self) -> None:
        self.audio = bytearray()
        self.words: list[str] = []
        self.said_at: float | None = None

    async def listen(self, session: realtime.GPTLiveSession) -> None:
        async for frame in session.audio_stream:
            self.audio += frame.frame.data

    def heard(self, delta: str) -> None:
        self.words.append(delta)  # the deltas carry their own spaces
        self.said_at = asyncio.get_running_loop().time()

    async def quiet(self, quiet_s: float, max_s: float) -> None:
        """Returns once the agent has spoken and then been quiet for quiet_s (or after max_s)."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + max_s
        while loop.time() < give_up:
            await asyncio.sleep(0.2)
            if self.said_at is not None and loop.time() - self.said_at > quiet_s:
                return


async def converse(args: argparse.Namespace) -> bytes:
    """The agent's voice (PCM16 at 24 kHz) in answer to the question in args.wav."""
    agent = Agent()
    async with aiohttp.ClientSession() as http:
        model = realtime.GPTLiveModel(
            base_url=args.url,
            model=args.model,
            api_key=args.api_key,
            http_session=http,
            delegation="client" if args.answer else "responses",
            responses_options={"model": "default"},
        )
        session = model.session()

        @session.on("input_audio_transcription_completed")
        def on_transcript(event: llm.InputTranscriptionCompleted) -> None:
            if event.is_final:
                say(you=event.transcript)

        @session.on("transcript_delta")
        def on_words(event: llm.DuplexOutputTranscriptDelta) -> None:
            agent.heard(event.text)

        @session.on("delegation_created")
        def on_delegation(delegation: realtime.GPTLiveDelegation) -> None:
            say(backend=args.answer)
            session.append_commentary(args.answer, delegation_id=delegation.id)

        @session.on("error")
        def on_error(event: llm.RealtimeModelError) -> None:
            say(error=str(event.error))

        await session._update_session(instructions="")  # as an AgentSession would (see above)
        listening = asyncio.create_task(agent.listen(session))
        talking = asyncio.create_task(microphone(session, args.wav))
        await agent.quiet(args.quiet_s, args.max_s)
        talking.cancel()
        await session.aclose()
        listening.cancel()
        await asyncio.gather(listening, talking, return_exceptions=True)
    if agent.words:
        say(agent="".join(agent.words).strip())
    return bytes(agent.audio)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8088/v1")
    parser.add_argument("--model", default="gpt-live-1", help="gpt-live-1 or kame-<mode>")
    parser.add_argument("--api-key", default="no-auth", help="the gateway's caller token")
    parser.add_argument("--answer", default="", help="be the back-end: answer with this")
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
