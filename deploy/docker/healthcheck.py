"""Container health check for the KAME images (Docker HEALTHCHECK, compose, `helm test`).

    python deploy/docker/healthcheck.py service
    python deploy/docker/healthcheck.py grpc --port 9113 [--host HOST] [--service NAME]
    python deploy/docker/healthcheck.py http --url http://127.0.0.1:8080/v1/models

`grpc` asks the standard grpc.health.v1 service that every KAME service
registers, the same check Kubernetes' native gRPC probes make, so a replica
that is draining (NOT_SERVING after SIGTERM) reports unhealthy here too.
`service` is that check for the service this container runs (KAME_SERVICE, set
by the image): on its plaintext health port KAME_<SVC>_HEALTH_PORT when that is
on, else on its gRPC port (KAME_<SVC>_PORT or the default of
kame_common/ports.py), which is plaintext only while TLS is off.
`http` is for the embedded LLM server, which speaks HTTP only; the web and
telephony services (KAME_SERVICE=web, telephony) answer `service` on GET
/healthz of their HTTP port.
Exit status 0 means healthy, 1 unhealthy (the message on stderr says why).
"""

from __future__ import annotations

import argparse
import os
import ssl
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping


def grpc_serving(address: str, service: str = "", timeout_s: float = 3.0) -> tuple[bool, str]:
    """(healthy, reason) from grpc.health.v1 Check on `address`."""
    import grpc  # imported here so the `http` mode works without grpcio
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.RpcError as exc:
            return False, f"{address}: {exc.code().name}: {exc.details()}"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return reply.status == health_pb2.HealthCheckResponse.SERVING, f"{address}: {status}"


def service_health_port(env: Mapping[str, str]) -> tuple[int, str]:
    """(port, "") where the container's own service answers health checks in plaintext, or
    (0, why not) when it cannot be asked."""
    from kame_common.ports import SERVICE_PORTS  # the image copies kame_common to /app

    service = env.get("KAME_SERVICE", "")
    if service not in SERVICE_PORTS:
        return 0, f"KAME_SERVICE={service!r}: expected one of {', '.join(SERVICE_PORTS)}"
    prefix = f"KAME_{service.upper()}_"
    health_port = int(env.get(f"{prefix}HEALTH_PORT") or 0)
    if health_port:
        return health_port, ""
    if env.get(f"{prefix}TLS_CERT_FILE"):
        return (
            0,
            f"{prefix}TLS_CERT_FILE is set and {prefix}HEALTH_PORT is 0: turn the health port on",
        )
    return int(env.get(f"{prefix}PORT") or SERVICE_PORTS[service].grpc), ""


def http_service_port(service: str) -> int | None:
    """The default HTTP port of a service that answers probes on GET /healthz (web,
    telephony), or None for a gRPC service."""
    from kame_common.ports import TELEPHONY_PORTS, WEB_PORTS

    return {"web": WEB_PORTS.http, "telephony": TELEPHONY_PORTS.http}.get(service)


def http_health_url(env: Mapping[str, str]) -> str:
    """The HTTP service's /healthz on this container (https when it serves TLS)."""
    service = env["KAME_SERVICE"]
    prefix = f"KAME_{service.upper()}_"
    port = int(env.get(f"{prefix}PORT") or http_service_port(service) or 0)
    scheme = "https" if env.get(f"{prefix}TLS_CERT_FILE") else "http"
    return f"{scheme}://127.0.0.1:{port}/healthz"


def http_ok(url: str, timeout_s: float = 3.0) -> tuple[bool, str]:
    """(healthy, reason) from a GET on `url` (any 2xx is healthy). The certificate of an
    https URL is not verified: it is this container's own, asked on 127.0.0.1."""
    context = ssl._create_unverified_context() if url.startswith("https:") else None
    try:
        with urllib.request.urlopen(url, timeout=timeout_s, context=context) as reply:
            return 200 <= reply.status < 300, f"{url}: HTTP {reply.status}"
    except (urllib.error.URLError, OSError) as exc:
        return False, f"{url}: {exc}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    modes = parser.add_subparsers(dest="mode", required=True)
    modes.add_parser("service", help="grpc.health.v1 of this container's KAME_SERVICE")
    grpc_mode = modes.add_parser("grpc", help="grpc.health.v1 Check")
    grpc_mode.add_argument("--host", default="127.0.0.1")
    grpc_mode.add_argument("--port", type=int, required=True)
    grpc_mode.add_argument("--service", default="", help="service name; empty = the server")
    grpc_mode.add_argument("--timeout", type=float, default=3.0)
    http_mode = modes.add_parser("http", help="HTTP GET, healthy on 2xx")
    http_mode.add_argument("--url", required=True)
    http_mode.add_argument("--timeout", type=float, default=3.0)
    args = parser.parse_args(argv)
    if args.mode == "service" and http_service_port(os.environ.get("KAME_SERVICE", "")):
        healthy, reason = http_ok(http_health_url(os.environ))
    elif args.mode == "service":
        port, reason = service_health_port(os.environ)
        healthy, reason = grpc_serving(f"127.0.0.1:{port}") if port else (False, reason)
    elif args.mode == "grpc":
        healthy, reason = grpc_serving(f"{args.host}:{args.port}", args.service, args.timeout)
    else:
        healthy, reason = http_ok(args.url, args.timeout)
    print(reason, file=sys.stderr)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
