"""Oracle service settings (flags / KAME_ORACLE_* env) and per-session resolution.

The service settings hold the defaults; each session's OracleConfig may
override back-end, model, base URL, key, prompt, policy and limits. API keys
come from the environment (OPENAI_API_KEY, ANTHROPIC_API_KEY: a Kubernetes
Secret), never from flags, which `ps` would show.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from kame_common.config import (
    ServiceSettings,
    grpc_port_setting,
    metrics_port_setting,
    setting,
)
from kame_common.ports import LOCAL_LLM_URL, LOCAL_REDIS_URL
from kamepb import oracle_pb2
from services.oracle.backends import (
    ANTHROPIC_API_BASE_URL,
    BACKEND_NAMES,
    OPENAI_API_BASE_URL,
    BackendSettings,
    is_vendor_api,
)
from services.oracle.policy import POLICY_NAMES, PolicyParams

# Models used when a session picks a back-end other than the service default
# and names no model.
VENDOR_DEFAULT_MODELS = {"openai": "gpt-4o-mini", "anthropic": "claude-haiku-4-5"}
VENDOR_BASE_URLS = {"openai": OPENAI_API_BASE_URL, "anthropic": ANTHROPIC_API_BASE_URL}
API_KEY_ENV = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}


@dataclass
class OracleSettings(ServiceSettings):
    SERVICE: ClassVar[str] = "oracle"

    port: int = grpc_port_setting("oracle")
    metrics_port: int = metrics_port_setting("oracle")
    max_sessions: int = setting(100, "concurrent sessions before RESOURCE_EXHAUSTED (0 = no limit)")
    redis_url: str = setting(LOCAL_REDIS_URL, "Redis for conversation history")
    history_ttl_s: int = setting(3600, "seconds a conversation log lives after its last turn")
    history_turns: int = setting(20, "most recent turns of history put in the prompt")
    backend: str = setting("openai", "default LLM back-end", choices=BACKEND_NAMES)
    model: str = setting("gemma-3-270m", "default model (the embedded llm server's alias)")
    base_url: str = setting(LOCAL_LLM_URL, "default back-end base URL")
    policy: str = setting("tandem", "default restart policy", choices=POLICY_NAMES)
    request_timeout_s: float = setting(10.0, "limit on connect and on each wait for LLM output")
    check_timeout_s: float = setting(3.0, "limit on the config-time reachability check")
    warmup_timeout_s: float = setting(
        20.0, "limit on warming the default back-end's prompt prefix at start (0 = no warm-up)"
    )
    max_tokens: int = setting(64, "default max tokens per answer")
    temperature: float = setting(0.0, "default sampling temperature (0 = greedy)")


@dataclass(frozen=True)
class ApiKeys:
    openai: str = ""
    anthropic: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ApiKeys:
        env = os.environ if env is None else env
        return cls(**{name: env.get(var, "") for name, var in API_KEY_ENV.items()})


@dataclass(frozen=True)
class SessionSettings:
    session_id: str
    backend: BackendSettings
    policy: PolicyParams
    history_turns: int


class InvalidSessionConfig(ValueError):
    """The session's OracleConfig cannot be served (-> INVALID_ARGUMENT)."""


def _policy(config: oracle_pb2.OracleConfig, service: OracleSettings) -> PolicyParams:
    given = config.policy
    defaults = PolicyParams()
    params = PolicyParams(
        name=given.name or service.policy,
        poll_interval_s=given.poll_interval_s or defaults.poll_interval_s,
        min_new_words=given.min_new_words or defaults.min_new_words,
        max_starts=given.max_starts or defaults.max_starts,
        start_window_s=given.start_window_s or defaults.start_window_s,
    )
    try:
        params.validate()
    except ValueError as exc:
        raise InvalidSessionConfig(str(exc)) from None
    return params


def _backend(
    config: oracle_pb2.OracleConfig, service: OracleSettings, keys: ApiKeys
) -> BackendSettings:
    backend = config.backend or service.backend
    if backend not in BACKEND_NAMES:
        allowed = ", ".join(repr(b) for b in BACKEND_NAMES)
        raise InvalidSessionConfig(f"backend {backend!r} is unknown; choose one of {allowed}")
    is_default = backend == service.backend
    base_url = config.base_url or (service.base_url if is_default else VENDOR_BASE_URLS[backend])
    model = config.model or (service.model if is_default else VENDOR_DEFAULT_MODELS[backend])
    api_key = config.api_key or getattr(keys, backend)
    if not api_key and is_vendor_api(backend, base_url):
        raise InvalidSessionConfig(
            f"backend {backend!r} at {base_url} needs an API key: set {API_KEY_ENV[backend]} "
            "in the oracle service's environment or api_key in the OracleConfig"
        )
    for name, value in (
        ("request_timeout_s", config.request_timeout_s),
        ("max_tokens", config.max_tokens),
        ("temperature", config.temperature),
    ):
        if value < 0:
            raise InvalidSessionConfig(f"{name} must be >= 0 (0 = service default), got {value}")
    return BackendSettings(
        backend=backend,
        model=model,
        base_url=base_url,
        api_key=api_key,
        request_timeout_s=config.request_timeout_s or service.request_timeout_s,
        max_tokens=config.max_tokens or service.max_tokens,
        temperature=config.temperature or service.temperature,
        system_prompt=config.system_prompt,
    )


def resolve_session(
    config: oracle_pb2.OracleConfig, service: OracleSettings, keys: ApiKeys
) -> SessionSettings:
    """Merge a session's OracleConfig over the service defaults; InvalidSessionConfig
    names the first problem."""
    if not config.session_id:
        raise InvalidSessionConfig("session_id is required: the conversation is stored under it")
    return SessionSettings(
        session_id=config.session_id,
        backend=_backend(config, service, keys),
        policy=_policy(config, service),
        history_turns=service.history_turns,
    )
