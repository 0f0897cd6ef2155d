"""The one metric reader of the tests: a sample of this process's Prometheus
registry (services run in the test's process), or of a scrape of a service in
a process of its own."""

from __future__ import annotations

from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families


def metric(name: str, **labels: str) -> float:
    """The sample `name` with exactly these labels in this process's registry; 0
    before anything was counted (a counter or a labelled child not yet made)."""
    return REGISTRY.get_sample_value(name, labels) or 0.0


def scraped(text: str, name: str, **labels: str) -> float:
    """The sample `name` with exactly these labels in a /metrics scrape `text`;
    AssertionError naming it where the scrape has no such sample."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    raise AssertionError(f"{name}{labels or ''} is not in the scrape")


def scraped_sum(text: str, name: str) -> float:
    """The sum of the samples `name` over all their label sets in a /metrics scrape
    `text` (0 where it has none)."""
    return sum(
        float(sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    )
