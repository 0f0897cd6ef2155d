"""STT service settings (flag `--decode-workers 2` or env `KAME_STT_DECODE_WORKERS=2`), and
the per-stream settings resolved from a client's SttConfig against the service defaults."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from kame_common.config import (
    ConfigError,
    MeasuredCapacitySettings,
    setting,
)
from kame_common.models import EMBEDDED_WHISPERS, WHISPER_TINY_EN

DEVICES = ("cpu", "cuda", "auto")
COMPUTE_TYPES = (
    "",  # int8 on CPU, float16 on CUDA
    "int8",
    "int8_float32",
    "int8_float16",
    "int8_bfloat16",
    "int16",
    "float16",
    "bfloat16",
    "float32",
    "auto",
    "default",
)
# One Whisper window is 30 s; a longer utterance would need a second window per partial.
MAX_UTTERANCE_LIMIT_S = 30.0
# More audio before the speech start than this is mostly the pause before it.
MAX_PRE_ROLL_S = 2.0


@dataclass
class SttSettings(MeasuredCapacitySettings):
    SERVICE: ClassVar[str] = "stt"

    model: str = setting(
        WHISPER_TINY_EN,
        "Embedded Whisper (unless model_dir names another)",
        choices=EMBEDDED_WHISPERS,
    )
    model_dir: str = setting("", "CTranslate2 Whisper directory (empty = the embedded `model`)")
    device: str = setting("cpu", "Where Whisper runs", choices=DEVICES)
    compute_type: str = setting(
        "", "CTranslate2 compute type (empty = int8 on CPU, float16 on CUDA)", choices=COMPUTE_TYPES
    )
    cpu_threads: int = setting(0, "Threads per decode worker on CPU (0 = cores / workers)")
    decode_workers: int = setting(1, "Whisper decodes run at once (all sessions share them)")
    max_batch: int = setting(8, "Utterances one Whisper decode may take together")
    window_pad_s: float = setting(
        2.0, "Silence after the audio in Whisper's window (30 = always the full 30 s window)"
    )
    beam_size: int = setting(5, "Beam size of final decodes (partials are always greedy)")
    temperature_fallback: bool = setting(
        False, "A final decode that looks wrong (repeats itself, improbable) is sampled again"
    )
    word_timestamps: bool = setting(True, "Align word timings (about 10% more decode time)")
    partial_interval_s: float = setting(0.5, "Default: re-decode after this much new speech")
    endpoint_silence_s: float = setting(0.5, "Default: a pause this long ends the utterance")
    max_utterance_s: float = setting(15.0, "Default: an utterance this long is finalized")
    vad_threshold: float = setting(0.5, "Default: Silero VAD speech probability threshold")
    pre_roll_s: float = setting(
        0.5, "Audio Whisper hears before the VAD's speech start (silence where there is none)"
    )

    def validate(self) -> None:
        super().validate()
        for name, minimum in (
            ("decode_workers", 1),
            ("max_batch", 1),
            ("beam_size", 1),
            ("cpu_threads", 0),
        ):
            if getattr(self, name) < minimum:
                raise ConfigError(f"{name}: must be at least {minimum}, got {getattr(self, name)}")
        if not 0.0 <= self.pre_roll_s <= MAX_PRE_ROLL_S:
            raise ConfigError(
                f"pre_roll_s: must be between 0 and {MAX_PRE_ROLL_S:g}, got {self.pre_roll_s:g}"
            )
        if not 0.5 <= self.window_pad_s <= MAX_UTTERANCE_LIMIT_S:
            raise ConfigError(
                f"window_pad_s: must be between 0.5 and {MAX_UTTERANCE_LIMIT_S:g} "
                f"(Whisper loops into a window with less silence), got {self.window_pad_s:g}"
            )
        for name in RANGES:
            try:
                _in_range(name, getattr(self, name))
            except ValueError as exc:
                raise ConfigError(str(exc).replace(" (or 0 for the default)", "")) from None


@dataclass(frozen=True)
class StreamSettings:
    """What one Transcribe stream runs with, after defaults and validation."""

    session_id: str
    language: str
    partial_interval_s: float
    endpoint_silence_s: float
    max_utterance_s: float
    vad_threshold: float
    progress_interval_s: float = 0.0  # 0: no SttProgress messages


# Allowed ranges of the per-stream settings, checked for client values and defaults alike.
RANGES = {
    "partial_interval_s": (0.16, 10.0),
    "endpoint_silence_s": (0.1, 5.0),
    "max_utterance_s": (1.0, MAX_UTTERANCE_LIMIT_S),
    "vad_threshold": (0.05, 0.95),
}
# SttConfig.progress_interval_s when set (0 = no progress messages): at least a frame.
PROGRESS_RANGE = (0.08, 60.0)


def _in_range(name: str, value: float) -> float:
    low, high = RANGES[name]
    if not low <= value <= high:
        raise ValueError(
            f"{name} must be between {low:g} and {high:g} (or 0 for the default), got {value:g}"
        )
    return value


def stream_settings(
    session_id: str,
    language: str,
    overrides: Mapping[str, float],
    defaults: SttSettings,
    progress_interval_s: float = 0.0,
) -> StreamSettings:
    """Resolve a stream's settings: a 0 in `overrides` means the service default
    (progress_interval_s has none: 0 means no progress messages). Raises
    ValueError naming the bad field and its allowed range."""
    values = {}
    for name in RANGES:
        requested = float(overrides.get(name, 0.0))
        values[name] = _in_range(name, requested if requested else getattr(defaults, name))
    if values["partial_interval_s"] > values["max_utterance_s"]:
        raise ValueError(
            f"partial_interval_s ({values['partial_interval_s']:g}) must not exceed "
            f"max_utterance_s ({values['max_utterance_s']:g})"
        )
    low, high = PROGRESS_RANGE
    if progress_interval_s and not low <= progress_interval_s <= high:
        raise ValueError(
            f"progress_interval_s must be between {low:g} and {high:g} (or 0 for none), "
            f"got {progress_interval_s:g}"
        )
    return StreamSettings(
        session_id=session_id,
        language=language or "en",
        progress_interval_s=progress_interval_s,
        **values,
    )
