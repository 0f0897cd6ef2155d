"""The `kame` and `moshi` front-end engines: batch slots over one model.

Each session owns one row (slot) of a `SlotBatch`. `step()` hands in one caller
frame and waits for the tick that carries it.

Ticks run on a fixed clock, one every `tick_s` (80 ms, the frame), in one
dedicated model thread, never on the event loop, one at a time. Every open
session has a small jitter buffer: the frames it handed in that no tick has
taken yet, oldest first. Each tick takes the oldest frame of every session
that has one, so all active sessions share every tick, whatever the phase of
their frames: a frame that arrived since the last tick is stepped at the next
one, which adds less than one tick of delay while a caller's frames come at
the frame rate (one tick plus the arrival jitter when its frames arrive right
at the tick). `step()` may be called again before the previous frame's tick
(the frontend service reads ahead), and the outputs come back in order.
- Underrun: a session with no frame at a tick is masked out of it; its state
  does not move (no concealment is fed to the model), and its frame goes in
  the next tick after it arrives (`kame_frontend_jitter_underruns_total`).
- Overflow: a buffer holds at most `jitter_frames` frames (2: the next tick's
  and one that came early). A frame more drops the oldest one waiting: the
  model never hears it and its step returns silence
  (`kame_frontend_jitter_dropped_frames_total`). A caller's backlog (frames
  that bunched after a network stall) is so cut back instead of delaying the
  rest of the call, and no frame waits two ticks or more.
- A tick that runs past the next tick's time (overload) is followed at once by
  the next one, and the clock goes on from there
  (`kame_frontend_tick_overruns_total`).
A masked row still costs a full pass: moshi computes every row of the batch
and masks the state updates (its CUDA graphs need the fixed batch shape), so a
tick costs what `batch_slots` rows cost, however many sessions are active.
`kame_frontend_tick_sessions` is the histogram of sessions per tick.

A slot is reset (model state, oracle, step count) in the first tick of the
session that takes it, so a new session starts with no oracle.

Long calls: the LM attends to the last `context` steps of its session (3000
steps, 4 minutes, in Moshi's config). Past that edge the engine keeps
speaking: moshi's `RingKVCache` (the reference's) is a sliding window, each
step overwrites the oldest of the `context` entries and attends to the last
`context` steps; the position (RoPE offset, computed in float32) keeps
counting. Nothing is reset at the edge: Mimi's codec state, the acoustic
delay, the step count and the oracle stream (anchored at step numbers that
keep counting) go on as before; the model simply no longer sees what was said
more than `context` steps ago. Mimi's own transformers (context 250) slide the
same way.

Oracle updates (kame engine; the moshi engine ignores them): text is tokenized
whole words at a time on arrival and queued; the queue is handed to the model
thread with the session's next frame, so an update takes effect from the next
step that starts after it arrived. A RESET that carries the candidate's first
words is a RESET followed by an APPEND of them, in the same step (the
reference semantics); its source is not used: the LM itself decides how to use
the oracle stream. An APPEND of an older generation than the current oracle is
dropped as stale; one of a newer generation, or with no oracle yet, starts a
new oracle first (as RESET would). Caller transcripts are ignored, and the
engine never reports turn ends: KAME is full duplex, it takes turns itself.

Agent audio: Mimi's decode of the step's agent codes; silence while the LM is
still filling its acoustic delay (the first step of a session). `speaking` is
True when the frame's level is above SPEAKING_DBFS.

The caller's CANCEL (push-to-talk clients) cannot stop the LM, which takes
turns itself; it silences the agent's current stretch of speech instead
(mute.py). END_TURN, RESPOND and typed messages do nothing here (the oracle
still hears a typed message), and manual turns are refused.

Agent words: a word is reported when the next token shows it complete, with
the oracle generation in effect (fed to the model) at the step its first piece
was spoken, not the newest one received; `flush_words` reports the word still
open when the caller's input ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import sentencepiece

from kame_common.audio import FRAME_SAMPLES, FRAME_SECONDS, Samples, rms_dbfs
from services.frontend.engines.base import (
    CandidateSource,
    Engine,
    EngineSession,
    InvalidSessionConfig,
    SessionParams,
    SlotsExhausted,
    SpokenWord,
    StepOutput,
)
from services.frontend.engines.kame import checkpoint, metrics
from services.frontend.engines.kame.batch import SlotBatch, SlotOutput
from services.frontend.engines.kame.text import WordAssembler, oracle_token_ids
from services.frontend.engines.mute import SpeechMute

DEFAULT_JITTER_FRAMES = 2
SPEAKING_DBFS = -50.0
# What the step of a frame dropped from a full jitter buffer returns: silence.
_DROPPED = SlotOutput(tokens=None, pcm=None)


class ModelSettings(Protocol):
    """The settings `KameEngine.from_config` reads (FrontendSettings has them)."""

    checkpoint: str
    device: str
    dtype: str
    batch_slots: int
    jitter_frames: int


@dataclass
class _OracleOp:
    tokens: list[int] | None  # None: RESET


@dataclass
class _Pending:
    frame: Samples
    future: asyncio.Future[SlotOutput]


@dataclass
class _SlotWork:
    slot: int
    frame: Samples
    reset: bool
    oracle_ops: list[_OracleOp] = field(default_factory=list)


class KameSession(EngineSession):
    def __init__(self, engine: KameEngine, slot: int, session_id: str) -> None:
        self._engine = engine
        self.slot = slot
        self.session_id = session_id
        self._needs_reset = True
        self._closed = False
        self._stepped = False  # a tick has taken one of its frames
        self._jitter: deque[_Pending] = deque()  # frames no tick has taken yet, oldest first
        self._oracle_ops: list[_OracleOp] = []
        # The newest generation received (what stale APPENDs are judged by), and
        # the one the model is fed: updates go to the model thread with the next
        # frame, so a word spoken in the meantime belongs to the older one.
        self._generation: int | None = None
        self._generation_in_effect: int | None = None
        self._frame_index = 0
        self._mute = SpeechMute()  # CANCEL: the current stretch of speech is silenced
        self._words = (
            WordAssembler(engine.tokenizer, engine.padding_ids)
            if engine.tokenizer is not None
            else None
        )

    async def step(self, frame: Samples) -> StepOutput:
        if self._closed:
            raise RuntimeError(f"session {self.session_id} is closed")
        frame = np.asarray(frame, dtype=np.float32)
        if frame.shape != (FRAME_SAMPLES,):
            raise ValueError(f"a frame must be {FRAME_SAMPLES} samples, got shape {frame.shape}")
        output = await self._engine._submit(self, frame)
        return self._step_output(output)

    def oracle_reset(
        self, generation: int, text: str = "", source: CandidateSource | None = None
    ) -> None:
        if not self._engine.with_oracle or self._closed:
            return
        self._generation = generation
        self._oracle_ops.append(_OracleOp(tokens=None))
        if text:
            self._queue_tokens(text)

    def oracle_append(self, generation: int, text: str) -> None:
        if not self._engine.with_oracle or self._closed:
            return
        if self._generation is not None and generation < self._generation:
            metrics.STALE_ORACLE_UPDATES.inc()
            return
        if self._generation is None or generation > self._generation:
            self.oracle_reset(generation)
        self._queue_tokens(text)

    def _queue_tokens(self, text: str) -> None:
        assert self._engine.tokenizer is not None  # the kame engine always loads one
        tokens = oracle_token_ids(self._engine.tokenizer, text)
        if tokens:
            self._oracle_ops.append(_OracleOp(tokens=tokens))
            metrics.ORACLE_TOKENS.inc(len(tokens))

    def cancel(self) -> None:
        self._mute.cancel()

    def flush_words(self) -> list[SpokenWord]:
        """The word still open (a word is reported once the next token shows it
        complete, and the session's last word has no next token)."""
        return self._words.flush() if self._words is not None else []

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._engine._release(self)

    def _next_frame(self) -> _Pending | None:
        """The oldest frame still awaited (a caller that gave up cancelled the others)."""
        while self._jitter:
            pending = self._jitter.popleft()
            if not pending.future.done():
                return pending
        return None

    def _take_work(self, frame: Samples) -> _SlotWork:
        work = _SlotWork(self.slot, frame, self._needs_reset, self._oracle_ops)
        self._needs_reset = False
        self._stepped = True
        self._oracle_ops = []
        self._generation_in_effect = self._generation
        return work

    def _cancel_frames(self) -> None:
        while self._jitter:
            self._jitter.popleft().future.cancel()

    def _step_output(self, output: SlotOutput) -> StepOutput:
        frame_index = self._frame_index
        self._frame_index += 1
        if output.pcm is None:
            pcm: Samples = np.zeros(FRAME_SAMPLES, dtype=np.float32)
            speaking = False
        else:
            pcm = output.pcm.astype(np.float32, copy=False)
            speaking = rms_dbfs(pcm) > SPEAKING_DBFS
        words = []
        if self._words is not None:
            text_token = output.tokens[0] if output.tokens is not None else None
            words = self._words.push(text_token, frame_index, self._generation_in_effect or 0)
        return self._mute.apply(StepOutput(pcm=pcm, speaking=speaking, words=words))


class KameEngine(Engine):
    def __init__(
        self,
        batch: SlotBatch,
        tokenizer: sentencepiece.SentencePieceProcessor | None,
        *,
        tick_s: float = FRAME_SECONDS,
        jitter_frames: int = DEFAULT_JITTER_FRAMES,
    ) -> None:
        if batch.with_oracle and tokenizer is None:
            raise ValueError("the kame engine needs the checkpoint's tokenizer for oracle text")
        if tick_s <= 0:
            raise ValueError(f"tick_s must be positive, got {tick_s}")
        if jitter_frames < 1:
            raise ValueError(f"jitter_frames must be at least 1, got {jitter_frames}")
        self.name = "kame" if batch.with_oracle else "moshi"
        self.with_oracle = batch.with_oracle
        self.tokenizer = tokenizer
        lm = batch.lm
        self.padding_ids = (
            lm.text_padding_token_id,
            lm.end_of_text_padding_id,
            lm.text_initial_token_id,
        )
        self._batch = batch
        self._tick_s = tick_s
        self._jitter_frames = jitter_frames
        self._sessions: list[KameSession | None] = [None] * batch.slots
        self._model_thread = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"{self.name}-model"
        )
        self._ticker: asyncio.Task[None] | None = None
        self._closed = False

    @classmethod
    def from_config(cls, config: ModelSettings, with_oracle: bool) -> KameEngine:
        """Load the checkpoint named by config.checkpoint (blocking: seconds to minutes).

        LMGen's parameters (sampling, CFG) come from the checkpoint's lm_gen_config;
        dtype `auto` is bfloat16 on CUDA, float32 elsewhere."""
        if not config.checkpoint:
            raise checkpoint.CheckpointError(
                "engines kame and moshi need a checkpoint: a directory in the Hugging Face "
                "layout or a repo id (--checkpoint / KAME_FRONTEND_CHECKPOINT)"
            )
        ckpt = checkpoint.read(checkpoint.resolve(config.checkpoint))
        dtype = checkpoint.resolve_dtype(config.dtype, config.device)
        lm = checkpoint.load_lm(ckpt, device=config.device, dtype=dtype)
        mimi = checkpoint.load_mimi(ckpt, device=config.device)
        tokenizer = None
        if with_oracle or ckpt.tokenizer_path is not None:
            tokenizer = checkpoint.load_tokenizer(ckpt)
        lm_gen_params = ckpt.lm_gen_params()
        try:
            batch = SlotBatch(
                lm,
                config.batch_slots,
                mimi=mimi,
                use_sampling=True,
                sampling_params=lm_gen_params,
                with_oracle=with_oracle,
            )
        except AssertionError as exc:  # LMGen checks its arguments (CFG needs a fuser)
            raise checkpoint.CheckpointError(
                f"{ckpt.directory}: lm_gen_config {lm_gen_params} does not suit this model: {exc}"
            ) from exc
        batch.warm_up()
        return cls(batch, tokenizer, jitter_frames=config.jitter_frames)

    @property
    def total_slots(self) -> int:
        return self._batch.slots

    @property
    def free_slots(self) -> int:
        return sum(session is None for session in self._sessions)

    async def open_session(self, params: SessionParams) -> KameSession:
        if self._closed:
            raise RuntimeError(f"the {self.name} engine is closed")
        free = [slot for slot, session in enumerate(self._sessions) if session is None]
        if params.manual_turns:
            raise InvalidSessionConfig(
                f"the {self.name} engine takes turns itself (full duplex): manual turns "
                "(push-to-talk) need the tts engine"
            )
        if not free:
            raise SlotsExhausted(
                f"all {self.total_slots} batch slots of the {self.name} engine are busy"
            )
        session = KameSession(self, free[0], params.session_id)
        self._sessions[session.slot] = session
        self._ensure_ticker()
        return session

    async def close(self) -> None:
        self._closed = True
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError, RuntimeError):
                await self._ticker
        for session in self._sessions:
            if session is not None:
                session._cancel_frames()
        await asyncio.to_thread(self._model_thread.shutdown, wait=True)

    def _ensure_ticker(self) -> None:
        loop = asyncio.get_running_loop()
        if self._ticker is not None and not self._ticker.done() and self._ticker.get_loop() is loop:
            return
        self._ticker = loop.create_task(self._tick_forever(), name=f"{self.name}-ticker")

    async def _submit(self, session: KameSession, frame: Samples) -> SlotOutput:
        """Queue the frame in the session's jitter buffer; its output once a tick took it."""
        self._ensure_ticker()
        future: asyncio.Future[SlotOutput] = asyncio.get_running_loop().create_future()
        session._jitter.append(_Pending(frame, future))
        if len(session._jitter) > self._jitter_frames:
            oldest = session._jitter.popleft()
            if not oldest.future.done():
                metrics.JITTER_DROPPED_FRAMES.labels(self.name).inc()
                oldest.future.set_result(_DROPPED)
        return await future

    def _release(self, session: KameSession) -> None:
        if self._sessions[session.slot] is session:
            self._sessions[session.slot] = None
        session._cancel_frames()

    async def _tick_forever(self) -> None:
        loop = asyncio.get_running_loop()
        next_tick = loop.time() + self._tick_s
        while True:
            await asyncio.sleep(max(0.0, next_tick - loop.time()))
            work, futures = self._collect_work()
            if work:
                await self._tick(loop, work, futures)
            next_tick += self._tick_s
            if loop.time() > next_tick:
                # This tick ran past the next one's time: that one starts at once and
                # the clock goes on from there (no burst of ticks to catch up).
                metrics.TICK_OVERRUNS.labels(self.name).inc()
                next_tick = loop.time()

    async def _tick(
        self,
        loop: asyncio.AbstractEventLoop,
        work: list[_SlotWork],
        futures: dict[int, asyncio.Future[SlotOutput]],
    ) -> None:
        try:
            outputs = await loop.run_in_executor(self._model_thread, self._run_tick, work)
        except asyncio.CancelledError:  # the engine is closing
            for future in futures.values():
                future.cancel()
            raise
        except Exception as exc:  # hand the failure to every session of the tick
            for future in futures.values():
                if not future.done():
                    future.set_exception(exc)
            return
        for slot, future in futures.items():
            if not future.done():
                future.set_result(outputs[slot])

    def _collect_work(self) -> tuple[list[_SlotWork], dict[int, asyncio.Future[SlotOutput]]]:
        """The oldest waiting frame of every open session that has one."""
        work: list[_SlotWork] = []
        futures: dict[int, asyncio.Future[SlotOutput]] = {}
        for session in self._sessions:
            if session is None:
                continue
            pending = session._next_frame()
            if pending is None:
                if session._stepped:
                    metrics.JITTER_UNDERRUNS.labels(self.name).inc()
                continue
            work.append(session._take_work(pending.frame))
            futures[session.slot] = pending.future
        return work, futures

    def _run_tick(self, work: list[_SlotWork]) -> dict[int, SlotOutput]:
        """Model thread: apply resets and oracle updates, then step the batch once."""
        started = time.perf_counter()
        self._batch.reset(item.slot for item in work if item.reset)
        for item in work:
            self._apply_oracle_ops(item)
        outputs = self._batch.step_audio({item.slot: item.frame for item in work})
        metrics.TICK_SECONDS.labels(self.name).observe(time.perf_counter() - started)
        metrics.TICK_SESSIONS.labels(self.name).observe(len(work))
        return outputs

    def _apply_oracle_ops(self, item: _SlotWork) -> None:
        for op in item.oracle_ops:
            if op.tokens is None:
                self._batch.oracle_reset(item.slot)
            else:
                late = self._batch.oracle_append(item.slot, op.tokens)
                if late:
                    metrics.LATE_ORACLE_TOKENS.inc(late)
