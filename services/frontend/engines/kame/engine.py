"""The `kame` and `moshi` front-end engines: batch slots over one model.

Each session owns one row (slot) of a `SlotBatch`. `step()` hands in one caller
frame and waits for the tick that carries it. The ticker (an asyncio task)
gathers the frames of the active sessions and starts one tick as soon as every
session stepped in the previous tick has supplied its next frame, or
`tick_deadline_s` after the first frame of the tick arrived. A session that is
late misses that tick (its row is masked out, its state does not move) and goes
in the next one; sessions out of that rhythm (just joined, or late last time)
are taken when their frame is there but not waited for, so a stalled client
does not delay everyone else's every frame. Ticks run in one dedicated model
thread, never on the event loop, one at a time.

A slot is reset (model state, oracle, step count) in the first tick of the
session that takes it, so a new session starts with no oracle.

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

Agent words: a word is reported when the next token shows it complete, with
the oracle generation in effect (fed to the model) at the step its first piece
was spoken, not the newest one received; `flush_words` reports the word still
open when the caller's input ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import sentencepiece

from kame_common.audio import FRAME_SAMPLES, Samples, rms_dbfs
from services.frontend.engines.base import (
    CandidateSource,
    Engine,
    EngineSession,
    SessionParams,
    SlotsExhausted,
    SpokenWord,
    StepOutput,
)
from services.frontend.engines.kame import checkpoint, metrics
from services.frontend.engines.kame.batch import SlotBatch, SlotOutput
from services.frontend.engines.kame.text import WordAssembler, oracle_token_ids

DEFAULT_TICK_DEADLINE_S = 0.02
SPEAKING_DBFS = -50.0


class ModelSettings(Protocol):
    """The settings `KameEngine.from_config` reads (FrontendSettings has them)."""

    checkpoint: str
    device: str
    dtype: str
    batch_slots: int


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
        self._oracle_ops: list[_OracleOp] = []
        # The newest generation received (what stale APPENDs are judged by), and
        # the one the model is fed: updates go to the model thread with the next
        # frame, so a word spoken in the meantime belongs to the older one.
        self._generation: int | None = None
        self._generation_in_effect: int | None = None
        self._frame_index = 0
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
        output = await self._engine._submit(self.slot, frame)
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

    def flush_words(self) -> list[SpokenWord]:
        """The word still open (a word is reported once the next token shows it
        complete, and the session's last word has no next token)."""
        return self._words.flush() if self._words is not None else []

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._engine._release(self)

    def _take_work(self, frame: Samples) -> _SlotWork:
        work = _SlotWork(self.slot, frame, self._needs_reset, self._oracle_ops)
        self._needs_reset = False
        self._oracle_ops = []
        self._generation_in_effect = self._generation
        return work

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
        return StepOutput(pcm=pcm, speaking=speaking, words=words)


class KameEngine(Engine):
    def __init__(
        self,
        batch: SlotBatch,
        tokenizer: sentencepiece.SentencePieceProcessor | None,
        *,
        tick_deadline_s: float = DEFAULT_TICK_DEADLINE_S,
    ) -> None:
        if batch.with_oracle and tokenizer is None:
            raise ValueError("the kame engine needs the checkpoint's tokenizer for oracle text")
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
        self._tick_deadline_s = tick_deadline_s
        self._sessions: list[KameSession | None] = [None] * batch.slots
        self._pending: dict[int, _Pending] = {}
        self._last_tick: list[KameSession] = []
        self._model_thread = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"{self.name}-model"
        )
        self._ticker: asyncio.Task[None] | None = None
        self._frame_arrived: asyncio.Event | None = None
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
        return cls(batch, tokenizer)

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
        for pending in self._pending.values():
            pending.future.cancel()
        self._pending.clear()
        await asyncio.to_thread(self._model_thread.shutdown, wait=True)

    def _ensure_ticker(self) -> None:
        loop = asyncio.get_running_loop()
        if self._ticker is not None and not self._ticker.done() and self._ticker.get_loop() is loop:
            return
        self._frame_arrived = asyncio.Event()
        self._ticker = loop.create_task(self._tick_forever(), name=f"{self.name}-ticker")

    async def _submit(self, slot: int, frame: Samples) -> SlotOutput:
        if slot in self._pending:
            raise RuntimeError(f"slot {slot} already has a frame waiting for its tick")
        self._ensure_ticker()
        future: asyncio.Future[SlotOutput] = asyncio.get_running_loop().create_future()
        self._pending[slot] = _Pending(frame, future)
        assert self._frame_arrived is not None
        self._frame_arrived.set()
        try:
            return await future
        finally:
            if self._pending.get(slot) is not None and self._pending[slot].future is future:
                del self._pending[slot]

    def _release(self, session: KameSession) -> None:
        if self._sessions[session.slot] is session:
            self._sessions[session.slot] = None
        pending = self._pending.pop(session.slot, None)
        if pending is not None:
            pending.future.cancel()
        if self._frame_arrived is not None:
            self._frame_arrived.set()  # the sessions left may all be ready now

    def _ready_to_tick(self) -> bool:
        """Every session still open that was stepped in the last tick has its frame in."""
        return all(
            session.slot in self._pending
            for session in self._last_tick
            if self._sessions[session.slot] is session
        )

    async def _tick_forever(self) -> None:
        loop = asyncio.get_running_loop()
        arrived = self._frame_arrived
        assert arrived is not None
        while True:
            await arrived.wait()
            deadline = loop.time() + self._tick_deadline_s
            while not self._ready_to_tick() and (remaining := deadline - loop.time()) > 0:
                arrived.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(arrived.wait(), remaining)
            arrived.clear()
            work, futures = self._collect_work()
            if not work:
                continue
            try:
                outputs = await loop.run_in_executor(self._model_thread, self._run_tick, work)
            except Exception as exc:  # hand the failure to every session of the tick
                for future in futures.values():
                    if not future.done():
                        future.set_exception(exc)
                continue
            for slot, future in futures.items():
                if not future.done():
                    future.set_result(outputs[slot])
            if self._pending:
                arrived.set()

    def _collect_work(self) -> tuple[list[_SlotWork], dict[int, asyncio.Future[SlotOutput]]]:
        work: list[_SlotWork] = []
        futures: dict[int, asyncio.Future[SlotOutput]] = {}
        stepped: list[KameSession] = []
        for slot, pending in list(self._pending.items()):
            session = self._sessions[slot]
            del self._pending[slot]
            if session is None or pending.future.done():
                continue
            work.append(session._take_work(pending.frame))
            futures[slot] = pending.future
            stepped.append(session)
        self._last_tick = stepped
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
