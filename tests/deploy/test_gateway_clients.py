"""The chart's web and telephony services, the gateway's clients inside the
release: each reaches a TLS gateway with the system CAs or a CA the operator names,
and neither is installed where the gateway asks its callers for client
certificates, which they do not hold."""

from __future__ import annotations

import os

import pytest

from tests.deploy.conftest import containers, helm_render, plain_settings

# The gateway behind TLS, with the certificate from a Secret the operator made.
GATEWAY_TLS = {"tls": {"gateway": {"enabled": True, "existingSecret": "edge-tls"}}}

# component -> its settings' prefix and what NOTES.txt says when it is left out.
CLIENTS = {
    "web": ("KAME_WEB_", "web page is not installed"),
    "telephony": ("KAME_TELEPHONY_", "telephony service is not installed"),
}


def components(rendered) -> set[str]:
    return {d["metadata"]["labels"].get("app.kubernetes.io/component") for d in rendered.documents}


@pytest.mark.parametrize("component", CLIENTS)
def test_a_tls_gateway_is_reached_with_the_system_cas_or_a_named_ca(component):
    prefix, _ = CLIENTS[component]
    system = plain_settings(helm_render(GATEWAY_TLS).one("Deployment", component), prefix)
    assert system[f"{prefix}GATEWAY_TLS"] == "true"
    rendered = helm_render({**GATEWAY_TLS, component: {"gatewayCaSecret": "edge-ca"}})
    deployment = rendered.one("Deployment", component)
    named = plain_settings(deployment, prefix)
    mounts = {m["mountPath"]: m["name"] for m in containers(deployment)[0]["volumeMounts"]}
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    ca_dir = os.path.dirname(named[f"{prefix}GATEWAY_CA_FILE"])
    assert volumes[mounts[ca_dir]]["secret"]["secretName"] == "edge-ca"
    assert f"{prefix}GATEWAY_TLS" not in named  # the CA file implies TLS


@pytest.mark.parametrize("component", CLIENTS)
def test_not_installed_when_the_gateway_requires_client_certificates_or_it_is_off(component):
    _, left_out = CLIENTS[component]
    client_certificates = {**GATEWAY_TLS["tls"]["gateway"], "clientCaSecret": "callers-ca"}
    rendered = helm_render({"tls": {"gateway": client_certificates}})
    assert component not in components(rendered)
    assert left_out in rendered.notes
    assert component not in components(helm_render({component: {"enabled": False}}))
