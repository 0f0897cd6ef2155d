"""Ask the KAME stack a spoken question from a Pipecat pipeline: Pipecat's
`OpenAIRealtimeLLMService` with `base_url` set to the stack's OpenAI Realtime
endpoint, between a WAV played at real time (in place of a microphone) and a
recorder of the agent's voice (in place of a speaker).

    pip install "pipecat-ai[openai]==1.14.0"
    kame say "What is the capital of France?" --out question.wav
    python examples/pipecat_realtime.py --url ws://127.0.0.1:8088/v1/realtime \
        --wav question.wav --out answer.wav

The service appends `?model=...` to --url itself. The agent's voice is saved to
--out once it has been quiet for --quiet-s, and what each side said is printed
as JSON lines: {"you": "..."} for the caller's transcript, {"agent": "..."} for
each answer. The API key is the gateway's caller token (anything when it has
none). No LLM context is given to the service: with one it would ask for
answers itself (`response.create`), and the stack's agent answers on its own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import wave

from loguru import logger
from pipecat.frames.frames import (
    ErrorFrame,
    Frame,
    InputAudioRawFrame,
    LLMFullResponseEndFrame,
    StartFrame,
    TranscriptionFrame,
    TTSAudioRawFrame,
    TTSTextFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService
from pipecat.workers.runner import WorkerRunner

RATE = 24000  # PCM16 mono at 24 kHz: the Realtime session's audio both ways
CHUNK_S = 0.02


def say(**line: str) -> None:
    print(json.dumps(line), flush=True)


class WavMicrophone(FrameProcessor):
    """Plays the question into the pipeline at real time, as a microphone would,
    and prints the caller's transcript (the service sends it upstream)."""

    def __init__(self, pcm: bytes) -> None:
        super().__init__()
        self.pcm = pcm
        self.playing: asyncio.Task | None = None

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, TranscriptionFrame):
            say(you=frame.text)
        await self.push_frame(frame, direction)
        if isinstance(frame, StartFrame):
            self.playing = self.create_task(self.play())

    async def cleanup(self) -> None:
        await super().cleanup()
        if self.playing is not None:  # the pipeline ended before the question did
            await self.cancel_task(self.playing)

    async def play(self) -> None:
        loop = asyncio.get_running_loop()
        start, step = loop.time(), int(RATE * CHUNK_S) * 2
        for index, offset in enumerate(range(0, len(self.pcm), step)):
            chunk = self.pcm[offset : offset + step]
            await self.push_frame(InputAudioRawFrame(audio=chunk, sample_rate=RATE, num_channels=1))
            await asyncio.sleep(max(0.0, start + (index + 1) * CHUNK_S - loop.time()))


class AnswerRecorder(FrameProcessor):
    """Keeps the agent's voice and prints each answer's words when it ends."""

    def __init__(self) -> None:
        super().__init__()
        self.audio = bytearray()
        self.words: list[str] = []
        self.last_audio_at: float | None = None

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, TTSAudioRawFrame):
            self.audio += frame.audio
            self.last_audio_at = asyncio.get_running_loop().time()
        elif isinstance(frame, TTSTextFrame):
            self.words.append(frame.text)  # the deltas carry their own spaces
        elif isinstance(frame, LLMFullResponseEndFrame) and self.words:
            say(agent="".join(self.words).strip())
            self.words.clear()
        await self.push_frame(frame, direction)


async def stop_when_quiet(
    worker: PipelineWorker, recorder: AnswerRecorder, quiet_s: float, max_s: float
) -> None:
    """Ends the pipeline once the agent has spoken and then been quiet for quiet_s."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + max_s
    while loop.time() < give_up:
        await asyncio.sleep(0.2)
        spoke = recorder.last_audio_at
        if spoke is not None and loop.time() - spoke > quiet_s:
            break
    await worker.stop_when_done()


async def converse(url: str, api_key: str, question: bytes, quiet_s: float, max_s: float) -> bytes:
    """The agent's voice (PCM16 at 24 kHz) in answer to `question`."""
    llm = OpenAIRealtimeLLMService(
        api_key=api_key,
        base_url=url,
        settings=OpenAIRealtimeLLMService.Settings(model="kame-tandem"),
    )
    recorder = AnswerRecorder()
    pipeline = Pipeline([WavMicrophone(question), llm, recorder])
    worker = PipelineWorker(
        pipeline, params=PipelineParams(audio_in_sample_rate=RATE, audio_out_sample_rate=RATE)
    )

    errors: list[str] = []

    @worker.event_handler("on_pipeline_error")
    async def on_error(worker: PipelineWorker, frame: ErrorFrame) -> None:
        say(error=frame.error)
        errors.append(frame.error)
        await worker.stop_when_done()

    stopping = asyncio.create_task(stop_when_quiet(worker, recorder, quiet_s, max_s))
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    await runner.run()  # until the pipeline ends
    stopping.cancel()
    if errors:
        raise SystemExit(f"the conversation failed: {errors[0]}")
    return bytes(recorder.audio)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="ws://127.0.0.1:8088/v1/realtime")
    parser.add_argument("--api-key", default="no-auth", help="the gateway's caller token")
    parser.add_argument("--wav", required=True, help="the question: 16-bit mono at 24 kHz")
    parser.add_argument("--out", required=True, help="where to save the agent's voice")
    parser.add_argument("--quiet-s", type=float, default=5.0, help="stop after this much quiet")
    parser.add_argument("--max-s", type=float, default=60.0, help="stop after this long anyway")
    args = parser.parse_args()
    logger.remove()
    logger.add(sys.stderr, level="INFO")  # Pipecat logs every frame at DEBUG
    with wave.open(args.wav) as wav:
        if (wav.getframerate(), wav.getsampwidth(), wav.getnchannels()) != (RATE, 2, 1):
            parser.error(f"{args.wav}: 16-bit mono at {RATE} Hz, please")
        question = wav.readframes(wav.getnframes())
    answer = asyncio.run(converse(args.url, args.api_key, question, args.quiet_s, args.max_s))
    with wave.open(args.out, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(RATE)
        out.writeframes(answer)


if __name__ == "__main__":
    main()
