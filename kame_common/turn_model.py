"""Smart Turn v3.2: does the caller's audio sound like a finished turn?

An 8 MB ONNX model (a Whisper tiny encoder and a classifier) that hears the
last 8 s of a caller's speech and gives the probability that the turn is
complete: the intonation and the words of "What is the capital of France?"
against "What is the capital of". It ships inside the `pipecat-ai` wheel,
whose dependencies clash with ours, so `python -m kame_cli.smart_turn_model`
(run by make setup) takes the one file out of that wheel into
~/.cache/kame/models/; `smart_turn_path()` finds it there.

The input is what the model was trained on: 16 kHz audio, the last 8 s
(zero-padded at the front when shorter), normalized to zero mean and unit
variance, as Whisper's 80-band log-mel spectrogram (25 ms windows every
10 ms, 800 frames). The features are computed here with numpy so that the
front-end needs no Whisper package.
"""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path

import numpy as np
import numpy.typing as npt

from kame_common.audio import Samples
from kame_common.models import ModelNotInstalled

MODEL_FILE = "smart-turn-v3.2-cpu.onnx"
# The wheel it comes from and where the file lies inside it; the file's sha256,
# checked when it is fetched and by --check.
SOURCE_PACKAGE = "pipecat-ai"
SOURCE_VERSION = "1.14.0"
SOURCE_MEMBER = "pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx"
MODEL_SHA256 = "2bb026316b14a660486a75b1733cd3fbab8c2fd0314dc9af7be49f8cca967e4f"
FETCH_COMMAND = "python -m kame_cli.smart_turn_model"
# Points at a model file elsewhere (an image that bakes it in at another path).
PATH_ENV = "KAME_SMART_TURN_MODEL"

MODEL_RATE = 16_000
WINDOW_S = 8
WINDOW_SAMPLES = MODEL_RATE * WINDOW_S
N_FFT = 400  # 25 ms
HOP = 160  # 10 ms
N_MELS = 80
FRAMES = WINDOW_SAMPLES // HOP  # 800
LOG_FLOOR = 1e-10
DYNAMIC_RANGE = 8.0  # log10 units kept below the loudest band (80 dB)
NORMALIZE_EPS = 1e-7


def models_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "kame" / "models"


def default_model_path() -> Path:
    """Where the fetch writes the model ($KAME_SMART_TURN_MODEL overrides it)."""
    named = os.environ.get(PATH_ENV)
    return Path(named) if named else models_dir() / MODEL_FILE


def smart_turn_path() -> Path:
    """The installed model file; ModelNotInstalled (naming the command that
    fetches it) if it is not there."""
    path = default_model_path()
    if not path.is_file():
        raise ModelNotInstalled(
            f"the Smart Turn model is not installed ({path} is missing): "
            f"run `{FETCH_COMMAND}` (make setup does)"
        )
    return path


# --- Whisper's log-mel features --------------------------------------------


def _hz_to_mel(hz: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Slaney's mel scale (Whisper's): linear to 1 kHz, logarithmic above."""
    linear = hz / (200.0 / 3.0)
    above = 15.0 + np.log(np.maximum(hz, 1e-9) / 1000.0) / (np.log(6.4) / 27.0)
    return np.where(hz >= 1000.0, above, linear)


def _mel_to_hz(mel: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    linear = mel * (200.0 / 3.0)
    above = 1000.0 * np.exp((mel - 15.0) * (np.log(6.4) / 27.0))
    return np.where(mel >= 15.0, above, linear)


@functools.cache
def mel_filters() -> npt.NDArray[np.float32]:
    """(N_MELS, N_FFT/2+1): triangles evenly spaced in mels from 0 Hz to
    Nyquist, each scaled to unit area (Slaney's normalization)."""
    edges_hz = _mel_to_hz(np.linspace(0.0, _hz_to_mel(np.array([MODEL_RATE / 2.0]))[0], N_MELS + 2))
    bins_hz = np.fft.rfftfreq(N_FFT, d=1.0 / MODEL_RATE)
    lower, centre, upper = edges_hz[:-2, None], edges_hz[1:-1, None], edges_hz[2:, None]
    rising = (bins_hz[None, :] - lower) / (centre - lower)
    falling = (upper - bins_hz[None, :]) / (upper - centre)
    triangles = np.maximum(0.0, np.minimum(rising, falling))
    area = 2.0 / (upper - lower)
    filters: npt.NDArray[np.float32] = (triangles * area).astype(np.float32)
    return filters


@functools.cache
def _hann() -> npt.NDArray[np.float32]:
    # Periodic (torch.hann_window's default), as Whisper's STFT uses.
    window: npt.NDArray[np.float32] = np.hanning(N_FFT + 1)[:-1].astype(np.float32)
    return window


def last_window(audio_16k: npt.ArrayLike) -> Samples:
    """The last WINDOW_S seconds, zero-padded at the front when shorter: the
    end of the turn always sits at the end of the window."""
    signal = np.asarray(audio_16k, dtype=np.float32).reshape(-1)[-WINDOW_SAMPLES:]
    if signal.size < WINDOW_SAMPLES:
        signal = np.concatenate([np.zeros(WINDOW_SAMPLES - signal.size, np.float32), signal])
    return signal


def log_mel_features(audio_16k: npt.ArrayLike) -> npt.NDArray[np.float32]:
    """(N_MELS, FRAMES) log-mel features of the last 8 s of 16 kHz audio."""
    signal = last_window(audio_16k)
    signal = (signal - signal.mean()) / np.sqrt(signal.var() + NORMALIZE_EPS)
    # Centred frames: reflect-padded by half a window on both sides, which gives
    # FRAMES + 1 frames; Whisper drops the last.
    padded = np.pad(signal, N_FFT // 2, mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP][:FRAMES]
    power = np.abs(np.fft.rfft(frames * _hann(), axis=-1)) ** 2
    log_mel = np.log10(np.maximum(mel_filters() @ power.T.astype(np.float32), LOG_FLOOR))
    log_mel = np.maximum(log_mel, log_mel.max() - DYNAMIC_RANGE)
    features: npt.NDArray[np.float32] = ((log_mel + 4.0) / 4.0).astype(np.float32)
    return features


# --- the model ---------------------------------------------------------------


class SmartTurn:
    """The model in one ONNX Runtime session on one thread (the front-end's
    cores are busy with the voice; one call took 35 ms median, 85 ms p90 on
    the 2 shared cores of kame_cli/bench/turn_bench.py). `predict` may be
    called from several threads at once (ONNX Runtime's run is thread-safe);
    `last_latency_s` is then the latest call's."""

    def __init__(self, path: Path | None = None) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.path = path or smart_turn_path()
        self._session = ort.InferenceSession(
            str(self.path), sess_options=options, providers=["CPUExecutionProvider"]
        )
        self._input = self._session.get_inputs()[0].name
        self.last_latency_s = 0.0

    def predict(self, audio_16k: npt.ArrayLike) -> float:
        """The probability (0..1) that the turn is complete, given the caller's
        audio at 16 kHz up to now (the model hears the last 8 s of it)."""
        started = time.perf_counter()
        features = log_mel_features(audio_16k)[None, :, :]
        (output,) = self._session.run(None, {self._input: features})
        # The exported model ends in a sigmoid: its output is the probability.
        probability = float(np.asarray(output).reshape(-1)[0])
        self.last_latency_s = time.perf_counter() - started
        return probability
