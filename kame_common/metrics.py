"""Prometheus /metrics endpoint and the bucket layouts every service shares."""

from __future__ import annotations

from wsgiref.simple_server import WSGIServer

from prometheus_client import start_http_server

# Per-frame timings live around the 80 ms frame budget.
FRAME_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 1.0)
# Per-turn latencies (response latency, TTFT, STT lag) span tens of ms to seconds.
TURN_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
# Real-time factors (compute time / audio time).
RTF_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 4.0)


def start_metrics_server(port: int, host: str = "0.0.0.0") -> WSGIServer | None:
    """Serve /metrics on `port` in a thread (0 = disabled); stop it with `shutdown()`."""
    if port <= 0:
        return None
    server, _thread = start_http_server(port, addr=host)
    return server
