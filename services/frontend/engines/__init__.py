"""Builds the engine a replica serves. The kame/moshi engines import torch, so
they are imported only when chosen: a tts replica never loads torch."""

from __future__ import annotations

from services.frontend.config import FrontendSettings
from services.frontend.engines.base import Engine


def build_engine(settings: FrontendSettings) -> Engine:
    """Load the configured engine's models (seconds to minutes: call it off the event loop)."""
    if settings.engine == "tts":
        from services.frontend.engines.backchannel import Backchannels
        from services.frontend.engines.base import DEFAULT_TURN_END_SILENCE_S
        from services.frontend.engines.semantic_turns import TurnTaking
        from services.frontend.engines.tts import TtsEngine

        taking = TurnTaking(
            mode=settings.turn_mode,
            silence_s=settings.turn_silence_s or DEFAULT_TURN_END_SILENCE_S,
            threshold=settings.turn_threshold,
            first_ask_s=settings.turn_first_ask_s,
            asks=settings.turn_asks,
            fallback_s=settings.turn_fallback_s,
        )
        backchannels = Backchannels(
            phrases=settings.backchannel_phrases,
            max_speech_s=settings.backchannel_max_s,
            wait_s=settings.backchannel_wait_s,
        )
        return TtsEngine(settings.voice, settings.batch_slots, taking, backchannels)
    from services.frontend.engines.kame.engine import KameEngine

    return KameEngine.from_config(settings, with_oracle=settings.engine == "kame")
