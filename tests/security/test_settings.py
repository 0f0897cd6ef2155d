"""The security settings: their environment names (which the deployment files
use), their defaults, and start-up errors that name the field."""

from __future__ import annotations

import secrets
import uuid

import pytest

from kame_common.config import MIN_TOKEN_BITS, ConfigError, load_settings, token_bits
from services.frontend.config import FrontendSettings
from services.gateway.config import GatewaySettings
from services.oracle.config import OracleSettings
from services.stt.config import SttSettings
from services.telephony.config import TelephonySettings


@pytest.mark.parametrize("cls", [GatewaySettings, FrontendSettings, SttSettings, OracleSettings])
def test_every_service_reads_its_tls_settings_from_its_environment(cls):
    prefix = cls.env_prefix()
    env = {
        f"{prefix}TLS_CERT_FILE": "/tls/tls.crt",
        f"{prefix}TLS_KEY_FILE": "/tls/tls.key",
        f"{prefix}TLS_CLIENT_CA_FILE": "/tls/ca.crt",
        f"{prefix}HEALTH_PORT": "9111",
        f"{prefix}REFLECTION": "false",
    }
    settings = load_settings(cls, [], env=env)
    assert (settings.tls_cert_file, settings.tls_key_file, settings.tls_client_ca_file) == (
        "/tls/tls.crt",
        "/tls/tls.key",
        "/tls/ca.crt",
    )
    assert (settings.health_port, settings.reflection) == (9111, False)


def test_plaintext_and_no_health_port_by_default_and_reflection_off_only_at_the_edge():
    for cls in (FrontendSettings, SttSettings, OracleSettings):
        settings = load_settings(cls, [], env={})
        assert (settings.tls_cert_file, settings.health_port, settings.reflection) == ("", 0, True)
    gateway = load_settings(GatewaySettings, [], env={})
    assert (gateway.reflection, gateway.auth_tokens, gateway.registry_secret) == (False, "", "")


def test_keys_pressed_are_masked_and_callers_keep_to_the_operators_backend_by_default():
    gateway = load_settings(GatewaySettings, [], env={})
    assert (gateway.dtmf_in_records, gateway.dtmf_per_s, gateway.dtmf_burst) == (False, 5.0, 10)
    oracle = load_settings(OracleSettings, [], env={})
    assert (oracle.dtmf_to_llm, oracle.allowed_backends, oracle.history_max_turns) == (
        False,
        "",
        500,
    )


def test_gateway_security_settings_from_the_environment():
    env = {
        "KAME_GATEWAY_AUTH_TOKENS": "token-one-0123456789,token-two-0123456789",
        "KAME_GATEWAY_UPSTREAM_CA_FILE": "/tls/ca.crt",
        "KAME_GATEWAY_UPSTREAM_CERT_FILE": "/tls/client.crt",
        "KAME_GATEWAY_UPSTREAM_KEY_FILE": "/tls/client.key",
        "KAME_GATEWAY_UPSTREAM_SERVER_NAME": "kame.internal",
        "KAME_GATEWAY_REGISTRY_SECRET": "registry-secret-0123456789",
    }
    settings = load_settings(GatewaySettings, [], env=env)
    tls = settings.upstream_tls()
    assert (tls.ca_file, tls.cert_file, tls.key_file, tls.server_name) == (
        "/tls/ca.crt",
        "/tls/client.crt",
        "/tls/client.key",
        "kame.internal",
    )
    assert settings.registry_secret == "registry-secret-0123456789"
    frontend = load_settings(
        FrontendSettings, [], env={"KAME_FRONTEND_REGISTRY_SECRET": "registry-secret-0123456789"}
    )
    assert frontend.registry_secret == settings.registry_secret


def test_random_tokens_pass_the_randomness_check_and_errors_never_show_a_token():
    """The old check took any 16 characters ('aaaaaaaaaaaaaaaa' included)."""
    for _ in range(200):
        for token in (secrets.token_hex(16), secrets.token_urlsafe(16), str(uuid.uuid4())):
            assert token_bits(token) >= MIN_TOKEN_BITS, token
    with pytest.raises(ConfigError) as refused:
        load_settings(GatewaySettings, [], env={"KAME_GATEWAY_AUTH_TOKENS": "z" * 16})
    assert "about 0 bits" in str(refused.value) and "z" * 16 not in str(refused.value)


@pytest.mark.parametrize(
    "cls, env, message",
    [
        (SttSettings, {"TLS_CERT_FILE": "/c"}, "tls_cert_file, tls_key_file: set both"),
        (OracleSettings, {"TLS_CLIENT_CA_FILE": "/ca"}, "tls_client_ca_file: client certificates"),
        (FrontendSettings, {"HEALTH_PORT": "50052"}, "health_port: must differ from port"),
        (GatewaySettings, {"AUTH_TOKENS": "short"}, "auth_tokens: a secret needs at least 16"),
        # Long enough, but guessable: a word and digits, a repeated word, one letter.
        (GatewaySettings, {"AUTH_TOKENS": "password12345678"}, "auth_tokens: a token of 16"),
        (GatewaySettings, {"AUTH_TOKENS": "changeme-changeme"}, "auth_tokens: a token of 17"),
        (TelephonySettings, {"GATEWAY_AUTH_TOKEN": "a" * 40}, "gateway_auth_token: a token"),
        (GatewaySettings, {"REGISTRY_SECRET": "short"}, "registry_secret: a secret needs"),
        (FrontendSettings, {"REGISTRY_SECRET": "short"}, "registry_secret: a secret needs"),
        (
            GatewaySettings,
            {"UPSTREAM_CERT_FILE": "/c", "UPSTREAM_KEY_FILE": "/k"},
            "upstream_cert_file: a client certificate needs TLS",
        ),
        (GatewaySettings, {"UPSTREAM_KEY_FILE": "/k"}, "upstream_cert_file, upstream_key_file"),
        (GatewaySettings, {"UPSTREAM_SERVER_NAME": "x"}, "upstream_server_name: applies to TLS"),
        (OracleSettings, {"ALLOWED_BASE_URLS": "llm:8080"}, "allowed_base_urls: 'llm:8080'"),
        (OracleSettings, {"ALLOWED_BACKENDS": "gemini"}, "allowed_backends: 'gemini' is unknown"),
        (OracleSettings, {"HISTORY_MAX_TURNS": "5"}, "history_max_turns: must be at least"),
        (GatewaySettings, {"DTMF_PER_S": "-1"}, "dtmf_per_s"),
    ],
)
def test_inconsistent_settings_fail_naming_the_field(cls, env, message):
    prefix = cls.env_prefix()
    with pytest.raises(ConfigError, match=message):
        load_settings(cls, [], env={prefix + k: v for k, v in env.items()})
