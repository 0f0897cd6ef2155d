"""How an ingress service (web, telephony) reaches the gateway: the settings it
shares with `kame talk` (address, TLS, bearer token) and one channel to it."""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from kame_common import tracing
from kame_common.config import ConfigError, check_token, setting
from kame_common.grpc_options import ConnectionPolicy
from kame_common.ports import loopback_address
from kame_common.tls import ClientTls


@dataclass
class GatewayClientSettings:
    """Settings of a service that is a client of Gateway.Converse."""

    gateway_address: str = setting(loopback_address("gateway"), "host:port of the gateway")
    gateway_ca_file: str = setting(
        "", "PEM CA of the gateway's certificate (non-empty = TLS to the gateway)"
    )
    gateway_tls: bool = setting(False, "TLS to the gateway with the system's CAs")
    gateway_server_name: str = setting(
        "", "name the gateway's certificate carries when gateway_address is an IP or another name"
    )
    gateway_auth_token: str = setting(
        "",
        "bearer token sent to the gateway (empty = none; the web page may bring its own)",
    )

    def gateway_tls_settings(self) -> ClientTls:
        return ClientTls(
            ca_file=self.gateway_ca_file,
            tls=self.gateway_tls,
            server_name=self.gateway_server_name,
            setting_prefix="gateway_",
        )

    def validate_gateway_client(self) -> None:
        check_token("gateway_auth_token", self.gateway_auth_token)
        if self.gateway_server_name and not (self.gateway_ca_file or self.gateway_tls):
            raise ConfigError(
                "gateway_server_name: applies to TLS only: set gateway_ca_file or gateway_tls"
            )

    def check_gateway_ca(self) -> None:
        """At start: an unreadable CA file is a ConfigError naming the setting now, not
        a failure of the first call. (Not in validation: settings are also checked
        where the file is not, e.g. a container's paths.)"""
        tls = self.gateway_tls_settings()
        if tls.enabled:
            tls.credentials()

    def gateway_channel(self, policy: ConnectionPolicy) -> grpc.aio.Channel:
        """A channel to the gateway with traces, keepalive and the TLS settings; a
        TLS one follows its CA file when it is replaced (kame_common.tls.ReloadingChannel)."""
        return self.gateway_tls_settings().reloading_channel(
            self.gateway_address,
            interceptors=tracing.client_interceptors(),
            options=policy.channel_options(),
        )
