"""Prometheus /metrics endpoint, the bucket layouts every service shares, what
each process says about itself (service, version, admission limit), and
`RecentHistograms`: the last minutes of a histogram, which a cumulative
histogram alone cannot tell a one-shot reader such as `kame status`."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from importlib import metadata
from wsgiref.simple_server import WSGIServer

from prometheus_client import REGISTRY, Gauge, Histogram, start_http_server
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

# Per-frame timings live around the 80 ms frame budget.
FRAME_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 1.0)
# Per-turn latencies (response latency, TTFT, STT lag) span tens of ms to seconds.
TURN_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
# Real-time factors (compute time / audio time).
RTF_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 4.0)

BUILD_INFO = Gauge(
    "kame_build_info",
    "Always 1; its labels name the service and the version it runs",
    ["service", "version"],
)
MAX_SESSIONS = Gauge(
    "kame_max_sessions", "Open sessions before RESOURCE_EXHAUSTED (0 = no limit)", ["service"]
)
PACKAGE = "kame-stack"


def version() -> str:
    """The installed version of the stack's package."""
    try:
        return metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:
        return "unknown"


def describe_service(service: str, max_sessions: int) -> None:
    """Publish which service and version this process runs, and its session limit
    (process_start_time_seconds, from prometheus_client, gives its uptime)."""
    BUILD_INFO.labels(service=service, version=version()).set(1)
    MAX_SESSIONS.labels(service=service).set(max_sessions)


def start_metrics_server(port: int, host: str = "0.0.0.0") -> WSGIServer | None:
    """Serve /metrics on `port` in a thread (0 = disabled); stop it with `shutdown()`."""
    if port <= 0:
        return None
    server, _thread = start_http_server(port, addr=host)
    return server


Snapshot = dict[tuple[str, tuple[tuple[str, str], ...]], float]


class RecentHistograms(Collector):
    """Exports, for each histogram given, `<name>_recent`: what was observed in
    the last `window_s` seconds (at least; up to `window_s + step_s`), as the
    difference between the histogram now and a snapshot taken then. A thread
    snapshots every `step_s` seconds; until the process has run `window_s`, the
    window is its whole life. `kame_recent_window_seconds` says how long it is."""

    def __init__(
        self,
        histograms: Sequence[Histogram],
        window_s: float = 300.0,
        step_s: float = 15.0,
        registry: object = REGISTRY,
    ) -> None:
        self._histograms = list(histograms)
        self._window_s, self._step_s = window_s, step_s
        self._started = time.monotonic()
        self._snapshots: deque[tuple[float, Snapshot]] = deque()
        self._lock = threading.Lock()
        registry.register(self)  # type: ignore[attr-defined]
        threading.Thread(
            target=self._snapshot_forever, name="recent-histograms", daemon=True
        ).start()

    def _current(self) -> tuple[Snapshot, dict[str, Metric]]:
        values: Snapshot = {}
        families: dict[str, Metric] = {}
        for histogram in self._histograms:
            for family in histogram.collect():
                families[family.name] = family
                for sample in family.samples:
                    if sample.name.endswith(("_bucket", "_count", "_sum")):
                        values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return values, families

    def _snapshot_forever(self) -> None:
        while True:
            now = time.monotonic()
            values, _ = self._current()
            with self._lock:
                self._snapshots.append((now, values))
                # Keep the newest snapshot at least window_s old, and all newer ones.
                while len(self._snapshots) > 1 and self._snapshots[1][0] <= now - self._window_s:
                    self._snapshots.popleft()
            time.sleep(self._step_s)

    def collect(self) -> Iterator[Metric]:
        now = time.monotonic()
        with self._lock:  # the first snapshot is taken at start: all zero
            base_t, base = self._snapshots[0] if self._snapshots else (self._started, {})
        values, families = self._current()
        window = Metric(
            "kame_recent_window_seconds", "Seconds the _recent histograms cover", "gauge"
        )
        window.add_sample("kame_recent_window_seconds", {}, now - base_t)
        yield window
        for name, family in families.items():
            recent = Metric(
                f"{name}_recent", f"{family.documentation} (recent window)", "histogram"
            )
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                if key in values:
                    recent.add_sample(
                        sample.name.replace(name, f"{name}_recent", 1),
                        sample.labels,
                        values[key] - base.get(key, 0.0),
                    )
            yield recent
