"""Frontend service settings: flags `--engine tts` or environment `KAME_FRONTEND_ENGINE=tts`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from kame_common.config import (
    ConfigError,
    RegistrySettings,
    setting,
)

ENGINES = ("tts", "kame", "moshi")
# auto: bfloat16 on a CUDA device, float32 elsewhere (resolved when the model loads).
DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass
class FrontendSettings(RegistrySettings):
    SERVICE: ClassVar[str] = "frontend"

    engine: str = setting("tts", "Engine this replica serves", choices=ENGINES)
    voice: str = setting("", "tts engine: piper .onnx voice path (empty = embedded joe voice)")
    checkpoint: str = setting("", "kame/moshi engines: checkpoint directory or HF repo id")
    device: str = setting("cpu", "kame/moshi engines: torch device")
    dtype: str = setting(
        "auto",
        "kame/moshi engines: torch dtype (auto = bfloat16 on CUDA, float32 otherwise)",
        choices=DTYPES,
    )
    batch_slots: int = setting(
        4, "Sessions served at once (kame/moshi: the model's batch size; tts: concurrent voices)"
    )
    jitter_frames: int = setting(
        2,
        "kame/moshi engines: caller frames a session may have waiting for the 80 ms tick; "
        "one more drops the oldest (bounds the delay a backlog adds)",
    )
    max_sessions: int = setting(0, "Admission limit on open streams (0 = batch_slots decides)")
    engine_stall_s: float = setting(
        5.0,
        "an engine step waiting this long turns the replica NOT_SERVING until steps "
        "complete again (0 = no watchdog)",
    )

    def validate(self) -> None:
        super().validate()
        if self.batch_slots < 1:
            raise ConfigError(f"batch_slots: must be at least 1, got {self.batch_slots}")
        if self.jitter_frames < 1:
            raise ConfigError(f"jitter_frames: must be at least 1, got {self.jitter_frames}")
        if self.engine_stall_s < 0:
            raise ConfigError(f"engine_stall_s: must be >= 0, got {self.engine_stall_s:g}")
