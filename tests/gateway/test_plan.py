"""The client's ConverseConfig is checked before any upstream is touched:
each problem maps to a status and a message that names the field."""

from __future__ import annotations

import grpc
import pytest

from kame_common.config import ConfigError, load_settings
from kamepb import gateway_pb2
from kamepb.common_pb2 import LLM_BACKEND_ANTHROPIC
from services.gateway.config import GatewaySettings
from services.gateway.plan import Mode, SessionError, plan_session

Config = gateway_pb2.ConverseConfig


def test_defaults_fill_in():
    plan = plan_session(Config(), GatewaySettings())
    assert plan.mode is Mode.TANDEM
    assert (plan.input_format.codec, plan.input_format.sample_rate) == ("pcm16", 24_000)
    assert plan.output_format.sample_rate == 24_000
    assert plan.language == "en"
    assert plan.llm is None
    assert plan.mode.uses_oracle


def test_modes_and_overrides():
    config = Config(
        mode=Config.S2S,
        llm=gateway_pb2.LlmOverride(backend=LLM_BACKEND_ANTHROPIC),
        input_format=gateway_pb2.AudioFormat(codec=gateway_pb2.AudioFormat.MULAW),
    )
    plan = plan_session(config, GatewaySettings(default_mode="cascade"))
    assert plan.mode is Mode.S2S and not plan.mode.uses_oracle
    assert plan.input_format.sample_rate == 8_000
    assert plan.llm.backend == LLM_BACKEND_ANTHROPIC
    assert plan_session(Config(), GatewaySettings(default_mode="cascade")).mode is Mode.CASCADE


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
            Config(llm=gateway_pb2.LlmOverride(backend=9)),  # type: ignore[arg-type]
            grpc.StatusCode.INVALID_ARGUMENT,
            "llm.backend: unknown back-end 9; choose one of 'openai', 'anthropic'",
        ),
        *(
            (
                Config(hold=gateway_pb2.HoldConfig(max_s=bad)),
                grpc.StatusCode.INVALID_ARGUMENT,
                "hold.max_s: must be 0 \\(the default, 5 s\\) to 10 seconds",
            )
            for bad in (-1.0, 10.5, float("inf"), float("nan"))
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


def test_hold_phrases_default_in_tandem_only():
    settings = GatewaySettings(hold_phrases="Hmm,| Let me see, |")
    assert plan_session(Config(), settings).hold_phrases == ("Hmm,", "Let me see,")
    assert plan_session(Config(mode=Config.CASCADE), settings).hold_phrases == ()
    own = gateway_pb2.HoldConfig(phrases=["One moment."], max_s=1.5)
    plan = plan_session(Config(mode=Config.CASCADE, hold=own), settings)
    assert (plan.hold_phrases, plan.hold_max_s) == (("One moment.",), 1.5)
    silent = plan_session(Config(hold=gateway_pb2.HoldConfig(silent=True)), settings)
    assert (silent.hold_phrases, silent.hold_max_s) == ((), settings.hold_max_s)


def test_a_negative_hold_time_names_the_field():
    with pytest.raises(SessionError, match=r"hold\.max_s"):
        plan_session(Config(hold=gateway_pb2.HoldConfig(max_s=-1)), GatewaySettings())


@pytest.mark.parametrize(
    ("hold", "message"),
    [
        (gateway_pb2.HoldConfig(phrases=["Hmm,"] * 9), "hold.phrases: at most 8 phrases, got 9"),
        (
            gateway_pb2.HoldConfig(phrases=["Let me see " * 8]),
            "hold.phrases: at most 60 characters each",
        ),
    ],
)
def test_hold_phrases_a_frontend_would_refuse_are_refused_here(hold, message):
    """The gateway holds the frontend's limits (kame_common/hold.py): a caller's
    phrases are refused before any upstream is touched, naming the field."""
    with pytest.raises(SessionError, match=message) as caught:
        plan_session(Config(hold=hold), GatewaySettings())
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT


def test_hold_phrases_are_collapsed_as_the_frontend_would():
    own = gateway_pb2.HoldConfig(phrases=["  One\tmoment. ", "", "Let  me see,"])
    plan = plan_session(Config(hold=own), GatewaySettings())
    assert plan.hold_phrases == ("One moment.", "Let me see,")


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        (["--hold-max-s", "12"], "hold_max_s: must be 0 .* to 10 seconds, got 12"),
        (["--hold-phrases", "|".join(["Hmm,"] * 9)], "hold_phrases: at most 8 phrases"),
        (["--hold-phrases", "Let me see " * 8], "hold_phrases: at most 60 characters"),
    ],
)
def test_hold_settings_every_call_would_fail_on_are_refused_at_start(flag, message):
    """Settings the frontend would refuse in every tandem call are a ConfigError
    at start, not an INVALID_ARGUMENT for each caller."""
    with pytest.raises(ConfigError, match=message):
        load_settings(GatewaySettings, flag, env={})
