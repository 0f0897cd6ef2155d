"""The shared side of the STT service: one Whisper model and what every stream uses.

`SttEngine` owns one WhisperModel, the Silero VAD model, the decode queue
(`DecodeScheduler`, which batches the sessions' decodes) and a small pool of
threads for per-frame audio work. Each caller's stream is an `SttSession`
(session.py) that submits its decodes here; `decode_batch` runs a batch as
windowed Whisper calls (whisper.py), one per language and beam size.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from faster_whisper import WhisperModel

from kame_common.audio import SAMPLE_RATE, Samples, resample
from kame_common.capacity import LoadMeter
from kame_common.models import embedded_whisper
from services.stt.agreement import Word
from services.stt.config import SttSettings
from services.stt.scheduler import DecodeScheduler
from services.stt.vad import VAD_RATE, SileroVad
from services.stt.whisper import DecodeRequest, WindowedWhisper

log = logging.getLogger(__name__)

# Bounds a decode that loops (Whisper can repeat itself): far above speech's ~5 tokens/s.
TOKENS_PER_SECOND_CAP = 10
MAX_NEW_TOKENS = 400
# Less audio than this holds no word: not worth a decode.
MIN_DECODE_S = 0.1
# The start-up guess of what one session costs (kame_common.capacity replaces it
# with measurements): it talks this share of the time, and while it talks it
# needs one decode of about this much audio per partial interval.
SPEAKING_SHARE = 0.5
TYPICAL_UTTERANCE_S = 3.0


@dataclass(frozen=True)
class Decoded:
    words: list[Word]  # stream seconds
    seconds: float  # wall time of the decode call that held it (0: nothing to decode)
    batch_size: int = 1  # utterances decoded in that call


def load_whisper(settings: SttSettings) -> tuple[Path, WhisperModel]:
    """The Whisper `settings` name (model_dir, else the embedded `model`) and
    where it lies."""
    if settings.model_dir:
        path, files = Path(settings.model_dir), {}
    else:
        embedded = embedded_whisper(settings.model)
        path, files = embedded.path, dict(embedded.files)  # faster-whisper empties it
    device = settings.device
    workers = settings.decode_workers
    model = WhisperModel(
        str(path),
        device=device,
        compute_type=settings.compute_type or ("float16" if device == "cuda" else "int8"),
        cpu_threads=settings.cpu_threads or max(1, (os.cpu_count() or 1) // workers),
        num_workers=workers,
        files=files or None,
    )
    return path, model


class SttEngine:
    """The shared model side. Construction loads the models (about a second on CPU)."""

    def __init__(self, settings: SttSettings | None = None) -> None:
        self.settings = settings or SttSettings()
        workers = self.settings.decode_workers
        self.model_dir, self.model = load_whisper(self.settings)
        self.whisper = WindowedWhisper(
            self.model, self.settings.window_pad_s, self.settings.word_timestamps
        )
        self.vad = SileroVad()
        # How busy the decode workers are: the service's capacity (kame_common.capacity).
        self.load = LoadMeter(parallelism=workers)
        # The first decode pays one-off allocations: pay them before serving.
        self.decode_batch([self.request(np.zeros(VAD_RATE, dtype=np.float32), 0.0, "en", 1)])
        self.prior_session_load = self._measure_session_load(workers)
        self.scheduler: DecodeScheduler[DecodeRequest, Decoded] = DecodeScheduler(
            workers, self.decode_batch, max_batch=self.settings.max_batch
        )
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

    @staticmethod
    def request(
        audio: Samples,
        offset_s: float,
        language: str,
        beam_size: int,
        lead_in_s: float = 0.0,
        fallback: bool = False,
    ) -> DecodeRequest:
        """A decode of one 16 kHz utterance whose word times start at `offset_s`, heard
        after `lead_in_s` of silence (with temperature fallback if `fallback`)."""
        duration = len(audio) / VAD_RATE
        max_new_tokens = min(MAX_NEW_TOKENS, int(TOKENS_PER_SECOND_CAP * duration) + 16)
        return DecodeRequest(
            audio, offset_s, language, beam_size, max_new_tokens, lead_in_s, fallback
        )

    def _measure_session_load(self, workers: int) -> float:
        """Share of the decode workers one session takes, from one timed decode of a
        typical utterance's length (its window costs the same, speech or not)."""
        audio = np.zeros(int(TYPICAL_UTTERANCE_S * VAD_RATE), dtype=np.float32)
        started = time.perf_counter()
        self.decode_batch([self.request(audio, 0.0, "en", 1)])
        decode_s = time.perf_counter() - started
        return SPEAKING_SHARE * decode_s / self.settings.partial_interval_s / workers

    def decode_batch(self, requests: Sequence[DecodeRequest]) -> list[Decoded]:
        """Transcribe a batch of utterances (blocking): one Whisper call per language
        and beam size among them; word times in stream seconds."""
        with self.load.busy():
            return self._decode_batch(requests)

    def _decode_batch(self, requests: Sequence[DecodeRequest]) -> list[Decoded]:
        results: dict[int, Decoded] = {}
        heard = [i for i, r in enumerate(requests) if len(r.audio) / VAD_RATE >= MIN_DECODE_S]
        for i in set(range(len(requests))) - set(heard):
            results[i] = Decoded([], 0.0)  # nothing to hear (e.g. a cut just before a pause)
        by_kind = sorted(heard, key=lambda i: (requests[i].language, requests[i].beam_size))
        for _kind, group in itertools.groupby(
            by_kind, key=lambda i: (requests[i].language, requests[i].beam_size)
        ):
            rows = list(group)
            started = time.perf_counter()
            words = self.whisper.decode([requests[i] for i in rows])
            seconds = time.perf_counter() - started
            for i, row_words in zip(rows, words, strict=True):
                results[i] = Decoded(row_words, seconds, len(rows))
        return [results[i] for i in range(len(requests))]

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
