"""Grafana dashboard, Prometheus and OpenTelemetry collector configs agree with the metrics the
services define and with docker-compose.yml."""

from __future__ import annotations

import json
import re

import yaml

from tests.deploy.conftest import ROOT

DASHBOARD = ROOT / "deploy/grafana/dashboards/kame-latency.json"
# The latency histograms docs/design.md asks to watch: each must have a panel.
LATENCY_HISTOGRAMS = {
    "kame_gateway_response_latency_seconds",
    "kame_gateway_frame_round_trip_seconds",
    "kame_frontend_step_seconds",
    "kame_stt_partial_lag_seconds",
    "kame_stt_final_lag_seconds",
    "kame_oracle_time_to_first_token_seconds",
    "kame_oracle_update_lag_seconds",
}
_SERIES = re.compile(r"\b(kame_[a-z0-9_]+)")


def exposed_series(defined: dict[str, str]) -> dict[str, str]:
    """{series name as Prometheus stores it: metric} (histogram suffixes, counters' _total)."""
    series = {}
    for name, kind in defined.items():
        if kind == "Histogram":
            series.update({f"{name}{s}": name for s in ("_bucket", "_sum", "_count")})
        elif kind == "Counter":
            series[name if name.endswith("_total") else f"{name}_total"] = name
        else:
            series[name] = name
    return series


def dashboard_queries() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [t["expr"] for p in panels for t in p.get("targets", [])]


def test_dashboard_queries_only_series_the_services_expose(defined_metrics):
    series = exposed_series(defined_metrics)
    queries = dashboard_queries()
    assert queries
    for query in queries:
        for name in _SERIES.findall(query):
            assert name in series, f"{name} in {query!r} is not defined by any service"


def test_dashboard_plots_every_latency_histogram_as_quantiles(defined_metrics):
    queries = dashboard_queries()
    for metric in LATENCY_HISTOGRAMS:
        assert defined_metrics.get(metric) == "Histogram", metric
        quantiles = [q for q in queries if f"{metric}_bucket" in q and "histogram_quantile" in q]
        assert {re.search(r"histogram_quantile\(([\d.]+)", q).group(1) for q in quantiles} == {
            "0.5",
            "0.9",
            "0.99",
        }, metric


def test_grafana_provisioning_matches_compose():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["grafana"]
    mounts = dict(v.split(":")[:2] for v in compose["volumes"])
    datasources = yaml.safe_load(
        (ROOT / "deploy/grafana/provisioning/datasources/prometheus.yaml").read_text()
    )
    (datasource,) = datasources["datasources"]
    assert datasource["url"] == "http://prometheus:9090"
    providers = yaml.safe_load(
        (ROOT / "deploy/grafana/provisioning/dashboards/kame.yaml").read_text()
    )["providers"]
    (provider,) = providers
    assert mounts["./deploy/grafana/dashboards"] == provider["options"]["path"]
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    templating = json.loads(DASHBOARD.read_text())["templating"]["list"]
    source = next(t for t in templating if t["type"] == "datasource")
    assert source["current"]["value"] == datasource["uid"]


def test_otel_collector_receives_what_the_services_send():
    collector = yaml.safe_load((ROOT / "deploy/otel/collector.yaml").read_text())
    assert collector["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"].endswith(":4317")
    pipeline = collector["service"]["pipelines"]["traces"]
    assert pipeline["receivers"] == ["otlp"]
    assert set(pipeline["exporters"]) <= set(collector["exporters"])
    compose = (ROOT / "docker-compose.yml").read_text()
    assert "KAME_OTLP_ENDPOINT=http://otel-collector:4317" in compose
