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


def test_connection_settings_are_checked_and_become_grpc_options():
    from kame_common.config import load_settings
    from services.gateway.config import GatewaySettings

    for flags, field in (
        (["--keepalive-time-s", "-1"], "keepalive_time_s"),
        (["--keepalive-timeout-s", "0"], "keepalive_timeout_s"),
        (["--max-connection-age-s", "-5"], "max_connection_age_s"),
        (["--idle-timeout-s", "-1"], "idle_timeout_s"),
        (["--input-burst-s", "-1"], "input_burst_s"),
        (["--max-chunk-s", "0"], "max_chunk_s"),
        (["--redis-timeout-s", "-1"], "redis_timeout_s"),
    ):
        with pytest.raises(ConfigError, match=f"^{field}: "):
            load_settings(GatewaySettings, flags, env={})
    off = load_settings(GatewaySettings, ["--keepalive-time-s", "0"], env={})
    assert not any("keepalive" in name for name, _ in off.connection_policy().server_options())

    policy = load_settings(
        GatewaySettings, ["--keepalive-time-s", "4", "--max-connection-age-s", "60"], env={}
    ).connection_policy()
    server = dict(policy.server_options())
    assert server["grpc.keepalive_time_ms"] == 4000
    assert server["grpc.keepalive_timeout_ms"] == 10_000
    assert server["grpc.http2.min_ping_interval_without_data_ms"] == 2000
    assert server["grpc.max_connection_age_ms"] == 60_000
    assert server["grpc.max_connection_age_grace_ms"] == 2**31 - 1  # calls run to their end
    channel = dict(policy.channel_options())
    assert channel["grpc.lb_policy_name"] == "round_robin"
    assert channel["grpc.http2.max_pings_without_data"] == 0
    assert "grpc.max_connection_age_ms" not in channel
    # A restarted upstream is dialled again within 2 s (gRPC's own backoff grows to 2 min).
    assert channel["grpc.initial_reconnect_backoff_ms"] == 250
    assert channel["grpc.max_reconnect_backoff_ms"] == 2000
    assert "grpc.min_reconnect_backoff_ms" not in channel  # the connect timeout too
