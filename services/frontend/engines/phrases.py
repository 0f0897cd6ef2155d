"""The tts engine's audio: phrases synthesized with their words' spans, the
worker thread that synthesizes them, and the Player that plays queued lines
into 80 ms frames (tts.py's module doc says how the engine uses them).

Word timing. Each phrase is synthesized whole; its voiced span (leading and
trailing silence trimmed by a 10 ms energy envelope) is divided among its
words in proportion to their characters (+1 each for the gap after the word).
A word's start_s/end_s are its samples' position in the agent's output stream,
in seconds from the stream's first frame. Hold and repair words carry
generation 0.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np

from kame_common.audio import FRAME_SAMPLES, SAMPLE_RATE, Samples
from kame_common.voice import Voice
from services.frontend import metrics
from services.frontend.engines.base import SpokenWord
from services.frontend.engines.commit import Line, LineKind

LEAD_IN_S = 0.02  # silence kept before a phrase's first sound
PAUSE_AFTER_S = {".": 0.25, "!": 0.25, "?": 0.25, ";": 0.15, ":": 0.15, ",": 0.1}
DEFAULT_TAIL_S = 0.03
ENVELOPE_WINDOW = SAMPLE_RATE // 100  # 10 ms
SILENCE_BELOW_PEAK_DB = 40.0  # envelope this far under the phrase's peak counts as silence

# --- phrases: synthesized audio with word spans ---


@dataclass
class WordSpan:
    text: str
    start: int  # samples into the phrase audio
    end: int


@dataclass
class Phrase:
    audio: Samples
    words: list[WordSpan]


def voiced_bounds(audio: Samples) -> tuple[int, int]:
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


def shape_phrase(audio: Samples, words: list[str]) -> Phrase:
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
    return Phrase(shaped, spans)


def synthesize_phrase(voice: Voice, words: list[str]) -> Phrase:
    """Runs on the synthesis thread."""
    started = time.perf_counter()
    audio = voice.synthesize(" ".join(words))
    elapsed = time.perf_counter() - started
    if len(audio):
        metrics.SYNTHESIS_RTF.observe(elapsed / (len(audio) / SAMPLE_RATE))
    return shape_phrase(audio, words)


class SynthesisWorker:
    """One thread that runs synthesis jobs, urgent ones (a session with nothing
    queued to say) before the rest, each in submission order."""

    def __init__(self) -> None:
        self._jobs: queue.PriorityQueue[
            tuple[int, int, Callable[[], Phrase] | None, Future[Phrase]]
        ] = queue.PriorityQueue()
        self._order = itertools.count()
        self._thread = threading.Thread(target=self._run, name="tts-synthesis", daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[], Phrase], urgent: bool) -> Future[Phrase]:
        future: Future[Phrase] = Future()
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


@dataclass
class Rendered:
    pcm: Samples  # one frame
    words: list[SpokenWord]  # the words that start in it
    filled: int  # samples of it that came from phrases (the rest is silence)
    started: list[Line]  # lines whose audio began in it, in order


class Player:
    """Plays queued lines' phrases into 80 ms frames."""

    def __init__(self) -> None:
        self._queue: deque[tuple[Line, Phrase]] = deque()
        self._pos = 0  # samples of the head phrase already played

    @property
    def queued_samples(self) -> int:
        return sum(len(phrase.audio) for _, phrase in self._queue) - self._pos

    def add(self, line: Line, phrase: Phrase) -> None:
        self._queue.append((line, phrase))

    def clear(self) -> None:
        self._queue.clear()
        self._pos = 0

    def finish_current_phrase(self) -> None:
        """Keep the phrase being played to its end; drop everything queued after it."""
        if self._pos == 0:
            self.clear()
        else:
            self._queue = deque([self._queue[0]])

    def render(self, frame_start_s: float) -> Rendered:
        out = Rendered(np.zeros(FRAME_SAMPLES, dtype=np.float32), [], 0, [])
        while out.filled < FRAME_SAMPLES and self._queue:
            line, phrase = self._queue[0]
            if self._pos == 0:
                out.started.append(line)
            take = min(FRAME_SAMPLES - out.filled, len(phrase.audio) - self._pos)
            out.pcm[out.filled : out.filled + take] = phrase.audio[self._pos : self._pos + take]
            for span in phrase.words:
                if self._pos <= span.start < self._pos + take:
                    start_s = frame_start_s + (out.filled + span.start - self._pos) / SAMPLE_RATE
                    duration_s = (span.end - span.start) / SAMPLE_RATE
                    out.words.append(
                        SpokenWord(
                            span.text,
                            start_s,
                            start_s + duration_s,
                            line.generation,
                            filler=line.kind is not LineKind.ANSWER,
                        )
                    )
            out.filled += take
            self._pos += take
            if self._pos >= len(phrase.audio):
                self._queue.popleft()
                self._pos = 0
        return out
