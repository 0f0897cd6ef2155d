"""Oracle service settings (flags / KAME_ORACLE_* env) and per-session resolution.

The service settings hold the defaults; each session's OracleConfig may
override back-end, model, base URL, key, prompt, policy and limits, within
what the operator allows. API keys come from the environment (OPENAI_API_KEY,
ANTHROPIC_API_KEY: a Kubernetes Secret), never from flags, which `ps` would
show.

Keys stay with their URLs. A service key goes only to the URLs that belong to
its back-end: the operator's `base_url` (for the configured back-end) and the
vendor's own API. A session may name another base URL only if the operator
lists it (or a prefix of it) in `allowed_base_urls`, and then only with its
own `api_key`: the service's keys never go there; naming the operator's own
`base_url` is refused too (leave it empty: only then does the gateway count
the call against the oracle's capacity). A session may choose a back-end only
from `allowed_backends` (empty: the configured one), so the operator's key of
another vendor is never spent unless the operator says so, and its model,
named or the back-end's default, must be the configured model or one of
`allowed_models` (`*`: any). A URL path with percent-escapes, backslashes or
`.`/`..` segments is refused (a server decodes `%2e%2e` into `..`). Whatever
breaks these rules is refused here, before any request is made.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from kame_common.config import (
    ConfigError,
    MeasuredCapacitySettings,
    check_not_negative,
    setting,
)
from kame_common.delegation import delegation_timeout_s
from kame_common.llm import BACKEND_NAMES, backend_name
from kame_common.ports import LOCAL_LLM_URL, LOCAL_REDIS_URL
from kame_common.words import BACKCHANNEL_PHRASES, parse_phrases
from kamepb import oracle_pb2
from services.oracle.backends import (
    ANTHROPIC_API_BASE_URL,
    OPENAI_API_BASE_URL,
    BackendSettings,
    is_vendor_api,
)
from services.oracle.budget import BudgetLimits
from services.oracle.policy import PARTIAL_STARTS, POLICY_NAMES, PolicyParams
from services.oracle.prompts import with_instructions
from services.oracle.tools.client_functions import client_function_specs
from services.oracle.tools.settings import parse_allowed, parse_servers, trusted_hint_servers
from services.oracle.tools.spec import ToolSpec

# Models used when a session picks a back-end other than the service default
# and names no model.
VENDOR_DEFAULT_MODELS = {"openai": "gpt-4o-mini", "anthropic": "claude-haiku-4-5"}
VENDOR_BASE_URLS = {"openai": OPENAI_API_BASE_URL, "anthropic": ANTHROPIC_API_BASE_URL}
API_KEY_ENV = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}


@dataclass
class OracleSettings(MeasuredCapacitySettings):
    SERVICE: ClassVar[str] = "oracle"

    max_sessions: int = setting(100, "concurrent sessions before RESOURCE_EXHAUSTED (0 = no limit)")
    redis_url: str = setting(
        LOCAL_REDIS_URL, "Redis for conversation history (and the capacity registry)"
    )
    history_ttl_s: int = setting(3600, "seconds a conversation log lives after its last turn")
    history_turns: int = setting(20, "most recent turns of history put in the prompt")
    history_max_turns: int = setting(
        500, "turns a conversation log in Redis keeps (the newest; older ones are dropped)"
    )
    dtmf_to_llm: bool = setting(
        False,
        "put the keys callers press (PINs, account numbers) into the LLM's prompt and the "
        "conversation log (off: '(pressed a key)'; on for menus such as 'press 1 for sales')",
    )
    backchannel_phrases: str = setting(
        ", ".join(BACKCHANNEL_PHRASES),
        "comma-separated phrases that, said alone (or in a row) while the agent speaks, are "
        "kept as context and start no new answer; keep equal to the frontend's",
    )
    backend: str = setting("openai", "default LLM back-end", choices=BACKEND_NAMES)
    model: str = setting("gemma-3-270m", "default model (the embedded llm server's alias)")
    base_url: str = setting(LOCAL_LLM_URL, "default back-end base URL")
    policy: str = setting("tandem", "default restart policy", choices=POLICY_NAMES)
    partial_starts: str = setting(
        "auto",
        "tandem: whether ordinary partials start candidates (every min_new_words new words); "
        "off: only settled partials (stt's early final) and finals do; auto: off for a "
        "front-end that speaks only once the caller's turn is over (the tts engine: measured, "
        "they never made its answer sooner), on otherwise (the kame engine reads them)",
        choices=PARTIAL_STARTS,
    )
    final_priority: bool = setting(
        True,
        "tandem: when stt starts decoding a final, the LLM stream an ordinary partial started "
        "is cancelled and none starts until the final's words come, so the decode the turn "
        "waits for has the CPU (off where the LLM runs on other hardware than stt)",
    )
    request_timeout_s: float = setting(10.0, "limit on connect and on each wait for LLM output")
    check_timeout_s: float = setting(3.0, "limit on the config-time reachability check")
    warmup_timeout_s: float = setting(
        20.0, "limit on warming the default back-end's prompt prefix at start (0 = no warm-up)"
    )
    max_tokens: int = setting(64, "default max tokens per answer")
    temperature: float = setting(0.0, "default sampling temperature (0 = greedy)")
    allowed_base_urls: str = setting(
        "",
        "comma-separated URLs or URL prefixes a session may choose as base_url, always with "
        "its own api_key (empty = sessions cannot choose one)",
    )
    llm_parallel: int = setting(
        1,
        "requests the default back-end's server runs at once without slowing each other "
        "(1 for the embedded llm server on CPU: its slots share the same cores)",
    )
    session_load_prior: float = setting(
        0.3,
        "share of the default LLM one tandem session keeps busy, until measured "
        "(capacity estimate; see kame_common.capacity)",
    )
    allowed_models: str = setting(
        "",
        "comma-separated models a session may use, named or its back-end's default "
        "(empty = only the configured model; * = any)",
    )
    allowed_backends: str = setting(
        "",
        "comma-separated back-ends a session may choose, with the service's key for it "
        "(empty = only the configured backend)",
    )
    mcp_servers: str = setting(
        "",
        "MCP servers whose tools the LLM may call, ';'-separated NAME=COMMAND (stdio) or "
        "NAME=URL (streamable HTTP); only tools listed in tools_allowed are offered",
    )
    tools_allowed: str = setting(
        "",
        "tools the LLM may call, comma-separated SERVER.TOOL or SERVER.* (all of a server), "
        "each optionally with :readonly (may run on partial transcripts) and :SECONDS (its "
        "timeout)",
    )
    trust_read_only_hints: str = setting(
        "",
        "comma-separated MCP servers whose readOnlyHint annotations are believed (* = all): "
        "their hinted tools may run on partial transcripts, as :readonly ones do (empty = "
        "none: a server's hint alone runs nothing early)",
    )
    tool_timeout_s: float = setting(5.0, "limit on one tool call, unless tools_allowed sets one")
    tool_budget: int = setting(4, "tool calls the LLM may start per caller turn")
    mcp_connect_timeout_s: float = setting(
        10.0, "limit on connecting an MCP server and listing its tools at start"
    )
    max_client_functions: int = setting(
        32, "functions a session's client may declare for the LLM to call (0 = none)"
    )
    session_token_budget: int = setting(
        2_000_000,
        "LLM tokens (estimated: input as request characters / 4, plus output) one session "
        "may spend, resumed calls included; then its call ends with RESOURCE_EXHAUSTED "
        "(0 = no limit)",
    )
    caller_token_budget: int = setting(
        0,
        "LLM tokens one caller (one bearer token; without auth every caller is one) may "
        "spend in caller_budget_window_s, all its sessions together (0 = no limit)",
    )
    caller_budget_window_s: float = setting(
        86400.0, "the window of caller_token_budget, in seconds"
    )

    def validate(self) -> None:
        super().validate()
        if self.llm_parallel < 1:
            raise ConfigError(f"llm_parallel: must be at least 1, got {self.llm_parallel}")
        if not 0 < self.session_load_prior <= 1:
            raise ConfigError(
                "session_load_prior: must be above 0 and at most 1, "
                f"got {self.session_load_prior:g}"
            )
        for entry in _entries(self.allowed_base_urls):
            problem = _url_problem(entry)
            if problem:
                raise ConfigError(f"allowed_base_urls: {entry!r} {problem}")
        for backend in _entries(self.allowed_backends):
            if backend not in BACKEND_NAMES:
                raise ConfigError(
                    f"allowed_backends: {backend!r} is unknown; choose from "
                    + ", ".join(BACKEND_NAMES)
                )
        for name, parse in (("mcp_servers", parse_servers), ("tools_allowed", parse_allowed)):
            try:
                parse(getattr(self, name))
            except ValueError as exc:
                raise ConfigError(f"{name}: {exc}") from None
        try:
            trusted_hint_servers(self.trust_read_only_hints, parse_servers(self.mcp_servers))
        except ValueError as exc:
            raise ConfigError(f"trust_read_only_hints: {exc}") from None
        if self.tool_timeout_s <= 0 or self.mcp_connect_timeout_s <= 0:
            raise ConfigError("tool_timeout_s and mcp_connect_timeout_s: must be above 0")
        if self.tool_budget < 0:
            raise ConfigError(f"tool_budget: must be at least 0, got {self.tool_budget}")
        if self.max_client_functions < 0:
            raise ConfigError(
                f"max_client_functions: must be at least 0, got {self.max_client_functions}"
            )
        check_not_negative(self, "session_token_budget", "caller_token_budget")
        if self.caller_budget_window_s <= 0:
            raise ConfigError(
                f"caller_budget_window_s: must be above 0, got {self.caller_budget_window_s:g}"
            )
        if self.history_max_turns < max(self.history_turns, 1):
            raise ConfigError(
                f"history_max_turns: must be at least history_turns ({self.history_turns}), "
                f"got {self.history_max_turns}"
            )


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
    backend: BackendSettings | None  # None: client delegation, no LLM
    policy: PolicyParams
    history_turns: int
    heartbeat_interval_s: float = 0.0  # 0: no HEARTBEAT events
    dtmf_to_llm: bool = False  # keys pressed are named in the prompt and the log
    # said while the agent speaks: context, not a question (normalized phrases)
    backchannels: tuple[tuple[str, ...], ...] = ()
    tool_budget: int = 4  # tool calls per caller turn
    client_functions: tuple[ToolSpec, ...] = ()  # the client's functions, as tools
    caller: str = ""  # whose caller_token_budget the session spends ("": its own)
    budget: BudgetLimits = field(default_factory=BudgetLimits)
    delegation_timeout_s: float = 0.0  # client delegation (services/oracle/delegation.py)


# OracleConfig.heartbeat_interval_s when set (0 = no heartbeats).
HEARTBEAT_RANGE = (0.1, 60.0)


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
        # A delegation asks the client's back-end for a whole answer: not every two words.
        partial_starts=not config.client_delegation
        and (
            service.partial_starts == "on"
            or (service.partial_starts == "auto" and not config.frontend_ends_turns)
        ),
        final_priority=service.final_priority,
    )
    try:
        params.validate()
    except ValueError as exc:
        raise InvalidSessionConfig(str(exc)) from None
    return params


def _entries(value: str) -> list[str]:
    return [entry.strip() for entry in value.split(",") if entry.strip()]


def _url_problem(url: str) -> str:
    """What makes `url` unfit as a base URL, or ''."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 (raises ValueError on a bad port)
    except ValueError as exc:
        return f"is not a URL ({exc})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be an http:// or https:// URL with a host"
    if parts.username is not None or parts.password is not None:
        return "must not carry credentials (send the key as api_key)"
    if parts.query or parts.fragment:
        return "must not have a query or a fragment"
    if "%" in parts.path or "\\" in parts.path:
        return "must not have percent-escapes or backslashes in its path"
    if {".", ".."} & set(parts.path.split("/")):
        return "must not contain '..' or '.' path segments"
    return ""


def _origin_and_path(url: str) -> tuple[tuple[str, str, int], str]:
    """((scheme, host, port), path without trailing slash) of a URL that has no problem."""
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    port = parts.port or (443 if scheme == "https" else 80)
    return (scheme, (parts.hostname or "").lower(), port), parts.path.rstrip("/")


def same_url(url: str, other: str) -> bool:
    """The same base URL, up to case of scheme and host, default port and a trailing slash."""
    if _url_problem(url) or _url_problem(other):
        return False
    return _origin_and_path(url) == _origin_and_path(other)


def url_allowed(url: str, allowed: list[str]) -> bool:
    """`url` is an entry of `allowed` or lies under one: same scheme, host and port,
    and a path equal to the entry's or below it at a '/' (so an entry
    https://llm.example.com/v1 admits .../v1/x, not .../v10 nor llm.example.com.evil)."""
    if _url_problem(url):
        return False
    origin, path = _origin_and_path(url)
    for entry in allowed:
        if _url_problem(entry):
            continue
        entry_origin, entry_path = _origin_and_path(entry)
        if origin == entry_origin and (path == entry_path or path.startswith(entry_path + "/")):
            return True
    return False


def _service_urls(service: OracleSettings, backend: str) -> list[str]:
    """The URLs a service key of `backend` may go to: the operator's and the vendor's."""
    own = [service.base_url] if backend == service.backend else []
    return [*own, VENDOR_BASE_URLS[backend]]


def _check_backend(backend: str, service: OracleSettings) -> None:
    """InvalidSessionConfig unless the operator allows sessions on `backend`."""
    allowed = _entries(service.allowed_backends) or [service.backend]
    if backend not in allowed:
        raise InvalidSessionConfig(
            f"backend {backend!r} is not allowed: sessions may choose back-ends from the "
            "oracle's allowed_backends setting (KAME_ORACLE_ALLOWED_BACKENDS), which allows "
            + ", ".join(repr(b) for b in allowed)
        )


def _model(config: oracle_pb2.OracleConfig, service: OracleSettings, backend: str) -> str:
    """The session's model: the one it names, else its back-end's default; either
    must be the configured model or one the operator allows."""
    default = service.model if backend == service.backend else VENDOR_DEFAULT_MODELS[backend]
    model = config.model or default
    allowed = _entries(service.allowed_models)
    if model == service.model or "*" in allowed or model in allowed:
        return model
    listed = f"it lists {', '.join(repr(m) for m in allowed)}" if allowed else "it is empty"
    raise InvalidSessionConfig(
        f"model {model!r} is not allowed: sessions may use models from the oracle's "
        f"allowed_models setting (KAME_ORACLE_ALLOWED_MODELS), and {listed}"
    )


def _names_own_server(base_url: str, service: OracleSettings, backend: str) -> bool:
    """Whether `base_url` is the operator's own LLM server (not a vendor API), whose
    capacity the gateway counts only for calls that leave base_url empty."""
    return (
        backend == service.backend
        and same_url(base_url, service.base_url)
        and not is_vendor_api(backend, service.base_url)
    )


def _endpoint(
    config: oracle_pb2.OracleConfig, service: OracleSettings, backend: str, keys: ApiKeys
) -> tuple[str, str]:
    """(base URL, API key) of the session: a service URL with the service's key
    (unless the session brings its own), or an allowed URL with the session's key."""
    service_urls = _service_urls(service, backend)
    if not config.base_url:
        return service_urls[0], config.api_key or getattr(keys, backend)
    if _names_own_server(config.base_url, service, backend):
        raise InvalidSessionConfig(
            "base_url: leave it empty to use the oracle's own LLM (only then is the call "
            "counted against the oracle's capacity)"
        )
    for url in service_urls:
        if same_url(config.base_url, url):
            return url, config.api_key or getattr(keys, backend)
    problem = _url_problem(config.base_url)
    if problem:
        raise InvalidSessionConfig(f"base_url {config.base_url!r} {problem}")
    if not url_allowed(config.base_url, _entries(service.allowed_base_urls)):
        raise InvalidSessionConfig(
            f"base_url {config.base_url!r} is not allowed: sessions may choose only URLs listed "
            "in the oracle's allowed_base_urls setting (KAME_ORACLE_ALLOWED_BASE_URLS)"
            + ("" if service.allowed_base_urls.strip() else ", which is empty")
        )
    if not config.api_key:
        raise InvalidSessionConfig(
            f"api_key is required with base_url {config.base_url!r}: a base URL the session "
            "chooses gets the session's own key, never the service's"
        )
    return config.base_url, config.api_key


def _backend(
    config: oracle_pb2.OracleConfig, service: OracleSettings, keys: ApiKeys
) -> BackendSettings:
    try:
        backend = backend_name(config.backend) or service.backend
    except ValueError as exc:
        raise InvalidSessionConfig(f"backend: {exc}") from None
    _check_backend(backend, service)
    model = _model(config, service, backend)
    base_url, api_key = _endpoint(config, service, backend, keys)
    if not api_key and is_vendor_api(backend, base_url):
        raise InvalidSessionConfig(
            f"backend {backend!r} needs an API key: set {API_KEY_ENV[backend]} in the oracle "
            "service's environment or api_key in the OracleConfig"
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
        system_prompt=with_instructions(config.system_prompt, config.instructions.strip(), model),
    )


def _delegation_timeout_s(config: oracle_pb2.OracleConfig) -> float:
    """Client delegation's timeout; 0 for a session with an LLM."""
    if not config.client_delegation:
        if config.delegation_timeout_s:
            raise InvalidSessionConfig("delegation_timeout_s: only with client_delegation")
        return 0.0
    llm_fields = [f for f in ("backend", "model", "base_url", "api_key") if getattr(config, f)]
    if llm_fields or config.client_functions:
        named = ", ".join([*llm_fields, *(["client_functions"] if config.client_functions else [])])
        raise InvalidSessionConfig(
            f"client_delegation: the client's back-end answers, with no LLM here: {named} "
            "cannot be set"
        )
    try:
        return delegation_timeout_s(config.delegation_timeout_s, "delegation_timeout_s")
    except ValueError as exc:
        raise InvalidSessionConfig(str(exc)) from None


def resolve_session(
    config: oracle_pb2.OracleConfig, service: OracleSettings, keys: ApiKeys
) -> SessionSettings:
    """Merge a session's OracleConfig over the service defaults; InvalidSessionConfig
    names the first problem."""
    if not config.session_id:
        raise InvalidSessionConfig("session_id is required: the conversation is stored under it")
    low, high = HEARTBEAT_RANGE
    if config.heartbeat_interval_s and not low <= config.heartbeat_interval_s <= high:
        raise InvalidSessionConfig(
            f"heartbeat_interval_s must be between {low:g} and {high:g} (or 0 for none), "
            f"got {config.heartbeat_interval_s:g}"
        )
    try:
        client_functions = client_function_specs(
            config.client_functions, service.max_client_functions, service.tool_timeout_s
        )
    except ValueError as exc:
        raise InvalidSessionConfig(str(exc)) from None
    timeout_s = _delegation_timeout_s(config)
    return SessionSettings(
        session_id=config.session_id,
        backend=None if timeout_s else _backend(config, service, keys),
        policy=_policy(config, service),
        history_turns=service.history_turns,
        heartbeat_interval_s=config.heartbeat_interval_s,
        dtmf_to_llm=service.dtmf_to_llm,
        backchannels=parse_phrases(service.backchannel_phrases),
        tool_budget=service.tool_budget,
        client_functions=client_functions,
        caller=config.caller,
        budget=BudgetLimits(
            service.session_token_budget,
            service.caller_token_budget,
            service.caller_budget_window_s,
        ),
        delegation_timeout_s=timeout_s,
    )
