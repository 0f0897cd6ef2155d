"""Per-frame timings from the services' Prometheus histograms.

The services hand per-frame figures to clients only through /metrics, so the
bench scrapes the frontend's and the gateway's histograms before and after a
stretch of calls and keeps the difference. Quantiles are interpolated inside
buckets, as Prometheus' histogram_quantile does.
"""

from __future__ import annotations

import asyncio
import math
import urllib.request
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from kame_cli.bench.runs import Run
from kame_cli.bench.stats import rounded
from kame_cli.stack_options import Ports

STEP_METRIC = "kame_frontend_step_seconds"
ROUND_TRIP_METRIC = "kame_gateway_frame_round_trip_seconds"
TRANSPORT_METRIC = "kame_gateway_frame_transport_seconds"


@dataclass
class Histogram:
    """Cumulative bucket counts (upper bound -> count), as /metrics exposes them."""

    buckets: dict[float, float] = field(default_factory=dict)
    total: float = 0.0
    count: float = 0.0

    def __sub__(self, earlier: Histogram) -> Histogram:
        return Histogram(
            {
                bound: value - earlier.buckets.get(bound, 0.0)
                for bound, value in self.buckets.items()
            },
            self.total - earlier.total,
            self.count - earlier.count,
        )

    def __add__(self, other: Histogram) -> Histogram:
        bounds = set(self.buckets) | set(other.buckets)
        return Histogram(
            {b: self.buckets.get(b, 0.0) + other.buckets.get(b, 0.0) for b in bounds},
            self.total + other.total,
            self.count + other.count,
        )

    def quantile(self, q: float) -> float | None:
        """Prometheus' histogram_quantile: linear inside the bucket that holds rank q."""
        if self.count <= 0:
            return None
        rank = q * self.count
        lower, below = 0.0, 0.0
        for bound in sorted(self.buckets):
            cumulative = self.buckets[bound]
            if cumulative >= rank:
                if math.isinf(bound):
                    return lower  # beyond the last finite bucket: its bound is all we know
                if cumulative == below:
                    return bound
                return lower + (bound - lower) * (rank - below) / (cumulative - below)
            lower, below = bound, cumulative
        return lower


def parse_histogram(text: str, name: str, labels: dict[str, str]) -> Histogram:
    """The histogram `name` summed over the series whose labels include `labels`."""
    histogram = Histogram()
    for family in text_string_to_metric_families(text):
        if family.name != name:
            continue
        for sample in family.samples:
            if any(sample.labels.get(key) != value for key, value in labels.items()):
                continue
            if sample.name.endswith("_bucket"):
                bound = float(sample.labels["le"])
                histogram.buckets[bound] = histogram.buckets.get(bound, 0.0) + sample.value
            elif sample.name.endswith("_sum"):
                histogram.total += sample.value
            elif sample.name.endswith("_count"):
                histogram.count += sample.value
    return histogram


@dataclass
class FrameTimes:
    """Per-frame histograms of one stretch of the bench (deltas of two scrapes)."""

    step: Histogram = field(default_factory=Histogram)
    round_trip: Histogram = field(default_factory=Histogram)
    transport: Histogram = field(default_factory=Histogram)

    KINDS = ("step", "round_trip", "transport")

    def __add__(self, other: FrameTimes) -> FrameTimes:
        return FrameTimes(*(getattr(self, k) + getattr(other, k) for k in self.KINDS))

    def __sub__(self, earlier: FrameTimes) -> FrameTimes:
        return FrameTimes(*(getattr(self, k) - getattr(earlier, k) for k in self.KINDS))

    def summary(self) -> dict[str, float | None]:
        """p50 and p99 of each kind: step_p50_s, ..., transport_p99_s."""
        return {
            f"{kind}_{tag}_s": rounded(getattr(self, kind).quantile(q), 5)
            for kind in self.KINDS
            for q, tag in ((0.5, "p50"), (0.99, "p99"))
        }


class MetricsProbe:
    """Scrapes the frontend's and gateway's /metrics of one stack for one run."""

    def __init__(self, ports: Ports, run: Run) -> None:
        self.frontend_url = f"http://127.0.0.1:{ports.frontend_metrics}/metrics"
        self.gateway_url = f"http://127.0.0.1:{ports.gateway_metrics}/metrics"
        self.run = run

    @staticmethod
    def _get(url: str) -> str:
        with urllib.request.urlopen(url, timeout=5) as response:
            body: bytes = response.read()
        return body.decode()

    async def snapshot(self) -> FrameTimes:
        frontend, gateway = await asyncio.gather(
            asyncio.to_thread(self._get, self.frontend_url),
            asyncio.to_thread(self._get, self.gateway_url),
        )
        mode = {"mode": self.run.mode}
        return FrameTimes(
            parse_histogram(frontend, STEP_METRIC, {"engine": self.run.engine}),
            parse_histogram(gateway, ROUND_TRIP_METRIC, mode),
            parse_histogram(gateway, TRANSPORT_METRIC, mode),
        )
