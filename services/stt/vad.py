"""Streaming voice activity detection with the Silero VAD model that faster-whisper ships.

`SileroVad` holds the ONNX model (one per process; onnxruntime sessions are
thread-safe) and hands out a `VadStream` per caller, which carries the LSTM
state and the 64-sample context across calls, so feeding audio in any chunk
size gives the same probabilities as one pass over the whole signal.
`Segmenter` turns those probabilities into speech starts and ends.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import onnxruntime
from faster_whisper.utils import get_assets_path

from kame_common.audio import Samples

VAD_RATE = 16_000
WINDOW_SAMPLES = 512  # 32 ms: the window the 16 kHz Silero model scores
WINDOW_S = WINDOW_SAMPLES / VAD_RATE
CONTEXT_SAMPLES = 64
STATE_SHAPE = (1, 1, 128)


class SileroVad:
    def __init__(self) -> None:
        options = onnxruntime.SessionOptions()
        # Each window is tiny: more threads only add synchronisation cost.
        options.inter_op_num_threads = 1
        options.intra_op_num_threads = 1
        options.log_severity_level = 4
        self._session = onnxruntime.InferenceSession(
            os.path.join(get_assets_path(), "silero_vad_v6.onnx"),
            providers=["CPUExecutionProvider"],
            sess_options=options,
        )

    def stream(self) -> VadStream:
        return VadStream(self._session)


class VadStream:
    """Speech probabilities of one 16 kHz stream, one per complete 512-sample window."""

    def __init__(self, session: onnxruntime.InferenceSession) -> None:
        self._session = session
        self._h = np.zeros(STATE_SHAPE, dtype=np.float32)
        self._c = np.zeros(STATE_SHAPE, dtype=np.float32)
        self._context: Samples = np.zeros(CONTEXT_SAMPLES, dtype=np.float32)
        self._pending: Samples = np.zeros(0, dtype=np.float32)

    def process(self, samples: npt.ArrayLike) -> npt.NDArray[np.float32]:
        audio = np.concatenate([self._pending, np.asarray(samples, dtype=np.float32)])
        count = len(audio) // WINDOW_SAMPLES
        self._pending = audio[count * WINDOW_SAMPLES :]
        if count == 0:
            return np.zeros(0, dtype=np.float32)
        windows = audio[: count * WINDOW_SAMPLES].reshape(count, WINDOW_SAMPLES)
        # Each window is scored with the 64 samples that precede it; the model
        # runs the batch as a sequence through its LSTM, carrying h and c.
        previous = np.concatenate([self._context[None], windows[:-1, -CONTEXT_SAMPLES:]])
        batch = np.concatenate([previous, windows], axis=1)
        probs, self._h, self._c = self._session.run(
            None, {"input": batch, "h": self._h, "c": self._c}
        )
        self._context = windows[-1, -CONTEXT_SAMPLES:].copy()
        return np.asarray(probs, dtype=np.float32).reshape(-1)


@dataclass(frozen=True)
class VadEvent:
    kind: str  # "start" | "end"
    at_s: float  # stream seconds: start of speech, or where the closing pause began


class Segmenter:
    """Speech segments from window probabilities, with hysteresis: speech starts at a
    window >= threshold; a pause starts at a window below `threshold - 0.15` and is
    cancelled by a window >= threshold; a pause of `endpoint_silence_s` ends the speech."""

    def __init__(self, threshold: float, endpoint_silence_s: float) -> None:
        self.threshold = threshold
        self.neg_threshold = max(threshold - 0.15, 0.01)
        # Counted in whole windows, so float rounding never shifts an endpoint.
        self._endpoint_windows = max(1, math.ceil(endpoint_silence_s / WINDOW_S - 1e-6))
        self.speaking = False
        self._pause_start: int | None = None  # window index
        self._windows = 0

    @property
    def position_s(self) -> float:
        """End of the last scored window, in stream seconds."""
        return self._windows * WINDOW_S

    @property
    def pause_start_s(self) -> float | None:
        """Where the current pause inside speech began (None when there is none)."""
        return None if self._pause_start is None else self._pause_start * WINDOW_S

    def push(self, probs: npt.NDArray[np.float32]) -> list[VadEvent]:
        events = []
        for prob in probs:
            window = self._windows
            self._windows += 1
            if not self.speaking:
                if prob >= self.threshold:
                    self.speaking, self._pause_start = True, None
                    events.append(VadEvent("start", window * WINDOW_S))
                continue
            if prob >= self.threshold:
                self._pause_start = None
            elif prob < self.neg_threshold and self._pause_start is None:
                self._pause_start = window
            if (
                self._pause_start is not None
                and self._windows - self._pause_start >= self._endpoint_windows
            ):
                events.append(VadEvent("end", self._pause_start * WINDOW_S))
                self.speaking, self._pause_start = False, None
        return events

    def end_speech(self) -> None:
        """The speech ended by decision from outside (the caller's turn is over):
        forget it and the pause in it, so the next speech window starts anew."""
        self.speaking, self._pause_start = False, None

    def pause_s(self) -> float:
        """How long the current pause inside speech has lasted (0 when none)."""
        return 0.0 if self._pause_start is None else (self._windows - self._pause_start) * WINDOW_S
