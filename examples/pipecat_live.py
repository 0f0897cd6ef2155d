"""Ask the KAME stack a spoken question from a Pipecat pipeline over GPT-Live,
with the caller's own back-end: Pipecat's `OpenAILiveLLMService` with `base_url`
set to the stack's GPT-Live endpoint and `ClientDelegation`, whose
`BackendLLMWorker` runs an OpenAI-compatible LLM service (here the stack's own
embedded LLM, `kame llm-server`). The stack hears the caller and speaks; when
a question needs an answer it delegates to the worker, and the worker's answer
is what the agent says, in its voice.

    pip install "pipecat-ai[openai]==1.14.0"
    kame say "What is the capital of France?" --out question.wav
    python examples/pipecat_live.py --url ws://127.0.0.1:8088/v1/live/sessions \
        --llm-url http://127.0.0.1:8000/v1 --wav question.wav --out answer.wav

What it takes to run the worker: the pipeline runs under a `WorkerRunner` (the
service registers the worker as a child of the pipeline's); the session
starts on the first `LLMContextFrame`, queued here with an empty context; and
the worker's model must begin a message with `>>` for the user to hear it
(Pipecat's pairing instruction asks it to). A small model such as the
embedded Gemma 3 270M follows no such instruction and reads a long prompt
slowly on a CPU, so a short pairing instruction of our own says what it
does, and `transform_output` marks every answer of the worker as one to
speak. The agent's voice is saved
to --out once it has been quiet for --quiet-s, and what each side said is
printed as JSON lines: {"you": "..."} for the caller's turn, {"agent": "..."}
for each of the agent's, {"backend": "..."} for each answer of the worker.
The API key is the gateway's caller token (anything when it has none).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import wave

from loguru import logger
from pipecat.frames.frames import (
    ErrorFrame,
    Frame,
    InputAudioRawFrame,
    LLMContextFrame,
    LLMFullResponseEndFrame,
    SpeechOutputAudioRawFrame,
    StartFrame,
    TranscriptionFrame,
    TTSTextFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.openai.live.llm import OpenAILiveLLMService
from pipecat.services.openai.llm import OpenAILLMService
from pipecat.workers.llm.backend_llm_worker import BackendLLMWorker, BackendOutput
from pipecat.workers.runner import WorkerRunner

RATE = 24000  # PCM16 mono at 24 kHz: the Live session's default, both ways
CHUNK_S = 0.02
BACKEND_MAX_TOKENS = 40
# The worker's whole system prompt (see the module doc).
PAIRING_INSTRUCTION = (
    "You are the backend of a voice assistant. It sends you the conversation; what you "
    "answer is told to the user. Answer the user's last question in one short sentence."
)


def say(**line: str) -> None:
    print(json.dumps(line), flush=True)


class WavMicrophone(FrameProcessor):
    """Plays the question into the pipeline at real time, as a microphone would,
    and prints the caller's turns (the service sends them upstream)."""

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
    """Keeps the agent's voice (the service streams it, silence included) and
    prints each of the agent's turns when it ends."""

    def __init__(self) -> None:
        super().__init__()
        self.audio = bytearray()
        self.words: list[str] = []
        self.last_word_at: float | None = None

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, SpeechOutputAudioRawFrame):
            self.audio += frame.audio
        elif isinstance(frame, TTSTextFrame):
            self.words.append(frame.text)  # the deltas carry their own spaces
            self.last_word_at = asyncio.get_running_loop().time()
        elif isinstance(frame, LLMFullResponseEndFrame) and self.words:
            say(agent="".join(self.words).strip())
            self.words.clear()
        await self.push_frame(frame, direction)


async def spoken(output: BackendOutput) -> BackendOutput:
    """Every answer of the worker is for the user to hear (the module doc says why)."""
    if output.text and not output.is_thought:
        say(backend=output.text)
    return dataclasses.replace(output, prefers_spoken=not output.is_thought)


async def stop_when_quiet(
    worker: PipelineWorker, recorder: AnswerRecorder, quiet_s: float, max_s: float
) -> None:
    """Ends the pipeline once the agent has said something and then been quiet for quiet_s."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + max_s
    while loop.time() < give_up:
        await asyncio.sleep(0.2)
        spoke = recorder.last_word_at
        if spoke is not None and loop.time() - spoke > quiet_s:
            break
    await worker.stop_when_done()


async def converse(
    url: str, api_key: str, llm_url: str, model: str, question: bytes, quiet_s: float, max_s: float
) -> bytes:
    """The agent's voice (PCM16 at 24 kHz) in answer to `question`."""
    backend = BackendLLMWorker(
        llm=OpenAILLMService(
            api_key="none",
            base_url=llm_url,
            # A short answer: the worker's message is sent once the model has written it all.
            settings=OpenAILLMService.Settings(model=model, max_tokens=BACKEND_MAX_TOKENS),
        ),
        transform_output=spoken,
        pairing_instruction=PAIRING_INSTRUCTION,
    )
    llm = OpenAILiveLLMService(
        api_key=api_key,
        base_url=url,
        settings=OpenAILiveLLMService.Settings(model="gpt-live-1"),
        delegation=OpenAILiveLLMService.ClientDelegation(backend=backend),
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

    await worker.queue_frames([LLMContextFrame(LLMContext())])  # starts the session
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
    parser.add_argument("--url", default="ws://127.0.0.1:8088/v1/live/sessions")
    parser.add_argument("--api-key", default="no-auth", help="the gateway's caller token")
    parser.add_argument("--llm-url", default="http://127.0.0.1:8000/v1", help="the back-end LLM")
    parser.add_argument("--llm-model", default="gemma-3-270m", help="the back-end LLM's model")
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
    answer = asyncio.run(
        converse(
            args.url,
            args.api_key,
            args.llm_url,
            args.llm_model,
            question,
            args.quiet_s,
            args.max_s,
        )
    )
    with wave.open(args.out, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(RATE)
        out.writeframes(answer)


if __name__ == "__main__":
    main()
