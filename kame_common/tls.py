"""TLS for the services' gRPC ports and for the channels between them.

Server side: `server_credentials` serves a certificate that is re-read when
its files change (cert-manager renewals, a rotated Kubernetes Secret), with no
restart. gRPC asks a fetcher for news at every TLS handshake, on one of its
own threads; the fetcher compares the files' modification stamps and hands
gRPC a new configuration only when they changed and the new certificate and
key load together. A half-written or mismatched pair keeps the previous one
serving (and is tried again at the next handshake). With a client CA the port
requires client certificates signed by it (mTLS); the CA file is re-read too.

Client side: `ClientTls` makes the channels: plaintext when it has no CA and
no `tls` flag, TLS otherwise (the CA file, or the system's roots), with a
client certificate for mTLS and an optional TLS name override for addresses
that are IPs. A long-lived channel is a `ReloadingChannel`: before every new
call it compares the files' stamps (a few stat calls) and, when they changed
and load together, starts a new channel with them; the old one takes no new
calls and closes when its calls end. Without that, a channel keeps the client
certificate it read at start, and once cert-manager has renewed it and the old
one expired, every reconnection (a server's max_connection_age, a new pod) is
refused.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from kame_common.config import ConfigError

log = logging.getLogger(__name__)

# (path, modification time in ns, size, inode) of every file of one configuration.
Stamp = tuple[tuple[str, int, int, int], ...]

# How long a channel replaced by newer certificates lets its calls run before it
# closes anyway: longer than any session (a gateway's max_session_s is 1 h).
RETIRED_CHANNEL_GRACE_S = 6 * 3600.0


def read_pem(path: str, setting_name: str) -> bytes:
    """The bytes of a PEM file; ConfigError naming the setting if it cannot be read."""
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{setting_name}: cannot read {path}: {exc.strerror}") from None


def _stamp(paths: Sequence[str]) -> Stamp:
    stamps = []
    for path in paths:
        status = os.stat(path)
        # The inode too: a Secret update swaps in new files, which may keep size and mtime.
        stamps.append((path, status.st_mtime_ns, status.st_size, status.st_ino))
    return tuple(stamps)


def _check_pair(cert_file: str, key_file: str) -> None:
    """Raise ssl.SSLError unless the certificate and key load and belong together."""
    ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert_file, key_file)


class ReloadingCertificate:
    """The server certificate configuration behind `server_credentials`."""

    def __init__(self, cert_file: str, key_file: str, client_ca_file: str = "") -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.client_ca_file = client_ca_file
        self.reloads = 0  # configurations handed to gRPC after the first
        self._lock = threading.Lock()  # gRPC may call the fetcher from several threads
        self._refused: Stamp | None = None
        self.initial = self._load()  # an unreadable file: ConfigError naming its setting
        self._stamp = _stamp(self._files)
        try:
            _check_pair(cert_file, key_file)
        except ssl.SSLError as exc:
            raise ConfigError(
                f"tls_cert_file, tls_key_file: {cert_file} and {key_file} do not load "
                f"as a certificate and its key: {exc}"
            ) from None

    @property
    def _files(self) -> list[str]:
        return [f for f in (self.cert_file, self.key_file, self.client_ca_file) if f]

    def _load(self) -> grpc.ServerCertificateConfiguration:
        cert = read_pem(self.cert_file, "tls_cert_file")
        key = read_pem(self.key_file, "tls_key_file")
        client_ca = (
            read_pem(self.client_ca_file, "tls_client_ca_file") if self.client_ca_file else None
        )
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=client_ca)

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """gRPC's fetcher: a new configuration if the files changed, else None (keep)."""
        with self._lock:
            stamp: Stamp | None = None
            try:
                stamp = _stamp(self._files)
                if stamp == self._stamp:
                    return None
                _check_pair(self.cert_file, self.key_file)
                config = self._load()
                if _stamp(self._files) != stamp:
                    return None  # changed while being read: take it at the next handshake
            except (OSError, ssl.SSLError, ConfigError) as exc:
                # Mid-rotation (a file briefly absent, a new cert before its key): keep serving.
                if stamp != self._refused:
                    log.warning("new TLS files do not load (%s); keeping the current ones", exc)
                    self._refused = stamp
                return None
            self._stamp = stamp
            self.reloads += 1
            log.info("TLS certificate reloaded from %s", self.cert_file)
            return config


def server_credentials(
    cert_file: str, key_file: str, client_ca_file: str = ""
) -> grpc.ServerCredentials:
    """TLS server credentials re-read when their files change; mTLS with a client CA."""
    certificate = ReloadingCertificate(cert_file, key_file, client_ca_file)
    return grpc.dynamic_ssl_server_credentials(
        certificate.initial,
        # grpc takes None from the fetcher as "keep the current certificate".
        certificate.fetch,  # type: ignore[arg-type]
        require_client_authentication=bool(client_ca_file),
    )


@dataclass(frozen=True)
class ClientTls:
    """How a client reaches a gRPC server: plaintext, TLS, or mTLS.

    `ca_file` (or `tls` for the system's roots) turns TLS on; `cert_file` and
    `key_file` add a client certificate (mTLS); `server_name` is the name the
    server's certificate must carry when the address does not (an IP)."""

    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    server_name: str = ""
    tls: bool = False
    setting_prefix: str = ""  # names the settings in errors, e.g. "upstream_"

    @property
    def enabled(self) -> bool:
        return self.tls or bool(self.ca_file)

    @property
    def files(self) -> list[str]:
        return [f for f in (self.ca_file, self.cert_file, self.key_file) if f]

    def credentials(self) -> grpc.ChannelCredentials:
        prefix = self.setting_prefix
        if bool(self.cert_file) != bool(self.key_file):
            raise ConfigError(f"{prefix}cert_file, {prefix}key_file: set both or neither")
        return grpc.ssl_channel_credentials(
            root_certificates=read_pem(self.ca_file, f"{prefix}ca_file") if self.ca_file else None,
            private_key=read_pem(self.key_file, f"{prefix}key_file") if self.key_file else None,
            certificate_chain=(
                read_pem(self.cert_file, f"{prefix}cert_file") if self.cert_file else None
            ),
        )

    def channel(
        self,
        address: str,
        interceptors: Sequence[grpc.aio.ClientInterceptor] | None = None,
        options: Sequence[tuple[str, str | int]] = (),
    ) -> grpc.aio.Channel:
        """An aio channel to `address` (plaintext unless TLS is on)."""
        if not self.enabled:
            return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)
        if self.server_name:
            options = [*options, ("grpc.ssl_target_name_override", self.server_name)]
        return grpc.aio.secure_channel(
            address, self.credentials(), options=options, interceptors=interceptors
        )

    def reloading_channel(
        self,
        address: str,
        interceptors: Sequence[grpc.aio.ClientInterceptor] | None = None,
        options: Sequence[tuple[str, str | int]] = (),
    ) -> grpc.aio.Channel:
        """Like `channel`, for a channel that lives longer than a certificate:
        rebuilt when the TLS files change (ReloadingChannel)."""
        if not self.enabled:
            return self.channel(address, interceptors, options)
        return ReloadingChannel(self, address, interceptors, options)


class ClientFiles:
    """A ClientTls's files as last loaded, and their credentials. `renewed` says
    when the files have changed and the new ones load together."""

    def __init__(self, tls: ClientTls) -> None:
        self.tls = tls
        self._refused: Stamp | None = None
        self.credentials = tls.credentials()  # an unreadable file: ConfigError naming it
        self._stamp = _stamp(tls.files)

    def _check(self) -> None:
        """Raise unless the CA parses and the certificate and key belong together."""
        if self.tls.ca_file:
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(self.tls.ca_file)
        if self.tls.cert_file:
            _check_pair(self.tls.cert_file, self.tls.key_file)

    def renewed(self) -> grpc.ChannelCredentials | None:
        """New credentials if the files changed since they were last loaded, else None.
        Files that do not load (mid-rotation: a new certificate before its key) are
        skipped until they change again; the current credentials stay."""
        stamp: Stamp | None = None
        try:
            stamp = _stamp(self.tls.files)
            if stamp in (self._stamp, self._refused):
                return None
            self._check()
            credentials = self.tls.credentials()
            if _stamp(self.tls.files) != stamp:
                return None  # changed while being read: take them at the next look
        except (OSError, ssl.SSLError, ConfigError) as exc:
            if stamp != self._refused:
                log.warning("new client TLS files do not load (%s); keeping the current ones", exc)
                self._refused = stamp
            return None
        self._stamp = stamp
        self.credentials = credentials
        log.info("client TLS files reloaded: %s", ", ".join(self.tls.files))
        return credentials


class RetiredChannels:
    """Channels that take no new calls and close once their calls have ended (or
    after RETIRED_CHANNEL_GRACE_S): a replaced or evicted channel's sessions run
    to their end."""

    def __init__(self) -> None:
        self._closing: dict[asyncio.Task[None], grpc.aio.Channel] = {}

    def __len__(self) -> int:
        return len(self._closing)

    def retire(self, channel: grpc.aio.Channel) -> None:
        # grpc's close(grace) refuses new calls at once and waits for the open ones.
        task = asyncio.get_running_loop().create_task(channel.close(RETIRED_CHANNEL_GRACE_S))
        self._closing[task] = channel
        task.add_done_callback(self._closing.pop)

    async def close(self, grace: float | None = None) -> None:
        """Close every retired channel now (their calls get `grace` seconds)."""
        closing = list(self._closing.items())
        for task, _ in closing:
            task.cancel()
        await asyncio.gather(*(task for task, _ in closing), return_exceptions=True)
        await asyncio.gather(*(channel.close(grace) for _, channel in closing))


class ReloadingChannel(grpc.aio.Channel):
    """A TLS channel to one address that follows its certificate files. Every new
    call (a stub's method) first looks at the files (ClientFiles.renewed); when
    they changed, the call goes to a new channel built with them, and the old
    channel is retired (RetiredChannels): its open calls run to their end."""

    def __init__(
        self,
        tls: ClientTls,
        address: str,
        interceptors: Sequence[grpc.aio.ClientInterceptor] | None = None,
        options: Sequence[tuple[str, str | int]] = (),
    ) -> None:
        self._files = ClientFiles(tls)
        self._address = address
        self._interceptors = interceptors
        self._options = list(options)
        if tls.server_name:
            self._options.append(("grpc.ssl_target_name_override", tls.server_name))
        self._current = self._build(self._files.credentials)
        self._retired = RetiredChannels()

    def _build(self, credentials: grpc.ChannelCredentials) -> grpc.aio.Channel:
        return grpc.aio.secure_channel(
            self._address, credentials, options=self._options, interceptors=self._interceptors
        )

    @property
    def retired(self) -> int:
        """Replaced channels still closing (calls of theirs still open)."""
        return len(self._retired)

    def _latest(self) -> grpc.aio.Channel:
        credentials = self._files.renewed()
        if credentials is not None:
            self._retired.retire(self._current)
            self._current = self._build(credentials)
        return self._current

    async def __aenter__(self) -> ReloadingChannel:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self, grace: float | None = None) -> None:
        await self._retired.close(grace)
        await self._current.close(grace)

    def get_state(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity:
        return self._current.get_state(try_to_connect)

    async def wait_for_state_change(self, last_observed_state: grpc.ChannelConnectivity) -> None:
        await self._current.wait_for_state_change(last_observed_state)

    async def channel_ready(self) -> None:
        await self._latest().channel_ready()

    # The multi-callables take gRPC's arguments as they are (they vary by version).
    def unary_unary(self, *args: Any, **kwargs: Any) -> grpc.aio.UnaryUnaryMultiCallable[Any, Any]:
        return self._latest().unary_unary(*args, **kwargs)

    def unary_stream(
        self, *args: Any, **kwargs: Any
    ) -> grpc.aio.UnaryStreamMultiCallable[Any, Any]:
        return self._latest().unary_stream(*args, **kwargs)

    def stream_unary(
        self, *args: Any, **kwargs: Any
    ) -> grpc.aio.StreamUnaryMultiCallable[Any, Any]:
        return self._latest().stream_unary(*args, **kwargs)

    def stream_stream(
        self, *args: Any, **kwargs: Any
    ) -> grpc.aio.StreamStreamMultiCallable[Any, Any]:
        return self._latest().stream_stream(*args, **kwargs)
