"""The telephony service's deployment: its image, compose service, Helm Deployment, Services
and NetworkPolicy, and the image's health check against a real telephony service. What it
shares with the other services (config keys, env vars, secrets by reference, drain) is checked
with them in test_chart, test_chart_security, test_compose and test_ports; the ports here are
kame_common/ports.py's TELEPHONY_PORTS, the one place they are written."""

from __future__ import annotations

import helm_python as helm
import kubernetes_validate
import pytest

from kame_common.ports import SERVICE_PORTS, TELEPHONY_PORTS, WEB_PORTS
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
from tests.deploy.test_chart import KUBE_VERSIONS
from tests.deploy.test_chart_security import Pod, allowed, chart_pods, outside

RTP = range(TELEPHONY_PORTS.rtp_first, TELEPHONY_PORTS.rtp_last + 1)
LOAD_BALANCER = {"telephony": {"service": {"type": "LoadBalancer"}}}


def settings_of(deployment: dict) -> dict[str, str]:
    return plain_settings(deployment, "KAME_TELEPHONY_")


def named_ports(service: dict) -> dict[str, tuple[int, str]]:
    return {p["name"]: (p["port"], p["protocol"]) for p in service["spec"]["ports"]}


# ---- image --------------------------------------------------------------------------------------


def test_the_image_exposes_the_telephony_ports_and_runs_the_service():
    image = build_image(SERVICE_DOCKERFILE, {"SERVICE": "telephony"})
    tcp = {TELEPHONY_PORTS.http, TELEPHONY_PORTS.audiosocket, TELEPHONY_PORTS.metrics}
    assert image.exposed == tcp
    assert image.exposed_ports("udp") == {TELEPHONY_PORTS.sip, *RTP}
    assert image.env["KAME_SERVICE"] == "telephony"
    taken = {
        port
        for ports in SERVICE_PORTS.values()
        for port in (ports.grpc, ports.metrics, ports.health)
    } | {WEB_PORTS.http, WEB_PORTS.metrics}
    assert not tcp & taken


# ---- compose ------------------------------------------------------------------------------------


def published(spec: dict) -> dict[tuple[int, str], dict]:
    """{(container port, protocol): its compose `ports` entry}, ranges expanded."""
    result = {}
    for entry in spec["ports"]:
        first, _, last = str(entry["published"]).partition("-")
        for offset in range(int(last or first) - int(first) + 1):
            result[(int(entry["target"]) + offset, entry["protocol"])] = {
                **entry,
                "published": int(first) + offset,
            }
    return result


def test_compose_publishes_sip_twilio_audiosocket_and_a_small_rtp_range_on_loopback(configs):
    telephony = compose_config()["services"]["telephony"]
    environment = {k: str(v) for k, v in telephony["environment"].items()}
    settings = configs["telephony"].load(environment)
    rtp = range(settings.rtp_port_first, settings.rtp_port_last + 1)
    assert len(rtp) <= 50  # each published UDP port is a NAT rule and a proxy
    ports = published(telephony)
    assert set(ports) == {
        (settings.sip_port, "udp"),
        (settings.port, "tcp"),
        (settings.audiosocket_port, "tcp"),
        *((port, "udp") for port in rtp),
    }
    for (target, _), entry in ports.items():
        assert entry["host_ip"] == "127.0.0.1" and entry["published"] == target
    # The default ports, with metrics for Prometheus on the compose network only.
    assert (settings.sip_port, settings.port, settings.audiosocket_port) == (
        TELEPHONY_PORTS.sip,
        TELEPHONY_PORTS.http,
        TELEPHONY_PORTS.audiosocket,
    )
    assert settings.metrics_port == TELEPHONY_PORTS.metrics
    assert (settings.port, settings.metrics_port) != (0, 0)
    assert settings.gateway_address == f"gateway:{SERVICE_PORTS['gateway'].grpc}"
    assert telephony["depends_on"]["gateway"]["condition"] == "service_healthy"
    # Only loopback by default: Docker's bridge range (where its proxy makes every outside
    # caller come from, on Docker Desktop and rootless podman) is the operator's to list.
    assert settings.caller_allowed("127.0.0.1") and not settings.caller_allowed("172.18.0.1")
    assert not settings.caller_allowed("203.0.113.7")
    assert not settings.twilio_auth_token  # unless the shell gives one
    assert prometheus_targets()["kame-telephony"] == [f"telephony:{TELEPHONY_PORTS.metrics}"]


def test_compose_takes_the_twilio_token_and_the_callers_from_the_shell(configs):
    env = {
        "KAME_TELEPHONY_TWILIO_AUTH_TOKEN": "0123456789abcdef0123456789abcdef",
        "KAME_TELEPHONY_ALLOWED_NETWORKS": "198.51.100.0/24",
        "KAME_TELEPHONY_SIP_ADVERTISED_IP": "192.0.2.10",
        "KAME_BIND": "0.0.0.0",
    }
    telephony = compose_config(env=env)["services"]["telephony"]
    settings = configs["telephony"].load({k: str(v) for k, v in telephony["environment"].items()})
    assert settings.twilio_auth_token == env["KAME_TELEPHONY_TWILIO_AUTH_TOKEN"]
    assert settings.caller_allowed("198.51.100.7") and not settings.caller_allowed("127.0.0.1")
    assert settings.advertised_ip == "192.0.2.10"
    assert {entry["host_ip"] for entry in published(telephony).values()} == {"0.0.0.0"}


# ---- the chart ----------------------------------------------------------------------------------


def test_the_chart_runs_telephony_with_http_probes_the_ports_and_the_gateways_address(
    rendered, configs
):
    deployment = rendered.one("Deployment", "telephony")
    (container,) = containers(deployment)
    assert container["command"] == ["python", "-m", "services.telephony"]
    ports = {p["name"]: (p["containerPort"], p["protocol"]) for p in container["ports"]}
    assert ports == {
        "sip": (TELEPHONY_PORTS.sip, "UDP"),
        "http": (TELEPHONY_PORTS.http, "TCP"),
        "audiosocket": (TELEPHONY_PORTS.audiosocket, "TCP"),
        "metrics": (TELEPHONY_PORTS.metrics, "TCP"),
    }
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "http"}, probe
    settings = configs["telephony"].load(
        {k: v.replace("$(POD_IP)", "10.1.2.3") for k, v in settings_of(deployment).items()}
    )
    assert (settings.sip_port, settings.rtp_port_first, settings.rtp_port_last) == (
        TELEPHONY_PORTS.sip,
        TELEPHONY_PORTS.rtp_first,
        TELEPHONY_PORTS.rtp_last,
    )
    assert settings.advertised_ip == "10.1.2.3"  # SDP names the pod, which RTP reaches
    gateway = rendered.one("Service", "gateway")
    gateway_port = {p["name"]: p["port"] for p in gateway["spec"]["ports"]}["grpc"]
    assert settings.gateway_address == f"{gateway['metadata']['name']}:{gateway_port}"
    service = rendered.one("Service", "telephony")
    assert service["spec"]["type"] == "ClusterIP"
    assert named_ports(service) == {name: port for name, port in ports.items()}
    assert {p["targetPort"] for p in service["spec"]["ports"]} == set(ports)
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert "hostNetwork" not in deployment["spec"]["template"]["spec"]
    assert "Or call from a phone (service kame-telephony)" in rendered.notes


def test_drain_outlasts_grace(rendered_sets):
    pod = rendered_sets["default"].one("Deployment", "telephony")["spec"]["template"]["spec"]
    grace_s = float(env_of(pod["containers"][0])["KAME_TELEPHONY_GRACE_S"]["value"])
    sleep_s = int(pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][1])
    assert pod["terminationGracePeriodSeconds"] > grace_s + sleep_s


def test_a_load_balancer_publishes_sip_http_audiosocket_and_optionally_rtp_never_metrics():
    assert not [
        s
        for s in helm_render().of_kind("Service")
        if s["metadata"]["labels"]["app.kubernetes.io/component"] == "telephony-public"
    ]
    values = {
        "telephony": {
            "rtpPortFirst": 40000,
            "rtpPortLast": 40009,
            "service": {
                "type": "LoadBalancer",
                "externalTrafficPolicy": "Local",
                "loadBalancerSourceRanges": ["198.51.100.0/24"],
            },
        }
    }
    rendered = helm_render(values)
    public = rendered.one("Service", "telephony-public")
    assert public["spec"]["type"] == "LoadBalancer"
    assert public["spec"]["externalTrafficPolicy"] == "Local"
    assert public["spec"]["loadBalancerSourceRanges"] == ["198.51.100.0/24"]
    assert named_ports(public) == {
        "sip": (TELEPHONY_PORTS.sip, "UDP"),
        "http": (TELEPHONY_PORTS.http, "TCP"),
        "audiosocket": (TELEPHONY_PORTS.audiosocket, "TCP"),
    }
    assert "kame-telephony-public" in rendered.notes
    values["telephony"]["service"]["rtp"] = True
    public = helm_render(values).one("Service", "telephony-public")
    rtp = {p["port"]: p for p in public["spec"]["ports"] if p["name"].startswith("rtp-")}
    assert sorted(rtp) == list(range(40000, 40010))
    assert all(p["protocol"] == "UDP" and p["targetPort"] == n for n, p in rtp.items())
    assert all(len(p["name"]) <= 15 for p in public["spec"]["ports"])  # IANA_SVC_NAME


def test_rtp_on_a_service_needs_a_load_balancer_and_a_small_range():
    with pytest.raises(helm.HelmError, match=r"service\.type=LoadBalancer"):
        helm_render({"telephony": {"service": {"type": "ClusterIP", "rtp": True}}})
    with pytest.raises(helm.HelmError, match="100 ports or fewer"):
        helm_render({"telephony": {"service": {"type": "LoadBalancer", "rtp": True}}})
    with pytest.raises(helm.HelmError, match="rtpPortLast"):
        helm_render({"telephony": {"rtpPortFirst": 41000, "rtpPortLast": 40000}})


def test_host_network_binds_the_nodes_ports_and_still_resolves_the_gateway(configs):
    rendered = helm_render({"telephony": {"hostNetwork": True, "rtpPortLast": 40099}})
    deployment = rendered.one("Deployment", "telephony")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True
    assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"  # the gateway's Service name resolves
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0
    settings = configs["telephony"].load(
        {k: v.replace("$(POD_IP)", "192.0.2.4") for k, v in settings_of(deployment).items()}
    )
    assert (settings.rtp_port_first, settings.rtp_port_last) == (40000, 40099)
    assert settings.advertised_ip == "192.0.2.4"  # a host-network pod's IP is the node's
    # NetworkPolicy does not govern host-network pods: none pretends to.
    components = {
        p["metadata"]["labels"]["app.kubernetes.io/component"]
        for p in rendered.of_kind("NetworkPolicy")
    }
    assert "telephony" not in components
    assert "hostNetwork" in rendered.notes
    assert "nodes' addresses" not in rendered.notes
    restricted = helm_render(
        {
            "telephony": {"hostNetwork": True},
            "networkPolicy": {"gatewayFrom": [{"ipBlock": {"cidr": "203.0.113.0/24"}}]},
        }
    )
    assert "add the nodes' addresses to networkPolicy.gatewayFrom" in restricted.notes


def test_config_names_the_address_sdp_carries_and_the_callers(configs):
    rendered = helm_render(
        {
            "telephony": {
                "config": {
                    "sip_advertised_ip": "198.51.100.20",
                    "allowed_networks": "198.51.100.0/24",
                    "public_url": "https://phones.example.com",
                }
            }
        }
    )
    settings = configs["telephony"].load(settings_of(rendered.one("Deployment", "telephony")))
    assert settings.advertised_ip == "198.51.100.20"
    assert settings.caller_allowed("198.51.100.7")
    assert settings.public_url == "https://phones.example.com"
    assert "allowed_networks" not in rendered.notes


def test_the_twilio_token_and_the_gateway_token_come_from_the_secret():
    rendered = helm_render(
        {
            "secrets": {
                "existingSecret": "kame-keys",
                "twilioAuthTokenKey": "TWILIO_AUTH_TOKEN",
                "telephonyGatewayAuthTokenKey": "PHONE_TOKEN",
            },
            "telephony": {"config": {"public_url": "https://phones.example.com"}},
        }
    )
    env = env_of(containers(rendered.one("Deployment", "telephony"))[0])
    assert env["KAME_TELEPHONY_TWILIO_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "kame-keys",
        "key": "TWILIO_AUTH_TOKEN",
    }
    assert env["KAME_TELEPHONY_GATEWAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "kame-keys",
        "key": "PHONE_TOKEN",
    }
    assert "Twilio calls are refused" not in rendered.notes
    assert "Twilio calls are refused" in helm_render().notes
    with pytest.raises(helm.HelmError, match=r"secrets\.twilioAuthTokenKey names a key"):
        helm_render({"secrets": {"twilioAuthTokenKey": "TWILIO_AUTH_TOKEN"}})


def test_the_variants_pass_kubernetes_schema_validation():
    """hostNetwork, a LoadBalancer with RTP ports and restricted policies render valid objects
    (the default values are validated in test_chart)."""
    variants = [
        {"telephony": {"hostNetwork": True}},
        {"telephony": {"rtpPortLast": 40099, "service": {"type": "LoadBalancer", "rtp": True}}},
        {
            "networkPolicy": {
                "telephonyFrom": [{"ipBlock": {"cidr": "198.51.100.0/24"}}],
                "telephonyEgress": [{"to": [{"ipBlock": {"cidr": "192.0.2.0/24"}}]}],
            }
        },
    ]
    for values in variants:
        rendered = helm_render(values)
        for doc in rendered.documents:
            component = doc["metadata"]["labels"].get("app.kubernetes.io/component", "")
            if component.startswith("telephony") or doc["kind"] == "NetworkPolicy":
                for version in KUBE_VERSIONS:
                    kubernetes_validate.validate(doc, version, strict=True)


# ---- NetworkPolicy ------------------------------------------------------------------------------

CALLER = "198.51.100.7"


def test_phones_reach_sip_rtp_and_audiosocket_and_prometheus_the_metrics(rendered):
    policies, pods = rendered.of_kind("NetworkPolicy"), chart_pods(rendered)
    telephony, phone = pods["telephony"], outside(CALLER)
    assert allowed(policies, phone, telephony, "sip", "UDP")
    assert allowed(policies, phone, telephony, RTP[0], "UDP")
    assert allowed(policies, phone, telephony, RTP[-1], "UDP")
    assert not allowed(policies, phone, telephony, RTP[-1] + 1, "UDP")
    assert allowed(policies, phone, telephony, "audiosocket")
    assert allowed(policies, phone, telephony, "http")  # Twilio (its requests are signed)
    assert not allowed(policies, phone, telephony, "metrics")
    assert not allowed(policies, phone, telephony, "sip")  # no SIP over TCP
    assert allowed(policies, pods["prometheus"], telephony, "metrics")


def test_telephony_reaches_dns_the_gateway_and_its_callers_only(rendered):
    policies, pods = rendered.of_kind("NetworkPolicy"), chart_pods(rendered)
    telephony = pods["telephony"]
    assert allowed(policies, telephony, pods["kube-dns"], 53, "UDP")
    assert allowed(policies, telephony, pods["gateway"], "grpc")
    assert not allowed(policies, telephony, pods["gateway"], "metrics")
    assert allowed(policies, telephony, outside(CALLER), 5060, "UDP")  # SIP requests back
    assert allowed(policies, telephony, outside(CALLER), 31234, "UDP")  # RTP to the caller
    assert not allowed(policies, telephony, outside(CALLER), 443)
    if "redis" in pods:
        assert not allowed(policies, telephony, pods["redis"], "redis")
    assert not allowed(policies, telephony, pods["oracle"], "grpc")
    assert not allowed(policies, telephony, pods["stranger"], 8080)


def test_restricted_callers_and_a_restricted_gateway():
    trunk = [{"ipBlock": {"cidr": "198.51.100.0/24"}}]
    ingress = [{"podSelector": {"matchLabels": {"app": "ingress-nginx"}}}]
    clients = [{"ipBlock": {"cidr": "203.0.113.0/24"}}]
    rendered = helm_render(
        {
            "networkPolicy": {
                "telephonyFrom": trunk,
                "telephonyHttpFrom": ingress,
                "gatewayFrom": clients,
            }
        }
    )
    policies, pods = rendered.of_kind("NetworkPolicy"), chart_pods(rendered)
    telephony = pods["telephony"]
    assert allowed(policies, outside(CALLER), telephony, "sip", "UDP")
    assert allowed(policies, outside(CALLER), telephony, RTP[0], "UDP")
    assert not allowed(policies, outside("192.0.2.1"), telephony, "sip", "UDP")
    assert not allowed(policies, outside("192.0.2.1"), telephony, "audiosocket")
    assert not allowed(policies, outside(CALLER), telephony, "http")

    controller = Pod("ingress", {"app": "ingress-nginx"})
    assert allowed(policies, controller, telephony, "http")
    # It sends SIP and RTP to the trunk only.
    assert allowed(policies, telephony, outside(CALLER), 40123, "UDP")
    assert not allowed(policies, telephony, outside("192.0.2.1"), 40123, "UDP")
    # The restricted gateway still takes this release's telephony (and web) pods.
    assert allowed(policies, telephony, pods["gateway"], "grpc")
    assert allowed(policies, pods["web"], pods["gateway"], "grpc")
    assert not allowed(policies, pods["stranger"], pods["gateway"], "grpc")
