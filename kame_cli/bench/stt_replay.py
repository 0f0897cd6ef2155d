"""A clip through the stt service's own streaming logic, in audio time.

`replay` feeds one clip, 80 ms frame by 80 ms frame, into a real `SttSession`
on a real `SttEngine`, as the gateway streams a caller, but on a clock that
is the audio's own: after each frame it waits until every decode the frame
started is done and its words are out. So each partial, the early final and
the final are decoded on exactly the audio the service would decode at one
session, the same every run, however busy the machine is: the words (and so
the word error rate) are repeatable.

When a transcript would have come out had the machine decoded as fast as it
just did is reconstructed from the audio clock and each decode's own wall
time: an event is out when its audio is in (the frame that triggered it)
and its decode is done (submitted then, plus its decode time). That is the
latency of one session on an otherwise idle decoder; under load
(kame_cli/bench/stt_bench.py) decodes also wait for each other.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from kame_common.audio import FRAME_BYTES, FRAME_SECONDS, SAMPLE_RATE, Samples, float_to_pcm16
from kamepb import common_pb2
from services.stt.config import stream_settings
from services.stt.engine import Decoded, SttEngine
from services.stt.scheduler import DecodeScheduler
from services.stt.session import SttSession
from services.stt.vad import VAD_RATE
from services.stt.whisper import DecodeRequest

# Silence streamed after the clip: the endpoint pause and more, as a caller's
# open line goes on after the question.
TRAILING_SILENCE_S = 1.5
# Rounds of the event loop that let a decode's waiters run once it is done
# (the session's delivery task, then the reader of its output).
LOOP_ROUNDS = 4


@dataclass(frozen=True)
class Partial:
    text: str
    stable_text: str
    settled: bool  # the early final's words, sent before the final (every word stable)
    out_at_s: float  # audio seconds when it would have come out


@dataclass(frozen=True)
class Final:
    text: str
    out_at_s: float
    decode_s: float  # wall time of the decode that made it


@dataclass
class Heard:
    """What the stt said of one clip, per utterance in order."""

    partials: list[list[Partial]] = field(default_factory=list)
    finals: list[Final] = field(default_factory=list)

    @property
    def text(self) -> str:
        return " ".join(final.text for final in self.finals if final.text)


@dataclass
class _Decode:
    submitted_at_s: float
    request: DecodeRequest
    future: Future[Decoded]
    final: bool


class TimedScheduler(DecodeScheduler[DecodeRequest, Decoded]):
    """A decode queue (one worker, no batching: one session) that remembers
    each decode's submission in audio time, so that its transcript's time can
    be told, and lets the replay wait for every decode under way."""

    def __init__(self, engine: SttEngine) -> None:
        super().__init__(1, engine.decode_batch, max_batch=1, name="stt-replay")
        self.now_s = 0.0
        self.decodes: list[_Decode] = []

    def submit_final(self, owner: Hashable, request: DecodeRequest) -> Future[Decoded]:
        return self._timed(super().submit_final(owner, request), request, final=True)

    def submit_partial(self, owner: Hashable, request: DecodeRequest) -> Future[Decoded]:
        return self._timed(super().submit_partial(owner, request), request, final=False)

    def _timed(
        self, future: Future[Decoded], request: DecodeRequest, *, final: bool
    ) -> Future[Decoded]:
        self.decodes.append(_Decode(self.now_s, request, future, final))
        return future

    async def drain(self) -> None:
        """Wait until every decode submitted so far is done (or was withdrawn)."""
        for decode in self.decodes:
            if not decode.future.cancelled():
                await asyncio.wrap_future(decode.future)
        for _ in range(LOOP_ROUNDS):
            await asyncio.sleep(0)

    def decode_of(self, span: common_pb2.AudioSpan) -> _Decode:
        """The newest finished decode of exactly the audio of `span`."""
        for decode in reversed(self.decodes):
            request, future = decode.request, decode.future
            end_s = request.offset_s + len(request.audio) / VAD_RATE
            if (
                abs(request.offset_s - span.start_s) < 1e-6
                and abs(end_s - span.end_s) < 1e-3
                and future.done()
                and not future.cancelled()
            ):
                return decode
        raise LookupError(f"no decode of {span.start_s:.3f}-{span.end_s:.3f} s")


def timed_engine(engine: SttEngine) -> TimedScheduler:
    """Give `engine` (the bench's own) a TimedScheduler as its decode queue."""
    engine.scheduler.close()
    scheduler = TimedScheduler(engine)
    engine.scheduler = scheduler
    return scheduler


def frames_of(audio: Samples) -> list[bytes]:
    """PCM16 80 ms frames (24 kHz) of the clip and its trailing silence."""
    trailing = np.zeros(int(TRAILING_SILENCE_S * SAMPLE_RATE), dtype=np.float32)
    pcm = float_to_pcm16(np.concatenate([audio, trailing]))
    pcm += b"\0" * (-len(pcm) % FRAME_BYTES)
    return [pcm[i : i + FRAME_BYTES] for i in range(0, len(pcm), FRAME_BYTES)]


async def replay(engine: SttEngine, scheduler: TimedScheduler, audio: Samples) -> Heard:
    """`audio` (float32, 24 kHz) through a new SttSession on `engine`, whose
    decode queue is `scheduler` (timed_engine), in audio time."""
    scheduler.decodes.clear()
    session = SttSession(engine, stream_settings("replay", "en", {}, engine.settings))
    heard = Heard()
    reader = asyncio.create_task(_read(session, scheduler, heard))
    try:
        for index, frame in enumerate(frames_of(audio)):
            scheduler.now_s = (index + 1) * FRAME_SECONDS
            await session.push_frame(frame, received_at=scheduler.now_s)
            await scheduler.drain()
        await session.finish()
        await scheduler.drain()
        await reader
    finally:
        await session.aclose()
    return heard


async def _read(session: SttSession, scheduler: TimedScheduler, heard: Heard) -> None:
    partials: dict[str, list[Partial]] = {}
    async for response in session.events():
        if not response.HasField("transcript"):
            continue
        event = response.transcript
        utterance = partials.setdefault(event.utterance_id, [])
        decode = scheduler.decode_of(event.span)
        seconds = decode.future.result().seconds
        # Out once its audio is in and its decode is done.
        out_at_s = max(scheduler.now_s, decode.submitted_at_s + seconds)
        if event.is_final:
            heard.partials.append(utterance)
            heard.finals.append(Final(event.text, out_at_s, seconds))
        else:
            utterance.append(Partial(event.text, event.stable_text, decode.final, out_at_s))
