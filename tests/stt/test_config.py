"""Service settings from flags and environment, and per-stream settings with defaults."""

from __future__ import annotations

import pytest

from kame_common.config import ConfigError, load_settings
from services.stt.config import SttSettings, stream_settings


def test_flags_and_environment():
    settings = load_settings(
        SttSettings,
        ["--decode-workers", "2", "--device", "cuda"],
        env={"KAME_STT_PORT": "6000", "KAME_STT_WORD_TIMESTAMPS": "false"},
    )
    assert (settings.decode_workers, settings.device, settings.port) == (2, "cuda", 6000)
    assert settings.word_timestamps is False
    assert load_settings(SttSettings, [], env={}).port == 50053


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--device", "tpu"], "device: 'tpu' is not allowed"),
        (["--decode-workers", "0"], "decode_workers: must be at least 1"),
        (["--endpoint-silence-s", "9"], "endpoint_silence_s must be between 0.1 and 5, got 9"),
        (["--beam-size", "many"], "beam_size (--beam-size): expected an integer"),
    ],
)
def test_bad_service_settings_name_the_field(argv, message):
    with pytest.raises(ConfigError) as raised:
        load_settings(SttSettings, argv, env={})
    assert message in str(raised.value)


def test_zero_means_the_service_default():
    defaults = SttSettings(endpoint_silence_s=0.7)
    settings = stream_settings(
        "s", "", {"partial_interval_s": 0.0, "max_utterance_s": 8.0}, defaults
    )
    assert settings.language == "en"
    assert settings.endpoint_silence_s == 0.7 and settings.partial_interval_s == 0.5
    assert settings.max_utterance_s == 8.0 and settings.vad_threshold == 0.5


def test_partial_interval_must_fit_in_an_utterance():
    with pytest.raises(ValueError, match="must not exceed max_utterance_s"):
        stream_settings(
            "s", "en", {"partial_interval_s": 5.0, "max_utterance_s": 2.0}, SttSettings()
        )
