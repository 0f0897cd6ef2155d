"""The gRPC connection options every server and every channel of the stack shares.

Keepalive, both sides: a connection pings its peer every `keepalive_time_s`
and closes when a ping goes unanswered for `keepalive_timeout_s`, failing its
calls. So a caller that vanished behind a NAT, or an upstream pod that went
away without a FIN, ends its sessions (and frees their slots) within about
time + timeout, instead of holding them until TCP gives up (minutes to hours).
Pings are allowed on connections without calls, and a server accepts pings up
to twice as often as it sends its own (more often is a ping flood: gRPC
answers it with GOAWAY).

Connection age, servers: a connection older than `max_connection_age_s` gets
GOAWAY; its open calls go on (for up to `max_connection_age_grace_s`, 0 = to
their end) and the client opens a new connection for new calls, re-resolving
the server's name. Behind a headless Kubernetes Service that is how a gateway
learns about new stt and oracle pods.

Load balancing, channels: `round_robin` over every address the target
resolves to (a headless Service's pod IPs, `dns:///stt:50053`; or a list,
`ipv4:10.0.0.1:50053,10.0.0.2:50053`), so one gateway spreads its sessions
over every replica instead of pinning the first.

Reconnecting, channels: gRPC's own defaults wait 1 s after a failed connection
attempt and then 1.6 times longer each time, up to 2 minutes. A stt or oracle
pod restarted in 5 s was then dialled again only 4-6 s later, and the session's
own reopening backoff came on top of that: the question a kill hit was lost.
Upstreams here are next door, so a channel tries again after
`reconnect_backoff_s`, doubling up to `reconnect_backoff_max_s`.
"""

from __future__ import annotations

from dataclasses import dataclass

# What gRPC takes as "no limit" for a duration in milliseconds (INT_MAX).
_FOREVER_MS = 2**31 - 1

Options = list[tuple[str, int | str]]


def _ms(seconds: float) -> int:
    return min(_FOREVER_MS, max(1, round(seconds * 1000)))


@dataclass(frozen=True)
class ConnectionPolicy:
    """The settings behind the options (ServiceSettings.connection_policy())."""

    keepalive_time_s: float = 20.0
    keepalive_timeout_s: float = 10.0
    max_connection_age_s: float = 300.0  # 0: no limit
    max_connection_age_grace_s: float = 0.0  # 0: open calls run to their end
    reconnect_backoff_s: float = 0.25  # a channel's first wait after a failed connect
    reconnect_backoff_max_s: float = 2.0  # its longest wait between connect attempts

    def _keepalive(self) -> Options:
        if self.keepalive_time_s <= 0:
            return []
        return [
            ("grpc.keepalive_time_ms", _ms(self.keepalive_time_s)),
            ("grpc.keepalive_timeout_ms", _ms(self.keepalive_timeout_s)),
            # This gRPC core times an unanswered ping (keepalive's included) with
            # the ping timeout (default 1 min); keepalive_timeout_ms alone is not
            # enforced.
            ("grpc.http2.ping_timeout_ms", _ms(self.keepalive_timeout_s)),
            ("grpc.keepalive_permit_without_calls", 1),
        ]

    def server_options(self) -> Options:
        options = self._keepalive()
        if self.keepalive_time_s > 0:
            options += [
                ("grpc.http2.min_ping_interval_without_data_ms", _ms(self.keepalive_time_s / 2)),
            ]
        if self.max_connection_age_s > 0:
            grace = self.max_connection_age_grace_s
            options += [
                ("grpc.max_connection_age_ms", _ms(self.max_connection_age_s)),
                ("grpc.max_connection_age_grace_ms", _ms(grace) if grace > 0 else _FOREVER_MS),
            ]
        return options

    def channel_options(self) -> Options:
        options = self._keepalive()
        if self.keepalive_time_s > 0:
            # By default a client sends at most 2 pings without data in between:
            # an idle channel would stop probing its connection.
            options.append(("grpc.http2.max_pings_without_data", 0))
        options.append(("grpc.lb_policy_name", "round_robin"))
        # Not grpc.min_reconnect_backoff_ms: gRPC takes it as the connect timeout
        # too (default 20 s), and a peer slow to finish its handshake would fail.
        options += [
            ("grpc.initial_reconnect_backoff_ms", _ms(self.reconnect_backoff_s)),
            ("grpc.max_reconnect_backoff_ms", _ms(self.reconnect_backoff_max_s)),
        ]
        # Its own subchannels: one shared with an earlier channel to the same address
        # (a replica restarted on its port, or a new one that got the port) may still
        # be in reconnect backoff, and would fail the new channel's first calls at once.
        options.append(("grpc.use_local_subchannel_pool", 1))
        return options
