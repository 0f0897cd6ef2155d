"""The client's ConverseConfig is checked before any upstream is touched:
each problem maps to a status and a message that names the field."""

from __future__ import annotations

import grpc
import pytest

from kame_common.config import ConfigError, load_settings
from kamepb import gateway_pb2
from services.gateway.config import GatewaySettings
from services.gateway.session import SessionError, plan_session

Config = gateway_pb2.ConverseConfig


def test_defaults_fill_in():
    plan = plan_session(Config(), GatewaySettings())
    assert plan.mode == "tandem"
    assert (plan.input_format.codec, plan.input_format.sample_rate) == ("pcm16", 24_000)
    assert plan.output_format.sample_rate == 24_000
    assert plan.language == "en"
    assert plan.llm is None
    assert plan.uses_oracle


def test_modes_and_overrides():
    config = Config(
        mode=Config.S2S,
        llm=gateway_pb2.LlmOverride(backend="anthropic"),
        input_format=gateway_pb2.AudioFormat(codec=gateway_pb2.AudioFormat.MULAW),
    )
    plan = plan_session(config, GatewaySettings(default_mode="cascade"))
    assert plan.mode == "s2s" and not plan.uses_oracle
    assert plan.input_format.sample_rate == 8_000
    assert plan.llm.backend == "anthropic"
    assert plan_session(Config(), GatewaySettings(default_mode="cascade")).mode == "cascade"


@pytest.mark.parametrize(
    ("config", "code", "message"),
    [
        (Config(mode=9), grpc.StatusCode.INVALID_ARGUMENT, "mode: unknown mode 9"),
        (
            Config(output_format=gateway_pb2.AudioFormat(codec=7)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "output_format.codec: unknown codec 7",
        ),
        (
            Config(
                input_format=gateway_pb2.AudioFormat(
                    codec=gateway_pb2.AudioFormat.OPUS, sample_rate_hz=8000
                )
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "input_format.sample_rate_hz",
        ),
        (
            Config(llm=gateway_pb2.LlmOverride(backend="gemini")),
            grpc.StatusCode.INVALID_ARGUMENT,
            "llm.backend: unknown back-end 'gemini'",
        ),
    ],
)
def test_bad_config_names_the_field(config, code, message):
    with pytest.raises(SessionError, match=message) as caught:
        plan_session(config, GatewaySettings())
    assert caught.value.code == code


def test_settings_from_flags_and_env():
    config = load_settings(
        GatewaySettings,
        ["--port", "6000"],
        env={"KAME_GATEWAY_DEFAULT_MODE": "cascade", "KAME_GATEWAY_PORT": "7000"},
    )
    assert (config.port, config.default_mode) == (6000, "cascade")  # the flag wins
    with pytest.raises(ConfigError, match="default_mode"):
        load_settings(GatewaySettings, ["--default-mode", "duplex"], env={})
