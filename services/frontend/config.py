"""Frontend service settings: flags `--engine tts` or environment `KAME_FRONTEND_ENGINE=tts`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from kame_common.audio import FRAME_SECONDS
from kame_common.config import (
    ConfigError,
    RegistrySettings,
    setting,
)
from kame_common.words import BACKCHANNEL_PHRASES, parse_phrases

ENGINES = ("tts", "kame", "moshi")
TURN_MODES = ("smart_turn", "silence")
# auto: bfloat16 on a CUDA device, float32 elsewhere (resolved when the model loads).
DTYPES = ("auto", "float32", "bfloat16", "float16")
MAX_TURN_SILENCE_S = 5.0


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

    # tts engine turn-taking (services/frontend/engines/semantic_turns.py), for
    # sessions that leave turn_end_silence_s 0; one that names it gets that fixed pause.
    turn_mode: str = setting(
        "smart_turn",
        "tts engine: how a pause ends the caller's turn: smart_turn (the Smart Turn model "
        "early in the pause, else turn_fallback_s) or silence (a fixed turn_silence_s); "
        "smart_turn without its model file falls back to silence (logged)",
        choices=TURN_MODES,
    )
    turn_silence_s: float = setting(
        0.0, "tts engine, silence mode: the pause that ends a turn (0 = the default, 0.4 s)"
    )
    turn_threshold: float = setting(
        0.96, "tts engine, smart_turn: Smart Turn's p(complete) that ends a turn early"
    )
    turn_first_ask_s: float = setting(
        0.16, "tts engine, smart_turn: silence after the speech before Smart Turn is asked"
    )
    turn_asks: int = setting(
        2,
        "tts engine, smart_turn: Smart Turn is asked on this many frames (80 ms apart) from "
        "turn_first_ask_s; all must say complete",
    )
    turn_fallback_s: float = setting(
        1.04,
        "tts engine, smart_turn: the pause that ends a turn the model did not end "
        "(longer than a mid-sentence pause)",
    )
    # tts engine: caller speech over the agent (services/frontend/engines/backchannel.py).
    backchannel_max_s: float = setting(
        0.72,
        "tts engine: caller speech over the agent pauses it; speech longer than this is a "
        "barge-in at once, shorter speech waits for its words (0 = every caller speech over "
        "the agent stops it at once)",
    )
    backchannel_wait_s: float = setting(
        0.8,
        "tts engine: how long after paused-for speech ends the agent waits for its final "
        "transcript; backchannel words only -> the agent goes on, other words or none in "
        "time -> barge-in",
    )
    backchannel_phrases: str = setting(
        ", ".join(BACKCHANNEL_PHRASES),
        "tts engine: comma-separated phrases that, said over the agent (alone or in a row), "
        "let it go on; keep equal to the oracle's backchannel_phrases",
    )

    def validate(self) -> None:
        super().validate()
        if not 0 <= self.turn_silence_s <= MAX_TURN_SILENCE_S:
            raise ConfigError(f"turn_silence_s: must be 0 to {MAX_TURN_SILENCE_S:g} s")
        if not 0 < self.turn_threshold <= 1:
            raise ConfigError(f"turn_threshold: must be in (0, 1], got {self.turn_threshold:g}")
        if self.turn_asks < 1:
            raise ConfigError(f"turn_asks: must be at least 1, got {self.turn_asks}")
        last_ask_s = self.turn_first_ask_s + FRAME_SECONDS * self.turn_asks
        if not (
            self.turn_first_ask_s > 0 and last_ask_s < self.turn_fallback_s <= MAX_TURN_SILENCE_S
        ):
            raise ConfigError(
                "turn_first_ask_s > 0 and its asks must come before turn_fallback_s "
                f"(<= {MAX_TURN_SILENCE_S:g} s): got first ask {self.turn_first_ask_s:g} s, "
                f"{self.turn_asks} asks, fallback {self.turn_fallback_s:g} s"
            )
        if not 0 <= self.backchannel_max_s <= MAX_TURN_SILENCE_S:
            raise ConfigError(f"backchannel_max_s: must be 0 to {MAX_TURN_SILENCE_S:g} s")
        if not 0 < self.backchannel_wait_s <= MAX_TURN_SILENCE_S:
            raise ConfigError(f"backchannel_wait_s: must be > 0 and <= {MAX_TURN_SILENCE_S:g} s")
        if self.backchannel_max_s and not parse_phrases(self.backchannel_phrases):
            raise ConfigError("backchannel_phrases: no phrase (set backchannel_max_s 0 instead)")
        if self.batch_slots < 1:
            raise ConfigError(f"batch_slots: must be at least 1, got {self.batch_slots}")
        if self.jitter_frames < 1:
            raise ConfigError(f"jitter_frames: must be at least 1, got {self.jitter_frames}")
        if self.engine_stall_s < 0:
            raise ConfigError(f"engine_stall_s: must be >= 0, got {self.engine_stall_s:g}")
