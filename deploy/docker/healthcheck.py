"""Container health check for the KAME images (Docker HEALTHCHECK and compose).

    python deploy/docker/healthcheck.py grpc --port 50053 [--service NAME]
    python deploy/docker/healthcheck.py http --url http://127.0.0.1:8080/v1/models

`grpc` asks the standard grpc.health.v1 service that every KAME service
registers, the same check Kubernetes' native gRPC probes make, so a replica
that is draining (NOT_SERVING after SIGTERM) reports unhealthy here too.
`http` is for the embedded LLM server, which speaks HTTP only.
Exit status 0 means healthy, 1 unhealthy (the message on stderr says why).
"""

from __future__ import annotations

import argparse
import sys
import urllib.error
import urllib.request


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


def http_ok(url: str, timeout_s: float = 3.0) -> tuple[bool, str]:
    """(healthy, reason) from a GET on `url` (any 2xx is healthy)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as reply:
            return 200 <= reply.status < 300, f"{url}: HTTP {reply.status}"
    except (urllib.error.URLError, OSError) as exc:
        return False, f"{url}: {exc}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    modes = parser.add_subparsers(dest="mode", required=True)
    grpc_mode = modes.add_parser("grpc", help="grpc.health.v1 Check")
    grpc_mode.add_argument("--host", default="127.0.0.1")
    grpc_mode.add_argument("--port", type=int, required=True)
    grpc_mode.add_argument("--service", default="", help="service name; empty = the server")
    grpc_mode.add_argument("--timeout", type=float, default=3.0)
    http_mode = modes.add_parser("http", help="HTTP GET, healthy on 2xx")
    http_mode.add_argument("--url", required=True)
    http_mode.add_argument("--timeout", type=float, default=3.0)
    args = parser.parse_args(argv)
    if args.mode == "grpc":
        healthy, reason = grpc_serving(f"{args.host}:{args.port}", args.service, args.timeout)
    else:
        healthy, reason = http_ok(args.url, args.timeout)
    print(reason, file=sys.stderr)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
