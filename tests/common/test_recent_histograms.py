"""RecentHistograms: `<name>_recent` holds what a histogram observed in its
last window only, and says how long that window is."""

from __future__ import annotations

import time

import pytest
from prometheus_client import CollectorRegistry, Histogram

from kame_cli.status import quantile
from kame_common.metrics import RecentHistograms


def recent_count(registry: CollectorRegistry, le: str) -> float:
    value = registry.get_sample_value("kame_test_seconds_recent_bucket", {"le": le})
    assert value is not None
    return value


def test_recent_holds_only_the_last_window():
    registry = CollectorRegistry()
    histogram = Histogram("kame_test_seconds", "test", buckets=(0.1, 1.0), registry=registry)
    RecentHistograms([histogram], window_s=0.6, step_s=0.1, registry=registry)
    histogram.observe(0.05)  # old: leaves the window
    assert recent_count(registry, "+Inf") == 1
    time.sleep(1.0)
    histogram.observe(0.5)
    histogram.observe(0.7)
    assert recent_count(registry, "0.1") == 0
    assert recent_count(registry, "1.0") == recent_count(registry, "+Inf") == 2
    assert registry.get_sample_value("kame_test_seconds_count") == 3  # the histogram itself
    window = registry.get_sample_value("kame_recent_window_seconds")
    assert 0.6 <= window <= 1.0


def test_quantile_interpolates_inside_the_bucket():
    buckets = [(0.1, 0.0), (0.5, 4.0), (1.0, 8.0), (float("inf"), 8.0)]
    assert quantile(buckets, 0.5) == 0.5
    assert quantile(buckets, 0.25) == pytest.approx(0.3)
    assert quantile(buckets, 0.75) == 0.75
    assert quantile([(0.1, 0.0), (float("inf"), 0.0)], 0.5) is None
    assert quantile([(0.1, 0.0), (float("inf"), 2.0)], 0.5) == 0.1  # beyond the last bound
