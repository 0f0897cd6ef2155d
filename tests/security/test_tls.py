"""TLS and mTLS on real gRPC servers on loopback, with certificates made by the
test (tests/security/certs.py): a client without the CA fails and with it
succeeds; a renewed certificate is served without a restart; the gateway's
client certificate is accepted by an upstream and a stranger's refused; the
plaintext health port serves probes; OTLP goes over TLS to a collector; the
clients' channels (gateway to upstreams, telephony to the gateway, OTLP) follow
a rotated CA and client certificate without a restart, and the gateway retires
channels nobody asks for."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Sequence
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kame_cli.stack_options import free_ports
from kame_common import store
from kame_common.config import ConfigError, ServiceSettings
from kame_common.server import ServiceRuntime
from kame_common.tls import ClientTls, server_credentials
from kame_common.tracing import otlp_exporter
from kamepb import oracle_pb2, oracle_pb2_grpc
from services.gateway import connections
from services.gateway.config import GatewaySettings
from services.gateway.connections import Connections
from services.oracle.config import ApiKeys, OracleSettings
from services.oracle.server import serve as serve_oracle
from services.telephony.config import TelephonySettings
from tests.security.certs import CertificateAuthority
from tests.support import ECHO_SERVICE, echo_handler, wait_until

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@dataclass
class ProbeSettings(ServiceSettings):
    SERVICE: ClassVar[str] = "probe"


@pytest.fixture
async def probe():
    """start(**settings) -> a running runtime with the echo service (stopped at teardown)."""
    runtimes: list[ServiceRuntime] = []

    async def start(**overrides) -> ServiceRuntime:
        settings = ProbeSettings(**{"host": "127.0.0.1", "port": 0, "grace_s": 5, **overrides})
        settings.validate()
        runtime = ServiceRuntime(settings, [ECHO_SERVICE])
        await runtime.start(lambda s: s.add_generic_rpc_handlers([echo_handler(runtime)]))
        runtimes.append(runtime)
        return runtime

    yield start
    for runtime in runtimes:
        await runtime.stop()


async def health(channel: grpc.aio.Channel) -> int | str:
    """The health status, or the name of the status code the call failed with."""
    try:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=5
        )
    except grpc.aio.AioRpcError as exc:
        return exc.code().name
    return reply.status


async def health_via(address: str, client: ClientTls) -> int | str:
    async with client.channel(address) as channel:
        return await health(channel)


def tls_files(pki, folder: Path) -> dict[str, str]:
    """Copies of the server's certificate and key in `folder` (tests may overwrite them)."""
    cert, key = folder / "tls.crt", folder / "tls.key"
    shutil.copy(pki.server_cert, cert)
    shutil.copy(pki.server_key, key)
    return {"tls_cert_file": str(cert), "tls_key_file": str(key)}


def replace_file(path: Path, data: bytes) -> None:
    """Write like a Secret update does: a new file moved over the old one."""
    staged = path.with_suffix(".new")
    staged.write_bytes(data)
    os.replace(staged, path)


# Servers in the rotation tests send GOAWAY this soon, so clients reconnect (a new
# TLS handshake) within the test, as they do every 5 min with the default.
SHORT_CONNECTION_AGE_S = 0.3


def rotate_server(files: dict[str, str], ca: CertificateAuthority) -> None:
    """cert-manager renews the server's certificate with `ca`; the client CA file
    (mTLS), if any, becomes `ca` too."""
    renewed = ca.server()
    replace_file(Path(files["tls_cert_file"]), renewed.cert)
    replace_file(Path(files["tls_key_file"]), renewed.key)
    if "tls_client_ca_file" in files:
        replace_file(Path(files["tls_client_ca_file"]), ca.pem)


async def after_the_connections_age() -> None:
    """Long enough that the server has sent GOAWAY and the next call reconnects."""
    await asyncio.sleep(SHORT_CONNECTION_AGE_S * 3)


# -- TLS -----------------------------------------------------------------------------------------


async def test_a_client_without_the_ca_fails_and_with_it_succeeds(probe, pki, tmp_path):
    runtime = await probe(**tls_files(pki, tmp_path))
    assert runtime.transport == "TLS"
    assert await health_via(runtime.address, ClientTls()) == "UNAVAILABLE"  # plaintext
    assert await health_via(runtime.address, ClientTls(tls=True)) == "UNAVAILABLE"  # system CAs
    assert await health_via(runtime.address, ClientTls(ca_file=str(pki.other_ca_file))) == (
        "UNAVAILABLE"
    )
    assert await health_via(runtime.address, ClientTls(ca_file=str(pki.ca_file))) == SERVING


async def test_a_renewed_certificate_is_served_without_a_restart(probe, pki, tmp_path):
    files = tls_files(pki, tmp_path)
    runtime = await probe(**files)
    old_ca, new_ca = ClientTls(ca_file=str(pki.ca_file)), ClientTls(ca_file=str(pki.other_ca_file))
    assert await health_via(runtime.address, old_ca) == SERVING

    # Mid-rotation: a new certificate whose key has not arrived yet. The old pair stays.
    renewed = pki.other_ca.server()
    replace_file(Path(files["tls_cert_file"]), renewed.cert)
    assert await health_via(runtime.address, old_ca) == SERVING

    replace_file(Path(files["tls_key_file"]), renewed.key)
    assert await health_via(runtime.address, new_ca) == SERVING
    assert await health_via(runtime.address, old_ca) == "UNAVAILABLE"


async def test_unreadable_certificate_files_fail_the_start_naming_the_setting(probe, pki, tmp_path):
    with pytest.raises(ConfigError, match="tls_key_file"):
        await probe(tls_cert_file=str(pki.server_cert), tls_key_file=str(tmp_path / "absent.key"))
    with pytest.raises(ConfigError, match="do not load as a certificate and its key"):
        await probe(tls_cert_file=str(pki.server_cert), tls_key_file=str(pki.client_key))


# -- mTLS between the gateway and an upstream -----------------------------------------------------


@pytest.fixture
async def mtls_oracle(pki, tmp_path):
    """The real oracle service requiring client certificates signed by the test CA."""
    settings = OracleSettings(
        host="127.0.0.1",
        port=0,
        metrics_port=0,
        redis_url="",
        warmup_timeout_s=0.0,  # no LLM behind it: only the mTLS handshake is tested
        tls_client_ca_file=str(pki.ca_file),
        **tls_files(pki, tmp_path),
    )
    runtime = await serve_oracle(settings, api_keys=ApiKeys())
    yield runtime
    await runtime.stop()


def gateway_dialer(
    pki, cert: Path | None, key: Path | None, ca_file: Path | None = None
) -> Connections:
    """The gateway's own upstream channels, with its settings for `cert`/`key`."""
    settings = GatewaySettings(
        upstream_ca_file=str(ca_file or pki.ca_file),
        upstream_cert_file=str(cert or ""),
        upstream_key_file=str(key or ""),
        upstream_server_name="localhost",  # the certificate names it; the address is an IP
    )
    settings.validate()
    return Connections(settings, store.connect("redis://127.0.0.1:6379/14"))


async def guide_reaches_the_servicer(channel: grpc.aio.Channel) -> str:
    """Send a bad first message: the servicer's INVALID_ARGUMENT proves the call got in."""
    call = oracle_pb2_grpc.OracleStub(channel).Guide()
    try:
        await call.write(oracle_pb2.GuideRequest())
        await call.done_writing()
        await call.read()
    except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
        pass  # InvalidStateError: the call failed (handshake refused) before the write
    return (await call.code()).name


@pytest.mark.parametrize(
    "client, outcome",
    [
        ("gateway", "INVALID_ARGUMENT"),  # in: the servicer answered
        ("stranger", "UNAVAILABLE"),  # a client certificate from another CA
        ("none", "UNAVAILABLE"),  # TLS without a client certificate
    ],
)
async def test_mtls_admits_the_gateways_certificate_and_refuses_others(
    mtls_oracle, pki, client, outcome
):
    assert mtls_oracle.transport == "mTLS"
    cert, key = {
        "gateway": (pki.client_cert, pki.client_key),
        "stranger": (pki.stranger_cert, pki.stranger_key),
        "none": (None, None),
    }[client]
    upstreams = gateway_dialer(pki, cert, key)
    try:
        channel = upstreams.channel(f"127.0.0.1:{mtls_oracle.port}")
        assert await guide_reaches_the_servicer(channel) == outcome
    finally:
        await upstreams.close()
        await upstreams.store.client.aclose()


async def test_the_gateways_upstream_channels_follow_a_rotated_ca_and_client_certificate(
    pki, tmp_path
):
    """The CA is rotated: the oracle now serves a certificate of the new CA and
    requires client certificates of it, and the gateway's Secret holds the new CA
    and a new client certificate. The gateway's next call, once the oracle's
    connection age has made it reconnect, gets in without a restart (it used to
    keep the files read at start: UNAVAILABLE from then on)."""
    (tmp_path / "oracle").mkdir()
    (tmp_path / "gateway").mkdir()
    server_files = tls_files(pki, tmp_path / "oracle")
    server_files["tls_client_ca_file"] = str(pki.ca.write(tmp_path / "oracle", "client-ca"))
    oracle = await serve_oracle(
        OracleSettings(
            host="127.0.0.1",
            port=0,
            metrics_port=0,
            redis_url="",
            warmup_timeout_s=0.0,
            max_connection_age_s=SHORT_CONNECTION_AGE_S,
            **server_files,
        ),
        api_keys=ApiKeys(),
    )
    ca_file = pki.ca.write(tmp_path / "gateway", "ca")
    cert, key = pki.ca.client().write(tmp_path / "gateway", "client")
    upstreams = gateway_dialer(pki, cert, key, ca_file=ca_file)
    address = f"127.0.0.1:{oracle.port}"
    try:
        assert await guide_reaches_the_servicer(upstreams.channel(address)) == "INVALID_ARGUMENT"

        new_ca = CertificateAuthority("rotated CA")
        rotate_server(server_files, new_ca)
        replace_file(ca_file, new_ca.pem)
        renewed = new_ca.client()
        replace_file(cert, renewed.cert)
        replace_file(key, renewed.key)
        await after_the_connections_age()

        assert await guide_reaches_the_servicer(upstreams.channel(address)) == "INVALID_ARGUMENT"
    finally:
        await upstreams.close()
        await upstreams.store.client.aclose()
        await oracle.stop()


async def test_a_half_rotated_client_pair_keeps_the_current_channel(probe, pki, tmp_path):
    """A new client certificate whose key has not arrived yet is not used: calls
    go on over the current channel until the pair matches."""
    (tmp_path / "server").mkdir()
    runtime = await probe(**tls_files(pki, tmp_path / "server"))
    cert, key = pki.ca.client().write(tmp_path, "client")
    client = ClientTls(
        ca_file=str(pki.ca_file), cert_file=str(cert), key_file=str(key), server_name="localhost"
    )
    async with client.reloading_channel(runtime.address) as channel:
        replace_file(cert, pki.ca.client().cert)  # its key is still the old one's
        assert await health(channel) == SERVING
        assert channel.retired == 0


async def test_the_telephony_channel_to_the_gateway_follows_a_rotated_ca(probe, pki, tmp_path):
    """Telephony keeps one channel to the gateway for its lifetime. After a CA
    rotation its next call gets through; a call open across the rotation runs to
    its end on the old channel, which then closes."""
    (tmp_path / "gateway").mkdir()
    server_files = tls_files(pki, tmp_path / "gateway")
    gateway = await probe(max_connection_age_s=SHORT_CONNECTION_AGE_S, **server_files)
    ca_file = pki.ca.write(tmp_path, "gateway-ca")
    settings = TelephonySettings(
        gateway_address=gateway.address,
        gateway_ca_file=str(ca_file),
        gateway_server_name="localhost",
    )
    settings.validate()
    channel = settings.gateway_channel(settings.connection_policy())
    try:
        assert await health(channel) == SERVING
        held = channel.stream_stream(f"/{ECHO_SERVICE}/Chat")()
        await held.write(b"before")
        assert await held.read() == b"before"

        new_ca = CertificateAuthority("rotated CA")
        rotate_server(server_files, new_ca)
        replace_file(ca_file, new_ca.pem)
        await after_the_connections_age()

        assert await health(channel) == SERVING
        await held.write(b"across the rotation")
        assert await held.read() == b"across the rotation"
        assert channel.retired == 1  # the old channel waits for `held`
        await held.done_writing()
        assert await held.code() == grpc.StatusCode.OK
        await wait_until(lambda: channel.retired == 0, "the old channel to close")
    finally:
        await channel.close()


async def test_the_gateway_retires_channels_nobody_asks_for(probe, monkeypatch):
    """A frontend replica that left the registry: its channel is retired once
    unused for CHANNEL_IDLE_S. A call still open on it runs to its end; the next
    session that picks that address gets a new channel. (Channels used to be kept
    for the gateway's lifetime, one more per address ever dialled.)"""
    monkeypatch.setattr(connections, "CHANNEL_IDLE_S", 0.2)
    departed, staying = await probe(), await probe()
    upstreams = Connections(GatewaySettings(), store.connect("redis://127.0.0.1:6379/14"))
    try:
        old = upstreams.channel(departed.address)
        held = old.stream_stream(f"/{ECHO_SERVICE}/Chat")()
        await held.write(b"a long session")
        assert await held.read() == b"a long session"
        await asyncio.sleep(0.3)

        upstreams.channel(staying.address)  # any session set-up looks for unused channels
        assert len(upstreams.channels) == 1
        assert len(upstreams.channels.retired) == 1
        await held.write(b"still here")
        assert await held.read() == b"still here"  # the session is not cut
        await held.done_writing()
        assert await held.code() == grpc.StatusCode.OK
        await wait_until(lambda: len(upstreams.channels.retired) == 0, "the channel to close")

        again = upstreams.channel(departed.address)
        assert again is not old
        assert await health(again) == SERVING
    finally:
        await upstreams.close()
        await upstreams.store.client.aclose()


async def test_the_gateway_keeps_at_most_max_channels(monkeypatch):
    monkeypatch.setattr(connections, "MAX_CHANNELS", 2)
    upstreams = Connections(GatewaySettings(), store.connect("redis://127.0.0.1:6379/14"))
    try:
        first = upstreams.channel("127.0.0.1:1")
        for port in range(2, 5):
            upstreams.channel(f"127.0.0.1:{port}")
        assert len(upstreams.channels) == 2
        assert upstreams.channel("127.0.0.1:1") is not first  # the least recently asked went
    finally:
        await upstreams.close()
        await upstreams.store.client.aclose()


# -- the plaintext health port --------------------------------------------------------------------


async def test_the_health_port_serves_probes_in_plaintext_and_follows_the_drain(
    probe, pki, tmp_path
):
    health_port = free_ports(1)[0]
    runtime = await probe(health_port=health_port, **tls_files(pki, tmp_path))
    assert runtime.health_port == health_port
    probe_address = f"127.0.0.1:{health_port}"
    assert await health_via(probe_address, ClientTls()) == SERVING

    async with ClientTls(ca_file=str(pki.ca_file)).channel(runtime.address) as channel:
        # Only health is on the probe port.
        async with grpc.aio.insecure_channel(probe_address) as plain:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                chat = plain.stream_stream(f"/{ECHO_SERVICE}/Chat")()
                await chat.write(b"x")
                await chat.read()
            assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
        chat = channel.stream_stream(f"/{ECHO_SERVICE}/Chat")()
        await chat.write(b"held")
        assert await chat.read() == b"held"
        drain = asyncio.create_task(runtime.drain())
        await asyncio.sleep(0.2)
        assert await health_via(probe_address, ClientTls()) == NOT_SERVING
        await chat.done_writing()
        await asyncio.wait_for(drain, 10)
    assert await health_via(probe_address, ClientTls()) == "UNAVAILABLE"  # closed with the server


# -- OTLP ------------------------------------------------------------------------------------------


class _Collector(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.spans: list[str] = []

    def Export(self, request, context):  # noqa: N802 (gRPC method name)
        for resource_spans in request.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                self.spans += [span.name for span in scope_spans.spans]
        return trace_service_pb2.ExportTraceServiceResponse()


@pytest.fixture
def tls_collector(pki):
    """An OTLP/gRPC trace collector serving TLS with the test CA's certificate."""
    collector = _Collector()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(collector, server)
    credentials = grpc.ssl_server_credentials(
        [(pki.server_key.read_bytes(), pki.server_cert.read_bytes())]
    )
    port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    yield collector, port
    server.stop(0)


def finished_span(name: str = "over-tls") -> Sequence:
    recorder = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "tls-test"}))
    provider.add_span_processor(SimpleSpanProcessor(recorder))
    with provider.get_tracer("test").start_as_current_span(name):
        pass
    return recorder.get_finished_spans()


def export_one_span(exporter) -> SpanExportResult:
    try:
        return exporter.export(finished_span())
    finally:
        exporter.shutdown()


def test_otlp_export_uses_tls_with_the_ca(tls_collector, pki, monkeypatch):
    collector, port = tls_collector
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "2")  # a refusal fails fast
    secure = otlp_exporter(f"https://127.0.0.1:{port}", ca_file=str(pki.ca_file))
    assert export_one_span(secure) == SpanExportResult.SUCCESS
    assert collector.spans == ["over-tls"]

    plaintext = otlp_exporter(f"http://127.0.0.1:{port}")
    assert export_one_span(plaintext) == SpanExportResult.FAILURE
    assert collector.spans == ["over-tls"]


@pytest.fixture
def rotating_collector(pki, tmp_path):
    """An OTLP collector whose certificate files can be rotated (it re-reads them),
    with a short connection age so exporters reconnect within the test."""
    collector = _Collector()
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=2),
        options=[("grpc.max_connection_age_ms", int(SHORT_CONNECTION_AGE_S * 1000))],
    )
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(collector, server)
    files = tls_files(pki, tmp_path)
    port = server.add_secure_port(
        "127.0.0.1:0", server_credentials(files["tls_cert_file"], files["tls_key_file"])
    )
    server.start()
    yield collector, port, files
    server.stop(0)


async def test_otlp_export_follows_a_rotated_ca(rotating_collector, pki, tmp_path, monkeypatch):
    """The collector's certificate is renewed by a new CA and the CA file replaced:
    spans still arrive, without a restart (the exporter used to keep the CA it
    read at start and fail every export from then on)."""
    collector, port, server_files = rotating_collector
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "2")
    ca_file = pki.ca.write(tmp_path, "otlp-ca")
    exporter = otlp_exporter(f"https://127.0.0.1:{port}", ca_file=str(ca_file))
    try:
        assert exporter.export(finished_span("before")) == SpanExportResult.SUCCESS
        new_ca = CertificateAuthority("rotated CA")
        rotate_server(server_files, new_ca)
        replace_file(ca_file, new_ca.pem)
        await after_the_connections_age()
        assert exporter.export(finished_span("after")) == SpanExportResult.SUCCESS
    finally:
        exporter.shutdown()
    assert collector.spans == ["before", "after"]
