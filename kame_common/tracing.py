"""OpenTelemetry setup: an OTLP exporter when an endpoint is configured, and
gRPC interceptors that carry the trace context in metadata across hops.

With no endpoint, a tracer provider is still installed (spans are created and
context propagates) but nothing is exported.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import grpc
from opentelemetry import trace
from opentelemetry.instrumentation.grpc import aio_client_interceptors, aio_server_interceptor
from opentelemetry.instrumentation.grpc.filters import service_prefix
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from kame_common.tls import ClientFiles, ClientTls

_configured = False

# Transcript text goes into spans only when the operator opts in: it is user data.
TRANSCRIPTS_IN_SPANS = os.environ.get("KAME_TRACE_TRANSCRIPTS", "").lower() in ("1", "true")


def setup_tracing(service_name: str, otlp_endpoint: str = "", ca_file: str = "") -> None:
    """Install the tracer provider once per process."""
    global _configured
    if _configured:
        return
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    if otlp_endpoint:
        provider.add_span_processor(BatchSpanProcessor(otlp_exporter(otlp_endpoint, ca_file)))
    trace.set_tracer_provider(provider)
    _configured = True


def otlp_exporter(endpoint: str, ca_file: str = "") -> SpanExporter:
    """OTLP/gRPC to `endpoint`: TLS when it is https:// or a CA file is given
    (that CA, else the system's roots; a replaced CA file is followed), plaintext
    otherwise (a collector beside the pod)."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    client = ClientTls(ca_file=ca_file, tls=endpoint.startswith("https://"), setting_prefix="otlp_")
    if not client.enabled:
        return OTLPSpanExporter(endpoint=endpoint, insecure=True)
    return ReloadingOtlpExporter(endpoint, ClientFiles(client))


class ReloadingOtlpExporter(SpanExporter):
    """An OTLP/gRPC exporter over TLS that follows its CA file: before each export
    it looks at the file (ClientFiles.renewed) and, when it was replaced, exports
    through a new exporter with the new CA and shuts the old one down. (The SDK's
    exporter keeps the credentials it was made with.) The batch processor exports
    from one thread at a time."""

    def __init__(self, endpoint: str, files: ClientFiles) -> None:
        self._endpoint = endpoint
        self._files = files
        self._exporter = self._make(files.credentials)

    def _make(self, credentials: grpc.ChannelCredentials) -> SpanExporter:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=self._endpoint, insecure=False, credentials=credentials)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        credentials = self._files.renewed()
        if credentials is not None:
            old, self._exporter = self._exporter, self._make(credentials)
            old.shutdown()
        return self._exporter.export(spans)

    def shutdown(self) -> None:
        self._exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._exporter.force_flush(timeout_millis)


def tracer(name: str) -> trace.Tracer:
    return trace.get_tracer(name)


# Only our own RPCs are traced. The interceptor also wraps streaming handlers
# that write with `context.write` (the health service's Watch) as if they were
# async generators, which breaks them; our servicers always `yield`.
_OUR_SERVICES = service_prefix("kame.v1.")


def server_interceptors() -> list[grpc.aio.ServerInterceptor]:
    interceptor: grpc.aio.ServerInterceptor = aio_server_interceptor(filter_=_OUR_SERVICES)  # type: ignore[no-untyped-call]
    return [interceptor]


def client_interceptors() -> list[grpc.aio.ClientInterceptor]:
    interceptors: list[grpc.aio.ClientInterceptor] = list(
        aio_client_interceptors(filter_=_OUR_SERVICES)  # type: ignore[no-untyped-call]
    )
    return interceptors
