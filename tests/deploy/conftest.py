"""Shared facts for the deployment tests: the services' real config dataclasses, the metric
names the code defines, and the Helm chart rendered offline (helm-python-sdk, Helm v4's Go
library) for the default and the GPU values."""

from __future__ import annotations

import dataclasses
import importlib
import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from kame_common.config import load_settings
from kame_common.ports import SERVICE_PORTS

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "kame"
SERVICES = ("gateway", "frontend", "stt", "oracle")
# The default ports, from their one source: gRPC and Prometheus.
PORTS = {service: ports.grpc for service, ports in SERVICE_PORTS.items()}
METRICS_PORTS = {service: ports.metrics for service, ports in SERVICE_PORTS.items()}
_JSON_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean"}


@dataclass(frozen=True)
class ServiceConfig:
    """One service's settings as its config module declares them."""

    service: str
    module: types.ModuleType
    cls: type
    prefix: str

    def load(self, env: dict[str, str]) -> typing.Any:
        """The settings the service would run with in `env`, through its own loader (which
        adds its range checks to the dataclass's types and choices)."""
        return load_settings(self.cls, [], env)

    @property
    def fields(self) -> dict[str, dataclasses.Field]:
        return {f.name: f for f in dataclasses.fields(self.cls)}

    def env_fields(self, names: typing.Iterable[str]) -> dict[str, str]:
        """{env var: field} for the KAME_<SVC>_* names among `names`."""
        return {n: n[len(self.prefix) :].lower() for n in names if n.startswith(self.prefix)}

    def json_type(self, field: str) -> str:
        return _JSON_TYPES[typing.get_type_hints(self.cls)[field]]

    def default(self, field: str) -> typing.Any:
        return self.fields[field].default


def _config_class(module) -> type:
    """The settings dataclass of a service's config module (the one with port and metrics_port)."""
    found = [
        obj
        for obj in vars(module).values()
        if isinstance(obj, type)
        and dataclasses.is_dataclass(obj)
        and obj.__module__ == module.__name__
        and {"port", "metrics_port"} <= {f.name for f in dataclasses.fields(obj)}
    ]
    assert len(found) == 1, f"{module.__name__}: expected one settings dataclass, found {found}"
    return found[0]


@pytest.fixture(scope="session")
def configs() -> dict[str, ServiceConfig]:
    result = {}
    for service in SERVICES:
        module = importlib.import_module(f"services.{service}.config")
        result[service] = ServiceConfig(
            service, module, _config_class(module), f"KAME_{service.upper()}_"
        )
    return result


_METRIC = re.compile(r"\b(Histogram|Counter|Gauge|Summary)\(\s*[\"']([a-zA-Z_:][a-zA-Z0-9_:]*)")


@pytest.fixture(scope="session")
def defined_metrics() -> dict[str, str]:
    """{metric name: kind} of every Prometheus metric the services and kame_common define."""
    metrics = {}
    for path in [*(ROOT / "services").rglob("*.py"), *(ROOT / "kame_common").rglob("*.py")]:
        for match in _METRIC.finditer(path.read_text()):
            metrics[match.group(2)] = match.group(1)
    return metrics


def load_yaml_documents(text: str) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


@dataclass
class Rendered:
    """The manifests of one `helm template` run, by kind."""

    manifests: dict[str, str]

    @property
    def documents(self) -> list[dict]:
        docs = []
        for name, text in sorted(self.manifests.items()):
            if name.endswith(".yaml"):
                docs += load_yaml_documents(text)
        return docs

    def of_kind(self, kind: str) -> list[dict]:
        return [d for d in self.documents if d["kind"] == kind]

    def one(self, kind: str, component: str) -> dict:
        found = [
            d
            for d in self.of_kind(kind)
            if d["metadata"]["labels"].get("app.kubernetes.io/component") == component
        ]
        assert len(found) == 1, f"expected one {kind} for {component}, found {len(found)}"
        return found[0]

    @property
    def notes(self) -> str:
        return next(text for name, text in self.manifests.items() if name.endswith("NOTES.txt"))


def helm_render(
    values: dict | None = None,
    values_files: tuple[str, ...] = (),
    release: str = "kame",
    namespace: str = "voice",
) -> Rendered:
    """`helm template` with values files (merged like -f) and then `values` (like --set)."""
    import helm_python as helm

    merged: dict = {}
    for name in values_files:
        merged = deep_merge(merged, yaml.safe_load((CHART / name).read_text()))
    merged = deep_merge(merged, values or {})
    with helm.Chart.load(CHART) as chart:
        chart.validate_schema(merged)
        return Rendered(chart.render(merged, name=release, namespace=namespace, is_install=True))


def deep_merge(base: dict, override: dict) -> dict:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


# The two configurations the issue asks for, rendered once per test session.
VALUE_SETS = {"default": (), "gpu": ("values-gpu.yaml",)}


@pytest.fixture(scope="session")
def rendered_sets() -> dict[str, Rendered]:
    return {name: helm_render(values_files=files) for name, files in VALUE_SETS.items()}


@pytest.fixture(scope="session", params=sorted(VALUE_SETS))
def rendered(request, rendered_sets) -> Rendered:
    return rendered_sets[request.param]


def containers(doc: dict) -> list[dict]:
    return doc["spec"]["template"]["spec"]["containers"]


def env_of(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}
