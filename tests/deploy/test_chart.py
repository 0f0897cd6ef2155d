"""The Helm chart (deploy/helm/kame): lint, render, offline Kubernetes schema validation, and
agreement with the services' real configuration. NetworkPolicies, the Redis password, TLS and the
refusal of inline secrets are in test_chart_security.py; ports in test_ports.py.

Rendering and lint run through helm-python-sdk (Helm v4's own Go library); the manifests are
validated with kubernetes-validate's bundled OpenAPI schemas (strict: unknown fields fail) for
the oldest Kubernetes the chart supports and the newest the package knows. Nothing here needs
a cluster or the network.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import importlib.util
import math
import re
import shlex

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate import utils as kv_utils

from kame_cli import llm_server
from kame_cli.main import COMMANDS
from kame_common.server import LIVENESS
from tests.deploy.conftest import (
    CHART,
    HEALTH_PORTS,
    HTTP_SERVICES,
    KAME_SERVICES,
    METRICS_PORTS,
    PORTS,
    ROOT,
    SERVICES,
    containers,
    env_of,
    helm_render,
    kubelet_expand,
)

# The chart's kubeVersion floor (native gRPC probes are GA from 1.27) and the newest known.
KUBE_VERSIONS = ("1.27.0", kv_utils.latest_version())
GPU = "nvidia.com/gpu"
# Fields the chart sets itself (so they agree with Services, probes, mounts and each other) or
# leaves at the service default on purpose; every other field is a `config` key in
# values.schema.json, except the secrets, which come only from secrets.existingSecret.
CHART_OWNED_COMMON = {
    "host",
    "port",
    "metrics_port",
    "health_port",
    "grace_s",
    "max_sessions",
    "otlp_endpoint",
    # OTLP over TLS: the chart takes an https:// tracing.otlpEndpoint (system roots);
    # a private collector CA is not mounted by the chart.
    "otlp_ca_file",
    "redis_url",
    "tls_cert_file",
    "tls_key_file",
    "tls_client_ca_file",
}
CHART_OWNED = {
    "gateway": {
        "stt_address",
        "oracle_address",
        "frontend_address",
        "upstream_ca_file",
        "upstream_cert_file",
        "upstream_key_file",
        "upstream_server_name",
    },
    # Capacity registry records: the pod's name and IP; stt and oracle always publish (the
    # gateway's capacity_admission decides whether anyone is refused).
    "frontend": {"replica_id", "advertise_address"},
    "stt": {"publish_capacity", "replica_id", "advertise_address"},
    "oracle": {"publish_capacity", "replica_id", "advertise_address"},
    "web": {"gateway_address", "gateway_ca_file", "gateway_tls"},
    # Ports the Services, NetworkPolicy and probes name, and the RTP range they must agree on.
    "telephony": {
        "gateway_address",
        "gateway_ca_file",
        "gateway_tls",
        "sip_port",
        "audiosocket_port",
        "rtp_port_first",
        "rtp_port_last",
    },
}
# The upstreams the gateway balances over, per pod, through a headless Service.
BALANCED = ("stt", "oracle")
SECRET_FIELDS = {
    "gateway": {"auth_tokens", "registry_secret", "resume_secret"},
    "frontend": {"registry_secret"},
    "stt": {"registry_secret"},
    "oracle": {"registry_secret"},
    "web": {"gateway_auth_token"},
    "telephony": {"gateway_auth_token", "twilio_auth_token"},
}
# Inherited from ServiceSettings but without effect: web and telephony serve no gRPC (their
# channel to the gateway keeps alive; connection age is a gRPC server's).
NOT_APPLICABLE = {
    service: {"reflection", "max_connection_age_s", "max_connection_age_grace_s"}
    for service in HTTP_SERVICES
}


def test_lint_has_no_errors_or_warnings():
    for values_file in ("values.yaml", "values-gpu.yaml"):
        values = yaml.safe_load((CHART / values_file).read_text())
        report = helm.lint(CHART, values, strict=True, kube_version="v1.27.0")
        problems = [m for m in report["messages"] if m["severity"] >= 2]
        assert not report["errors"] and not problems, (values_file, report)


def test_manifests_pass_kubernetes_schema_validation(rendered):
    """Every built-in object is valid against the strict OpenAPI schemas (no unknown field)."""
    checked = 0
    for doc in rendered.documents:
        if doc["apiVersion"].startswith(("monitoring.coreos.com/", "cert-manager.io/")):
            continue  # CRDs: checked structurally (test_service_monitor_*, test_cert_manager_*)
        for version in KUBE_VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)
        checked += 1
    assert checked >= 15


def test_validation_catches_a_broken_manifest(rendered_sets):
    """The validator really checks: a typo'd field and a wrong type are both refused."""
    deployment = rendered_sets["default"].one("Deployment", "frontend")
    typo = copy.deepcopy(deployment)
    typo["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {"grpc": {"port": 1}}
    wrong_type = copy.deepcopy(deployment)
    wrong_type["spec"]["template"]["spec"]["containers"][0]["startupProbe"]["grpc"]["port"] = "x"
    for broken in (typo, wrong_type):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, KUBE_VERSIONS[0], strict=True)


def test_gpu_values_request_nvidia_gpus_with_scheduling(rendered_sets):
    spec = rendered_sets["gpu"].one("Deployment", "frontend")["spec"]["template"]["spec"]
    resources = spec["containers"][0]["resources"]
    assert resources["limits"][GPU] == 1 and resources["requests"][GPU] == 1
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": GPU, "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    env = env_of(spec["containers"][0])
    assert env["KAME_FRONTEND_ENGINE"]["value"] == "kame"
    assert env["KAME_FRONTEND_DEVICE"]["value"] == "cuda"
    # The checkpoint PVC is mounted read-only where KAME_FRONTEND_CHECKPOINT points.
    mounts = {m["name"]: m for m in spec["containers"][0]["volumeMounts"]}
    assert mounts["checkpoint"]["readOnly"] is True
    assert env["KAME_FRONTEND_CHECKPOINT"]["value"].startswith(mounts["checkpoint"]["mountPath"])
    claim = next(v for v in spec["volumes"] if v["name"] == "checkpoint")["persistentVolumeClaim"]
    assert claim == {"claimName": "kame-checkpoints", "readOnly": True}
    assert spec["containers"][0]["image"].endswith("-cuda")


def test_default_values_request_no_gpu(rendered_sets):
    for deployment in rendered_sets["default"].of_kind("Deployment"):
        for container in containers(deployment):
            assert GPU not in str(container["resources"]), deployment["metadata"]["name"]


def test_every_deployment_container_requests_cpu_and_memory(rendered):
    deployments = rendered.of_kind("Deployment")
    assert {d["metadata"]["labels"]["app.kubernetes.io/component"] for d in deployments} >= {
        *SERVICES,
        "redis",
    }
    for deployment in deployments:
        for container in containers(deployment):
            requests = container.get("resources", {}).get("requests", {})
            assert requests.get("cpu") and requests.get("memory"), (
                deployment["metadata"]["name"],
                container["name"],
            )


def test_grpc_services_use_native_grpc_probes_on_their_plaintext_health_port(rendered):
    """The kubelet cannot speak the services' TLS: every probe asks grpc.health.v1 on the
    health port, which the service opens because the chart sets its HEALTH_PORT."""
    for service in SERVICES:
        container = containers(rendered.one("Deployment", service))[0]
        port = {p["name"]: p["containerPort"] for p in container["ports"]}["health"]
        assert port == HEALTH_PORTS[service]
        assert env_of(container)[f"KAME_{service.upper()}_HEALTH_PORT"]["value"] == str(port)
        # Readiness asks the whole server; startup and liveness only whether the process
        # works (a gateway waiting for its upstreams is alive: kame_common.server.LIVENESS).
        assert container["readinessProbe"]["grpc"] == {"port": port}, service
        for probe in ("startupProbe", "livenessProbe"):
            assert container[probe]["grpc"] == {"port": port, "service": LIVENESS}, (service, probe)
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert "httpGet" not in container[probe] and "exec" not in container[probe]


def test_startup_probes_allow_for_model_load(rendered_sets):
    def allowed_s(rendered, service):
        probe = containers(rendered.one("Deployment", service))[0]["startupProbe"]
        return probe["periodSeconds"] * probe["failureThreshold"]

    assert allowed_s(rendered_sets["default"], "frontend") >= 180
    assert allowed_s(rendered_sets["gpu"], "frontend") >= 600
    assert allowed_s(rendered_sets["default"], "stt") >= 60


def test_drain_outlasts_grace(rendered):
    """preStop sleep + the service's grace_s fit inside terminationGracePeriodSeconds."""
    for service in SERVICES:
        pod = rendered.one("Deployment", service)["spec"]["template"]["spec"]
        container = pod["containers"][0]
        grace_s = float(env_of(container)[f"KAME_{service.upper()}_GRACE_S"]["value"])
        pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
        assert pre_stop[0] == "sleep"
        assert pod["terminationGracePeriodSeconds"] > math.ceil(grace_s) + int(pre_stop[1]), service


def test_gpu_frontend_grace_follows_values(rendered_sets):
    pod = rendered_sets["gpu"].one("Deployment", "frontend")["spec"]["template"]["spec"]
    assert env_of(pod["containers"][0])["KAME_FRONTEND_GRACE_S"]["value"] == "120"
    assert pod["terminationGracePeriodSeconds"] > 125


def test_pod_disruption_budgets_select_their_pods(rendered):
    for service in SERVICES:
        pdb = rendered.one("PodDisruptionBudget", service)
        pod_labels = rendered.one("Deployment", service)["spec"]["template"]["metadata"]["labels"]
        assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


def test_balanced_services_are_headless(rendered_sets):
    """stt and oracle Services return pod IPs (clusterIP: None), so one gateway spreads its
    sessions over every pod; the gateway and frontend keep a virtual IP (the frontend is
    chosen through the capacity registry). `service.headless: false` gives stt a VIP back."""
    rendered = rendered_sets["default"]
    for service in SERVICES:
        headless = rendered.one("Service", service)["spec"].get("clusterIP") == "None"
        assert headless == (service in BALANCED), service
    with_vip = helm_render({"stt": {"service": {"headless": False}}})
    assert "clusterIP" not in with_vip.one("Service", "stt")["spec"]
    assert with_vip.one("Service", "oracle")["spec"]["clusterIP"] == "None"


def test_services_route_to_the_container_ports(rendered):
    for service in SERVICES:
        svc = rendered.one("Service", service)
        pod = rendered.one("Deployment", service)["spec"]["template"]
        assert svc["spec"]["type"] == "ClusterIP"
        assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
        ports = {p["name"]: p for p in svc["spec"]["ports"]}
        assert ports["grpc"]["port"] == PORTS[service]
        assert ports["metrics"]["port"] == METRICS_PORTS[service]
        assert ports["health"]["port"] == HEALTH_PORTS[service]
        container_ports = {
            p["name"] for p in containers(rendered.one("Deployment", service))[0]["ports"]
        }
        assert {p["targetPort"] for p in ports.values()} <= container_ports


def test_a_published_gateway_exposes_only_the_converse_port(rendered_sets):
    """values-gpu.yaml publishes the gateway on a LoadBalancer: a second Service with the
    Converse port alone; metrics and health stay on the ClusterIP Service."""
    public = rendered_sets["gpu"].one("Service", "gateway-public")
    assert public["spec"]["type"] == "LoadBalancer"
    assert [p["name"] for p in public["spec"]["ports"]] == ["grpc"]
    gateway_pods = rendered_sets["gpu"].one("Deployment", "gateway")["spec"]["template"]
    assert public["spec"]["selector"].items() <= gateway_pods["metadata"]["labels"].items()
    assert not [
        s
        for s in rendered_sets["default"].of_kind("Service")
        if s["metadata"]["labels"]["app.kubernetes.io/component"] == "gateway-public"
    ]
    rendered = helm_render(
        {
            "gateway": {
                "service": {
                    "type": "LoadBalancer",
                    "annotations": {"example.com/lb": "internal"},
                    "loadBalancerSourceRanges": ["203.0.113.0/24"],
                    "externalTrafficPolicy": "Local",
                }
            },
            # Published only with TLS and client authentication (test_chart_security.py).
            "tls": {"gateway": {"enabled": True, "existingSecret": "kame-gateway-tls"}},
            "secrets": {"existingSecret": "kame-keys", "gatewayAuthTokensKey": "TOKENS"},
        }
    )
    public = rendered.one("Service", "gateway-public")["spec"]
    assert public["loadBalancerSourceRanges"] == ["203.0.113.0/24"]
    assert public["externalTrafficPolicy"] == "Local"
    assert rendered.one("Service", "gateway-public")["metadata"]["annotations"] == {
        "example.com/lb": "internal"
    }
    assert "annotations" not in rendered.one("Service", "gateway")["metadata"]


def test_schema_config_keys_are_the_services_real_fields(configs):
    """values.schema.json's `config` of each service lists exactly the fields the chart does not
    set itself and that are no secret, with the dataclass's type and choices."""
    with helm.Chart.load(CHART) as chart:
        schema = chart.schema
    for service, config in configs.items():
        config_schema = schema["properties"][service]["properties"]["config"]
        properties = config_schema["properties"]
        not_config = (
            CHART_OWNED_COMMON
            | CHART_OWNED[service]
            | SECRET_FIELDS.get(service, set())
            | NOT_APPLICABLE.get(service, set())
        )
        assert set(properties) == config.known_fields - not_config, service
        assert config_schema["additionalProperties"] is False
        for name, prop in properties.items():
            assert prop["type"] == config.json_type(name), (service, name)
            field = config.fields.get(name)
            choices = field.metadata.get("choices") if field else None
            assert prop.get("enum") == (list(choices) if choices else None), (service, name)


def test_every_kame_env_var_is_a_real_config_field(rendered, configs):
    """Each service's rendered environment loads through the service's own config loader
    (the pod's $(POD_IP) / $(POD_NAME) filled in as the kubelet would)."""
    pod = {"POD_IP": "10.1.2.3", "POD_NAME": "kame-frontend-7d9f-abcde", "REDIS_PASSWORD": "pw"}
    for service, config in configs.items():
        container = containers(rendered.one("Deployment", service))[0]
        env = env_of(container)
        kame_vars = [name for name in env if name.startswith("KAME_")]
        assert kame_vars, service
        for name in kame_vars:
            field = config.env_fields([name]).get(name)
            assert field in config.known_fields, f"{service}: {name} is not a field of {config.cls}"
        values = {n: kubelet_expand(e["value"], pod) for n, e in env.items() if "value" in e}
        loaded = config.load(values)
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        served = ports["http"] if service in HTTP_SERVICES else ports["grpc"]
        assert (loaded.port, loaded.metrics_port) == (served, ports["metrics"])


def test_addresses_between_services_agree(rendered):
    services = {
        s["metadata"]["name"]: {p["name"]: p["port"] for p in s["spec"]["ports"]}
        for s in rendered.of_kind("Service")
    }
    gateway = env_of(containers(rendered.one("Deployment", "gateway"))[0])
    for target in ("stt", "oracle", "frontend"):
        address = gateway[f"KAME_GATEWAY_{target.upper()}_ADDRESS"]["value"]
        if target in BALANCED:  # a DNS target the gateway's round_robin channel spreads over
            assert address.startswith("dns:///"), address
            address = address.removeprefix("dns:///")
        host, port = address.split(":")
        assert services[host]["grpc"] == int(port) == PORTS[target]
    # Every replica that publishes in the capacity registry does so under its pod's name and IP.
    for service in ("frontend", "stt", "oracle"):
        env = env_of(containers(rendered.one("Deployment", service))[0])
        prefix = f"KAME_{service.upper()}_"
        assert env[f"{prefix}ADVERTISE_ADDRESS"]["value"] == f"$(POD_IP):{PORTS[service]}"
        assert env[f"{prefix}REPLICA_ID"]["value"] == "$(POD_NAME)"
        names = list(env)
        # The kubelet expands only variables defined earlier in the list.
        assert names.index("POD_IP") < names.index(f"{prefix}ADVERTISE_ADDRESS")
        assert names.index("POD_NAME") < names.index(f"{prefix}REPLICA_ID")
        if service != "frontend":  # it always publishes; stt and oracle do when told to
            assert env[f"{prefix}PUBLISH_CAPACITY"]["value"] == "true"


def test_oracle_uses_the_embedded_llm_or_the_configured_url(rendered_sets):
    default = env_of(containers(rendered_sets["default"].one("Deployment", "oracle"))[0])
    llm_service = rendered_sets["default"].one("Service", "llm")
    llm_port = llm_service["spec"]["ports"][0]["port"]
    assert default["KAME_ORACLE_BASE_URL"]["value"] == (
        f"http://{llm_service['metadata']['name']}:{llm_port}/v1"
    )
    gpu = env_of(containers(rendered_sets["gpu"].one("Deployment", "oracle"))[0])
    assert gpu["KAME_ORACLE_BASE_URL"]["value"] == "https://api.openai.com/v1"
    assert not rendered_sets["gpu"].of_kind("Service") or all(
        s["metadata"]["labels"]["app.kubernetes.io/component"] != "llm"
        for s in rendered_sets["gpu"].of_kind("Service")
    )


def test_commands_run_the_service_modules(rendered):
    for deployment in rendered.of_kind("Deployment"):
        container = containers(deployment)[0]
        command = container.get("command", [])
        if command[:2] == ["python", "-m"]:
            assert importlib.util.find_spec(command[2]) is not None, command
            if command[2] == "kame_cli":
                parser = argparse.ArgumentParser()
                llm_server.add_arguments(parser)
                args = parser.parse_args(command[4:])
                assert args.host == "0.0.0.0"
                ports = {p["name"]: p["containerPort"] for p in container["ports"]}
                assert args.port == ports["http"]


def test_hpa_scales_frontend_on_active_sessions(rendered_sets):
    hpa = rendered_sets["gpu"].one("HorizontalPodAutoscaler", "frontend")
    assert (
        hpa["spec"]["scaleTargetRef"]["name"]
        == rendered_sets["gpu"].one("Deployment", "frontend")["metadata"]["name"]
    )
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    assert metric["pods"]["metric"]["name"] == "kame_frontend_active_sessions"
    assert metric["pods"]["target"] == {"type": "AverageValue", "averageValue": "6"}
    # The Deployment leaves replicas to the HPA.
    assert "replicas" not in rendered_sets["gpu"].one("Deployment", "frontend")["spec"]


def test_prometheus_adapter_rule_serves_the_hpa_metric(rendered_sets, defined_metrics):
    adapter = yaml.safe_load(
        (ROOT / "deploy/prometheus/prometheus-adapter-values.yaml").read_text()
    )
    (rule,) = adapter["rules"]["custom"]
    hpa_metric = rendered_sets["gpu"].one("HorizontalPodAutoscaler", "frontend")["spec"]["metrics"][
        0
    ]["pods"]["metric"]["name"]
    assert rule["name"]["as"] == hpa_metric
    series = re.match(r"([a-z_]+)\{", rule["seriesQuery"]).group(1)
    assert defined_metrics.get(series) == "Gauge"
    assert (
        'service="frontend"' in rule["seriesQuery"] and 'service="frontend"' in rule["metricsQuery"]
    )
    assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}


def test_service_monitor_scrapes_the_metrics_ports(rendered_sets):
    rendered = rendered_sets["gpu"]
    (monitor,) = rendered.of_kind("ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    selector = monitor["spec"]["selector"]
    (expression,) = selector["matchExpressions"]
    selected = [
        s
        for s in rendered.of_kind("Service")
        if selector["matchLabels"].items() <= s["metadata"]["labels"].items()
        and s["metadata"]["labels"]["app.kubernetes.io/component"] in expression["values"]
    ]
    assert sorted(
        s["metadata"]["labels"]["app.kubernetes.io/component"] for s in selected
    ) == sorted(KAME_SERVICES)
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["honorLabels"] is True  # keeps kame_active_sessions{service=...}
    for service in selected:
        assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert not rendered_sets["default"].of_kind("ServiceMonitor")


def test_pods_run_as_non_root_with_read_only_root(rendered):
    for deployment in rendered.of_kind("Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["automountServiceAccountToken"] is False
        for container in pod["containers"]:
            assert container["securityContext"]["readOnlyRootFilesystem"] is True
            assert container["securityContext"]["allowPrivilegeEscalation"] is False


def test_external_redis_and_missing_url():
    rendered = helm_render({"redis": {"enabled": False, "externalUrl": "redis://cache:6379/2"}})
    assert not [
        d
        for d in rendered.of_kind("Deployment")
        if d["metadata"]["labels"]["app.kubernetes.io/component"] == "redis"
    ]
    for service in SERVICES:
        env = env_of(containers(rendered.one("Deployment", service))[0])
        assert env[f"KAME_{service.upper()}_REDIS_URL"]["value"] == "redis://cache:6379/2"
        assert "REDIS_PASSWORD" not in env  # no password key: an external Redis without one
    with pytest.raises(helm.HelmError, match=r"redis\.externalUrl"):
        helm_render({"redis": {"enabled": False}})
    with pytest.raises(helm.HelmError, match=r"secrets\.existingSecret"):
        helm_render({"redis": {"enabled": False}, "secrets": {"redisUrlKey": "REDIS_URL"}})
    # The in-release Redis wins over a URL key: one REDIS_URL, never two.
    rendered = helm_render({"secrets": {"existingSecret": "k", "redisUrlKey": "REDIS_URL"}})
    names = [e["name"] for e in containers(rendered.one("Deployment", "gateway"))[0]["env"]]
    assert names.count("KAME_GATEWAY_REDIS_URL") == 1


def test_config_reaches_the_service_and_ports_move_together():
    rendered = helm_render({"gateway": {"config": {"default_mode": "cascade"}, "port": 6000}})
    gateway = containers(rendered.one("Deployment", "gateway"))[0]
    env = env_of(gateway)
    assert env["KAME_GATEWAY_DEFAULT_MODE"]["value"] == "cascade"
    assert env["KAME_GATEWAY_PORT"]["value"] == "6000"
    assert rendered.one("Service", "gateway")["spec"]["ports"][0]["port"] == 6000
    rendered = helm_render({"stt": {"healthPort": 7000}})
    stt = containers(rendered.one("Deployment", "stt"))[0]
    assert env_of(stt)["KAME_STT_HEALTH_PORT"]["value"] == "7000"
    assert stt["readinessProbe"]["grpc"]["port"] == 7000


@pytest.mark.parametrize("values", ["default", "gpu"])
def test_notes_tell_how_to_connect(rendered_sets, values):
    notes = rendered_sets[values].notes
    # The kame commands it shows are valid for the CLI.
    commands = [
        shlex.split(line.strip().replace("$GATEWAY", "127.0.0.1:50051"))
        for line in notes.splitlines()
        if line.strip().startswith("kame ")
    ]
    assert [c[1] for c in commands] == ["say", "talk"]
    for command in commands:
        module = importlib.import_module(COMMANDS[command[1]][0])
        parser = argparse.ArgumentParser()
        module.add_arguments(parser)
        _, unknown = parser.parse_known_args(command[2:])
        assert not [u for u in unknown if u.startswith("-")], unknown
    if values == "default":
        assert "port-forward svc/kame-gateway 50051:50051" in notes
        assert "TLS: client port off (plaintext)" in notes
        assert "--ca-file" not in notes
    else:
        assert "get svc kame-gateway-public" in notes and "loadBalancer" in notes
        assert "prometheus-adapter" in notes and "1 x nvidia.com/gpu" in notes
        assert "export KAME_AUTH_TOKEN=$(kubectl -n voice get secret kame-keys" in notes
        assert "--ca-file ca.crt" in notes and "secret kame-gateway-tls" in notes
        assert "password from secret kame-keys key REDIS_PASSWORD" in notes
