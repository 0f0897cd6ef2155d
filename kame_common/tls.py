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
that are IPs.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from kame_common.config import ConfigError

log = logging.getLogger(__name__)

# (path, modification time in ns, size) of every file of one configuration.
Stamp = tuple[tuple[str, int, int], ...]


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
        stamps.append((path, status.st_mtime_ns, status.st_size))
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
