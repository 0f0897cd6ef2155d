"""Service configuration from flags and environment variables.

A service declares its settings as a dataclass; each field becomes a flag
(`--max-sessions`) and an environment variable (`KAME_STT_MAX_SESSIONS`).
Precedence: flag, then environment, then the field default. Fields may carry
`choices` and a `help` text in their metadata. Every error names the field,
where it came from and what is allowed.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import inspect
import math
import os
import socket
import typing
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, TypeVar

from kame_common.grpc_options import ConnectionPolicy
from kame_common.ports import LOCAL_REDIS_URL, SERVICE_PORTS

T = TypeVar("T")
SettingsT = TypeVar("SettingsT", bound="ServiceSettings")


class ConfigError(ValueError):
    """A setting is missing or invalid; the message names the field."""


def setting(default: Any, help: str, choices: Sequence[Any] | None = None) -> Any:
    """Declare one setting of a config dataclass."""
    return dataclasses.field(default=default, metadata={"help": help, "choices": choices})


def _parse_bool(raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("expected one of true/false/1/0/yes/no/on/off")


def _convert(kind: type, raw: str) -> Any:
    if kind is bool:
        return _parse_bool(raw)
    if kind is int:
        return int(raw)
    if kind is float:
        return float(raw)
    return raw


_TYPE_WORDS = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}


def env_name(prefix: str, field_name: str) -> str:
    return f"{prefix}{field_name.upper()}"


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def load_config(
    cls: type[T],
    prefix: str,
    argv: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> T:
    """Build `cls` from flags (argv), then `env` (default os.environ), then defaults."""
    env = os.environ if env is None else env
    fields = dataclasses.fields(typing.cast("type[Any]", cls))
    hints = typing.get_type_hints(cls)
    parser = argparse.ArgumentParser(
        description=f"Settings of {cls.__name__}: each flag also reads the environment "
        "variable named after it; flags win.",
        exit_on_error=False,
    )
    for field in fields:
        choices = field.metadata.get("choices")
        allowed = f", one of {list(choices)}" if choices else ""
        text = (
            f"{field.metadata.get('help', '')} "
            f"[env {env_name(prefix, field.name)}, default {field.default!r}{allowed}]"
        )
        parser.add_argument(
            flag_name(field.name), dest=field.name, default=None, help=text.replace("%", "%%")
        )  # argparse formats help with %
    try:
        args = parser.parse_args(list(argv or []))
    except argparse.ArgumentError as exc:
        raise ConfigError(str(exc)) from exc
    values: dict[str, Any] = {}
    for field in fields:
        kind = hints[field.name]
        raw, source = getattr(args, field.name), flag_name(field.name)
        if raw is None and env_name(prefix, field.name) in env:
            raw, source = env[env_name(prefix, field.name)], env_name(prefix, field.name)
        if raw is None:
            continue
        try:
            values[field.name] = _convert(kind, raw)
        except ValueError as exc:
            raise ConfigError(
                f"{field.name} ({source}): expected {_TYPE_WORDS.get(kind, kind)}, got {raw!r}"
                + (f" ({exc})" if kind is bool else "")
            ) from None
    config = cls(**values)
    validate_choices(config)
    return config


def validate_choices(config: Any) -> None:
    """Raise ConfigError if a field with `choices` holds another value."""
    for field in dataclasses.fields(config):
        choices = field.metadata.get("choices")
        value = getattr(config, field.name)
        if choices is not None and value not in choices:
            allowed = ", ".join(repr(c) for c in choices)
            raise ConfigError(f"{field.name}: {value!r} is not allowed; choose one of {allowed}")


# Shorter shared secrets (bearer tokens, HMAC keys) are guessable.
MIN_SECRET_CHARS = 16


def check_secret(field_name: str, value: str) -> None:
    """ConfigError naming the field unless `value` is empty or long enough."""
    if value and len(value) < MIN_SECRET_CHARS:
        raise ConfigError(
            f"{field_name}: a secret needs at least {MIN_SECRET_CHARS} characters, got {len(value)}"
        )


# A bearer token callers present must carry at least this much randomness, as
# `token_bits` estimates it: a guesser then needs about 2^63 tries.
MIN_TOKEN_BITS = 64


def token_bits(token: str) -> float:
    """The randomness of `token`, estimated from its own characters: its length times
    the entropy of their frequencies: 'aaaa...' has none, 'password12345678' about
    62, 128 random bits as 32 hex characters about 115 (94 at the least)."""
    counts = collections.Counter(token)
    return sum(n * math.log2(len(token) / n) for n in counts.values())


def check_token(field_name: str, token: str) -> None:
    """ConfigError naming the field unless `token` is empty or a secret (check_secret)
    of at least MIN_TOKEN_BITS estimated bits; the message never shows the token."""
    check_secret(field_name, token)
    if token and (bits := token_bits(token)) < MIN_TOKEN_BITS:
        raise ConfigError(
            f"{field_name}: a token of {len(token)} characters with about {bits:.0f} bits of "
            f"randomness (estimated from its characters) is too easy to guess; use one of at "
            f"least {MIN_TOKEN_BITS}, e.g. `openssl rand -hex 32`"
        )


def grpc_port_setting(service: str) -> Any:
    """The `port` setting of `service`, defaulting to its port in kame_common.ports."""
    return setting(SERVICE_PORTS[service].grpc, "gRPC port (0 picks a free one)")


def check_not_negative(config: Any, *names: str) -> None:
    """ConfigError naming the first of the fields `names` of `config` below zero."""
    for name in names:
        if getattr(config, name) < 0:
            raise ConfigError(f"{name}: must not be negative, got {getattr(config, name)}")


def redis_timeout_setting() -> Any:
    """The `redis_timeout_s` setting of a service that uses Redis (kame_common.store)."""
    return setting(
        1.0,
        "seconds a Redis connect or command may take before it fails, so a Redis that "
        "hangs costs records, never a call (0 = no timeout)",
    )


# Off by default: on two shared cores the bound (1.5 measured as the operator's
# choice, docs/capacity.md) turned away the second and third callers of the e2e
# suite whenever other work loaded the machine, and it refuses more than its
# admitted callers' answer times justify (1 of 16 admitted at 1.03x); it is an
# operator's setting until it is tuned.
DEFAULT_ANSWER_TIME_FACTOR = 0.0


def answer_time_factor_setting() -> Any:
    """The operator's bound on answer time under load (kame_common.answer_time): the
    gateway and each measured service admit a call only while the predicted answer
    median stays within this factor of an unloaded call's."""
    return setting(
        DEFAULT_ANSWER_TIME_FACTOR,
        "admit a call only while the predicted answer median stays within this factor of "
        "an unloaded call's (RESOURCE_EXHAUSTED with a retry hint beyond; 0 = no bound)",
    )


def check_answer_time_factor(factor: float) -> None:
    if factor != 0 and factor < 1:
        raise ConfigError(f"answer_time_factor: must be 0 (off) or at least 1, got {factor:g}")


def metrics_port_setting(service: str) -> Any:
    return setting(SERVICE_PORTS[service].metrics, "Prometheus /metrics port (0 disables)")


@dataclasses.dataclass
class ServiceSettings:
    """The settings every service has. A service's settings class extends it and
    names its service in SERVICE, which makes the KAME_<SERVICE>_ prefix of its
    environment variables and its default ports (kame_common.ports). `validate`
    checks what a type alone cannot."""

    SERVICE: ClassVar[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Give `port` and `metrics_port` the named service's defaults, before the
        subclass's @dataclass reads its fields."""
        super().__init_subclass__(**kwargs)
        service = cls.__dict__.get("SERVICE")
        if service not in SERVICE_PORTS:
            return  # not one of the stack's services (a test's): ports default to 0
        own = inspect.get_annotations(cls)
        cls.__annotations__ = {"port": "int", "metrics_port": "int", **own}
        cls.port = grpc_port_setting(service)
        cls.metrics_port = metrics_port_setting(service)

    host: str = setting("0.0.0.0", "address the gRPC server binds")
    port: int = setting(0, "gRPC port (0 picks a free one)")
    metrics_port: int = setting(0, "Prometheus /metrics port (0 disables)")
    max_sessions: int = setting(0, "open sessions before RESOURCE_EXHAUSTED (0 = no limit)")
    grace_s: float = setting(30.0, "on SIGTERM, seconds open sessions get to finish")
    otlp_endpoint: str = setting(
        "", "OpenTelemetry OTLP/gRPC endpoint (empty = no export; https://... = TLS)"
    )
    otlp_ca_file: str = setting(
        "", "PEM CA that signs the OTLP collector's certificate (non-empty = TLS to it)"
    )
    tls_cert_file: str = setting(
        "",
        "PEM certificate chain of the gRPC port, re-read when it changes (empty = plaintext)",
    )
    tls_key_file: str = setting("", "PEM private key of tls_cert_file, re-read with it")
    tls_client_ca_file: str = setting(
        "", "PEM CA: require client certificates it signed (mTLS; needs tls_cert_file)"
    )
    health_port: int = setting(
        0, "plaintext port serving only grpc.health.v1, for probes that cannot speak TLS (0 = off)"
    )
    reflection: bool = setting(True, "serve gRPC reflection on the gRPC port")
    keepalive_time_s: float = setting(
        20.0,
        "seconds between HTTP/2 keepalive pings on every connection the service serves or "
        "dials (0 = gRPC's defaults: servers every 2 h, channels never)",
    )
    keepalive_timeout_s: float = setting(
        10.0, "a keepalive ping unanswered this long closes the connection and fails its calls"
    )
    max_connection_age_s: float = setting(
        300.0,
        "server: connections older than this get GOAWAY (open calls go on), so clients "
        "reconnect and re-resolve DNS to reach new replicas (0 = no limit)",
    )
    max_connection_age_grace_s: float = setting(
        0.0,
        "server: after max_connection_age_s, seconds open calls may still run before the "
        "connection closes (0 = until they end)",
    )

    @classmethod
    def env_prefix(cls) -> str:
        return f"KAME_{cls.SERVICE.upper()}_"

    def connection_policy(self) -> ConnectionPolicy:
        """Keepalive and connection age of the service's server and channels."""
        return ConnectionPolicy(
            keepalive_time_s=self.keepalive_time_s,
            keepalive_timeout_s=self.keepalive_timeout_s,
            max_connection_age_s=self.max_connection_age_s,
            max_connection_age_grace_s=self.max_connection_age_grace_s,
        )

    def validate(self) -> None:
        """Raise ConfigError naming a field whose value is out of its range."""
        if self.max_sessions < 0:
            raise ConfigError(f"max_sessions: must not be negative, got {self.max_sessions}")
        if self.grace_s < 0:
            raise ConfigError(f"grace_s: must not be negative, got {self.grace_s}")
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ConfigError(
                "tls_cert_file, tls_key_file: set both (TLS) or neither (plaintext), "
                f"got cert {self.tls_cert_file!r} and key {self.tls_key_file!r}"
            )
        if self.tls_client_ca_file and not self.tls_cert_file:
            raise ConfigError(
                "tls_client_ca_file: client certificates (mTLS) need TLS: set tls_cert_file "
                "and tls_key_file too"
            )
        check_not_negative(
            self, "keepalive_time_s", "max_connection_age_s", "max_connection_age_grace_s"
        )
        if self.keepalive_time_s > 0 and self.keepalive_timeout_s <= 0:
            raise ConfigError(
                f"keepalive_timeout_s: must be positive while keepalive_time_s is on, "
                f"got {self.keepalive_timeout_s}"
            )
        if self.health_port < 0:
            raise ConfigError(f"health_port: must not be negative, got {self.health_port}")
        if self.health_port and self.health_port == self.port:
            raise ConfigError(
                f"health_port: must differ from port ({self.port}): it serves plaintext health only"
            )


@dataclasses.dataclass
class RegistrySettings(ServiceSettings):
    """The settings of a service that publishes its capacity in the Redis registry
    (kame_common.capacity), where gateways read it: the frontend its batch slots,
    stt and the oracle the sessions they can serve in time."""

    redis_url: str = setting(LOCAL_REDIS_URL, "Redis for the capacity registry")
    redis_timeout_s: float = redis_timeout_setting()
    replica_id: str = setting("", "Name in the capacity registry (empty = hostname-pid)")
    registry_secret: str = setting(
        "", "HMAC key that signs this replica's capacity records (the gateway's registry_secret)"
    )
    advertise_address: str = setting(
        "", "host:port the gateway dials for this replica (empty = 127.0.0.1:<bound port>)"
    )

    def resolved_replica_id(self) -> str:
        return self.replica_id or f"{socket.gethostname()}-{os.getpid()}"

    def resolved_advertise_address(self, bound_port: int) -> str:
        return self.advertise_address or f"127.0.0.1:{bound_port}"

    def validate(self) -> None:
        super().validate()
        check_secret("registry_secret", self.registry_secret)
        check_not_negative(self, "redis_timeout_s")


@dataclasses.dataclass
class MeasuredCapacitySettings(RegistrySettings):
    """A service whose capacity is measured (stt, oracle): see kame_common.capacity."""

    publish_capacity: bool = setting(
        False,
        "publish the sessions this replica can serve in time in the Redis registry, so "
        "gateways refuse calls beyond them (RESOURCE_EXHAUSTED)",
    )
    target_utilization: float = setting(
        0.8, "share of its bottleneck (stt: decode workers, oracle: the LLM) it may fill"
    )
    answer_time_factor: float = answer_time_factor_setting()

    def validate(self) -> None:
        super().validate()
        if self.publish_capacity and not self.redis_url:
            raise ConfigError("publish_capacity: needs redis_url (the registry lives in Redis)")
        if not 0.05 <= self.target_utilization <= 1.0:
            raise ConfigError(
                f"target_utilization: must be between 0.05 and 1, got {self.target_utilization:g}"
            )
        check_answer_time_factor(self.answer_time_factor)


def load_settings(
    cls: type[SettingsT],
    argv: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> SettingsT:
    """A service's settings from flags, then KAME_<SERVICE>_* variables, then
    defaults; raises ConfigError naming the first bad field."""
    settings = load_config(cls, prefix=cls.env_prefix(), argv=argv, env=env)
    settings.validate()
    return settings
