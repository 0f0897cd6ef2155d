"""Service settings from flags/env, and how a session's OracleConfig overrides them."""

from __future__ import annotations

import pytest

from kame_common.config import ConfigError, load_settings
from kamepb import oracle_pb2
from kamepb.common_pb2 import LLM_BACKEND_ANTHROPIC
from services.oracle.config import (
    VENDOR_DEFAULT_MODELS,
    ApiKeys,
    InvalidSessionConfig,
    OracleSettings,
    resolve_session,
)


def test_defaults_point_at_the_embedded_llm_server():
    settings = load_settings(OracleSettings, [], env={})
    assert (settings.port, settings.metrics_port) == (50054, 9104)
    assert (settings.backend, settings.model) == ("openai", "gemma-3-270m")
    assert settings.base_url == "http://127.0.0.1:8080/v1"


def test_environment_and_flags():
    env = {
        "KAME_ORACLE_BACKEND": "anthropic",
        "KAME_ORACLE_MODEL": "claude-x",
        "KAME_ORACLE_BASE_URL": "http://llm:9000",
        "KAME_ORACLE_MAX_TOKENS": "32",
    }
    settings = load_settings(OracleSettings, ["--model", "claude-y"], env=env)
    assert (settings.backend, settings.model, settings.base_url, settings.max_tokens) == (
        "anthropic",
        "claude-y",
        "http://llm:9000",
        32,
    )


def test_an_unknown_backend_setting_names_the_field():
    with pytest.raises(ConfigError, match="backend: 'gemini' is not allowed"):
        load_settings(OracleSettings, [], env={"KAME_ORACLE_BACKEND": "gemini"})


def test_api_keys_come_from_the_vendor_variables():
    keys = ApiKeys.from_env({"OPENAI_API_KEY": "sk-o", "ANTHROPIC_API_KEY": "sk-a"})
    assert (keys.openai, keys.anthropic) == ("sk-o", "sk-a")


def test_a_session_overrides_the_service_defaults():
    service = load_settings(OracleSettings, [], env={"KAME_ORACLE_ALLOWED_MODELS": "other"})
    session = resolve_session(
        oracle_pb2.OracleConfig(
            session_id="s",
            model="other",
            max_tokens=10,
            temperature=0.7,
            request_timeout_s=2,
            policy=oracle_pb2.OraclePolicy(name="cascade", min_new_words=3),
        ),
        service,
        ApiKeys(),
    )
    backend = session.backend
    assert (backend.backend, backend.model, backend.base_url) == (
        "openai",
        "other",
        "http://127.0.0.1:8080/v1",
    )
    assert (backend.max_tokens, backend.request_timeout_s) == (10, 2)
    assert backend.temperature == pytest.approx(0.7)
    assert (session.policy.name, session.policy.min_new_words, session.policy.max_starts) == (
        "cascade",
        3,
        5,
    )


def test_zero_means_the_service_default():
    service = load_settings(OracleSettings, [], env={"KAME_ORACLE_TEMPERATURE": "0.3"})
    session = resolve_session(oracle_pb2.OracleConfig(session_id="s"), service, ApiKeys())
    assert session.backend.temperature == pytest.approx(0.3)
    assert session.backend.max_tokens == service.max_tokens
    assert session.policy.poll_interval_s == 0.5


def test_another_backend_than_the_default_uses_the_vendor_api_and_the_service_key():
    service = load_settings(
        OracleSettings,
        [],
        env={
            "KAME_ORACLE_ALLOWED_BACKENDS": "openai,anthropic",
            "KAME_ORACLE_ALLOWED_MODELS": VENDOR_DEFAULT_MODELS["anthropic"],
        },
    )
    session = resolve_session(
        oracle_pb2.OracleConfig(session_id="s", backend=LLM_BACKEND_ANTHROPIC),
        service,
        ApiKeys(anthropic="sk-a"),
    )
    assert (session.backend.base_url, session.backend.api_key) == (
        "https://api.anthropic.com",
        "sk-a",
    )
    assert session.backend.model == VENDOR_DEFAULT_MODELS["anthropic"]


def test_a_key_is_required_for_vendor_apis_only():
    service = load_settings(
        OracleSettings, [], env={"KAME_ORACLE_BASE_URL": "https://api.openai.com/v1"}
    )
    with pytest.raises(InvalidSessionConfig, match="needs an API key: set OPENAI_API_KEY"):
        resolve_session(oracle_pb2.OracleConfig(session_id="s"), service, ApiKeys())
    local_service = load_settings(
        OracleSettings, [], env={"KAME_ORACLE_BASE_URL": "http://vllm:8000/v1"}
    )
    local = resolve_session(oracle_pb2.OracleConfig(session_id="s"), local_service, ApiKeys())
    assert (local.backend.base_url, local.backend.api_key) == ("http://vllm:8000/v1", "")


@pytest.mark.parametrize(
    ("setting", "frontend_ends_turns", "partial_starts"),
    [
        ("auto", True, False),  # the tts engine keeps only a final's words: settled starts
        ("auto", False, True),  # the kame engine reads candidates while the caller speaks
        ("on", True, True),
        ("off", False, False),
    ],
)
def test_partial_starts_auto_follows_the_front_end(setting, frontend_ends_turns, partial_starts):
    service = OracleSettings(partial_starts=setting)
    config = oracle_pb2.OracleConfig(session_id="s", frontend_ends_turns=frontend_ends_turns)
    session = resolve_session(config, service, ApiKeys())
    assert session.policy.partial_starts is partial_starts


def test_partial_starts_names_its_choices():
    with pytest.raises(ConfigError, match="partial_starts"):
        load_settings(OracleSettings, [], env={"KAME_ORACLE_PARTIAL_STARTS": "maybe"})
