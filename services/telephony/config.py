"""Telephony settings: flags `--sip-port ...` or env `KAME_TELEPHONY_SIP_PORT ...`.

The telephony service answers phones on three protocols and is, towards the
gateway, a client like any app (same address, TLS and bearer-token settings as
the web service). Who may call is the operator's choice: SIP and AudioSocket
only from `allowed_networks`, Twilio only with a valid webhook signature.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import ClassVar

from kame_common.config import ConfigError, ServiceSettings, check_secret, setting
from kame_common.gateway_client import GatewayClientSettings
from kame_common.ports import TELEPHONY_PORTS

MODES = ("tandem", "cascade", "s2s")
SIP_CODECS = ("PCMU", "PCMA")
# What the agent may do to a call (services/telephony/call_control.py), each only
# when the operator lists it in call_control.
CALL_CONTROL_ACTIONS = ("hang_up", "transfer", "send_dtmf")
# The keys the agent may press in one send_dtmf unless the operator says otherwise.
DEFAULT_DTMF_SEND_ALLOWED = "[0-9]{1,16}"
# A transfer target's URI goes into a SIP header (Refer-To) or TwiML: none of these.
URI_FORBIDDEN = frozenset(" \t\r\n<>\"',;")

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def entries(value: str) -> list[str]:
    """The non-blank items of a comma-separated setting."""
    return [item.strip() for item in value.split(",") if item.strip()]


@dataclass(frozen=True)
class TransferTarget:
    """Where the agent may transfer a call: the name it asks for, and the URI the
    phone is sent to (SIP: Refer-To)."""

    name: str
    uri: str


def transfer_targets(value: str) -> list[TransferTarget]:
    """`NAME=URI` or `URI` entries of the transfer_targets setting (a bare URI is
    its own name); ConfigError for one that is not a sip:, sips: or tel: URI."""
    targets = []
    for entry in entries(value):
        # A name comes before the URI's scheme: "sales=sip:..." but not "sip:a=b".
        named = "=" in entry.split(":")[0]
        name, _, uri = entry.partition("=") if named else ("", "", entry)
        name, uri = name.strip() or uri.strip(), uri.strip()
        scheme = uri.split(":")[0].lower()
        if scheme not in ("sip", "sips", "tel") or uri == scheme + ":" or URI_FORBIDDEN & set(uri):
            raise ConfigError(
                f"transfer_targets: {entry!r}: NAME=URI or URI, the URI sip:, sips: or tel: "
                "without spaces, quotes, commas, semicolons or angle brackets"
            )
        targets.append(TransferTarget(name, uri))
    return targets


@dataclass
class TelephonySettings(ServiceSettings, GatewayClientSettings):
    SERVICE: ClassVar[str] = "telephony"

    host: str = setting("0.0.0.0", "address the SIP, HTTP and AudioSocket servers bind")
    port: int = setting(
        TELEPHONY_PORTS.http,
        "HTTP port: Twilio's TwiML webhook, its Media Streams WebSocket and /healthz (0 picks one)",
    )
    metrics_port: int = setting(TELEPHONY_PORTS.metrics, "Prometheus /metrics port (0 disables)")
    max_sessions: int = setting(
        32, "phone calls at once before new ones are refused (0 = no limit)"
    )
    sip_port: int = setting(TELEPHONY_PORTS.sip, "SIP port, UDP (0 picks one; -1 = no SIP)")
    sip_advertised_ip: str = setting(
        "",
        "IP address put in SDP and Contact for RTP and SIP to come back to "
        "(empty = host, or 127.0.0.1 when host is 0.0.0.0)",
    )
    rtp_port_first: int = setting(TELEPHONY_PORTS.rtp_first, "first UDP port for RTP of SIP calls")
    rtp_port_last: int = setting(TELEPHONY_PORTS.rtp_last, "last UDP port for RTP of SIP calls")
    sip_codecs: str = setting(
        ",".join(SIP_CODECS), "comma-separated G.711 codecs offered, in order (PCMU, PCMA)"
    )
    audiosocket_port: int = setting(
        TELEPHONY_PORTS.audiosocket, "Asterisk AudioSocket TCP port (0 picks one; -1 = off)"
    )
    allowed_networks: str = setting(
        "127.0.0.0/8,::1/128",
        "comma-separated networks (CIDR) SIP and AudioSocket calls may come from: a trunk's "
        "or a PBX's addresses",
    )
    twilio_auth_token: str = setting(
        "",
        "Twilio auth token that signs the webhook and the stream "
        "(empty = Twilio calls are refused)",
    )
    public_url: str = setting(
        "",
        "https://host[:port] Twilio reaches this service at (signatures are computed on it; "
        "empty = the URL the request names)",
    )
    mode: str = setting("tandem", "conversation mode of phone calls", choices=MODES)
    playout_prebuffer_ms: int = setting(
        100,
        "agent audio held before playout starts, to ride out the gateway's 80 ms frames "
        "and jitter (20 ms steps)",
    )
    playout_max_ms: int = setting(
        1000, "agent audio queued for playout beyond which the oldest is dropped"
    )
    rtp_timeout_s: float = setting(
        30.0,
        "SIP: hang up (BYE) a call whose phone has sent no RTP for this long, unless it "
        "holds the call (0 = never)",
    )
    sip_session_expires_s: int = setting(
        1800,
        "SIP session timers (RFC 4028): the interval offered when the INVITE names none; "
        "a call not refreshed within it is ended with BYE (0 = no session timers)",
    )
    sip_min_se_s: int = setting(
        90, "SIP session timers: the shortest Session-Expires taken (shorter: 422)"
    )
    dtmf_rate_per_s: float = setting(
        10.0, "keys a call may press per second, sustained; more are dropped (0 = no limit)"
    )
    dtmf_burst: int = setting(20, "keys a call may press at once before dtmf_rate_per_s applies")
    call_control: str = setting(
        "",
        "comma-separated call control the agent may use: hang_up, transfer, send_dtmf "
        "(empty = none)",
    )
    transfer_targets: str = setting(
        "",
        "comma-separated NAME=URI (or URI) the agent may transfer a call to, e.g. "
        "sales=sip:sales@pbx.example.net (empty = no transfers)",
    )
    dtmf_send_allowed: str = setting(
        DEFAULT_DTMF_SEND_ALLOWED,
        "regular expression the keys of one send_dtmf must match whole (0-9, *, #, A-D; "
        "alternatives with |, e.g. [0-9]|\\*9); the default allows digits only: * and # "
        "reach a PBX's features (transfers, outside lines)",
    )
    dtmf_send_max_keys: int = setting(
        32, "keys the agent may press in one call, all its send_dtmf together (0 = none)"
    )

    @classmethod
    def loopback_sip(cls, gateway_address: str) -> TelephonySettings:
        """A SIP service on 127.0.0.1 for phones on this machine (baresip, SIPp: a
        test's or a bench's), in front of the gateway at `gateway_address`: SIP
        and HTTP on ports the system picks, no metrics port, no AudioSocket."""
        return cls(
            host="127.0.0.1",
            port=0,
            metrics_port=0,
            sip_port=0,
            audiosocket_port=-1,
            gateway_address=gateway_address,
        )

    @property
    def networks(self) -> list[Network]:
        return [
            ipaddress.ip_network(entry, strict=False) for entry in entries(self.allowed_networks)
        ]

    @property
    def codec_choices(self) -> list[str]:
        return [entry.upper() for entry in entries(self.sip_codecs)]

    @property
    def call_control_actions(self) -> frozenset[str]:
        return frozenset(entry.lower() for entry in entries(self.call_control))

    @property
    def advertised_ip(self) -> str:
        if self.sip_advertised_ip:
            return self.sip_advertised_ip
        return "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host

    def caller_allowed(self, address: str) -> bool:
        """Whether a SIP or AudioSocket peer at `address` may call."""
        try:
            peer = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(peer in network for network in self.networks)

    def validate(self) -> None:
        super().validate()
        self.validate_gateway_client()
        check_secret("twilio_auth_token", self.twilio_auth_token)
        try:
            self.networks  # noqa: B018 (parsed for its errors)
        except ValueError as exc:
            raise ConfigError(f"allowed_networks: {exc}") from None
        unknown = [c for c in self.codec_choices if c not in SIP_CODECS]
        if unknown or not self.codec_choices:
            raise ConfigError(
                f"sip_codecs: {self.sip_codecs!r}: list one or more of {', '.join(SIP_CODECS)}"
            )
        if not 1024 <= self.rtp_port_first <= self.rtp_port_last <= 65535:
            raise ConfigError(
                "rtp_port_first, rtp_port_last: a range within 1024..65535, first <= last; got "
                f"{self.rtp_port_first}..{self.rtp_port_last}"
            )
        if self.playout_prebuffer_ms % 20 or not 0 <= self.playout_prebuffer_ms <= 1000:
            raise ConfigError(
                f"playout_prebuffer_ms: 0..1000 in steps of 20, got {self.playout_prebuffer_ms}"
            )
        if self.playout_max_ms < self.playout_prebuffer_ms + 80:
            raise ConfigError(
                f"playout_max_ms: at least playout_prebuffer_ms + 80, got {self.playout_max_ms}"
            )
        if self.rtp_timeout_s < 0 or self.sip_session_expires_s < 0 or self.dtmf_rate_per_s < 0:
            raise ConfigError("rtp_timeout_s, sip_session_expires_s, dtmf_rate_per_s: 0 or more")
        if self.sip_session_expires_s and not 0 < self.sip_min_se_s <= self.sip_session_expires_s:
            raise ConfigError(
                f"sip_min_se_s: 1..sip_session_expires_s ({self.sip_session_expires_s}), "
                f"got {self.sip_min_se_s}"
            )
        if self.dtmf_burst < 1:
            raise ConfigError(f"dtmf_burst: 1 or more, got {self.dtmf_burst}")
        if self.public_url and not self.public_url.startswith(("https://", "http://")):
            raise ConfigError(f"public_url: an http(s):// URL, got {self.public_url!r}")
        self._validate_call_control()

    def _validate_call_control(self) -> None:
        unknown = sorted(self.call_control_actions - set(CALL_CONTROL_ACTIONS))
        if unknown:
            allowed = ", ".join(CALL_CONTROL_ACTIONS)
            raise ConfigError(f"call_control: {', '.join(unknown)}: list some of {allowed}")
        targets = transfer_targets(self.transfer_targets)
        if "transfer" in self.call_control_actions and not targets:
            raise ConfigError("transfer_targets: call_control has transfer: list where to")
        try:
            re.compile(self.dtmf_send_allowed)
        except re.error as exc:
            raise ConfigError(
                f"dtmf_send_allowed: {self.dtmf_send_allowed!r} is not a regular expression ({exc})"
            ) from None
        if self.dtmf_send_max_keys < 0:
            raise ConfigError(f"dtmf_send_max_keys: 0 or more, got {self.dtmf_send_max_keys}")
