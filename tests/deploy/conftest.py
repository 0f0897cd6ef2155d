"""Shared facts for the deployment tests: the services' real config dataclasses (and the
settings the security work adds to them), the metric names the code defines, the Helm chart
rendered offline (helm-python-sdk, Helm v4's Go library) for the default and the GPU values,
the one service Dockerfile resolved for given build arguments, `docker compose config`, and a
real redis-server standing in for the containers' Redis."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import json
import os
import re
import socket
import subprocess
import tempfile
import time
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import compose
import pytest
import redis
import yaml

from kame_cli.stack_options import free_ports
from kame_common.config import load_settings
from kame_common.ports import SERVICE_PORTS

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "kame"
SERVICES = ("gateway", "frontend", "stt", "oracle")  # the gRPC services
# Services that serve HTTP (probed on GET /healthz) and are clients of the gateway.
HTTP_SERVICES = ("web", "telephony")
# Every service of the one service Dockerfile: the gRPC ones, web and telephony.
KAME_SERVICES = (*SERVICES, *HTTP_SERVICES)
# The default ports, from their one source: gRPC and Prometheus.
PORTS = {service: ports.grpc for service, ports in SERVICE_PORTS.items()}
METRICS_PORTS = {service: ports.metrics for service, ports in SERVICE_PORTS.items()}
HEALTH_PORTS = {service: ports.health for service, ports in SERVICE_PORTS.items()}
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
        adds its range checks to the dataclass's types and choices). Settings naming files
        (`*_FILE`: TLS certificates and keys) load as paths: the files exist only inside the
        container, so tests check them against the mounts."""
        return load_settings(self.cls, [], env)

    @property
    def fields(self) -> dict[str, dataclasses.Field]:
        return {f.name: f for f in dataclasses.fields(self.cls)}

    @property
    def known_fields(self) -> set[str]:
        return set(self.fields)

    def env_fields(self, names: typing.Iterable[str]) -> dict[str, str]:
        """{env var: field} for the KAME_<SVC>_* names among `names`."""
        return {n: n[len(self.prefix) :].lower() for n in names if n.startswith(self.prefix)}

    def field_type(self, field: str) -> type:
        return typing.get_type_hints(self.cls)[field]

    def json_type(self, field: str) -> str:
        return _JSON_TYPES[self.field_type(field)]

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
    for service in KAME_SERVICES:
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

    @functools.cached_property
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
    is_upgrade: bool = False,
) -> Rendered:
    """`helm template` with values files (merged like -f) and then `values` (like --set);
    `is_upgrade`: as `helm upgrade` renders (offline here: `lookup` finds nothing)."""
    import helm_python as helm

    merged: dict = {}
    for name in values_files:
        merged = deep_merge(merged, yaml.safe_load((CHART / name).read_text()))
    merged = deep_merge(merged, values or {})
    with helm.Chart.load(CHART) as chart:
        chart.validate_schema(merged)
        rendered = chart.render(
            merged,
            name=release,
            namespace=namespace,
            is_install=not is_upgrade,
            is_upgrade=is_upgrade,
        )
        return Rendered(rendered)


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


def plain_settings(deployment: dict, prefix: str) -> dict[str, str]:
    """The settings a deployment's main container gets as plain values (not from a
    Secret) whose names start with `prefix`, e.g. KAME_WEB_."""
    env = env_of(containers(deployment)[0])
    return {k: e["value"] for k, e in env.items() if k.startswith(prefix) and "value" in e}


def prometheus_targets() -> dict[str, list[str]]:
    """What the compose Prometheus scrapes: host:port targets by job name."""
    prometheus = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    return {
        job["job_name"]: [t for c in job["static_configs"] for t in c["targets"]]
        for job in prometheus["scrape_configs"]
    }


_KUBELET_REFERENCE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def kubelet_expand(text: str, env: dict[str, str]) -> str:
    """$(NAME) references expanded as the kubelet does in env values and args: a defined
    variable is replaced, any other reference stays as written."""
    return _KUBELET_REFERENCE.sub(lambda m: env.get(m.group(1), m.group(0)), text)


# ---- Dockerfiles ------------------------------------------------------------------------------

SERVICE_DOCKERFILE = ROOT / "deploy" / "docker" / "service.Dockerfile"
LLM_DOCKERFILE = ROOT / "deploy" / "docker" / "llm.Dockerfile"


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile: continuations joined, comments dropped."""
    result, pending = [], ""
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        keyword, _, arguments = pending.strip().partition(" ")
        result.append((keyword.upper(), arguments.strip()))
        pending = ""
    return result


_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")
# Instructions whose arguments the builder expands (RUN and exec-form CMD are left to the shell).
_EXPANDED = {"FROM", "COPY", "ADD", "ENV", "EXPOSE", "USER", "WORKDIR", "LABEL", "STOPSIGNAL"}


def _expand(text: str, variables: dict[str, str]) -> str:
    return _VARIABLE.sub(lambda m: variables.get(m.group(1) or m.group(2), ""), text)


@dataclass
class Image:
    """What a Dockerfile builds for some build arguments: the instructions of the final stage
    and of the stages it is built FROM, in build order, with the builder's variables expanded
    where the builder expands them, and the stages they came from."""

    base: str  # the image the first stage starts FROM
    steps: list[tuple[str, str]]
    stages: list[str]

    def arguments(self, keyword: str) -> list[str]:
        return [args for kw, args in self.steps if kw == keyword]

    @property
    def env(self) -> dict[str, str]:
        result: dict[str, str] = {}
        for args in self.arguments("ENV"):
            result.update(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)=(\S+)", args))
        return result

    def exposed_ports(self, protocol: str) -> set[int]:
        """The EXPOSEd ports of one protocol ("tcp", the default, or "udp"), ranges expanded."""
        result: set[int] = set()
        for args in self.arguments("EXPOSE"):
            for entry in args.split():
                ports, _, proto = entry.partition("/")
                if (proto or "tcp") == protocol:
                    first, _, last = ports.partition("-")
                    result.update(range(int(first), int(last or first) + 1))
        return result

    @property
    def exposed(self) -> set[int]:
        """The EXPOSEd TCP ports."""
        return self.exposed_ports("tcp")


def build_image(
    path: Path, build_args: dict[str, str] | None = None, target: str | None = None
) -> Image:
    """Resolve the final stage of `path` (or the stage `target`, as `--target` does) for
    `build_args` as BuildKit does: global ARGs (before the first FROM) feed FROM lines, a FROM
    naming an earlier stage continues it, an ARG inside a stage takes the build argument or the
    global default. KeyError: a FROM names no stage or image the file defines (e.g.
    SERVICE=nothing -> `service-nothing`)."""
    build_args = build_args or {}
    steps = instructions(path)
    first_from = next(i for i, (kw, _) in enumerate(steps) if kw == "FROM")
    global_args: dict[str, str] = {}
    for _, args in steps[:first_from]:
        name, _, default = args.partition("=")
        global_args[name] = build_args.get(name, default)
    stages: dict[str, tuple[str, list[tuple[str, str]]]] = {}
    order: list[str] = []
    for keyword, args in steps[first_from:]:
        if keyword == "FROM":
            base, _, name = _expand(args, global_args).partition(" AS ")
            name = name.strip() or f"stage-{len(order)}"
            stages[name] = (base.strip(), [])
            order.append(name)
        else:
            stages[order[-1]][1].append((keyword, args))
    chain, name = [], target or order[-1]
    while name in stages:
        chain.insert(0, name)
        name = stages[name][0]
    if ":" not in name and "/" not in name:
        raise KeyError(f"{path.name}: FROM {name}: no such stage or image")
    result: list[tuple[str, str]] = []
    environment: dict[str, str] = {}  # ENV carries into the stages built FROM it; ARG does not
    for stage in chain:
        variables = dict(environment)
        for keyword, args in stages[stage][1]:
            if keyword == "ARG":
                arg, has_default, default = args.partition("=")
                inherited = default if has_default else global_args.get(arg, "")
                variables[arg] = build_args.get(arg, inherited)
            if keyword in _EXPANDED:
                args = _expand(args, variables)
            if keyword == "ENV":
                environment.update(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)=(\S+)", args))
                variables.update(environment)
            result.append((keyword, args))
    return Image(name, result, chain)


# ---- docker compose ---------------------------------------------------------------------------

COMPOSE = ROOT / "docker-compose.yml"
DOCKER_COMPOSE = Path(compose.__file__).parent / "docker-compose"


def compose_config(*options: str, env: dict[str, str] | None = None) -> dict:
    """`docker compose config` as JSON in a clean environment: only `env`, none of the caller's
    variables. Without `-f` or an env file naming COMPOSE_FILE, docker-compose.yml alone."""
    result = subprocess.run(
        [
            str(DOCKER_COMPOSE),
            "--project-directory",
            str(ROOT),
            *options,
            "config",
            "--format",
            "json",
        ],
        env={"PATH": os.defpath, "HOME": tempfile.gettempdir(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def compose_image(spec: dict) -> Image:
    """The image a compose service builds: its Dockerfile with its build arguments."""
    build = spec["build"]
    return build_image(Path(build["context"]) / build["dockerfile"], build.get("args") or {})


# ---- a real Redis ------------------------------------------------------------------------------


def free_port() -> int:
    """A loopback port nothing listens on (now), from this worker's share below the
    ephemeral range (free_ports): a port 0 bind's pick can be taken by any outgoing
    connection before the server that was to use it binds."""
    (port,) = free_ports(1)
    return port


@dataclass
class RedisServer:
    """A redis-server on this machine, standing in for a container's Redis."""

    port: int

    def pings(self, url: str) -> bool:
        """PING through a service's Redis URL, its host and port replaced by this server's."""
        parts = urlsplit(url)
        credentials = parts.netloc.rpartition("@")[0]
        netloc = f"{credentials}@127.0.0.1:{self.port}" if credentials else f"127.0.0.1:{self.port}"
        client = redis.Redis.from_url(urlunsplit(parts._replace(netloc=netloc)))
        try:
            return bool(client.ping())
        finally:
            client.close()

    def requires_password(self) -> bool:
        try:
            return not self.pings("redis://placeholder/0")
        except redis.AuthenticationError:
            return True

    def check(self, script: str, auth: str) -> int:
        """Exit status of a container's redis-cli health check (a shell script), run here
        against this server with REDISCLI_AUTH=auth."""
        script = script.replace("redis-cli ", f"redis-cli -p {self.port} ")
        env = {"PATH": os.defpath, "REDISCLI_AUTH": auth}
        return subprocess.run(["sh", "-c", script], env=env, capture_output=True).returncode


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def redis_server(
    args: list[str],
    directory: Path,
    launcher: tuple[str, ...] = ("redis-server",),
    env: dict[str, str] | None = None,
) -> Iterator[RedisServer]:
    """redis-server with a container's arguments (those after the binary) on a free loopback
    port, its files in `directory`; stopped on exit. `launcher`: a container's whole command
    that starts redis-server with its own arguments and then these, with `env` added."""
    port = free_port()
    process = subprocess.Popen(
        [
            *launcher,
            *args,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(directory),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )
    try:
        deadline = time.monotonic() + 10
        while not _listening(port):
            assert time.monotonic() < deadline and process.poll() is None, "no redis-server"
            time.sleep(0.05)
        yield RedisServer(port)
    finally:
        process.terminate()
        process.wait(timeout=10)
