"""Bad configs and bad streams fail at once with INVALID_ARGUMENT and a message that
says what is wrong; the service keeps serving other sessions."""

from __future__ import annotations

import socket

import grpc
import pytest

from kamepb import common_pb2, oracle_pb2
from kamepb.common_pb2 import LLM_BACKEND_ANTHROPIC, LLM_BACKEND_OPENAI
from services.oracle.config import ApiKeys


def closed_port_url() -> str:
    """A loopback URL where nothing listens."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


BAD_CONFIGS = [
    (dict(backend=9), "backend: unknown back-end 9; choose one of 'openai', 'anthropic'"),
    (dict(backend=LLM_BACKEND_OPENAI, base_url="https://api.openai.com/v1"), "set OPENAI_API_KEY"),
    (dict(backend=LLM_BACKEND_ANTHROPIC), "backend 'anthropic' is not allowed"),  # allowed_backends
    (dict(base_url=closed_port_url()), "is not allowed: sessions may choose only URLs listed"),
    (dict(model="gpt-4o"), "model 'gpt-4o' is not allowed"),
    (dict(policy=oracle_pb2.OraclePolicy(name="eager")), "policy 'eager' is unknown"),
    (dict(policy=oracle_pb2.OraclePolicy(min_new_words=-1)), "min_new_words must be >= 1"),
    (dict(max_tokens=-5), "max_tokens must be >= 0"),
    (dict(session_id=""), "session_id is required"),
    (dict(heartbeat_interval_s=0.01), "heartbeat_interval_s must be between 0.1 and 60"),
    (dict(delegation_timeout_s=5), "delegation_timeout_s: only with client_delegation"),
    (
        dict(client_delegation=True, delegation_timeout_s=61),
        "delegation_timeout_s: 0 (the default, 10 s) to 60 s, got 61",
    ),
    (
        dict(client_delegation=True, model="stub-model", api_key="k"),
        "client_delegation: the client's back-end answers, with no LLM here: model, api_key",
    ),
]


@pytest.mark.parametrize(
    "fields, message",
    BAD_CONFIGS,
    ids=[m.split(" ")[0] + str(i) for i, (_f, m) in enumerate(BAD_CONFIGS)],
)
async def test_bad_config_is_invalid_argument(
    fields, message, oracle_service, guide_client, stub_http, session_id
):
    _server, url = await stub_http({})
    runtime = await oracle_service(base_url=f"{url}/v1", model="stub-model")
    client = guide_client(runtime.port)
    await client.config(**{"session_id": session_id, **fields})
    assert await client.finish() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in client.error.details()
    assert runtime.active_sessions == 0


async def test_an_unreachable_configured_url_is_invalid_argument_and_stays_unnamed(
    oracle_service, guide_client, session_id
):
    internal = closed_port_url()
    runtime = await oracle_service(base_url=internal)
    client = guide_client(runtime.port)
    await client.config(session_id=session_id)
    assert await client.finish() == grpc.StatusCode.INVALID_ARGUMENT
    assert "the base URL is unreachable" in client.error.details()
    assert internal not in client.error.details()  # the caller learns no internal address


async def test_rejected_key_is_invalid_argument(
    oracle_service, guide_client, stub_http, session_id
):
    async def unauthorized(_request, respond):
        await respond.json(
            401,
            {"error": {"message": "Incorrect API key provided", "type": "invalid_request_error"}},
        )

    _server, url = await stub_http({("GET", "/v1/models"): unauthorized})
    runtime = await oracle_service(allowed_base_urls=url)
    client = guide_client(runtime.port)
    await client.config(session_id=session_id, base_url=f"{url}/v1", api_key="sk-wrong")
    assert await client.finish() == grpc.StatusCode.INVALID_ARGUMENT
    details = client.error.details()
    assert "rejected the API key" in details
    # The caller may see this: no URL, no key, no server text (the log has them).
    assert url not in details and "sk-wrong" not in details and "Incorrect" not in details


async def test_a_local_server_needs_no_key_and_a_service_key_is_used(
    oracle_service, guide_client, stub_http, session_id
):
    server, url = await stub_http({})
    runtime = await oracle_service(base_url=f"{url}/v1")
    client = guide_client(runtime.port)
    await client.config(session_id=session_id)
    assert await client.finish() == grpc.StatusCode.OK

    keyed = await oracle_service(base_url=f"{url}/v1", api_keys=ApiKeys(openai="sk-service"))
    client = guide_client(keyed.port)
    await client.config(session_id=session_id)
    assert await client.finish() == grpc.StatusCode.OK
    assert server.requests[-1].headers["authorization"] == "Bearer sk-service"


@pytest.mark.parametrize(
    "first, message",
    [
        (
            oracle_pb2.GuideRequest(user_transcript=common_pb2.TranscriptEvent(text="hi")),
            "the first message must be the config (OracleConfig), got user_transcript",
        ),
        (
            oracle_pb2.GuideRequest(),
            "the first message must be the config (OracleConfig), got an empty message",
        ),
    ],
)
async def test_events_before_the_config_are_refused(first, message, oracle_service, guide_client):
    runtime = await oracle_service()
    client = guide_client(runtime.port)
    await client.send(first)
    assert await client.finish() == grpc.StatusCode.INVALID_ARGUMENT
    assert client.error.details() == message


async def test_a_second_config_is_refused_and_the_service_goes_on(
    oracle_service, guide_client, stub_http, session_id
):
    _server, url = await stub_http({})
    runtime = await oracle_service(base_url=f"{url}/v1")
    client = guide_client(runtime.port)
    await client.config(session_id=session_id)
    await client.user("hello")
    await client.config(session_id=session_id)
    assert await client.finish() == grpc.StatusCode.INVALID_ARGUMENT
    assert "a second config arrived" in client.error.details()

    healthy = guide_client(runtime.port)
    await healthy.config(session_id=session_id + "-2")
    assert await healthy.finish() == grpc.StatusCode.OK
    assert runtime.active_sessions == 0
