"""The shared side of the STT service: one Whisper model and what every stream uses.

`SttEngine` owns one WhisperModel, the Silero VAD model, the decode queue
(`DecodeScheduler`) and a small pool of threads for per-frame audio work.
Each caller's stream is an `SttSession` (session.py) that submits its
decodes here.
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from faster_whisper import WhisperModel
from faster_whisper.transcribe import Segment

from kame_common.audio import SAMPLE_RATE, Samples, resample
from kame_common.models import whisper_tiny_en_dir
from services.stt.agreement import Word
from services.stt.config import SttSettings
from services.stt.scheduler import DecodeScheduler
from services.stt.vad import VAD_RATE, SileroVad

log = logging.getLogger(__name__)

# Bounds a decode that loops (Whisper can repeat itself): far above speech's ~5 tokens/s.
TOKENS_PER_SECOND_CAP = 10
MAX_NEW_TOKENS = 400
# Less audio than this holds no word: not worth a decode.
MIN_DECODE_S = 0.1


@dataclass(frozen=True)
class Decoded:
    words: list[Word]  # stream seconds
    seconds: float  # decode wall time


class SttEngine:
    """The shared model side. Construction loads the models (about a second on CPU)."""

    def __init__(self, settings: SttSettings | None = None) -> None:
        self.settings = settings or SttSettings()
        self.model_dir = (
            Path(self.settings.model_dir) if self.settings.model_dir else whisper_tiny_en_dir()
        )
        device = self.settings.device
        compute_type = self.settings.compute_type or ("float16" if device == "cuda" else "int8")
        workers = self.settings.decode_workers
        cpu_threads = self.settings.cpu_threads or max(1, (os.cpu_count() or 1) // workers)
        self.model = WhisperModel(
            str(self.model_dir),
            device=device,
            compute_type=compute_type,
            cpu_threads=cpu_threads,
            num_workers=workers,
        )
        self.vad = SileroVad()
        # The first decode pays one-off allocations: pay them before serving.
        self.decode(np.zeros(VAD_RATE, dtype=np.float32), 0.0, "en", 1)
        self.scheduler = DecodeScheduler(workers)
        # Resampling and VAD per frame: light, but never on the event loop thread.
        self.audio_executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="stt-audio")

    def check_model(self, requested: str) -> None:
        """Sessions may name the served model (or leave it empty); ValueError otherwise."""
        if requested and Path(requested).resolve() != self.model_dir.resolve():
            raise ValueError(
                f"model: this replica serves the Whisper model at {self.model_dir}; "
                f"leave model empty or name that directory, got {requested!r}"
            )

    def check_language(self, language: str) -> None:
        if not self.model.model.is_multilingual and language != "en":
            raise ValueError(
                f"language: the model at {self.model_dir} is English-only; "
                f"use 'en' (or leave it empty), got {language!r}"
            )
        if language not in self.model.supported_languages:
            raise ValueError(
                f"language: {language!r} is not supported; use one of "
                f"{', '.join(self.model.supported_languages)}"
            )

    def decode(self, audio: Samples, offset_s: float, language: str, beam_size: int) -> Decoded:
        """Transcribe one 16 kHz utterance (blocking); word times in stream seconds."""
        started = time.perf_counter()
        duration = len(audio) / VAD_RATE
        if duration < MIN_DECODE_S:
            return Decoded([], 0.0)  # nothing to hear (e.g. a cut just before a pause ended)
        segments, _info = self.model.transcribe(
            audio,
            language=language,
            beam_size=beam_size,
            temperature=0.0,
            condition_on_previous_text=False,
            word_timestamps=self.settings.word_timestamps,
            max_new_tokens=min(MAX_NEW_TOKENS, int(TOKENS_PER_SECOND_CAP * duration) + 16),
        )
        words = [
            word for segment in segments for word in _segment_words(segment, offset_s, duration)
        ]
        return Decoded(words, time.perf_counter() - started)

    def transcribe_clip(
        self, samples: Samples, sample_rate: int = SAMPLE_RATE, beam_size: int = 5
    ) -> str:
        """The text of a whole clip (float32, default 24 kHz), e.g. to check what an
        agent said. Offline, so it can afford beam search (tiny.en's greedy decode
        mishears names such as "Paris" -> "Harris"). Blocking: call it from a
        thread in async code."""
        audio = resample(np.asarray(samples, dtype=np.float32), sample_rate, VAD_RATE)
        segments, _info = self.model.transcribe(
            audio,
            language="en" if not self.model.model.is_multilingual else None,
            beam_size=beam_size,
            condition_on_previous_text=False,
        )
        return " ".join(segment.text.strip() for segment in segments).strip()

    def close(self) -> None:
        self.scheduler.close()
        self.audio_executor.shutdown(wait=True, cancel_futures=True)


def _segment_words(segment: Segment, offset_s: float, duration_s: float) -> list[Word]:
    """The segment's words in stream seconds, inside the decoded audio (Whisper's
    timestamps are 20 ms steps and can overshoot the end of a short clip)."""
    if segment.words is not None:
        timed = [(w.word.strip(), w.start, w.end, float(w.probability)) for w in segment.words]
    else:  # without word alignment, spread the segment's words evenly over its span
        texts = segment.text.split()
        step = (segment.end - segment.start) / max(len(texts), 1)
        probability = float(np.exp(segment.avg_logprob))
        timed = [
            (text, segment.start + i * step, segment.start + (i + 1) * step, probability)
            for i, text in enumerate(texts)
        ]
    return [
        Word(text, offset_s + min(start, duration_s), offset_s + min(end, duration_s), prob)
        for text, start, end, prob in timed
        if text
    ]
