"""The `tts` engine: speaks the oracle's text with the piper voice when the caller's turn ends.

No speech LM: the agent says exactly the oracle text, in the embedded piper
voice (`kame_common.voice`, 24 kHz). It runs on any CPU and is the cascade
baseline.

Turns. `turns.TurnDetector` watches the caller frames: SPEECH_START after two
voiced frames, TURN_END after `turn_end_silence_s` of pause. TURN_END opens the
agent's turn: it speaks the current oracle candidate at once and keeps speaking
as APPENDs extend it. Caller speech (SPEECH_START) during the agent's turn
ends it: playback stops on that frame (barge-in: the agent is silent from the
second frame of caller speech on), queued audio is dropped and the candidate
being spoken is closed (later APPENDs of it are ignored; the oracle answers the
new words with a new RESET).

Phrases. Text is synthesized phrase by phrase in one worker thread (piper's
phonemizer is process-global, and onnxruntime already spreads one synthesis over
the cores), never on the event loop. A phrase ends at punctuation or at a word
limit that grows with the audio already queued: 3 words when nothing is queued
(so the first audio of a turn comes quickly), 6 with under 1.5 s queued, then
12. A phrase that the oracle has not finished yet (no punctuation, below the
limit) waits for more text until less than LOW_WATER_S of audio is left.
Phrases for an empty queue jump the worker's queue ahead of other sessions'
later phrases. While the caller is still speaking, the first phrase of the
current candidate is synthesized ahead, so a turn end usually finds its audio
ready and the agent speaks on the turn-end frame itself. A frame that is due to
carry speech but finds no audio ready carries silence and is counted
(kame_frontend_late_audio_frames_total).

RESET policy. A RESET while the agent speaks lets the word in progress finish
(the phrase is cut at that word's end, snapped to the quietest point nearby and
faded out over 5 ms) and drops everything queued after it; the agent then goes
on with the new candidate. Because a restarted oracle usually begins its new
answer with the words already said, the new candidate's leading words that
repeat, position by position, the words the agent already spoke of the previous
candidate are skipped, and speech continues from the first word that differs.
A RESET while the caller holds the turn just replaces the candidate (and its
prepared first phrase). APPENDs of another generation than the current one are
stale and ignored; an APPEND before any RESET starts a candidate.

Word timing. Each phrase is synthesized whole; its voiced span (leading and
trailing silence trimmed by a 10 ms energy envelope) is divided among its
words in proportion to their characters (+1 each for the gap after the word).
A word's start_s/end_s are its samples' position in the agent's output stream,
in seconds from the stream's first frame.

Filler. If the session's config names a filler text and, at turn end, nothing
of the oracle is ready or being synthesized, the filler (synthesized once per
engine) is said first, with generation 0. Off unless configured.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kame_common.audio import FRAME_SAMPLES, FRAME_SECONDS, SAMPLE_RATE
from kame_common.models import piper_voice_path
from kame_common.voice import Voice, load_voice
from services.frontend import metrics
from services.frontend.engines.base import (
    Engine,
    EngineSession,
    InvalidSessionConfig,
    SessionParams,
    SlotsExhausted,
    SpokenWord,
    StepOutput,
)
from services.frontend.engines.turns import TurnDetector, TurnEvent

log = logging.getLogger(__name__)

FIRST_PHRASE_WORDS = 3
MID_PHRASE_WORDS = 6
MAX_PHRASE_WORDS = 12
MID_PHRASE_QUEUED_S = 1.5  # below this much queued audio, phrases stay mid-sized
LOW_WATER_S = 0.5  # an unfinished phrase is synthesized once less audio than this is queued
LEAD_IN_S = 0.02  # silence kept before a phrase's first sound
PAUSE_AFTER_S = {".": 0.25, "!": 0.25, "?": 0.25, ";": 0.15, ":": 0.15, ",": 0.1}
DEFAULT_TAIL_S = 0.03
ENVELOPE_WINDOW = SAMPLE_RATE // 100  # 10 ms
SILENCE_BELOW_PEAK_DB = 40.0  # envelope this far under the phrase's peak counts as silence
SNAP_RADIUS = SAMPLE_RATE // 20  # a RESET cut moves at most 50 ms to the quietest point
FADE_SAMPLES = SAMPLE_RATE // 200  # 5 ms fade-out at a cut
_CLAUSE_END = re.compile(r"[.,!?;:]['\")\]]*$")


def normalize_word(word: str) -> str:
    """Lower case without punctuation: how two candidates' words are compared."""
    return re.sub(r"[^\w']", "", word.lower())


# --- phrases: synthesized audio with word spans ---


@dataclass
class WordSpan:
    text: str
    start: int  # samples into the phrase audio
    end: int


@dataclass
class Phrase:
    audio: np.ndarray
    words: list[WordSpan]
    generation: int

    def copy(self) -> Phrase:
        spans = [WordSpan(w.text, w.start, w.end) for w in self.words]
        return Phrase(self.audio.copy(), spans, self.generation)


def voiced_bounds(audio: np.ndarray) -> tuple[int, int]:
    """First and last sample of the phrase's sound (10 ms energy envelope)."""
    windows = len(audio) // ENVELOPE_WINDOW
    if windows == 0:
        return 0, len(audio)
    energy = np.square(audio[: windows * ENVELOPE_WINDOW], dtype=np.float64)
    envelope = energy.reshape(windows, ENVELOPE_WINDOW).mean(axis=1)
    peak = float(envelope.max())
    if peak <= 0.0:
        return 0, 0
    loud = np.flatnonzero(envelope >= peak * 10 ** (-SILENCE_BELOW_PEAK_DB / 10))
    return int(loud[0]) * ENVELOPE_WINDOW, (int(loud[-1]) + 1) * ENVELOPE_WINDOW


def shape_phrase(audio: np.ndarray, words: list[str], generation: int) -> Phrase:
    """Trim the synthesized phrase to LEAD_IN_S + sound + a pause fitting its last
    punctuation, and spread its words over the sound by character count."""
    start, end = voiced_bounds(audio)
    lead = min(start, round(LEAD_IN_S * SAMPLE_RATE))
    tail_s = PAUSE_AFTER_S.get(words[-1][-1:], DEFAULT_TAIL_S) if words else 0.0
    tail = round(tail_s * SAMPLE_RATE)
    sound = audio[start - lead : end]
    shaped = np.concatenate([sound, np.zeros(tail, dtype=np.float32)]).astype(np.float32)
    weights = np.array([len(w) + 1 for w in words], dtype=np.float64)
    edges = lead + np.round(
        np.concatenate([[0.0], np.cumsum(weights)]) / weights.sum() * (end - start)
    ).astype(int)
    spans = [WordSpan(w, int(edges[i]), int(edges[i + 1])) for i, w in enumerate(words)]
    return Phrase(shaped, spans, generation)


def synthesize_phrase(voice: Voice, words: list[str], generation: int) -> Phrase:
    """Runs on the synthesis thread."""
    started = time.perf_counter()
    audio = voice.synthesize(" ".join(words))
    elapsed = time.perf_counter() - started
    if len(audio):
        metrics.SYNTHESIS_RTF.observe(elapsed / (len(audio) / SAMPLE_RATE))
    return shape_phrase(audio, words, generation)


class SynthesisWorker:
    """One thread that runs synthesis jobs, urgent ones (a session with nothing
    queued to say) before the rest, each in submission order."""

    def __init__(self) -> None:
        self._jobs: queue.PriorityQueue[tuple[int, int, Callable[[], Any] | None, Future]] = (
            queue.PriorityQueue()
        )
        self._order = itertools.count()
        self._thread = threading.Thread(target=self._run, name="tts-synthesis", daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[], Any], urgent: bool) -> Future:
        future: Future = Future()
        self._jobs.put((0 if urgent else 1, next(self._order), job, future))
        return future

    def _run(self) -> None:
        while True:
            _, _, job, future = self._jobs.get()
            if job is None:
                return
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(job())
            except Exception as exc:  # handed to the session that asked for it
                future.set_exception(exc)

    def close(self) -> None:
        """Stop after the job in progress; jobs still queued are cancelled."""
        self._jobs.put((-1, next(self._order), None, Future()))
        self._thread.join()
        while not self._jobs.empty():
            self._jobs.get_nowait()[3].cancel()


# --- playback ---


class Player:
    """Plays queued phrases into 80 ms frames and reports the words they start."""

    def __init__(self) -> None:
        self._queue: deque[Phrase] = deque()
        self._pos = 0  # samples of the head phrase already played

    @property
    def queued_samples(self) -> int:
        return sum(len(p.audio) for p in self._queue) - self._pos

    def add(self, phrase: Phrase) -> None:
        self._queue.append(phrase)

    def clear(self) -> None:
        self._queue.clear()
        self._pos = 0

    def render(self, frame_start_s: float) -> tuple[np.ndarray, list[SpokenWord], int]:
        """The next frame, the words that start in it, and how many samples came from phrases."""
        out = np.zeros(FRAME_SAMPLES, dtype=np.float32)
        words: list[SpokenWord] = []
        filled = 0
        while filled < FRAME_SAMPLES and self._queue:
            head = self._queue[0]
            take = min(FRAME_SAMPLES - filled, len(head.audio) - self._pos)
            out[filled : filled + take] = head.audio[self._pos : self._pos + take]
            for span in head.words:
                if self._pos <= span.start < self._pos + take:
                    start_s = frame_start_s + (filled + span.start - self._pos) / SAMPLE_RATE
                    duration_s = (span.end - span.start) / SAMPLE_RATE
                    words.append(
                        SpokenWord(span.text, start_s, start_s + duration_s, head.generation)
                    )
            filled += take
            self._pos += take
            if self._pos >= len(head.audio):
                self._queue.popleft()
                self._pos = 0
        return out, words, filled

    def finish_current_word(self) -> None:
        """Keep only the rest of the word being spoken; drop everything after it."""
        if not self._queue:
            return
        head = self._queue[0]
        self._queue = deque([head])
        started = [span for span in head.words if span.start < self._pos]
        head.words = started
        if started and started[-1].end > self._pos:
            cut = self._quietest_near(head.audio, started[-1].end)
        else:  # between words: stop right here
            cut = self._pos
        head.audio = head.audio[:cut].copy()
        fade = min(FADE_SAMPLES, cut - self._pos)
        if fade > 0:
            head.audio[cut - fade : cut] *= np.linspace(1.0, 0.0, fade, dtype=np.float32)
        if self._pos >= len(head.audio):
            self.clear()

    def _quietest_near(self, audio: np.ndarray, target: int) -> int:
        """The sample within SNAP_RADIUS of `target` (never before the play position)
        where a 5 ms window is quietest: a cut there does not clip a sound."""
        low = max(self._pos, target - SNAP_RADIUS)
        high = min(len(audio), target + SNAP_RADIUS)
        if high - low <= FADE_SAMPLES:
            return min(target, len(audio))
        energy = np.convolve(np.square(audio[low:high]), np.ones(FADE_SAMPLES), mode="valid")
        return low + int(np.argmin(energy)) + FADE_SAMPLES // 2


# --- oracle candidates ---


@dataclass
class Candidate:
    """One oracle answer (a generation) and how far the agent got through it."""

    generation: int
    words: list[str] = field(default_factory=list)
    next_index: int = 0  # first word not yet handed to synthesis
    said: list[str] = field(default_factory=list)  # normalized words the agent has spoken
    # Normalized words the agent spoke of the candidate this one replaced: leading
    # words that repeat them are skipped instead of said twice.
    echo: list[str] = field(default_factory=list)
    closed: bool = False

    @property
    def pending(self) -> int:
        return len(self.words) - self.next_index

    def skip_echo(self) -> None:
        while self.echo and self.next_index < len(self.words):
            if self.next_index >= len(self.echo):
                self.echo = []
            elif normalize_word(self.words[self.next_index]) == self.echo[self.next_index]:
                self.said.append(self.echo[self.next_index])
                self.next_index += 1
            else:
                self.echo = []

    def next_phrase(self, limit: int) -> tuple[list[str], bool]:
        """Up to `limit` pending words, ending early after a clause's punctuation;
        complete is True when the phrase ends at punctuation or reaches the limit."""
        if self.echo:  # still deciding whether the next word repeats what was said
            return [], False
        phrase: list[str] = []
        for word in self.words[self.next_index : self.next_index + limit]:
            phrase.append(word)
            if _CLAUSE_END.search(word):
                return phrase, True
        return phrase, len(phrase) == limit


# --- sessions ---


class TtsSession(EngineSession):
    def __init__(self, engine: TtsEngine, params: SessionParams) -> None:
        self._engine = engine
        self._turns = TurnDetector(params.turn_end_silence_s)
        self._player = Player()
        self._candidate: Candidate | None = None
        self._responding = False  # the agent holds the turn
        self._job: Future | None = None
        self._job_epoch = 0
        self._epoch = 0  # bumped whenever audio being synthesized stops being wanted
        self._frame_index = 0
        self._turn_end_at: float | None = None  # monotonic time of the turn end, until first audio
        filler_text = params.filler_text.strip()
        self._filler = engine.filler(filler_text) if filler_text else None
        self._closed = False

    async def step(self, frame: np.ndarray) -> StepOutput:
        event = self._turns.push(frame)
        if event is TurnEvent.SPEECH_START and self._responding:
            self._end_agent_turn()
        elif event is TurnEvent.TURN_END:
            self._start_agent_turn()
        self._collect_synthesis()
        self._plan_synthesis()
        frame_start_s = self._frame_index * FRAME_SECONDS
        self._frame_index += 1
        if not self._responding:
            return StepOutput(np.zeros(FRAME_SAMPLES, dtype=np.float32), speaking=False)
        pcm, words, filled = self._player.render(frame_start_s)
        self._note_spoken(words)
        if filled < FRAME_SAMPLES and self._job is not None:
            metrics.LATE_AUDIO_FRAMES.inc()
        if filled and self._turn_end_at is not None:
            metrics.FIRST_AUDIO_SECONDS.observe(time.monotonic() - self._turn_end_at)
            self._turn_end_at = None
        return StepOutput(pcm, speaking=filled > 0, words=words)

    def oracle_reset(self, generation: int) -> None:
        previous = self._candidate
        # Only an answer still being given can be continued; a closed one ended with its turn.
        continuing = previous is not None and not previous.closed and self._responding
        echo = previous.said if continuing else []
        if self._responding:
            self._player.finish_current_word()
        else:
            self._player.clear()
        self._drop_synthesis()
        self._candidate = Candidate(generation, echo=list(echo))

    def oracle_append(self, generation: int, text: str) -> None:
        if self._candidate is None:
            self.oracle_reset(generation)
        candidate = self._candidate
        if candidate.generation != generation or candidate.closed:
            return  # a stale generation: a newer RESET replaced it, or a barge-in closed it
        candidate.words.extend(text.split())
        candidate.skip_echo()
        self._plan_synthesis()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._drop_synthesis()
        self._player.clear()
        self._engine.release_slot()

    def _start_agent_turn(self) -> None:
        metrics.TURN_ENDS.inc()
        self._responding = True
        self._turn_end_at = time.monotonic()
        nothing_to_say = (
            self._player.queued_samples == 0
            and self._job is None
            and (self._candidate is None or self._candidate.closed or not self._candidate.pending)
        )
        if nothing_to_say and self._filler is not None and self._filler.done():
            if self._filler.exception() is None:
                self._player.add(self._filler.result().copy())

    def _end_agent_turn(self) -> None:
        """The caller spoke during the agent's turn: stop talking now."""
        if self._player.queued_samples:
            metrics.BARGE_INS.inc()
        self._responding = False
        self._turn_end_at = None
        self._player.clear()
        self._drop_synthesis()
        if self._candidate is not None:
            self._candidate.closed = True

    def _drop_synthesis(self) -> None:
        self._epoch += 1
        if self._job is not None:
            self._job.cancel()
            self._job = None

    def _collect_synthesis(self) -> None:
        if self._job is None or not self._job.done():
            return
        job, self._job = self._job, None
        if self._job_epoch != self._epoch or job.cancelled():
            return
        if job.exception() is not None:
            log.error("synthesis failed; skipping a phrase", exc_info=job.exception())
            return
        self._player.add(job.result())

    def _plan_synthesis(self) -> None:
        """Hand the next phrase to the synthesis thread when it is time (module docstring)."""
        candidate = self._candidate
        if self._job is not None or candidate is None or candidate.closed or self._closed:
            return
        queued_s = self._player.queued_samples / SAMPLE_RATE
        if not self._responding and queued_s > 0:
            return  # the coming turn's first phrase is ready; the rest waits for the turn end
        if queued_s == 0:
            limit = FIRST_PHRASE_WORDS
        elif queued_s < MID_PHRASE_QUEUED_S:
            limit = MID_PHRASE_WORDS
        else:
            limit = MAX_PHRASE_WORDS
        words, complete = candidate.next_phrase(limit)
        if not words:
            return
        if not complete and (not self._responding or queued_s >= LOW_WATER_S):
            return  # wait for the oracle to finish the phrase while audio lasts
        candidate.next_index += len(words)
        voice, generation = self._engine.voice, candidate.generation
        self._job = self._engine.worker.submit(
            lambda: synthesize_phrase(voice, words, generation), urgent=queued_s == 0
        )
        self._job_epoch = self._epoch

    def _note_spoken(self, words: list[SpokenWord]) -> None:
        candidate = self._candidate
        if candidate is None:
            return
        candidate.said.extend(
            normalize_word(w.text) for w in words if w.generation == candidate.generation
        )


class TtsEngine(Engine):
    name = "tts"

    def __init__(self, voice_path: str = "", slots: int = 4) -> None:
        path = Path(voice_path) if voice_path else piper_voice_path()
        if not path.is_file():
            raise FileNotFoundError(f"piper voice {path} does not exist")
        self.voice = load_voice(voice_path)
        self.voice_name = path.stem
        self._accepted_voices = {"", str(path), path.name, path.stem}
        self.worker = SynthesisWorker()
        self._slots = slots
        self._open = 0
        self._fillers: dict[str, Future] = {}

    @property
    def total_slots(self) -> int:
        return self._slots

    @property
    def free_slots(self) -> int:
        return self._slots - self._open

    async def open_session(self, params: SessionParams) -> TtsSession:
        if params.voice not in self._accepted_voices:
            raise InvalidSessionConfig(
                f"voice {params.voice!r} is not served here; use '' or {self.voice_name!r}"
            )
        if self._open >= self._slots:
            raise SlotsExhausted(f"all {self._slots} tts sessions of this replica are in use")
        self._open += 1
        return TtsSession(self, params)

    def release_slot(self) -> None:
        self._open -= 1

    def filler(self, text: str) -> Future:
        """The filler phrase, synthesized once per engine and shared by its sessions."""
        if text not in self._fillers:
            voice, words = self.voice, text.split()
            self._fillers[text] = self.worker.submit(
                lambda: synthesize_phrase(voice, words, 0), urgent=False
            )
        return self._fillers[text]

    async def close(self) -> None:
        await asyncio.to_thread(self.worker.close)
