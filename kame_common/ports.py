"""Default ports of every process of the stack: the one place they are written.

The services' settings and `kame up` read them from here; docker-compose.yml
and the Helm chart cannot import Python, so a test checks that they agree.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServicePorts:
    grpc: int
    metrics: int
    # Plaintext gRPC health only, for probes that cannot speak TLS (Kubernetes'
    # native gRPC probe). Deployments turn it on; a process started by hand has it off.
    health: int


SERVICE_PORTS = {
    "gateway": ServicePorts(grpc=50051, metrics=9101, health=9111),
    "frontend": ServicePorts(grpc=50052, metrics=9102, health=9112),
    "stt": ServicePorts(grpc=50053, metrics=9103, health=9113),
    "oracle": ServicePorts(grpc=50054, metrics=9104, health=9114),
}


@dataclass(frozen=True)
class HttpPorts:
    http: int
    metrics: int


# The browser's way in: an HTTP server (the page, its WebSocket bridge and a
# /healthz for probes), no gRPC port of its own.
WEB_PORTS = HttpPorts(http=8088, metrics=9105)


@dataclass(frozen=True)
class TelephonyPorts:
    sip: int  # SIP over UDP (and TCP), the standard port
    http: int  # Twilio Media Streams: the TwiML webhook and its WebSocket, /healthz
    audiosocket: int  # Asterisk AudioSocket over TCP
    metrics: int
    rtp_first: int  # RTP ports of SIP calls: one per call from this range
    rtp_last: int


# The phones' way in: no gRPC port of its own either.
TELEPHONY_PORTS = TelephonyPorts(
    sip=5060, http=8089, audiosocket=9092, metrics=9106, rtp_first=40000, rtp_last=40999
)
LLM_PORT = 8080  # the embedded OpenAI-compatible LLM server
REDIS_PORT = 6379


def loopback_address(service: str) -> str:
    """host:port of `service` on this machine, at its default port."""
    return f"127.0.0.1:{SERVICE_PORTS[service].grpc}"


LOCAL_REDIS_URL = f"redis://127.0.0.1:{REDIS_PORT}/0"
LOCAL_LLM_URL = f"http://127.0.0.1:{LLM_PORT}/v1"
