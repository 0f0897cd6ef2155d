"""The web service over real HTTP and WebSockets on loopback: the page and its
modules with their security headers, the operator's choices, the health check,
and each way a conversation can fail to start, against a real gateway (with
bearer-token auth; its upstreams are addresses where nothing listens, since
every check here happens before a session needs them)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.error
import urllib.request

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from services.gateway.config import GatewaySettings
from services.gateway.server import serve as serve_gateway
from services.web.config import WebSettings
from services.web.server import serve

TOKEN = "web-test-token-0123456789"
NOWHERE = "127.0.0.1:1"  # nothing listens on port 1
START = json.dumps({"type": "start", "mode": "tandem", "rate": 48000})


@pytest.fixture
async def gateway(redis_url):
    settings = GatewaySettings(
        host="127.0.0.1",
        port=0,
        metrics_port=0,
        redis_url=redis_url,
        auth_tokens=TOKEN,
        stt_address=NOWHERE,
        oracle_address=NOWHERE,
        frontend_address=NOWHERE,
        connect_timeout_s=2.0,
        registry_secret="registry-secret-for-web-tests",  # no stray registry record is chosen
    )
    runtime = await serve_gateway(settings)
    yield runtime
    await runtime.stop()


@pytest.fixture
async def web(gateway):
    """start(**settings) -> a running web service in front of the gateway."""
    servers = []

    async def start(**overrides):
        settings = WebSettings(
            host="127.0.0.1", port=0, metrics_port=0, gateway_address=gateway.address
        )
        for name, value in overrides.items():
            setattr(settings, name, value)
        settings.validate()
        servers.append(await serve(settings))
        return servers[-1]

    yield start
    for server in servers:
        await server.stop()


async def get(url: str) -> tuple[int, dict[str, str], bytes]:
    """GET `url` off the event loop, which serves it."""
    return await asyncio.to_thread(blocking_get, url)


def blocking_get(url: str) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return reply.status, dict(reply.headers), reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


async def converse(
    server, first: str | bytes, origin: str | None = None, audio: list[bytes] = ()
) -> list[dict]:
    """Open /converse, send `first` (then `audio` at once, as a page with its
    microphone open does), and collect the JSON events until the bridge closes."""
    url = f"ws://127.0.0.1:{server.port}/converse"
    headers = {"Origin": origin} if origin else {}
    async with connect(url, additional_headers=headers, open_timeout=10) as socket:
        with contextlib.suppress(ConnectionClosed):  # refused before it read anything
            await socket.send(first)
            for chunk in audio:
                await socket.send(chunk)
        return [json.loads(m) async for m in socket if isinstance(m, str)]


async def test_the_page_and_its_modules_are_served_with_a_strict_policy(web):
    server = await web()
    status, headers, body = await get(server.url)
    assert status == 200 and b'<script type="module" src="/static/app.js">' in body
    assert "default-src 'self'" in headers["content-security-policy"]
    assert headers["x-content-type-options"] == "nosniff"
    for module in ("app.js", "audio.js", "timeline.js", "capture-worklet.js", "player-worklet.js"):
        status, headers, body = await get(f"{server.url}static/{module}")
        assert status == 200 and "javascript" in headers["content-type"], module
        assert body.strip(), module


async def test_the_page_offers_what_the_operator_configured(web):
    server = await web(modes="tandem,cascade", llm_models="gemma-3-270m, gpt-4o-mini")
    status, _, body = await get(f"{server.url}config.json")
    assert status == 200
    assert json.loads(body) == {
        "modes": ["tandem", "cascade"],
        "llm_models": ["gemma-3-270m", "gpt-4o-mini"],
    }


async def test_health_turns_503_when_the_service_drains(web):
    server = await web()
    assert (await get(f"{server.url}healthz"))[0] == 200
    server.web.draining = True
    assert (await get(f"{server.url}healthz"))[0] == 503


async def test_a_wrong_or_missing_token_is_reported_as_auth_refused(web):
    server = await web()
    for token in ("", "wrong-token-0123456789"):
        start = json.dumps({"type": "start", "rate": 48000, "token": token})
        (event,) = await converse(server, start)
        assert event["type"] == "error" and event["code"] == "UNAUTHENTICATED", event
        assert event["message"].startswith("auth refused"), event


async def test_a_refusal_is_reported_as_sent_while_the_page_streams_audio(web):
    """The page's audio waits until the session started: a write racing the
    gateway's refusal (here: no upstream, after the gateway read the config)
    would turn it into INTERNAL (grpc/grpc#36066). A refusal by the auth
    interceptor, before the config is read, can still race the config's own
    write: not covered here."""
    server = await web(gateway_auth_token=TOKEN)
    twenty_ms = bytes(2 * 960)
    for _ in range(5):
        events = await converse(server, START, audio=[twenty_ms] * 25)
        assert [e["code"] for e in events if e["type"] == "error"] == ["UNAVAILABLE"], events


async def test_the_right_token_gets_past_the_gateways_auth(web):
    """With the page's token, and with the bridge's own when the page has none, the
    gateway lets the call in (and then finds no upstream: UNAVAILABLE, not auth)."""
    for server, start in (
        (await web(), json.dumps({"type": "start", "rate": 48000, "token": TOKEN})),
        (await web(gateway_auth_token=TOKEN), START),
    ):
        events = await converse(server, start)
        assert events[-1]["type"] == "error", events
        assert events[-1]["code"] == "UNAVAILABLE", events


async def test_a_gateway_that_does_not_answer_is_reported_as_down(web):
    server = await web(gateway_address=NOWHERE)
    (event,) = await converse(server, START)
    assert event["code"] == "UNAVAILABLE" and event["message"].startswith("gateway down"), event
    assert NOWHERE in event["message"]


async def test_a_bad_start_message_is_refused(web):
    server = await web()
    (event,) = await converse(server, json.dumps({"type": "start", "rate": 1}))
    assert event["code"] == "INVALID_ARGUMENT" and "rate" in event["message"], event


async def test_a_page_from_another_origin_may_not_open_the_socket(web):
    server = await web(allowed_origins="https://kame.example")
    with pytest.raises(InvalidStatus) as refused:
        await converse(server, START, origin="https://evil.example")
    assert refused.value.response.status_code == 403
    (event,) = await converse(server, START, origin="https://kame.example")
    assert event["code"] == "UNAUTHENTICATED"  # let in: the gateway decides
    (event,) = await converse(server, START, origin=f"http://127.0.0.1:{server.port}")
    assert event["code"] == "UNAUTHENTICATED"


async def test_conversations_beyond_the_limit_are_refused(web):
    server = await web(max_sessions=1)
    server.web.active_sessions = 1  # one conversation is open
    (event,) = await converse(server, START)
    assert event["code"] == "RESOURCE_EXHAUSTED" and "limit of 1" in event["message"], event
