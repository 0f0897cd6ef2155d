"""Configuration from flags and environment, with errors that name the field."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from kame_common.config import ConfigError, load_config, setting


@dataclass
class DemoConfig:
    port: int = setting(50053, "gRPC port")
    engine: str = setting("tts", "engine to run", choices=("tts", "kame", "moshi"))
    interval_s: float = setting(0.5, "partial interval")
    verbose: bool = setting(False, "log more")


def test_defaults_then_env_then_flags():
    assert load_config(DemoConfig, "KAME_X_", [], env={}) == DemoConfig()
    env = {"KAME_X_PORT": "6000", "KAME_X_ENGINE": "kame", "KAME_X_VERBOSE": "yes"}
    from_env = load_config(DemoConfig, "KAME_X_", [], env=env)
    assert (from_env.port, from_env.engine, from_env.verbose) == (6000, "kame", True)
    from_flags = load_config(
        DemoConfig, "KAME_X_", ["--port", "7000", "--interval-s", "0.25"], env=env
    )
    assert (from_flags.port, from_flags.interval_s, from_flags.engine) == (7000, 0.25, "kame")


def test_bad_choice_names_field_and_allowed_values():
    with pytest.raises(ConfigError) as info:
        load_config(DemoConfig, "KAME_X_", ["--engine", "gpt"], env={})
    message = str(info.value)
    assert "engine" in message and "'gpt'" in message
    assert "'tts'" in message and "'kame'" in message and "'moshi'" in message


def test_bad_type_names_field_and_source():
    with pytest.raises(ConfigError, match=r"port \(KAME_X_PORT\): expected an integer, got 'abc'"):
        load_config(DemoConfig, "KAME_X_", [], env={"KAME_X_PORT": "abc"})
    with pytest.raises(ConfigError, match=r"verbose \(--verbose\): expected a boolean"):
        load_config(DemoConfig, "KAME_X_", ["--verbose", "maybe"], env={})


def test_unknown_flag_is_an_error():
    with pytest.raises((ConfigError, SystemExit)):
        load_config(DemoConfig, "KAME_X_", ["--no-such-flag", "1"], env={})
