"""Web settings: flags `--gateway-address ...` or env `KAME_WEB_GATEWAY_ADDRESS ...`.

The web service is a client of the gateway like any app: it reaches it with
the same TLS settings a `kame talk` would (a CA file, or the system's roots),
and forwards the bearer token the page sends (or its own, when the operator
puts the page behind a login of their own and gives the bridge a token).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from kame_common.config import ConfigError, ServiceSettings, setting
from kame_common.gateway_client import GatewayClientSettings
from kame_common.ports import WEB_PORTS

MODES = ("tandem", "cascade", "s2s")


def entries(value: str) -> list[str]:
    """The non-blank items of a comma-separated setting."""
    return [item.strip() for item in value.split(",") if item.strip()]


@dataclass
class WebSettings(ServiceSettings, GatewayClientSettings):
    SERVICE: ClassVar[str] = "web"

    port: int = setting(WEB_PORTS.http, "HTTP port of the page and its WebSocket (0 picks one)")
    metrics_port: int = setting(WEB_PORTS.metrics, "Prometheus /metrics port (0 disables)")
    max_sessions: int = setting(16, "open page sessions before new ones are refused (0 = no limit)")
    modes: str = setting(
        ",".join(MODES), "comma-separated modes the page offers (tandem, cascade, s2s)"
    )
    llm_models: str = setting(
        "",
        "comma-separated LLM models the page offers besides the oracle's own "
        "(the oracle's allowed_models must allow them too)",
    )
    allowed_origins: str = setting(
        "",
        "comma-separated origins (https://host:port) whose pages may open the WebSocket, "
        "besides the page's own origin",
    )

    @property
    def mode_choices(self) -> list[str]:
        return entries(self.modes)

    @property
    def llm_choices(self) -> list[str]:
        return entries(self.llm_models)

    @property
    def origins(self) -> list[str]:
        return entries(self.allowed_origins)

    def validate(self) -> None:
        super().validate()
        self.validate_gateway_client()
        unknown = [m for m in self.mode_choices if m not in MODES]
        if unknown or not self.mode_choices:
            raise ConfigError(
                f"modes: {self.modes!r}: list one or more of {', '.join(MODES)}"
                + (f" (unknown: {', '.join(unknown)})" if unknown else "")
            )
        if self.tls_client_ca_file:
            raise ConfigError("tls_client_ca_file: the web service does not ask browsers for certs")
        if self.health_port:
            raise ConfigError("health_port: the web service answers probes on GET /healthz")
