"""The chart's security (issue #12): a NetworkPolicy per component, the Redis password, TLS from
Secrets (or cert-manager), and a schema that refuses key material, for the default values and
values-gpu.yaml.

NetworkPolicies are checked by what they allow, not by their text: a small evaluator of the
NetworkPolicy semantics (pod and namespace selectors, ipBlocks, named and numbered ports) asks
who may open a connection to which port of which pod, over the pods the chart renders plus a
few others (a stranger pod in the namespace, Prometheus, the cluster DNS). The Redis wiring runs
on a real redis-server, with the $(VAR) references expanded as the kubelet expands them.
"""

from __future__ import annotations

import base64
import ipaddress
import re
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import helm_python as helm
import pytest

from tests.deploy.conftest import (
    CHART,
    SERVICES,
    Rendered,
    containers,
    deep_merge,
    env_of,
    helm_render,
    kubelet_expand,
    redis_server,
)

NAMESPACE = "voice"  # helm_render's
SECRETISH = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|REDISCLI_AUTH", re.IGNORECASE)
# Settings whose names look secret and are not (a switch about a token).
NOT_SECRETS = {"KAME_WEB_RELAY_TOKEN_BEHIND_LOGIN"}
# Every gRPC service uses Redis: session records and conversations, and the capacity registry
# the frontend, stt and oracle publish in (the gateway reads it).
REDIS_USERS = ("gateway", "frontend", "stt", "oracle")


# ---- a NetworkPolicy evaluator -----------------------------------------------------------------


@dataclass
class Pod:
    name: str
    labels: dict[str, str]
    namespace: str = NAMESPACE
    namespace_labels: dict[str, str] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)  # named container ports
    ip: str = "10.1.0.1"

    def __post_init__(self) -> None:
        # Kubernetes labels every namespace with its name.
        self.namespace_labels = {
            "kubernetes.io/metadata.name": self.namespace,
            **self.namespace_labels,
        }


def selects(selector: dict, labels: dict[str, str]) -> bool:
    """A LabelSelector: matchLabels and matchExpressions (In, NotIn, Exists, DoesNotExist)."""
    if not (selector.get("matchLabels") or {}).items() <= labels.items():
        return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], expression.get("values")
        present = key in labels
        if not {
            "In": present and labels.get(key) in (values or []),
            "NotIn": not present or labels[key] not in (values or []),
            "Exists": present,
            "DoesNotExist": not present,
        }[operator]:
            return False
    return True


def peer_admits(peer: dict, pod: Pod, policy_namespace: str) -> bool:
    if "ipBlock" in peer:
        block = peer["ipBlock"]
        address = ipaddress.ip_address(pod.ip)
        excepted = any(address in ipaddress.ip_network(c) for c in block.get("except", []))
        return address in ipaddress.ip_network(block["cidr"]) and not excepted
    if "namespaceSelector" in peer:
        if not selects(peer["namespaceSelector"], pod.namespace_labels):
            return False
    elif pod.namespace != policy_namespace:
        return False
    return "podSelector" not in peer or selects(peer["podSelector"], pod.labels)


def port_matches(rule_port: dict, port: int | str, protocol: str, target: Pod) -> bool:
    if rule_port.get("protocol", "TCP") != protocol:
        return False
    wanted = rule_port.get("port")
    if wanted is None:
        return True
    number = target.ports.get(port, port) if isinstance(port, str) else port
    if isinstance(wanted, str):
        return target.ports.get(wanted) == number
    return wanted <= number <= rule_port.get("endPort", wanted)


def allowed(
    policies: list[dict], source: Pod, target: Pod, port: int | str, protocol: str = "TCP"
) -> bool:
    """May `source` open a connection to `port` of `target`? Both ends must allow it: the
    target's ingress policies and the source's egress policies (a pod no policy of a direction
    selects is not isolated in that direction)."""

    def direction_allows(kind: str, selected: Pod, other: Pod, peers_key: str) -> bool:
        applying = [
            p
            for p in policies
            if p["metadata"].get("namespace", NAMESPACE) == selected.namespace
            and selects(p["spec"]["podSelector"], selected.labels)
            and kind in p["spec"]["policyTypes"]
        ]
        if not applying:
            return True
        return any(
            (
                peers_key not in rule
                or any(peer_admits(x, other, NAMESPACE) for x in rule[peers_key])
            )
            and (
                "ports" not in rule
                or any(port_matches(rp, port, protocol, target) for rp in rule["ports"])
            )
            for policy in applying
            for rule in policy["spec"].get(kind.lower(), [])
        )

    return direction_allows("Ingress", target, source, "from") and direction_allows(
        "Egress", source, target, "to"
    )


def chart_pods(rendered: Rendered) -> dict[str, Pod]:
    """The pods the chart creates (one per component; the `helm test` pod) and strangers."""
    pods = {}
    for deployment in rendered.of_kind("Deployment"):
        template = deployment["spec"]["template"]
        component = template["metadata"]["labels"]["app.kubernetes.io/component"]
        ports = {p["name"]: p["containerPort"] for c in containers(deployment) for p in c["ports"]}
        pods[component] = Pod(component, template["metadata"]["labels"], ports=ports)
    (test,) = [d for d in rendered.of_kind("Pod") if "helm.sh/hook" in d["metadata"]["annotations"]]
    pods["test"] = Pod("test", test["metadata"]["labels"])
    pods["stranger"] = Pod("stranger", {"app": "something-else"})
    pods["prometheus"] = Pod(
        "prometheus", {"app.kubernetes.io/name": "prometheus"}, namespace="monitoring"
    )
    pods["kube-dns"] = Pod(
        "kube-dns", {"k8s-app": "kube-dns"}, namespace="kube-system", ports={"dns": 53}
    )
    return pods


def outside(ip: str) -> Pod:
    """An address outside the cluster (a hosted API, a caller)."""
    return Pod(f"host {ip}", {}, namespace="", ip=ip)


def test_the_evaluator_really_evaluates():
    """Hand-made policies: a selector mismatch, a namespace mismatch, a wrong port and an
    excepted address are all refused."""
    target = Pod("db", {"app": "db"}, ports={"sql": 5432})
    web = Pod("web", {"app": "web"})
    policy = {
        "metadata": {"namespace": NAMESPACE},
        "spec": {
            "podSelector": {"matchLabels": {"app": "db"}},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [{"podSelector": {"matchLabels": {"app": "web"}}}],
                    "ports": [{"port": "sql"}],
                }
            ],
        },
    }
    assert allowed([policy], web, target, 5432)
    assert not allowed([policy], web, target, 5433)
    assert not allowed([policy], Pod("x", {"app": "x"}), target, 5432)
    assert not allowed([policy], Pod("web", {"app": "web"}, namespace="other"), target, 5432)
    egress = {
        "metadata": {"namespace": NAMESPACE},
        "spec": {
            "podSelector": {"matchLabels": {"app": "web"}},
            "policyTypes": ["Egress"],
            "egress": [{"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8"]}}]}],
        },
    }
    assert allowed([egress], web, outside("203.0.113.7"), 443)
    assert not allowed([egress], web, outside("10.2.3.4"), 443)


# ---- the chart's NetworkPolicies ---------------------------------------------------------------


def test_each_component_has_one_policy_selecting_exactly_its_pods(rendered):
    policies = rendered.of_kind("NetworkPolicy")
    pods = chart_pods(rendered)
    components = {
        d["metadata"]["labels"]["app.kubernetes.io/component"]
        for d in rendered.of_kind("Deployment")
    }
    assert components >= {*SERVICES, "redis"}
    for component in components:
        mine = [p for p in policies if selects(p["spec"]["podSelector"], pods[component].labels)]
        assert len(mine) == 1, component
        others = [c for c in components if c != component]
        assert not [c for c in others if selects(mine[0]["spec"]["podSelector"], pods[c].labels)]
    assert len(policies) == len(components)


def admitted(rendered: Rendered, target: str, port: str) -> set[str]:
    """The pods (of chart_pods) that may connect to `port` of the `target` component."""
    policies, pods = rendered.of_kind("NetworkPolicy"), chart_pods(rendered)
    return {name for name, pod in pods.items() if allowed(policies, pod, pods[target], port)}


# Who may connect where. The kubelet's probes on the health ports come from the pod's own node,
# which NetworkPolicy always admits (Kubernetes documents it); besides, only `helm test` asks.
WHO_CONNECTS = [
    *((upstream, "grpc", {"gateway"}) for upstream in ("frontend", "stt", "oracle")),
    ("redis", "redis", set(REDIS_USERS)),
    *((service, "metrics", {"prometheus"}) for service in SERVICES),
    *((service, "health", {"test"}) for service in SERVICES),
]


@pytest.mark.parametrize(("target", "port", "sources"), WHO_CONNECTS)
def test_who_may_connect(rendered, target, port, sources):
    assert admitted(rendered, target, port) == sources


def test_the_gateway_takes_calls_from_any_client_by_default(rendered):
    # Any source outside the release, web, telephony and the test pod: the release's other
    # pods' egress is limited (they never call the gateway).
    assert admitted(rendered, "gateway", "grpc") == {
        "web",
        "telephony",
        "test",
        "stranger",
        "prometheus",
        "kube-dns",
    }
    policies, pods = rendered.of_kind("NetworkPolicy"), chart_pods(rendered)
    assert allowed(policies, outside("203.0.113.7"), pods["gateway"], "grpc")
    # ... but nothing else of the gateway: metrics and health are not for clients.
    assert not allowed(policies, outside("203.0.113.7"), pods["gateway"], "metrics")
    assert not allowed(policies, outside("203.0.113.7"), pods["gateway"], "health")


# What each pod of the release may reach besides DNS (Redis and the llm: not even DNS).
REACHES = {
    "gateway": {("redis", "redis"), ("frontend", "grpc"), ("stt", "grpc"), ("oracle", "grpc")},
    "frontend": {("redis", "redis")},
    "stt": {("redis", "redis")},
    "oracle": {("redis", "redis"), ("llm", "http")},
    "web": {("gateway", "grpc")},
    "telephony": {("gateway", "grpc")},
    "redis": set(),
    "llm": set(),
}


def test_every_pod_reaches_only_what_it_needs(rendered):
    """The old chart limited the oracle's, web's and telephony's egress only: a gateway,
    frontend, stt, Redis or llm pod that was taken over reached anything, the cloud
    metadata address and the internet included."""
    policies, pods = rendered.of_kind("NetworkPolicy"), chart_pods(rendered)
    present = [name for name in REACHES if name in pods]  # no llm pod with a hosted LLM
    for source in present:
        pod, reaches = pods[source], REACHES[source]
        for target in present:
            for port in ("grpc", "redis", "http"):
                if port in pods[target].ports and target != source:
                    wanted = (target, port) in reaches
                    assert allowed(policies, pod, pods[target], port) == wanted, (source, target)
        assert allowed(policies, pod, pods["kube-dns"], 53, "UDP") == bool(reaches), source
        assert not allowed(policies, pod, pods["stranger"], 8080), source
        if source != "oracle":  # a hosted LLM's API (values-gpu.yaml): its own test
            assert not allowed(policies, pod, outside("203.0.113.7"), 443), source
        assert not allowed(policies, pod, outside("169.254.169.254"), 80), source


def test_common_egress_reaches_every_service_and_own_egress_one(rendered):
    collector = {"to": [{"ipBlock": {"cidr": "10.9.0.0/16"}}], "ports": [{"port": 4317}]}
    hub = {"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}], "ports": [{"port": 443}]}
    extra = helm_render({"networkPolicy": {"commonEgress": [collector], "frontendEgress": [hub]}})
    policies, pods = extra.of_kind("NetworkPolicy"), chart_pods(extra)
    for service in ("gateway", "frontend", "stt", "oracle", "web", "telephony"):
        assert allowed(policies, pods[service], outside("10.9.0.7"), 4317), service
        reaches_hub = allowed(policies, pods[service], outside("203.0.113.7"), 443)
        assert reaches_hub == (service == "frontend"), service
    assert not allowed(policies, pods["redis"], outside("10.9.0.7"), 4317)


def test_the_embedded_llm_takes_calls_from_the_oracle_only(rendered_sets):
    assert admitted(rendered_sets["default"], "llm", "http") == {"oracle"}


def test_the_oracle_reaches_dns_redis_and_its_llm_only(rendered_sets):
    default, gpu = rendered_sets["default"], rendered_sets["gpu"]
    for rendered in (default, gpu):
        policies, pods = rendered.of_kind("NetworkPolicy"), chart_pods(rendered)
        oracle = pods["oracle"]
        assert allowed(policies, oracle, pods["kube-dns"], 53, "UDP")
        assert allowed(policies, oracle, pods["kube-dns"], 53, "TCP")
        assert allowed(policies, oracle, pods["redis"], "redis")
        assert not allowed(policies, oracle, pods["frontend"], "grpc")
        assert not allowed(policies, oracle, pods["stranger"], 8080)
        assert not allowed(policies, oracle, outside("169.254.169.254"), 80)
    # The embedded llm by default; nothing outside.
    policies, pods = default.of_kind("NetworkPolicy"), chart_pods(default)
    assert allowed(policies, pods["oracle"], pods["llm"], "http")
    assert not allowed(policies, pods["oracle"], outside("203.0.113.7"), 443)
    # values-gpu.yaml's hosted API: public addresses on 443, no cluster range or metadata.
    policies, pods = gpu.of_kind("NetworkPolicy"), chart_pods(gpu)
    assert allowed(policies, pods["oracle"], outside("203.0.113.7"), 443)
    assert not allowed(policies, pods["oracle"], outside("203.0.113.7"), 80)
    for private in ("10.20.0.5", "172.16.4.4", "192.168.1.1", "169.254.169.254"):
        assert not allowed(policies, pods["oracle"], outside(private), 443), private


def test_named_ports_of_every_policy_exist_on_the_selected_pods(rendered):
    pods = chart_pods(rendered)
    for policy in rendered.of_kind("NetworkPolicy"):
        selected = [p for p in pods.values() if selects(policy["spec"]["podSelector"], p.labels)]
        for rule in policy["spec"].get("ingress", []):
            for port in rule.get("ports", []):
                if isinstance(port["port"], str):
                    assert all(port["port"] in p.ports for p in selected), (policy, port)


def test_policy_sources_are_configurable_and_policies_can_be_off():
    rendered = helm_render(
        {
            "networkPolicy": {
                "gatewayFrom": [{"ipBlock": {"cidr": "203.0.113.0/24"}}],
                "metricsFrom": [{"namespaceSelector": {"matchLabels": {"team": "observability"}}}],
            }
        }
    )
    policies, pods = rendered.of_kind("NetworkPolicy"), chart_pods(rendered)
    assert allowed(policies, outside("203.0.113.9"), pods["gateway"], "grpc")
    assert not allowed(policies, outside("198.51.100.1"), pods["gateway"], "grpc")
    assert not allowed(policies, pods["stranger"], pods["gateway"], "grpc")
    scraper = Pod("scraper", {"app": "vmagent"}, "obs", {"team": "observability"})
    assert allowed(policies, scraper, pods["stt"], "metrics")
    assert not allowed(policies, pods["prometheus"], pods["stt"], "metrics")
    assert not helm_render({"networkPolicy": {"enabled": False}}).of_kind("NetworkPolicy")


# ---- secrets by reference ----------------------------------------------------------------------

ALL_KEYS = {
    "existingSecret": "kame-keys",
    "gatewayAuthTokensKey": "GATEWAY_AUTH_TOKENS",
    "registrySecretKey": "REGISTRY_SECRET",
    "resumeSecretKey": "RESUME_SECRET",
    "redisPasswordKey": "REDIS_PASSWORD",
    "webGatewayAuthTokenKey": "WEB_GATEWAY_TOKEN",
    "telephonyGatewayAuthTokenKey": "TELEPHONY_GATEWAY_TOKEN",
    "twilioAuthTokenKey": "TWILIO_AUTH_TOKEN",
}


def secret_references(rendered: Rendered) -> dict[tuple[str, str], dict]:
    """{(container, env var): secretKeyRef}; asserts no secret-looking variable has a value."""
    references = {}
    for deployment in rendered.of_kind("Deployment"):
        for container in containers(deployment):
            for name, entry in env_of(container).items():
                if (
                    SECRETISH.search(name)
                    and name not in NOT_SECRETS
                    and not name.endswith("_FILE")
                ):
                    assert "value" not in entry, (container["name"], name)
                    references[(container["name"], name)] = entry["valueFrom"]["secretKeyRef"]
    return references


# Every secret reference, and what the web relay token requires (the operator's login
# in front of the web service, and only it reaching the page).
WITH_ALL_KEYS = {
    "secrets": ALL_KEYS,
    "web": {"config": {"relay_token_behind_login": True}},
    "networkPolicy": {"webFrom": [{"podSelector": {"matchLabels": {"app": "login"}}}]},
}


def test_secrets_are_referenced_never_inlined():
    """With every secret reference set, keys come from the named Secret; no Secret object and
    no literal value of a secret-looking variable appears anywhere."""
    rendered = helm_render(WITH_ALL_KEYS)
    assert not rendered.of_kind("Secret")
    references = secret_references(rendered)
    assert references[("oracle", "OPENAI_API_KEY")] == {
        "name": "kame-keys",
        "key": "OPENAI_API_KEY",
        "optional": True,
    }
    assert references[("oracle", "ANTHROPIC_API_KEY")]["name"] == "kame-keys"
    for container, variable, key in (
        ("gateway", "KAME_GATEWAY_AUTH_TOKENS", "GATEWAY_AUTH_TOKENS"),
        ("gateway", "KAME_GATEWAY_REGISTRY_SECRET", "REGISTRY_SECRET"),
        ("gateway", "KAME_GATEWAY_RESUME_SECRET", "RESUME_SECRET"),
        ("frontend", "KAME_FRONTEND_REGISTRY_SECRET", "REGISTRY_SECRET"),
        ("stt", "KAME_STT_REGISTRY_SECRET", "REGISTRY_SECRET"),
        ("oracle", "KAME_ORACLE_REGISTRY_SECRET", "REGISTRY_SECRET"),
        ("web", "KAME_WEB_GATEWAY_AUTH_TOKEN", "WEB_GATEWAY_TOKEN"),
        ("telephony", "KAME_TELEPHONY_GATEWAY_AUTH_TOKEN", "TELEPHONY_GATEWAY_TOKEN"),
        ("telephony", "KAME_TELEPHONY_TWILIO_AUTH_TOKEN", "TWILIO_AUTH_TOKEN"),
        ("redis", "REDISCLI_AUTH", "REDIS_PASSWORD"),
        *((s, "REDIS_PASSWORD", "REDIS_PASSWORD") for s in REDIS_USERS),
    ):
        assert references[(container, variable)] == {"name": "kame-keys", "key": key}
    # The one secret in a plain value: a REDIS_URL's password, as a reference the kubelet fills.
    for service in REDIS_USERS:
        url = env_of(containers(rendered.one("Deployment", service))[0])[
            f"KAME_{service.upper()}_REDIS_URL"
        ]["value"]
        assert urlsplit(url).password == "$(REDIS_PASSWORD)", url
    external = helm_render(
        {
            "secrets": {"existingSecret": "kame-keys", "redisUrlKey": "REDIS_URL"},
            "redis": {"enabled": False},
        }
    )
    secret_references(external)
    for service in REDIS_USERS:
        entry = env_of(containers(external.one("Deployment", service))[0])[
            f"KAME_{service.upper()}_REDIS_URL"
        ]
        assert entry == {
            "name": f"KAME_{service.upper()}_REDIS_URL",
            "valueFrom": {"secretKeyRef": {"name": "kame-keys", "key": "REDIS_URL"}},
        }


@pytest.mark.parametrize(
    "bad",
    [
        {"gateway": {"config": {"auth_tokens": "s3cret"}}},
        {"gateway": {"config": {"auth_token": "s3cret"}}},
        {"gateway": {"config": {"registry_secret": "s3cret"}}},
        {"frontend": {"config": {"registry_secret": "s3cret"}}},
        {"stt": {"config": {"registry_secret": "s3cret"}}},
        {"oracle": {"config": {"registry_secret": "s3cret"}}},
        {"web": {"config": {"gateway_auth_token": "s3cret"}}},
        {"telephony": {"config": {"twilio_auth_token": "0123456789abcdef"}}},
        {"telephony": {"config": {"gateway_auth_token": "s3cret"}}},
        {"telephony": {"extraEnv": [{"name": "KAME_TELEPHONY_TWILIO_AUTH_TOKEN", "value": "x"}]}},
        {"secrets": {"twilioAuthTokenKey": "AC0123 0123456789abcdef"}},
        {"oracle": {"config": {"api_key": "sk-123"}}},
        {"oracle": {"extraEnv": [{"name": "OPENAI_API_KEY", "value": "sk-123"}]}},
        {"gateway": {"extraEnv": [{"name": "KAME_GATEWAY_AUTH_TOKENS", "value": "t1,t2"}]}},
        {
            "gateway": {
                "extraEnv": [{"name": "KAME_GATEWAY_REDIS_URL", "value": "redis://:pw@r:6379/0"}]
            }
        },
        {"secrets": {"openaiApiKey": "sk-123"}},
        {"secrets": {"redisPassword": "hunter2"}},
        {"secrets": {"gatewayAuthTokensKey": "token with spaces=="}},
        {"redis": {"externalUrl": "redis://:hunter2@cache:6379/0"}},
        {"redis": {"externalUrl": "rediss://user:hunter2@cache:6380/0"}},
        {"redis": {"auth": {"password": "hunter2"}}},
        {"tls": {"gateway": {"existingSecret": "-----BEGIN PRIVATE KEY-----\nMIIE..."}}},
        {"tls": {"gateway": {"key": "-----BEGIN PRIVATE KEY-----"}}},
        {"tls": {"internal": {"caCert": "-----BEGIN CERTIFICATE-----"}}},
    ],
)
def test_schema_refuses_inline_secrets(bad):
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmValuesError):
        chart.validate_schema(bad)


def test_schema_refuses_bad_values_and_accepts_references():
    with helm.Chart.load(CHART) as chart:
        for bad in (
            {"frontend": {"config": {"engine": "gpt"}}},
            {"frontend": {"resources": {"requests": {"cpu": None}}}},  # --set ...cpu=null
            {"gateway": {"port": 70000}},
            {"stt": {"healthPort": 0}},
            {"stt": {"service": {"type": "LoadBalancer"}}},  # only the gateway is published
            {"networkPolicy": {"gatewayFrom": [{"cidr": "0.0.0.0/0"}]}},
        ):
            with pytest.raises(helm.HelmValuesError):
                chart.validate_schema(bad)
        chart.validate_schema(
            {
                "oracle": {
                    "extraEnv": [
                        {
                            "name": "OPENAI_API_KEY",
                            "valueFrom": {"secretKeyRef": {"name": "k", "key": "o"}},
                        },
                        {"name": "KAME_ORACLE_REDIS_URL", "value": "redis://cache:6379/1"},
                    ]
                },
                "redis": {"externalUrl": "rediss://cache.example.com:6380/0"},
                "secrets": ALL_KEYS,
            }
        )


# ---- the Redis password ------------------------------------------------------------------------


def redis_password_refs(rendered: Rendered) -> dict[str, dict]:
    """{container: secretKeyRef} of the Redis password: REDISCLI_AUTH of the Redis container
    (its requirepass) and REDIS_PASSWORD of every service that uses Redis."""
    refs = {}
    for deployment in rendered.of_kind("Deployment"):
        for container in containers(deployment):
            env = env_of(container)
            for name in ("REDISCLI_AUTH", "REDIS_PASSWORD"):
                if name in env:
                    refs[container["name"]] = env[name]["valueFrom"]["secretKeyRef"]
    return refs


def test_redis_requires_the_password_every_url_carries(rendered):
    """Both values files: the in-release Redis runs with requirepass from a Secret, and the
    gateway, frontend, stt and oracle read the same Secret key into the URL they connect with."""
    refs = redis_password_refs(rendered)
    assert set(refs) == {"redis", *REDIS_USERS}
    assert len({(r["name"], r["key"]) for r in refs.values()}) == 1
    redis_container = containers(rendered.one("Deployment", "redis"))[0]
    args = redis_container["args"]
    assert args[args.index("--requirepass") + 1] == "$(REDISCLI_AUTH)"
    for service in REDIS_USERS:
        container = containers(rendered.one("Deployment", service))[0]
        names = [e["name"] for e in container["env"]]
        url_name = f"KAME_{service.upper()}_REDIS_URL"
        url = urlsplit(env_of(container)[url_name]["value"])
        assert url.password == "$(REDIS_PASSWORD)" and url.hostname == "kame-redis"
        # The kubelet expands only variables defined earlier in the list.
        assert names.index("REDIS_PASSWORD") < names.index(url_name)


def test_default_values_generate_the_password_gpu_values_name_it(rendered_sets):
    generated = rendered_sets["default"].one("Secret", "redis-auth")
    assert redis_password_refs(rendered_sets["default"])["redis"] == {
        "name": generated["metadata"]["name"],
        "key": "redis-password",
    }
    password = base64.b64decode(generated["data"]["redis-password"]).decode()
    assert re.fullmatch(r"[A-Za-z0-9]{40}", password)  # URL-safe: it is part of every URL
    assert not rendered_sets["gpu"].of_kind("Secret")
    assert redis_password_refs(rendered_sets["gpu"])["redis"] == {
        "name": "kame-keys",
        "key": "REDIS_PASSWORD",
    }


def test_redis_password_sources_and_their_errors():
    with pytest.raises(helm.HelmError, match=r"redis\.auth\.generatePassword"):
        helm_render({"redis": {"auth": {"generatePassword": False}}})
    with pytest.raises(helm.HelmError, match=r"secrets\.redisPasswordKey names a key"):
        helm_render({"secrets": {"redisPasswordKey": "REDIS_PASSWORD"}})
    # An external Redis: the URL gets the password from the key...
    rendered = helm_render(
        {
            "redis": {"enabled": False, "externalUrl": "rediss://cache.example.com:6380/2"},
            "secrets": {"existingSecret": "k", "redisPasswordKey": "REDIS_PASSWORD"},
        }
    )
    env = env_of(containers(rendered.one("Deployment", "oracle"))[0])
    assert (
        env["KAME_ORACLE_REDIS_URL"]["value"]
        == "rediss://:$(REDIS_PASSWORD)@cache.example.com:6380/2"
    )
    assert not generated_secrets(rendered) & {"redis-auth"}
    # ... or the whole URL comes from one key, never both.
    with pytest.raises(helm.HelmError, match=r"leave secrets\.redisPasswordKey empty"):
        helm_render(
            {
                "redis": {"enabled": False},
                "secrets": {"existingSecret": "k", "redisPasswordKey": "P", "redisUrlKey": "U"},
            }
        )


@pytest.mark.service  # a real Redis or gRPC server (tests/support/tiers.py)
@pytest.mark.parametrize("values", ["default", "gpu"])
def test_services_reach_the_release_redis_with_the_rendered_wiring(rendered_sets, values, tmp_path):
    """A real redis-server started with the Redis container's rendered args, and every service's
    rendered REDIS_URL, both expanded as the kubelet expands them from the same Secret value.
    The readiness probe passes with the password and fails with another."""
    rendered = rendered_sets[values]
    if values == "default":
        secret = rendered.one("Secret", "redis-auth")
        password = base64.b64decode(secret["data"]["redis-password"]).decode()
    else:
        password = "a-password-in-kame-keys"
    redis_container = containers(rendered.one("Deployment", "redis"))[0]
    args = [kubelet_expand(a, {"REDISCLI_AUTH": password}) for a in redis_container["args"]]
    (shell, flag, probe) = redis_container["readinessProbe"]["exec"]["command"]
    assert (shell, flag) == ("sh", "-c")
    with redis_server(args, tmp_path) as server:
        for service in REDIS_USERS:
            env = env_of(containers(rendered.one("Deployment", service))[0])
            url = env[f"KAME_{service.upper()}_REDIS_URL"]["value"]
            assert server.pings(kubelet_expand(url, {"REDIS_PASSWORD": password})), service
        assert server.requires_password()
        assert server.check(probe, password) == 0
        assert server.check(probe, "wrong") != 0


# ---- TLS ---------------------------------------------------------------------------------------

TLS_SECRET_KEYS = {"tls.crt", "tls.key", "ca.crt"}  # kubernetes.io/tls, plus a CA


def tls_files(rendered: Rendered, service: str) -> dict[str, tuple[str, str]]:
    """{setting: (Secret name, key)} of each *_FILE setting of a service, through its mounts:
    every file must lie in a read-only, whole-Secret mount (no subPath, so that renewed
    certificates reach the files) of a key such a Secret has."""
    pod = rendered.one("Deployment", service)["spec"]["template"]["spec"]
    container = pod["containers"][0]
    volumes = {v["name"]: v for v in pod["volumes"]}
    result = {}
    for name, entry in env_of(container).items():
        if not name.endswith("_FILE"):
            continue
        path = entry["value"]
        (mount,) = [m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
        assert mount["readOnly"] is True and "subPath" not in mount, mount
        secret = volumes[mount["name"]]["secret"]
        assert secret["defaultMode"] == 0o440
        key = path.removeprefix(mount["mountPath"] + "/")
        assert key in TLS_SECRET_KEYS, path
        result[name.removeprefix(f"KAME_{service.upper()}_").lower()] = (secret["secretName"], key)
    return result


def test_gpu_values_turn_tls_on_everywhere(rendered_sets, configs):
    rendered = rendered_sets["gpu"]
    gateway = tls_files(rendered, "gateway")
    assert gateway == {
        "tls_cert_file": ("kame-gateway-tls", "tls.crt"),
        "tls_key_file": ("kame-gateway-tls", "tls.key"),
        "upstream_ca_file": ("kame-internal-tls", "ca.crt"),
        "upstream_cert_file": ("kame-internal-tls", "tls.crt"),
        "upstream_key_file": ("kame-internal-tls", "tls.key"),
    }
    env = env_of(containers(rendered.one("Deployment", "gateway"))[0])
    assert env["KAME_GATEWAY_UPSTREAM_SERVER_NAME"]["value"] == "kame-internal"
    for service in ("frontend", "stt", "oracle"):
        assert tls_files(rendered, service) == {
            "tls_cert_file": ("kame-internal-tls", "tls.crt"),
            "tls_key_file": ("kame-internal-tls", "tls.key"),
            "tls_client_ca_file": ("kame-internal-tls", "ca.crt"),
        }, service
    for service in SERVICES:
        assert set(tls_files(rendered, service)) <= configs[service].known_fields


def test_default_values_serve_plaintext_and_mount_no_certificates(rendered_sets):
    for service in SERVICES:
        assert not tls_files(rendered_sets["default"], service)
        pod = rendered_sets["default"].one("Deployment", service)["spec"]["template"]["spec"]
        assert not [v for v in pod["volumes"] if "secret" in v]


def test_no_published_gateway_is_plaintext(rendered_sets):
    """A Service that publishes the gateway outside the cluster only with TLS on its port."""
    for rendered in rendered_sets.values():
        gateway = rendered.one("Deployment", "gateway")["spec"]["template"]
        for service in rendered.of_kind("Service"):
            published = service["spec"]["type"] in ("LoadBalancer", "NodePort")
            if (
                published
                and service["spec"]["selector"].items() <= gateway["metadata"]["labels"].items()
            ):
                assert "KAME_GATEWAY_TLS_CERT_FILE" in env_of(gateway["spec"]["containers"][0])


def test_gateway_client_certificates_and_missing_certificate_sources():
    rendered = helm_render(
        {
            "tls": {
                "gateway": {
                    "enabled": True,
                    "existingSecret": "edge-tls",
                    "clientCaSecret": "callers-ca",
                }
            }
        }
    )
    assert tls_files(rendered, "gateway") == {
        "tls_cert_file": ("edge-tls", "tls.crt"),
        "tls_key_file": ("edge-tls", "tls.key"),
        "tls_client_ca_file": ("callers-ca", "ca.crt"),
    }
    assert not tls_files(rendered, "stt")
    with pytest.raises(helm.HelmError, match=r"tls\.gateway\.existingSecret or tls\.certManager"):
        helm_render({"tls": {"gateway": {"enabled": True}}})
    with pytest.raises(helm.HelmError, match=r"tls\.internal\.existingSecret or tls\.certManager"):
        helm_render({"tls": {"internal": {"enabled": True}}})


CERT_MANAGER = {
    "tls": {
        "gateway": {"enabled": True, "dnsNames": ["voice.example.com"]},
        "internal": {"enabled": True},
        "certManager": {
            "enabled": True,
            "issuerRef": {
                "name": "letsencrypt",
                "kind": "ClusterIssuer",
                "group": "cert-manager.io",
            },
            "internalIssuerRef": {"name": "kame-ca", "kind": "Issuer", "group": "cert-manager.io"},
        },
    }
}
CERTIFICATE_SPEC = {
    "secretName",
    "duration",
    "renewBefore",
    "privateKey",
    "dnsNames",
    "usages",
    "issuerRef",
}


def test_cert_manager_certificates_write_the_secrets_the_pods_mount():
    rendered = helm_render(CERT_MANAGER)
    certificates = {c["metadata"]["name"]: c for c in rendered.of_kind("Certificate")}
    assert set(certificates) == {"kame-gateway-tls", "kame-internal-tls"}
    for certificate in certificates.values():
        assert certificate["apiVersion"] == "cert-manager.io/v1"
        assert set(certificate["spec"]) == CERTIFICATE_SPEC
    gateway, internal = (
        certificates["kame-gateway-tls"]["spec"],
        certificates["kame-internal-tls"]["spec"],
    )
    mounted = {
        secret for service in SERVICES for secret, _ in tls_files(rendered, service).values()
    }
    assert {gateway["secretName"], internal["secretName"]} == mounted
    assert {"kame-gateway", f"kame-gateway.{NAMESPACE}.svc", "voice.example.com"} <= set(
        gateway["dnsNames"]
    )
    assert "client auth" not in gateway["usages"] and gateway["issuerRef"]["name"] == "letsencrypt"
    # The internal certificate: the name the gateway verifies, the upstreams' Service names,
    # both server and client use, from the CA issuer.
    server_name = env_of(containers(rendered.one("Deployment", "gateway"))[0])[
        "KAME_GATEWAY_UPSTREAM_SERVER_NAME"
    ]["value"]
    upstreams = {
        rendered.one("Service", s)["metadata"]["name"] for s in ("frontend", "stt", "oracle")
    }
    assert {server_name, *upstreams} <= set(internal["dnsNames"])
    assert {"server auth", "client auth"} <= set(internal["usages"])
    assert internal["issuerRef"] == {
        "name": "kame-ca",
        "kind": "Issuer",
        "group": "cert-manager.io",
    }


def test_cert_manager_leaves_existing_secrets_alone_and_needs_an_issuer():
    values = {
        **CERT_MANAGER,
        "tls": {**CERT_MANAGER["tls"], "gateway": {"enabled": True, "existingSecret": "edge-tls"}},
    }
    certificates = helm_render(values).of_kind("Certificate")
    assert [c["metadata"]["name"] for c in certificates] == ["kame-internal-tls"]
    with pytest.raises(helm.HelmError, match=r"tls\.certManager\.issuerRef\.name"):
        helm_render({"tls": {"gateway": {"enabled": True}, "certManager": {"enabled": True}}})
    assert not helm_render().of_kind("Certificate")


def test_helm_test_asks_every_health_port_through_its_service(rendered):
    (pod,) = [d for d in rendered.of_kind("Pod") if "helm.sh/hook" in d["metadata"]["annotations"]]
    script = " ".join(pod["spec"]["containers"][0]["args"])
    for service in SERVICES:
        svc = rendered.one("Service", service)
        health = {p["name"]: p["port"] for p in svc["spec"]["ports"]}["health"]
        assert f"--host {svc['metadata']['name']} --port {health}" in script, service


def test_notes_say_what_the_oracle_cannot_reach(rendered_sets):
    notes = helm_render(
        {
            "redis": {"enabled": False, "externalUrl": "redis://cache:6379/0"},
            "llm": {"enabled": False},
            "tracing": {"otlpEndpoint": "http://otel:4317"},
        }
    ).notes
    assert (
        "add your Redis, the OTLP collector (http://otel:4317) to networkPolicy.commonEgress"
        in (notes)
    )
    assert "add its LLM there, or the oracle cannot reach it" in notes
    for rendered in rendered_sets.values():  # the embedded llm, or oracleEgress for the API
        assert "oracle's egress is limited" not in rendered.notes
        assert "Every pod's egress is limited" not in rendered.notes


def generated_secrets(rendered: Rendered) -> set[str]:
    """The components of the Secrets the chart generates."""
    return {
        s["metadata"]["labels"]["app.kubernetes.io/component"] for s in rendered.of_kind("Secret")
    }


def test_redis_evicts_expiring_keys_beyond_its_maxmemory(rendered):
    """A flood of records (long conversations, DTMF) fills Redis up to maxmemory, below the
    pod's memory limit; then keys with a TTL are evicted instead of the pod being OOM-killed."""
    args = containers(rendered.one("Deployment", "redis"))[0]["args"]
    assert args[args.index("--maxmemory") + 1] == "384mb"
    assert args[args.index("--maxmemory-policy") + 1] == "volatile-lru"


# ---- generated secrets, published gateways, credentials in URLs --------------------------------


def test_an_offline_upgrade_fails_rather_than_re_randomise_generated_secrets():
    """An upgrade rendered without the cluster (helm template, --dry-run, Argo CD) cannot read
    the generated Redis password or registry key: it used to render new random ones, which
    replaced the Secret under running pods (Redis and the services then disagree). Now it fails
    and names the setting to use instead; with the keys named it renders."""
    with pytest.raises(helm.HelmError, match=r"secrets\.redisPasswordKey"):
        helm_render({"secrets": {"existingSecret": "k", "registrySecretKey": "R"}}, is_upgrade=True)
    with pytest.raises(helm.HelmError, match=r"secrets\.registrySecretKey"):
        helm_render({"secrets": {"existingSecret": "k", "redisPasswordKey": "P"}}, is_upgrade=True)
    named = {"existingSecret": "k", "redisPasswordKey": "P", "registrySecretKey": "R"}
    assert not helm_render({"secrets": named}, is_upgrade=True).of_kind("Secret")


def test_the_capacity_registry_is_signed_by_default(rendered_sets):
    """Without secrets.registrySecretKey the chart generates the key (it used to leave the
    registry unsigned: any pod that can write to Redis could steer calls to its address)."""
    default = rendered_sets["default"]
    assert generated_secrets(default) == {"redis-auth", "registry-secret"}
    generated = default.one("Secret", "registry-secret")
    key = base64.b64decode(generated["data"]["registry-secret"]).decode()
    assert re.fullmatch(r"[A-Za-z0-9]{40}", key)
    for values, expected in (
        (default, {"name": "kame-registry-secret", "key": "registry-secret"}),
        (rendered_sets["gpu"], {"name": "kame-keys", "key": "REGISTRY_SECRET"}),
    ):
        for service in ("gateway", "frontend", "stt", "oracle"):
            env = env_of(containers(values.one("Deployment", service))[0])
            reference = env[f"KAME_{service.upper()}_REGISTRY_SECRET"]["valueFrom"]
            assert reference["secretKeyRef"] == expected, service
    unsigned = helm_render({"registry": {"generateSecret": False}})
    assert generated_secrets(unsigned) == {"redis-auth"}
    gateway_env = env_of(containers(unsigned.one("Deployment", "gateway"))[0])
    assert "KAME_GATEWAY_REGISTRY_SECRET" not in gateway_env


PUBLISHED = {"service": {"type": "LoadBalancer"}}


@pytest.mark.parametrize(
    "values, missing",
    [
        ({"gateway": PUBLISHED}, r"tls\.gateway\.enabled"),
        ({"gateway": {"service": {"type": "NodePort"}}}, r"tls\.gateway\.enabled"),
        (
            {"gateway": PUBLISHED, "tls": {"gateway": {"enabled": True, "existingSecret": "t"}}},
            r"secrets\.gatewayAuthTokensKey",
        ),
        (
            {
                "gateway": PUBLISHED,
                "secrets": {"existingSecret": "k", "gatewayAuthTokensKey": "TOKENS"},
            },
            r"tls\.gateway\.enabled",
        ),
    ],
)
def test_a_published_gateway_without_tls_or_client_authentication_does_not_render(values, missing):
    """A LoadBalancer (or NodePort) gateway used to render without TLS and without tokens:
    whoever reached the address talked to the LLM and the GPUs, in plaintext."""
    with pytest.raises(helm.HelmError, match=missing):
        helm_render(values)


@pytest.mark.parametrize(
    "authentication",
    [
        {"secrets": {"existingSecret": "k", "gatewayAuthTokensKey": "TOKENS"}},
        {"tls": {"gateway": {"clientCaSecret": "clients-ca"}}},
    ],
)
def test_a_published_gateway_renders_with_tls_and_tokens_or_client_certificates(authentication):
    tls = {"tls": {"gateway": {"enabled": True, "existingSecret": "t"}}}
    values = deep_merge(deep_merge({"gateway": PUBLISHED}, tls), authentication)
    assert helm_render(values).one("Service", "gateway-public")["spec"]["type"] == "LoadBalancer"


@pytest.mark.parametrize(
    "url",
    ["https://user:sk-secret@api.example.com/v1", "http://sk-secret@llm.internal:8000/v1"],
)
def test_schema_refuses_credentials_in_the_oracle_base_url(url):
    """The base URL is logged and shown in errors: a key in it would leak. The API key comes
    from the Secret (secrets.openaiApiKeyKey, secrets.anthropicApiKeyKey)."""
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmValuesError):
        chart.validate_schema({"oracle": {"config": {"base_url": url}}})


def test_schema_accepts_base_urls_without_credentials():
    with helm.Chart.load(CHART) as chart:
        for url in ("", "https://api.openai.com/v1", "http://vllm:8000/v1?tag=a@b"):
            chart.validate_schema({"oracle": {"config": {"base_url": url}}})
