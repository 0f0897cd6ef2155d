"""Default ports have one source, kame_common/ports.py: the services' settings and `kame up`
read it; docker-compose.yml (and its TLS override), the Helm values, the service Dockerfile and
Prometheus' compose config cannot import Python, so this file proves they agree with it, each
port in each place it is written (issue #14)."""

from __future__ import annotations

import dataclasses
import re
import tempfile
from urllib.parse import urlsplit

import pytest
import yaml

from kame_cli.child import StackError
from kame_cli.stack import Stack, stack_file
from kame_cli.stack_options import Ports, StackOptions
from kame_common.ports import LLM_PORT, REDIS_PORT, SERVICE_PORTS, TELEPHONY_PORTS, WEB_PORTS
from tests.deploy.conftest import (
    CHART,
    HTTP_SERVICES,
    LLM_DOCKERFILE,
    ROOT,
    SERVICE_DOCKERFILE,
    SERVICES,
    build_image,
    compose_config,
    containers,
    env_of,
    prometheus_targets,
)

TLS_OVERRIDE = ROOT / "deploy" / "compose" / "tls.yml"


def as_triple(ports) -> tuple[int, int, int]:
    return (ports.grpc, ports.metrics, ports.health)


def test_every_service_has_three_distinct_ports():
    every = [p for ports in SERVICE_PORTS.values() for p in as_triple(ports)]
    assert set(SERVICE_PORTS) == set(SERVICES)
    assert len(every) == len(set(every)) and LLM_PORT not in every and REDIS_PORT not in every


def test_the_services_default_to_them(configs):
    for service in SERVICES:
        config = configs[service]
        assert config.default("port") == SERVICE_PORTS[service].grpc
        assert config.default("metrics_port") == SERVICE_PORTS[service].metrics


def test_kame_up_uses_them():
    ports = Ports()
    for service in SERVICES:
        assert getattr(ports, service) == SERVICE_PORTS[service].grpc
        assert getattr(ports, f"{service}_metrics") == SERVICE_PORTS[service].metrics
    assert (ports.llm, ports.redis) == (LLM_PORT, REDIS_PORT)
    # Health ports, once `kame up` has them (a process started by hand has them off).
    for service in SERVICES:
        if f"{service}_health" in {f.name for f in dataclasses.fields(Ports)}:
            assert getattr(ports, f"{service}_health") == SERVICE_PORTS[service].health


def test_helm_values_use_them():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for service, ports in SERVICE_PORTS.items():
        written = values[service]
        assert (written["port"], written["metricsPort"], written["healthPort"]) == as_triple(ports)
    assert values["llm"]["port"] == LLM_PORT
    gpu = yaml.safe_load((CHART / "values-gpu.yaml").read_text())
    assert not [k for s in SERVICES for k in gpu.get(s, {}) if k.lower().endswith("port")]


def test_the_rendered_chart_uses_them(rendered):
    for service, ports in SERVICE_PORTS.items():
        container = containers(rendered.one("Deployment", service))[0]
        named = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert (named["grpc"], named["metrics"], named["health"]) == as_triple(ports)
    redis_service = rendered.one("Service", "redis")
    assert [p["port"] for p in redis_service["spec"]["ports"]] == [REDIS_PORT]
    gateway = env_of(containers(rendered.one("Deployment", "gateway"))[0])
    assert urlsplit(gateway["KAME_GATEWAY_REDIS_URL"]["value"]).port == REDIS_PORT


def test_the_service_dockerfile_exposes_them():
    for service, ports in SERVICE_PORTS.items():
        deps = {"DEPS": "frontend-cpu"} if service == "frontend" else {}
        image = build_image(SERVICE_DOCKERFILE, {"SERVICE": service, **deps})
        assert image.exposed == set(as_triple(ports)), service
    assert build_image(LLM_DOCKERFILE).exposed == {LLM_PORT}


def test_compose_uses_them(configs):
    services = compose_config("--profile", "gpu")["services"]
    by_service = {}
    for name, spec in services.items():
        command = spec.get("command") or []
        if command[:2] == ["python", "-m"] and command[2].startswith("services."):
            by_service.setdefault(command[2].split(".")[1], []).append((name, spec))
    web = configs["web"].load(
        {k: str(v) for k, v in by_service.pop("web")[0][1]["environment"].items()}
    )
    assert (web.port, web.metrics_port) == (WEB_PORTS.http, WEB_PORTS.metrics)
    telephony = configs["telephony"].load(
        {k: str(v) for k, v in by_service.pop("telephony")[0][1]["environment"].items()}
    )
    assert (
        telephony.sip_port,
        telephony.port,
        telephony.audiosocket_port,
        telephony.metrics_port,
    ) == (
        TELEPHONY_PORTS.sip,
        TELEPHONY_PORTS.http,
        TELEPHONY_PORTS.audiosocket,
        TELEPHONY_PORTS.metrics,
    )
    hosts = {}
    for service, specs in by_service.items():
        for name, spec in specs:
            env = {k: str(v) for k, v in spec["environment"].items()}
            loaded = configs[service].load(env)
            assert (loaded.port, loaded.metrics_port) == as_triple(SERVICE_PORTS[service])[:2]
            hosts[name] = service
    gateway = services["gateway"]["environment"]
    for variable in ("KAME_GATEWAY_STT_ADDRESS", "KAME_GATEWAY_ORACLE_ADDRESS"):
        host, port = gateway[variable].split(":")
        assert int(port) == SERVICE_PORTS[hosts[host]].grpc, variable
    for name in ("frontend", "frontend-gpu"):
        address = services[name]["environment"]["KAME_FRONTEND_ADVERTISE_ADDRESS"]
        assert address == f"{name}:{SERVICE_PORTS['frontend'].grpc}"
    (published,) = services["gateway"]["ports"]
    assert int(published["target"]) == int(published["published"]) == SERVICE_PORTS["gateway"].grpc
    llm_command = " ".join(services["llm"]["command"])
    assert re.search(rf"--port {LLM_PORT}\b", llm_command)
    assert f":{LLM_PORT}/v1" in services["oracle"]["environment"]["KAME_ORACLE_BASE_URL"]
    for name, service in hosts.items():
        url = services[name]["environment"].get(f"KAME_{service.upper()}_REDIS_URL")
        assert url is None or urlsplit(url).port in (None, REDIS_PORT), name


def test_the_compose_tls_override_uses_the_health_ports():
    override = yaml.safe_load(TLS_OVERRIDE.read_text())["services"]
    for name, spec in override.items():
        if name in HTTP_SERVICES:
            continue  # HTTP: probed on /healthz, no health port
        service = "frontend" if name.startswith("frontend") else name
        port = spec["environment"][f"KAME_{service.upper()}_HEALTH_PORT"]
        assert int(port) == SERVICE_PORTS[service].health, name


def test_prometheus_scrapes_the_metrics_ports():
    checked = 0
    for job, targets in prometheus_targets().items():
        service = job.removeprefix("kame-")
        for target in targets:
            if service in SERVICE_PORTS:
                assert int(target.split(":")[1]) == SERVICE_PORTS[service].metrics, target
                checked += 1
    assert checked >= len(SERVICE_PORTS)


# ---- `kame up`'s stack file ----------------------------------------------------------------------


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """The temporary directory `kame up` writes its stack file under, the test's own."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_kame_up_does_not_follow_a_symlink_planted_at_its_stack_file(private_tmp):
    """The stack file lives under the shared temporary directory: a link planted at its path
    (pointing at a file of the user's) used to be followed, and that file truncated and
    overwritten. Now `kame up` refuses it and the file is untouched."""
    stack = Stack(StackOptions(log_dir=private_tmp / "logs"))
    victim = private_tmp / "dotfile"
    victim.write_text("precious")
    path = stack_file(stack.ports.gateway)
    path.parent.mkdir(mode=0o700)
    path.symlink_to(victim)
    with pytest.raises(StackError, match="symbolic link"):
        stack.write_stack_file()
    assert victim.read_text() == "precious"


def test_kame_up_refuses_a_stack_folder_others_can_write(private_tmp):
    stack = Stack(StackOptions(log_dir=private_tmp / "logs"))
    folder = stack_file(stack.ports.gateway).parent
    folder.mkdir()
    folder.chmod(0o777)  # as if another user had made it first, for everyone
    with pytest.raises(StackError, match="not a private folder"):
        stack.write_stack_file()
    folder.chmod(0o700)
    stack.write_stack_file()
    assert stack_file(stack.ports.gateway).stat().st_mode & 0o777 == 0o600
