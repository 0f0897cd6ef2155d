"""The web service's deployment: its image, compose service, Helm Deployment, Service and
NetworkPolicy, and the image's health check against a real web service. The gRPC services'
tests (test_chart, test_compose, test_ports, ...) cover what web shares with them: config keys,
env vars, ports, drain."""

from __future__ import annotations

import helm_python as helm
import pytest

from kame_common.ports import SERVICE_PORTS, WEB_PORTS
from tests.deploy.conftest import (
    SERVICE_DOCKERFILE,
    build_image,
    compose_config,
    containers,
    env_of,
    helm_render,
    plain_settings,
    prometheus_targets,
)


def settings_of(deployment: dict) -> dict[str, str]:
    return plain_settings(deployment, "KAME_WEB_")


def test_the_image_exposes_the_web_ports_and_runs_the_service():
    image = build_image(SERVICE_DOCKERFILE, {"SERVICE": "web"})
    assert image.exposed == {WEB_PORTS.http, WEB_PORTS.metrics}
    assert image.env["KAME_SERVICE"] == "web"
    assert not {WEB_PORTS.http, WEB_PORTS.metrics} & {
        port
        for ports in SERVICE_PORTS.values()
        for port in (ports.grpc, ports.metrics, ports.health)
    }


def test_compose_publishes_the_page_on_loopback_in_front_of_the_gateway():
    services = compose_config()["services"]
    web = services["web"]
    (published,) = web["ports"]
    assert (published["host_ip"], int(published["published"]), published["target"]) == (
        "127.0.0.1",
        WEB_PORTS.http,
        WEB_PORTS.http,
    )
    env = web["environment"]
    assert env["KAME_WEB_GATEWAY_ADDRESS"] == f"gateway:{SERVICE_PORTS['gateway'].grpc}"
    assert web["depends_on"]["gateway"]["condition"] == "service_healthy"
    assert prometheus_targets()["kame-web"] == [f"web:{WEB_PORTS.metrics}"]


def test_the_chart_runs_web_with_http_probes_and_the_gateways_address(rendered_sets):
    rendered = rendered_sets["default"]
    deployment = rendered.one("Deployment", "web")
    (container,) = containers(deployment)
    assert container["command"] == ["python", "-m", "services.web"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": WEB_PORTS.http, "metrics": WEB_PORTS.metrics}
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "http"}, probe
    gateway = rendered.one("Service", "gateway")
    gateway_port = {p["name"]: p["port"] for p in gateway["spec"]["ports"]}["grpc"]
    settings = settings_of(deployment)
    assert settings["KAME_WEB_GATEWAY_ADDRESS"] == f"{gateway['metadata']['name']}:{gateway_port}"
    assert "KAME_WEB_GATEWAY_TLS" not in settings and "KAME_WEB_GATEWAY_CA_FILE" not in settings
    service = rendered.one("Service", "web")
    assert {p["name"]: p["targetPort"] for p in service["spec"]["ports"]} == {
        "http": "http",
        "metrics": "metrics",
    }
    assert service["spec"]["type"] == "ClusterIP"
    assert "port-forward svc/kame-web" in rendered.notes


LOGIN_PODS = [{"podSelector": {"matchLabels": {"app": "oauth2-proxy"}}}]
RELAY = {
    "secrets": {"existingSecret": "kame-keys", "webGatewayAuthTokenKey": "WEB_TOKEN"},
    "web": {"config": {"relay_token_behind_login": True}},
    "networkPolicy": {"webFrom": LOGIN_PODS},
}


def test_the_bridge_token_comes_from_the_secret_behind_the_operators_login():
    rendered = helm_render(RELAY)
    (container,) = containers(rendered.one("Deployment", "web"))
    env = env_of(container)
    assert env["KAME_WEB_GATEWAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "kame-keys",
        "key": "WEB_TOKEN",
    }
    assert (
        settings_of(rendered.one("Deployment", "web"))["KAME_WEB_RELAY_TOKEN_BEHIND_LOGIN"]
        == "true"
    )
    assert policy(rendered, "web")["ingress"][0]["from"] == LOGIN_PODS


@pytest.mark.parametrize(
    ("missing", "error"),
    [
        ({"networkPolicy": {"webFrom": []}}, r"networkPolicy\.webFrom"),
        ({"networkPolicy": {"enabled": False, "webFrom": LOGIN_PODS}}, r"networkPolicy\.webFrom"),
        ({"web": {"config": {}}}, r"relay_token_behind_login"),
    ],
)
def test_a_relay_token_needs_the_login_in_front_and_only_it_reaching_the_page(missing, error):
    """The attack: a token for the bridge while anyone reaches the page (no webFrom, or
    no NetworkPolicy) or with nobody saying a login guards it: the chart refuses."""
    values = {**RELAY, **missing}
    with pytest.raises(helm.HelmError, match=error):
        helm_render(values)


def policy(rendered, component: str) -> dict:
    return rendered.one("NetworkPolicy", component)["spec"]


def test_web_may_reach_dns_and_the_gateway_only(rendered_sets):
    rendered = rendered_sets["default"]
    spec = policy(rendered, "web")
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    gateway_pods = policy(rendered, "gateway")["podSelector"]
    (dns, to_gateway) = spec["egress"]
    assert {p["port"] for p in dns["ports"]} == {53}
    assert to_gateway["to"] == [{"podSelector": gateway_pods}]
    assert to_gateway["ports"] == [{"port": SERVICE_PORTS["gateway"].grpc, "protocol": "TCP"}]
    page, metrics = spec["ingress"]
    assert page == {"ports": [{"port": "http", "protocol": "TCP"}]}  # any browser by default
    assert metrics["ports"] == [{"port": "metrics", "protocol": "TCP"}] and metrics["from"]


def test_a_restricted_gateway_still_takes_the_web_pods():
    clients = [{"ipBlock": {"cidr": "203.0.113.0/24"}}]
    rendered = helm_render({"networkPolicy": {"gatewayFrom": clients}})
    converse = policy(rendered, "gateway")["ingress"][0]
    web_pods = policy(rendered, "web")["podSelector"]
    assert converse["from"][: len(clients)] == clients  # then this release's gateway clients
    assert {"podSelector": web_pods} in converse["from"]
    ingress = [{"podSelector": {"matchLabels": {"app": "ingress-nginx"}}}]
    page = policy(helm_render({"networkPolicy": {"webFrom": ingress}}), "web")["ingress"][0]
    assert page["from"] == ingress
