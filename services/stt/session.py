"""One caller's Transcribe stream: VAD segmentation, partial and final decodes, events in order.

    frame (24 kHz) -> resample to 16 kHz -> Silero VAD -> Segmenter
      speech start  -> SPEECH_START, open an utterance
      every `partial_interval_s` of new speech -> partial decode of the whole
                       utterance; local agreement keeps its prefix stable
      pause of 0.2 s -> FINAL_DECODE, the final decode starts early (discarded if
                       the caller goes on), so it is usually done when the endpoint is;
                       done before it, its words go out at once as a partial
                       whose every word is stable (stability 1.0), if they
                       extend the words partials made stable
      pause of `endpoint_silence_s` -> SPEECH_END, final transcript
      EndOfTurn (the front-end's turn detector: the caller's turn is over)
                    -> SPEECH_END and final at once, without waiting for the
                       endpoint pause (the early final is reused when it covers
                       the same audio); the next speech opens a new utterance
      `max_utterance_s` of audio -> final transcript, the next utterance
                       starts at once (speech goes on: no activity events)

With the stream's progress_interval_s set, an SttProgress follows every that
much audio through the VAD, whether or not anyone speaks: the client's sign
that the stream is alive (dropped, never waited for, when the output is full).

Events come out of `events()` in order: transcript events of an utterance
never follow its final, and finals come in utterance order.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import logging
import time
from collections.abc import AsyncIterator, Coroutine
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from kame_common import tracing
from kame_common.aio import cancel_and_wait
from kame_common.audio import (
    FRAME_SECONDS,
    SAMPLE_RATE,
    Samples,
    StreamResampler,
    pcm16_to_float,
)
from kamepb import common_pb2, stt_pb2
from services.stt import metrics
from services.stt.agreement import LocalAgreement, Word, join_words
from services.stt.config import MAX_UTTERANCE_LIMIT_S, StreamSettings
from services.stt.engine import Decoded, SttEngine
from services.stt.vad import VAD_RATE, Segmenter, VadEvent
from services.stt.whisper import DecodeRequest

log = logging.getLogger(__name__)
_tracer = tracing.tracer(__name__)

# The final decode covers this much of the pause after the speech, and starts as
# soon as that audio is in, before the endpoint is confirmed.
FINAL_TAIL_S = 0.2
# Per-session bounds: finals awaiting emission (more blocks the reader, so the client
# feels backpressure) and events awaiting the client (partials are dropped when full).
MAX_PENDING_FINALS = 4
OUTPUT_QUEUE_SIZE = 64

SPEECH_START = common_pb2.SpeechActivity.SPEECH_START
SPEECH_END = common_pb2.SpeechActivity.SPEECH_END
FINAL_DECODE = common_pb2.SpeechActivity.FINAL_DECODE


class SessionFailed(RuntimeError):
    """A final decode failed; the stream cannot deliver its transcript."""


class AudioBuffer:
    """The recent 16 kHz audio of a stream, addressed in stream seconds. Frames are
    joined only when audio is read or dropped, not on every append."""

    def __init__(self) -> None:
        self._chunks: list[Samples] = []
        self._length = 0
        self._first = 0  # stream sample index of the first kept sample

    @property
    def end_s(self) -> float:
        return (self._first + self._length) / VAD_RATE

    @property
    def start_s(self) -> float:
        return self._first / VAD_RATE

    def append(self, samples: Samples) -> None:
        self._chunks.append(samples)
        self._length += len(samples)

    def _joined(self) -> Samples:
        if len(self._chunks) != 1:
            self._chunks = [
                np.concatenate(self._chunks) if self._chunks else np.zeros(0, dtype=np.float32)
            ]
        return self._chunks[0]

    def slice(self, start_s: float, end_s: float) -> Samples:
        start = max(round(start_s * VAD_RATE) - self._first, 0)
        end = max(round(end_s * VAD_RATE) - self._first, start)
        return self._joined()[start:end].copy()

    def keep_from(self, start_s: float) -> None:
        drop = min(max(round(start_s * VAD_RATE) - self._first, 0), self._length)
        if drop:
            self._chunks = [self._joined()[drop:]]
            self._length -= drop
            self._first += drop


class FrameClock:
    """When each recent frame arrived (monotonic seconds), to measure lag behind the audio."""

    def __init__(self, keep_frames: int) -> None:
        self._times: collections.deque[float] = collections.deque(maxlen=keep_frames)
        self._count = 0

    def append(self, received_at: float) -> None:
        self._times.append(received_at)
        self._count += 1

    def received_at(self, stream_s: float) -> float:
        """Arrival of the frame holding the audio just before `stream_s`."""
        index = int(max(stream_s - 1e-6, 0.0) / FRAME_SECONDS)
        oldest = self._count - len(self._times)
        return self._times[min(max(index - oldest, 0), len(self._times) - 1)]


@dataclass
class Utterance:
    utterance_id: str
    audio_start_s: float  # decoded audio starts here (speech start minus pre-roll)
    speech_start_s: float  # where the VAD heard it begin (or where a max-length cut began it)
    lead_in_s: float = 0.0  # silence Whisper hears before the audio (the missing pre-roll)
    opened_ns: int = field(default_factory=time.time_ns)
    agreement: LocalAgreement = field(default_factory=LocalAgreement)
    last_partial_end_s: float = 0.0  # audio end of the newest partial submitted
    applied_partial_end_s: float = 0.0  # audio end of the newest partial emitted
    partials: int = 0
    early_final: Future[Decoded] | None = None
    early_final_pause_s: float | None = None  # the pause the early final was cut at
    early_final_end_s: float = 0.0
    final: Future[Decoded] | None = None
    final_end_s: float = 0.0
    speech_end_s: float | None = None  # None when cut at max length
    final_emitted: bool = False


class _End(enum.Enum):
    """The end of a queue: no item follows (an enum member, so its type is its own)."""

    END = enum.auto()


_END: Final = _End.END


class SttSession:
    def __init__(self, engine: SttEngine, settings: StreamSettings) -> None:
        self._engine = engine
        self.settings = settings
        self._resampler = StreamResampler(SAMPLE_RATE, VAD_RATE)
        self._vad = engine.vad.stream()
        self._segmenter = Segmenter(settings.vad_threshold, settings.endpoint_silence_s)
        self._audio = AudioBuffer()
        self._clock = FrameClock(int((MAX_UTTERANCE_LIMIT_S + 10) / FRAME_SECONDS))
        self._utterance: Utterance | None = None
        self._utterance_count = 0
        self._last_speech_end_s = 0.0
        self._final_tail_s = min(FINAL_TAIL_S, settings.endpoint_silence_s)
        # Audio kept before the VAD's speech start (the service's pre_roll_s): Silero
        # fires a little after soft onsets. Where the stream has less (its first
        # words, or a shorter pause before them), Whisper hears silence for the
        # rest: on speech from the audio's first sample tiny.en mishears more
        # words and loops (says the question again).
        self._pre_roll_s = engine.settings.pre_roll_s
        self._out: asyncio.Queue[stt_pb2.TranscribeResponse | Exception | _End] = asyncio.Queue(
            maxsize=OUTPUT_QUEUE_SIZE
        )
        self._finals: asyncio.Queue[Utterance | _End] = asyncio.Queue(maxsize=MAX_PENDING_FINALS)
        self._tasks: set[asyncio.Task[None]] = set()
        self._final_emitter = asyncio.create_task(self._emit_finals())
        self._finished = False
        self._error: Exception | None = None
        self._next_progress_s = settings.progress_interval_s  # 0: no progress messages

    # --- input ---

    async def push_frame(self, pcm: bytes, received_at: float | None = None) -> None:
        """Feed one validated 80 ms frame (PCM s16le, 24 kHz); `received_at` is its
        arrival in time.monotonic() seconds (default: now)."""
        self._clock.append(time.monotonic() if received_at is None else received_at)
        loop = asyncio.get_running_loop()
        samples, probs = await loop.run_in_executor(self._engine.audio_executor, self._analyze, pcm)
        self._audio.append(samples)
        for event in self._segmenter.push(probs):
            await self._on_vad_event(event)
        await self._schedule_decodes()
        # Idle, keep the pre-roll (plus a frame: a speech start can lie in the last one).
        keep = (
            self._utterance.audio_start_s
            if self._utterance
            else self._audio.end_s - self._pre_roll_s - FRAME_SECONDS
        )
        self._audio.keep_from(keep)
        self._report_progress()

    def _report_progress(self) -> None:
        """SttProgress once another progress_interval_s of audio is through the VAD:
        the client's sign of life while the caller is silent. Never waits: when
        the output is full, the next one will do."""
        if not self._next_progress_s or self._audio.end_s < self._next_progress_s:
            return
        interval = self.settings.progress_interval_s
        while self._next_progress_s <= self._audio.end_s:
            self._next_progress_s += interval
        progress = stt_pb2.SttProgress(audio_s=self._audio.end_s)
        with contextlib.suppress(asyncio.QueueFull):
            self._out.put_nowait(stt_pb2.TranscribeResponse(progress=progress))

    def _analyze(self, pcm: bytes) -> tuple[Samples, npt.NDArray[np.float32]]:
        samples = self._resampler.process(pcm16_to_float(pcm))
        return samples, self._vad.process(samples)

    async def end_turn(self, speech_end_s: float) -> None:
        """EndOfTurn: finalize the open utterance now. Its SPEECH_END is where the VAD
        saw the pause begin, else `speech_end_s`. Without an open utterance, or when
        it began after `speech_end_s` (the turn that ended was an earlier one), it
        does nothing."""
        utterance = self._utterance
        if self._finished or utterance is None or speech_end_s <= utterance.speech_start_s:
            metrics.END_OF_TURN.labels(outcome="no_utterance").inc()
            return
        pause = self._segmenter.pause_start_s
        end_s = min(speech_end_s if pause is None else pause, self._audio.end_s)
        self._segmenter.end_speech()
        metrics.END_OF_TURN.labels(outcome="finalized").inc()
        await self._end_speech(utterance, end_s)

    async def finish(self) -> None:
        """End of audio: finalize the open utterance; `events()` ends after its final."""
        if self._finished:
            return
        self._finished = True
        utterance = self._utterance
        loop = asyncio.get_running_loop()
        self._audio.append(
            await loop.run_in_executor(self._engine.audio_executor, self._resampler.flush)
        )
        if utterance is not None:
            pause = self._segmenter.pause_start_s
            await self._end_speech(utterance, self._audio.end_s if pause is None else pause)
        await self._finals.put(_END)

    # --- output ---

    async def events(self) -> AsyncIterator[stt_pb2.TranscribeResponse]:
        """Responses in order until the stream is finished; raises the error given to
        `fail()`, or SessionFailed when a final decode failed."""
        while True:
            if self._error is not None:
                raise self._error
            item = await self._out.get()
            if item is _END:
                return
            if isinstance(item, Exception):
                raise item
            yield item

    def fail(self, error: Exception) -> None:
        """End the stream with `error`: `events()` raises it next."""
        self._error = error
        with contextlib.suppress(asyncio.QueueFull):
            self._out.put_nowait(error)  # wakes a waiting events(); when full it checks first

    # --- segmentation ---

    async def _on_vad_event(self, event: VadEvent) -> None:
        if event.kind == "start":
            self._utterance_count += 1
            utterance_id = f"{self.settings.session_id or 'stt'}-{self._utterance_count}"
            start = max(event.at_s - self._pre_roll_s, self._last_speech_end_s, self._audio.start_s)
            # The first partial comes after partial_interval_s of speech, not of pre-roll.
            self._utterance = Utterance(
                utterance_id,
                start,
                speech_start_s=event.at_s,
                lead_in_s=self._pre_roll_s - (event.at_s - start),
                last_partial_end_s=event.at_s,
            )
            await self._emit_activity(SPEECH_START, utterance_id, event.at_s)
        elif self._utterance is not None:
            await self._end_speech(self._utterance, event.at_s)

    async def _end_speech(self, utterance: Utterance, speech_end_s: float) -> None:
        utterance.speech_end_s = speech_end_s
        self._last_speech_end_s = speech_end_s
        await self._emit_activity(SPEECH_END, utterance.utterance_id, speech_end_s)
        if utterance.early_final is not None and utterance.early_final_pause_s == speech_end_s:
            utterance.final = utterance.early_final
            utterance.final_end_s = utterance.early_final_end_s
        else:
            self._discard_early_final(utterance)
            utterance.final_end_s = self._final_end(utterance, speech_end_s)
            utterance.final = self._submit_final(utterance, utterance.final_end_s)
            await self._emit_activity(FINAL_DECODE, utterance.utterance_id, utterance.final_end_s)
        await self._queue_final(utterance)

    async def _queue_final(self, utterance: Utterance) -> None:
        self._utterance = None
        await self._finals.put(utterance)

    async def _schedule_decodes(self) -> None:
        utterance = self._utterance
        if utterance is None:
            return
        pause = self._segmenter.pause_start_s
        if utterance.early_final is not None and utterance.early_final_pause_s != pause:
            self._discard_early_final(utterance)  # the caller went on talking
        if pause is not None:
            if utterance.early_final is None and self._audio.end_s >= pause + self._final_tail_s:
                end_s = self._final_end(utterance, pause)
                early_final = self._submit_final(utterance, end_s)
                utterance.early_final = early_final
                utterance.early_final_pause_s, utterance.early_final_end_s = pause, end_s
                await self._emit_activity(FINAL_DECODE, utterance.utterance_id, end_s)
                self._start_task(self._announce_early_final(utterance, early_final))
        elif self._audio.end_s - utterance.last_partial_end_s >= self.settings.partial_interval_s:
            self._submit_partial(utterance)
        if self._audio.end_s - utterance.audio_start_s >= self.settings.max_utterance_s:
            await self._cut(utterance)

    async def _cut(self, utterance: Utterance) -> None:
        """Max length: finalize what we have; the speech goes on in a new utterance."""
        self._discard_early_final(utterance)
        end_s = self._audio.end_s
        utterance.final, utterance.final_end_s = self._submit_final(utterance, end_s), end_s
        await self._emit_activity(FINAL_DECODE, utterance.utterance_id, end_s)
        await self._queue_final(utterance)
        self._utterance_count += 1
        self._utterance = Utterance(
            f"{self.settings.session_id or 'stt'}-{self._utterance_count}",
            end_s,
            speech_start_s=end_s,
            last_partial_end_s=end_s,
        )

    def _final_end(self, utterance: Utterance, speech_end_s: float) -> float:
        """Where the final's audio ends: a little into the pause. (After a max-length cut
        the speech may have ended before this utterance began: then it is empty.)"""
        end_s = min(speech_end_s + self._final_tail_s, self._audio.end_s)
        return max(end_s, utterance.audio_start_s)

    def _discard_early_final(self, utterance: Utterance) -> None:
        if utterance.early_final is not None:
            self._engine.scheduler.cancel(utterance.early_final)
            metrics.EARLY_FINALS_DISCARDED.inc()
            utterance.early_final, utterance.early_final_pause_s = None, None

    # --- decoding ---

    def _decode_request(self, utterance: Utterance, end_s: float, *, final: bool) -> DecodeRequest:
        """A final is decoded as the service's settings say (beam size, temperature
        fallback); a partial greedily, once."""
        audio = self._audio.slice(utterance.audio_start_s, end_s)
        settings = self._engine.settings
        return self._engine.request(
            audio,
            utterance.audio_start_s,
            self.settings.language,
            settings.beam_size if final else 1,
            utterance.lead_in_s,
            fallback=final and settings.temperature_fallback,
        )

    def _submit_final(self, utterance: Utterance, end_s: float) -> Future[Decoded]:
        """Queue the final's decode; the caller then sends FINAL_DECODE, so the oracle's
        speculative LLM work stops and the decode a turn waits for has the CPU."""
        request = self._decode_request(utterance, end_s, final=True)
        # A waiting partial would only run after the final: drop it. A running one
        # is still emitted if it ends before the final does.
        if self._engine.scheduler.withdraw_partial(self):
            metrics.PARTIALS_SKIPPED.labels(reason="finalized").inc()
        return _observed(self._engine.scheduler.submit_final(self, request), "final", request)

    def _submit_partial(self, utterance: Utterance) -> None:
        end_s = self._audio.end_s
        request = self._decode_request(utterance, end_s, final=False)
        future = _observed(self._engine.scheduler.submit_partial(self, request), "partial", request)
        utterance.last_partial_end_s = end_s
        received_at = self._clock.received_at(end_s)
        self._start_task(self._deliver_partial(utterance, future, end_s, received_at))

    def _start_task(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _announce_early_final(self, utterance: Utterance, future: Future[Decoded]) -> None:
        """The early final's words, as soon as they are decoded, as a partial whose every
        word is stable, if the caller is still in the same pause and the endpoint has
        not come yet: the oracle starts its LLM on them and the front-end may take
        them as settled, a pause before the final (which reuses this decode, so says
        the same words)."""
        end_s = utterance.early_final_end_s
        received_at = self._clock.received_at(end_s)
        try:
            decoded: Decoded = await asyncio.wrap_future(future)
        except (asyncio.CancelledError, Exception):
            return  # discarded (the caller went on), or failed: the final says so
        if utterance.early_final is not future or utterance.final is not None:
            return  # the caller went on, or the endpoint came: the final is on its way
        if end_s <= utterance.applied_partial_end_s or not decoded.words:
            return
        words = utterance.agreement.settled(decoded.words)
        if words is None:
            return  # it revised a stable word: not settled; the final says what it heard
        utterance.applied_partial_end_s = end_s
        text = join_words(words)
        lag = time.monotonic() - received_at
        event = _transcript(
            utterance,
            is_final=False,
            stability=1.0,
            words=words,
            stable_text=text,
            end_s=end_s,
            lag_s=lag,
        )
        self._emit_partial(utterance, event, lag)

    async def _deliver_partial(
        self, utterance: Utterance, future: Future[Decoded], end_s: float, received_at: float
    ) -> None:
        try:
            decoded: Decoded = await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            return  # superseded in the queue (counted there) or the session closed
        except Exception:
            log.exception("partial decode failed for %s", utterance.utterance_id)
            return
        if utterance.final_emitted:
            metrics.PARTIALS_SKIPPED.labels(reason="finalized").inc()
            return
        if end_s <= utterance.applied_partial_end_s:
            metrics.PARTIALS_SKIPPED.labels(reason="superseded").inc()
            return
        utterance.applied_partial_end_s = end_s
        tail = utterance.agreement.update(decoded.words)
        stable = utterance.agreement.stable
        lag = time.monotonic() - received_at
        event = _transcript(
            utterance,
            is_final=False,
            stability=utterance.agreement.stability(tail),
            words=stable + tail,
            stable_text=join_words(stable),
            end_s=end_s,
            lag_s=lag,
        )
        self._emit_partial(utterance, event, lag)

    def _emit_partial(
        self, utterance: Utterance, event: stt_pb2.TranscribeResponse, lag: float
    ) -> None:
        try:
            self._out.put_nowait(event)
        except asyncio.QueueFull:
            metrics.PARTIALS_SKIPPED.labels(reason="output_full").inc()
            return
        utterance.partials += 1
        metrics.PARTIAL_LAG_SECONDS.observe(lag)
        metrics.TRANSCRIPTS.labels(kind="partial").inc()

    async def _emit_finals(self) -> None:
        while (utterance := await self._finals.get()) is not _END:
            try:
                # Queued only by _end_speech and _cut, once they submitted its final.
                assert utterance.final is not None
                decoded = await asyncio.wrap_future(utterance.final)
            except Exception as exc:
                log.exception("final decode failed for %s", utterance.utterance_id)
                await self._out.put(SessionFailed(f"final decode failed: {exc}"))
                return
            utterance.final_emitted = True
            await self._out.put(self._final_event(utterance, decoded))
        await self._out.put(_END)

    def _final_event(self, utterance: Utterance, decoded: Decoded) -> stt_pb2.TranscribeResponse:
        now = time.monotonic()
        lag = now - self._clock.received_at(utterance.final_end_s)
        text = join_words(decoded.words)
        event = _transcript(
            utterance,
            is_final=True,
            stability=1.0,
            words=decoded.words,
            stable_text=text,
            end_s=utterance.final_end_s,
            lag_s=lag,
        )
        metrics.TRANSCRIPTS.labels(kind="final").inc()
        attributes: dict[str, str | float] = {
            "stt.utterance_id": utterance.utterance_id,
            "stt.lag_s": lag,
            "stt.partials": utterance.partials,
            "stt.words": len(decoded.words),
        }
        if utterance.speech_end_s is not None:
            after_speech = now - self._clock.received_at(utterance.speech_end_s)
            metrics.FINAL_LAG_SECONDS.observe(after_speech)
            attributes["stt.final_lag_after_speech_s"] = after_speech
        if tracing.TRANSCRIPTS_IN_SPANS:
            attributes["stt.text"] = text
        span = _tracer.start_span(
            "stt.utterance", start_time=utterance.opened_ns, attributes=attributes
        )
        span.end()
        return event

    async def _emit_activity(
        self, kind: common_pb2.SpeechActivity.Kind.ValueType, utterance_id: str, at_s: float
    ) -> None:
        activity = common_pb2.SpeechActivity(kind=kind, utterance_id=utterance_id, at_s=at_s)
        await self._out.put(stt_pb2.TranscribeResponse(activity=activity))

    async def aclose(self) -> None:
        """Abandon the stream: withdraw its waiting decodes, stop its tasks and wait for them."""
        self._engine.scheduler.cancel_owner(self)
        await cancel_and_wait([self._final_emitter, *self._tasks])


def _observed(future: Future[Decoded], kind: str, request: DecodeRequest) -> Future[Decoded]:
    """`future`, whose decode (when it runs) is counted in the decode metrics."""
    duration = max(len(request.audio) / VAD_RATE, 1e-3)

    def observe(done: Future[Decoded]) -> None:
        if done.cancelled() or done.exception() is not None:
            return
        decoded = done.result()
        if decoded.seconds:  # 0 when there was too little audio to run Whisper
            metrics.DECODE_SECONDS.labels(kind=kind).observe(decoded.seconds)
            metrics.DECODE_RTF.labels(kind=kind).observe(decoded.seconds / duration)

    future.add_done_callback(observe)
    return future


def _transcript(
    utterance: Utterance,
    *,
    is_final: bool,
    stability: float,
    words: list[Word],
    stable_text: str,
    end_s: float,
    lag_s: float,
) -> stt_pb2.TranscribeResponse:
    event = common_pb2.TranscriptEvent(
        utterance_id=utterance.utterance_id,
        is_final=is_final,
        stability=stability,
        text=join_words(words),
        stable_text=stable_text,
        words=[
            common_pb2.WordTiming(
                word=w.text, start_s=w.start_s, end_s=w.end_s, probability=w.probability
            )
            for w in words
        ],
        span=common_pb2.AudioSpan(start_s=utterance.audio_start_s, end_s=end_s),
        lag_s=lag_s,
    )
    return stt_pb2.TranscribeResponse(transcript=event)
