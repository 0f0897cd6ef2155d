"""Web settings: flags `--gateway-address ...` or env `KAME_WEB_GATEWAY_ADDRESS ...`.

The web service is a client of the gateway like any app: it reaches it with
the same TLS settings a `kame talk` would (a CA file, or the system's roots),
and forwards the bearer token the page sends. It relays a token of its own
(`gateway_auth_token`) only when the operator says that their own login sits
in front of the page (`relay_token_behind_login`): otherwise whoever reaches
the page would talk on the operator's token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from kame_common.config import ConfigError, ServiceSettings, setting
from kame_common.delegation import MAX_TIMEOUT_S
from kame_common.gateway_client import GatewayClientSettings
from kame_common.ports import WEB_PORTS
from kame_common.words import BACKCHANNEL_PHRASES
from services.web.admission import Network, proxy_networks

MODES = ("tandem", "cascade", "s2s")
# Host names a browser on this machine uses for the page; always allowed.
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
WILDCARD_BINDS = ("", "0.0.0.0", "::")


def entries(value: str) -> list[str]:
    """The non-blank items of a comma-separated setting."""
    return [item.strip() for item in value.split(",") if item.strip()]


@dataclass
class WebSettings(ServiceSettings, GatewayClientSettings):
    SERVICE: ClassVar[str] = "web"

    port: int = setting(WEB_PORTS.http, "HTTP port of the page and its WebSocket (0 picks one)")
    metrics_port: int = setting(WEB_PORTS.metrics, "Prometheus /metrics port (0 disables)")
    max_sessions: int = setting(
        16,
        "open calls (a socket counts once its call to the gateway opens) before new ones are "
        "refused (0 = no limit)",
    )
    max_waiting_per_address: int = setting(
        8,
        "WebSockets one client address may hold open without a call (before their call "
        "opens, at most start_timeout_s each); more are refused (0 = no limit)",
    )
    trusted_proxies: str = setting(
        "",
        "comma-separated addresses or networks (CIDR) of proxies in front of the web service "
        "(an Ingress): only for a connection from one of them is the client address taken "
        "from X-Forwarded-For",
    )
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
    allowed_hosts: str = setting(
        "",
        "comma-separated host names the page may be reached by (the Host header, e.g. your "
        "Ingress's name), besides localhost, 127.0.0.1, ::1 and the bind address",
    )
    start_timeout_s: float = setting(
        10.0,
        "seconds a new WebSocket may go without a call to the gateway (the page: its start "
        "message; /v1/live/sessions: its session.start; /v1/realtime: its first event that "
        "needs a call) before it is closed",
    )
    realtime_idle_timeout_s: float = setting(
        300.0,
        "seconds a call from any WebSocket may go without the caller's audio with sound in it "
        "or text before it is closed with the protocol's error (idle_timeout): messages that "
        "carry neither do not count, so a forgotten or chatty client holds no call",
    )
    live_delegation_timeout_s: float = setting(
        30.0,
        "seconds a /v1/live/sessions client's back-end may take to answer a delegation (nothing "
        "from it for this long: the agent apologises, the call goes on); at most the gateway's "
        "60",
    )
    realtime_relay_instructions: bool = setting(
        False,
        "give a /v1/realtime session's instructions to the agent (the gateway's "
        "allow_instructions must be on too, or the call is refused); off: they are kept and "
        "shown back only",
    )
    backchannel_phrases: str = setting(
        ", ".join(BACKCHANNEL_PHRASES),
        "comma-separated phrases that, said over the agent (alone or in a row), are a "
        "backchannel to a /v1/realtime client: no speech_started, the response goes on; keep "
        "equal to the frontend's and oracle's backchannel_phrases",
    )
    relay_token_behind_login: bool = setting(
        False,
        "relay gateway_auth_token for pages that bring no token: set it only when a login of "
        "your own sits in front of the page (else whoever reaches the page uses your token)",
    )

    @property
    def mode_choices(self) -> list[str]:
        return entries(self.modes)

    @property
    def llm_choices(self) -> list[str]:
        return entries(self.llm_models)

    @property
    def relayed_token(self) -> str:
        """The token sent for a caller who brings none: the operator's own, only where
        they said a login of theirs guards the service."""
        return self.gateway_auth_token if self.relay_token_behind_login else ""

    @property
    def proxies(self) -> list[Network]:
        return proxy_networks(self.trusted_proxies)

    @property
    def origins(self) -> list[str]:
        return entries(self.allowed_origins)

    @property
    def hosts(self) -> set[str]:
        """Every host name the Host header may carry (lower case, no port)."""
        named = {host.lower().strip("[]") for host in entries(self.allowed_hosts)}
        bind = {self.host.strip("[]")} - set(WILDCARD_BINDS)
        return set(LOOPBACK_HOSTS) | bind | named

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
        proxy_networks(self.trusted_proxies)  # ConfigError for one that is not an address
        if self.max_waiting_per_address < 0:
            raise ConfigError(
                f"max_waiting_per_address: 0 or more, got {self.max_waiting_per_address}"
            )
        if not self.start_timeout_s > 0:
            raise ConfigError(f"start_timeout_s: must be above 0, got {self.start_timeout_s}")
        if not self.realtime_idle_timeout_s > 0:
            raise ConfigError(
                f"realtime_idle_timeout_s: must be above 0, got {self.realtime_idle_timeout_s}"
            )
        if not 0 < self.live_delegation_timeout_s <= MAX_TIMEOUT_S:  # NaN fails too
            raise ConfigError(
                f"live_delegation_timeout_s: above 0 and at most {MAX_TIMEOUT_S:g} (the gateway's "
                f"limit), got {self.live_delegation_timeout_s}"
            )
        if self.gateway_auth_token and not self.relay_token_behind_login:
            raise ConfigError(
                "gateway_auth_token: the bridge would hand it to anyone who reaches the page; "
                "set relay_token_behind_login=true if a login of your own sits in front of the "
                "page, or leave the token empty and let each person type theirs in the page"
            )
