"""`kame status [--gateway ADDR] [--json]`: how a running stack is doing.

For each service (gateway, stt, oracle, frontend): gRPC health, version,
uptime, PID and restarts (when `kame up` started it), open sessions and free capacity, from
the health service and the service's Prometheus /metrics (kame_build_info,
process_start_time_seconds, kame_active_sessions, kame_max_sessions,
kame_frontend_free_slots); Redis and the frontend replicas in its capacity
registry; the LLM server's models; and the gateway's response latency, answer
latency and frame round trip percentiles over its last minutes
(the `_recent` histograms, kame_common.metrics.RecentHistograms), with the
share of late frames (a round trip over the 80 ms frame budget). The ingress
services in front of the gateway (web, telephony) are HTTP servers: their
health is GET /healthz (200 SERVING, 503 NOT_SERVING), the rest as above.

Where the services are: a stack started by `kame up` lists its endpoints in
its stack file (kame_cli.stack.stack_file), found by the gateway's port;
without one, every service is looked for on the gateway's host at its default
ports (kame_common.ports). Exit status 0 when every gRPC service is SERVING
and no ingress service that answers is unhealthy (a deployment may run without
web or telephony), 1 otherwise; when nothing answers at all, one line says so.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families
from redis.exceptions import RedisError

from kame_cli.errors import USAGE, CliError
from kame_cli.stack import INGRESS, SERVICES, stack_file
from kame_common import store
from kame_common.ports import (
    LLM_PORT,
    REDIS_PORT,
    SERVICE_PORTS,
    TELEPHONY_PORTS,
    WEB_PORTS,
    HttpPorts,
    TelephonyPorts,
    loopback_address,
)

FRAME_BUDGET_S = 0.08
SHOWN_ORDER = (*INGRESS, "gateway", "frontend", "stt", "oracle")  # the caller's path inwards
INGRESS_PORTS: dict[str, HttpPorts | TelephonyPorts] = {
    "web": WEB_PORTS,
    "telephony": TELEPHONY_PORTS,
}
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")
QUANTILES = (0.5, 0.9, 0.99)
# (label, histogram) of the gateway shown in the latency section.
LATENCIES = (
    ("response latency", "kame_gateway_response_latency_seconds"),
    ("answer latency", "kame_gateway_answer_latency_seconds"),
    ("frame round trip", "kame_gateway_frame_round_trip_seconds"),
)


# Every sample of a /metrics page: name -> [(labels, value)].
Samples = dict[str, list[tuple[dict[str, str], float]]]


@dataclass
class Endpoints:
    grpc: dict[str, str]  # the gRPC services' addresses, and the ingress services' /healthz URLs
    metrics: dict[str, str]
    redis_url: str
    llm_url: str
    pids: dict[str, int] = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)  # by `kame up`'s supervisor
    source: str = "default ports"


@dataclass
class ServiceStatus:
    name: str
    address: str
    health: str
    version: str = ""
    uptime_s: float | None = None
    pid: int | None = None
    restarts: int | None = None  # None: not started by `kame up`
    active_sessions: int | None = None
    free_capacity: int | None = None  # None: unknown or no limit (see limit)
    limit: int | None = None


@dataclass
class LatencyStatus:
    name: str
    count: int
    quantiles_s: dict[str, float | None]
    late_share: float | None = None  # frames over the budget, for the frame round trip


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise CliError(f"--gateway {address!r} is not HOST:PORT", USAGE)
    return host, int(port)


def find_endpoints(gateway: str) -> Endpoints:
    """The stack file of the `kame up` whose gateway is `gateway`, else the
    default ports on the gateway's host."""
    host, port = split_address(gateway)
    path = stack_file(port)
    if host in LOOPBACK_HOSTS and path.is_file():
        described = json.loads(path.read_text())
        processes = described["processes"]
        return Endpoints(
            grpc={
                **{s: processes[s]["endpoint"] for s in SERVICES if s in processes},
                **{s: processes[s]["health_url"] for s in INGRESS if s in processes},
            },
            metrics={s: processes[s]["metrics_url"] for s in SHOWN_ORDER if s in processes},
            redis_url=described["redis_url"],
            llm_url=described["llm_url"],
            pids={name: p["pid"] for name, p in processes.items() if p.get("pid")},
            restarts={name: p.get("restarts", 0) for name, p in processes.items()},
            source=f"stack file {path}",
        )
    grpc_addresses = {s: loopback_address(s).replace("127.0.0.1", host) for s in SERVICES}
    grpc_addresses["gateway"] = gateway
    metrics = {s: f"http://{host}:{SERVICE_PORTS[s].metrics}/metrics" for s in SERVICES}
    for name, ports in INGRESS_PORTS.items():
        grpc_addresses[name] = f"http://{host}:{ports.http}/healthz"
        metrics[name] = f"http://{host}:{ports.metrics}/metrics"
    return Endpoints(
        grpc=grpc_addresses,
        metrics=metrics,
        redis_url=f"redis://{host}:{REDIS_PORT}/0",
        llm_url=f"http://{host}:{LLM_PORT}/v1",
    )


def health_of(address: str, timeout_s: float) -> str:
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=timeout_s
            )
        except grpc.RpcError as exc:
            return "unreachable" if exc.code() == grpc.StatusCode.UNAVAILABLE else exc.code().name
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))


def http_health_of(url: str, timeout_s: float) -> str:
    """An ingress service's /healthz as a gRPC health status name."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s):
            return "SERVING"
    except urllib.error.HTTPError as exc:
        return "NOT_SERVING" if exc.code == 503 else f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError):
        return "unreachable"


def scrape(url: str, timeout_s: float) -> Samples:
    """Every sample of a /metrics page by sample name; empty if it does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            text = response.read().decode()
    except (urllib.error.URLError, OSError):
        return {}
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


def _value(samples: Samples, name: str) -> float | None:
    values = [value for _, value in samples.get(name, [])]
    return sum(values) if values else None


def service_status(
    name: str, endpoints: Endpoints, timeout_s: float
) -> tuple[ServiceStatus, Samples]:
    """A service's row and its scraped metrics."""
    address = endpoints.grpc[name]
    health = (
        http_health_of(address, timeout_s) if name in INGRESS else health_of(address, timeout_s)
    )
    status = ServiceStatus(
        name,
        address,
        health,
        pid=endpoints.pids.get(name),
        restarts=endpoints.restarts.get(name),
    )
    samples = scrape(endpoints.metrics[name], timeout_s)
    if not samples:
        return status, samples
    status.version = next(
        (labels["version"] for labels, _ in samples.get("kame_build_info", [])), ""
    )
    started = _value(samples, "process_start_time_seconds")
    status.uptime_s = None if started is None else round(time.time() - started, 1)
    active = _value(samples, "kame_active_sessions")
    status.active_sessions = None if active is None else int(active)
    limit = _value(samples, "kame_max_sessions")
    status.limit = None if limit is None else int(limit)
    free_slots = _value(samples, "kame_frontend_free_slots")
    if free_slots is not None:
        status.free_capacity = int(free_slots)
    elif status.limit and status.active_sessions is not None:
        status.free_capacity = max(0, status.limit - status.active_sessions)
    return status, samples


def quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """The q-quantile of a cumulative histogram [(le, count)], interpolated
    linearly inside its bucket (as Prometheus' histogram_quantile does)."""
    buckets = sorted(buckets)
    total = buckets[-1][1] if buckets else 0
    if total <= 0:
        return None
    rank, lower_le, lower_count = q * total, 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if le == float("inf"):
                return lower_le  # above the last finite bucket: its bound is all we know
            share = (rank - lower_count) / (count - lower_count) if count > lower_count else 1.0
            return lower_le + (le - lower_le) * share
        lower_le, lower_count = le, count
    return lower_le


def latency_status(samples: Samples, label: str, name: str, recent: bool) -> LatencyStatus:
    """Percentiles of one gateway histogram, all modes together."""
    base = f"{name}_recent" if recent else name
    summed: dict[float, float] = {}
    for labels, value in samples.get(f"{base}_bucket", []):
        le = float(labels["le"])
        summed[le] = summed.get(le, 0.0) + value
    buckets = sorted(summed.items())
    count = int(buckets[-1][1]) if buckets else 0
    result = LatencyStatus(
        label, count, {f"p{round(q * 100)}": quantile(buckets, q) for q in QUANTILES}
    )
    if name == "kame_gateway_frame_round_trip_seconds" and count:
        on_time = summed.get(FRAME_BUDGET_S, 0.0)
        result.late_share = (count - on_time) / count
    return result


async def _registry_and_ping(redis_url: str, timeout_s: float) -> tuple[bool, list[store.Replica]]:
    client = store.connect(redis_url)
    try:
        await asyncio.wait_for(client.ping(), timeout_s)
        return True, await store.CapacityRegistry(client, "frontend").replicas()
    except (OSError, TimeoutError, RedisError):
        return False, []
    finally:
        await client.aclose()


def llm_models(url: str, timeout_s: float) -> list[str] | None:
    try:
        with urllib.request.urlopen(f"{url}/models", timeout=timeout_s) as response:
            return [model["id"] for model in json.load(response)["data"]]
    except (urllib.error.URLError, OSError, ValueError, KeyError):
        return None


def collect(gateway: str, redis_url: str, timeout_s: float) -> dict[str, Any]:
    """Everything `kame status` shows, as JSON-ready data."""
    endpoints = find_endpoints(gateway)
    if redis_url:
        endpoints.redis_url = redis_url
    services, gateway_samples = [], {}
    for name in SHOWN_ORDER:
        if name not in endpoints.grpc:
            continue  # a stack started without it
        status, samples = service_status(name, endpoints, timeout_s)
        services.append(status)
        if name == "gateway":
            gateway_samples = samples
    redis_ok, replicas = asyncio.run(_registry_and_ping(endpoints.redis_url, timeout_s))
    window = _value(gateway_samples, "kame_recent_window_seconds")
    latencies = [
        latency_status(gateway_samples, label, name, recent=window is not None)
        for label, name in LATENCIES
    ]
    return {
        "gateway": gateway,
        "endpoints_from": endpoints.source,
        "services": [asdict(s) for s in services],
        "redis": {"url": store.redacted_url(endpoints.redis_url), "ok": redis_ok},
        "frontend_registry": [asdict(r) for r in replicas],
        "llm": {"url": endpoints.llm_url, "models": llm_models(endpoints.llm_url, timeout_s)},
        "latency_window_s": None if window is None else round(window, 1),
        "latencies": [asdict(latency) for latency in latencies],
    }


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def _or_dash(value: object) -> str:
    return "-" if value is None or value == "" else str(value)


def render(data: dict[str, Any]) -> str:
    """The table `kame status` prints."""
    lines = [f"KAME stack at {data['gateway']} (endpoints from {data['endpoints_from']})", ""]
    header = (
        "service",
        "health",
        "version",
        "uptime",
        "pid",
        "restarts",
        "sessions",
        "free",
        "address",
    )
    rows = [header]
    for s in data["services"]:
        free = s["free_capacity"]
        if free is None and s["limit"] == 0:
            free = "no limit"
        rows.append(
            (
                s["name"],
                s["health"],
                _or_dash(s["version"]),
                _duration(s["uptime_s"]),
                _or_dash(s["pid"]),
                _or_dash(s["restarts"]),
                _or_dash(s["active_sessions"]),
                _or_dash(free),
                s["address"],
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines += [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    redis, llm = data["redis"], data["llm"]
    lines.append("")
    lines.append(f"redis     {'ok' if redis['ok'] else 'unreachable'}  {redis['url']}")
    models = llm["models"]
    lines.append(
        f"llm       {'ok (' + ', '.join(models) + ')' if models else 'unreachable'}  {llm['url']}"
    )
    replicas = data["frontend_registry"]
    lines.append(
        "frontend replicas in the Redis registry: "
        + (
            ", ".join(
                f"{r['replica_id']} at {r['address']} ({r['free_slots']}/{r['total_slots']} free)"
                for r in replicas
            )
            or "none"
        )
    )
    window = data["latency_window_s"]
    span = "since it started" if window is None else f"the last {_duration(window)}"
    lines += ["", f"At the gateway, {span} (all modes):"]
    lines += [_latency_line(latency) for latency in data["latencies"]]
    return "\n".join(lines)


def _latency_line(latency: dict[str, Any]) -> str:
    unit = "frames" if "frame" in latency["name"] else "turns"
    if not latency["count"]:
        return f"  {latency['name']:<17} no {unit} yet"
    quantiles = "  ".join(f"{k} {_seconds(v)}" for k, v in latency["quantiles_s"].items())
    count = latency["count"]
    text = f"  {latency['name']:<17} {quantiles}  ({count} {unit if count > 1 else unit[:-1]})"
    if latency["late_share"] is not None:
        text += f"; late (> {FRAME_BUDGET_S * 1000:.0f} ms): {latency['late_share']:.1%}"
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--gateway", default=loopback_address("gateway"), help="the stack's gateway host:port"
    )
    parser.add_argument(
        "--redis-url",
        default="",
        help="the stack's Redis (default: the stack file's, or HOST:6379)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--timeout-s", type=float, default=2.0, help="per request")


def healthy(services: list[dict[str, Any]]) -> bool:
    """Every gRPC service SERVING; an ingress service only if it answers."""
    return all(
        s["health"] == "SERVING" or (s["name"] in INGRESS and s["health"] == "unreachable")
        for s in services
    )


def run(args: argparse.Namespace) -> int:
    data = collect(args.gateway, args.redis_url, args.timeout_s)
    healths = [s["health"] for s in data["services"]]
    if all(h == "unreachable" for h in healths):
        raise CliError(f"no service answers for the stack at {args.gateway}: is `kame up` running?")
    print(json.dumps(data, indent=2) if args.json else render(data))
    return 0 if healthy(data["services"]) else 1
