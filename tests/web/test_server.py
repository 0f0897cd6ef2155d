"""The web service over real HTTP and WebSockets on loopback: the page and its
modules with their security headers, the operator's choices, the health check,
and each way a conversation can fail to start, against a real gateway (with
bearer-token auth; its upstreams are addresses where nothing listens, since
every check here happens before a session needs them). The attacks on the
bridge itself (silent sockets, DNS rebinding, missing or foreign origins, the
operator's token, internal addresses in errors) are each performed here."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import urllib.error
import urllib.request

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from kame_common.config import ConfigError
from services.gateway.config import GatewaySettings
from services.gateway.server import serve as serve_gateway
from services.web.config import WebSettings
from services.web.server import serve
from tests.support.web import web_before

TOKEN = "web-test-token-0123456789"
NOWHERE = "127.0.0.1:1"  # nothing listens on port 1
START = json.dumps({"type": "start", "mode": "tandem", "rate": 48000})
WITH_TOKEN = json.dumps({"type": "start", "rate": 48000, "token": TOKEN})
PAGE = "the page's own"  # converse's default origin: the one a browser on the page sends


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
        readiness_interval_s=0,  # admit calls to upstreams that are not there
        connect_timeout_s=2.0,
        registry_secret="registry-secret-for-web-tests",  # no stray registry record is chosen
    )
    runtime = await serve_gateway(settings)
    yield runtime
    await runtime.stop()


@pytest.fixture
async def web(gateway):
    """start(**settings) -> a running web service in front of the gateway."""
    async with contextlib.AsyncExitStack() as servers:

        async def start(**settings):
            settings.setdefault("gateway_address", gateway.address)
            return await servers.enter_async_context(web_before(**settings))

        yield start


async def get(url: str, host: str = "") -> tuple[int, dict[str, str], bytes]:
    """GET `url` off the event loop, which serves it; `host`: another Host header."""
    return await asyncio.to_thread(blocking_get, url, host)


def blocking_get(url: str, host: str = "") -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, headers={"Host": host} if host else {})
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            return reply.status, dict(reply.headers), reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def opened(server, origin: str | None = PAGE, host: str = "127.0.0.1"):
    """A WebSocket to /converse on loopback, as a page at http://`host`:port opens it:
    `host` is what the browser resolved to 127.0.0.1 (a DNS rebinding, unless it
    is a loopback name); `origin` None sends no Origin."""
    netloc = f"{host}:{server.port}"
    headers = {"Origin": f"http://{netloc}" if origin == PAGE else origin} if origin else {}
    return connect(
        f"ws://{netloc}/converse",
        sock=socket.create_connection(("127.0.0.1", server.port)),
        additional_headers=headers,
        open_timeout=10,
    )


async def converse(
    server,
    first: str | bytes,
    origin: str | None = PAGE,
    audio: list[bytes] = (),
    host: str = "127.0.0.1",
) -> list[dict]:
    """Open /converse, send `first` (then `audio` at once, as a page with its
    microphone open does), and collect the JSON events until the bridge closes."""
    async with opened(server, origin, host) as page:
        with contextlib.suppress(ConnectionClosed):  # refused before it read anything
            await page.send(first)
            for chunk in audio:
                await page.send(chunk)
        return [json.loads(m) async for m in page if isinstance(m, str)]


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
    server.web.admission.draining = True
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
    server = await web(gateway_auth_token=TOKEN, relay_token_behind_login=True)
    twenty_ms = bytes(2 * 960)
    for _ in range(5):
        events = await converse(server, START, audio=[twenty_ms] * 25)
        assert [e["code"] for e in events if e["type"] == "error"] == ["UNAVAILABLE"], events


async def test_the_right_token_gets_past_the_gateways_auth(web):
    """With the page's token, and with the bridge's own when the page has none (and
    the operator said their login guards the page), the gateway lets the call in
    (and then finds no upstream: UNAVAILABLE, not auth)."""
    for server, start in (
        (await web(), WITH_TOKEN),
        (await web(gateway_auth_token=TOKEN, relay_token_behind_login=True), START),
    ):
        events = await converse(server, start)
        assert events[-1]["type"] == "error", events
        assert events[-1]["code"] == "UNAVAILABLE", events


async def test_a_gateway_that_does_not_answer_is_reported_as_down_without_its_address(web):
    """gRPC's own words for it ("failed to connect to all addresses; last error: ...
    ipv4:127.0.0.1:1: Connection refused") name the internal address: not on the page."""
    server = await web(gateway_address=NOWHERE)
    (event,) = await converse(server, START)
    assert event["code"] == "UNAVAILABLE" and event["message"].startswith("gateway down"), event
    assert "127.0.0.1" not in event["message"] and "ipv4" not in event["message"], event


async def test_a_bad_start_message_is_refused(web):
    server = await web()
    (event,) = await converse(server, json.dumps({"type": "start", "rate": 1}))
    assert event["code"] == "INVALID_ARGUMENT" and "rate" in event["message"], event


async def refused_status(server, **how) -> int:
    """The HTTP status a WebSocket upgrade opened `how` gets; fails if it is let in."""
    with pytest.raises(InvalidStatus) as refused:
        await converse(server, START, **how)
    return refused.value.response.status_code


async def test_a_page_from_another_origin_may_not_open_the_socket(web):
    server = await web(allowed_origins="https://kame.example")
    assert await refused_status(server, origin="https://evil.example") == 403
    assert await refused_status(server, origin="null") == 403  # a sandboxed frame
    (event,) = await converse(server, START, origin="https://kame.example")
    assert event["code"] == "UNAUTHENTICATED"  # let in: the gateway decides
    (event,) = await converse(server, START)  # the page's own origin
    assert event["code"] == "UNAUTHENTICATED"


async def test_a_socket_without_an_origin_is_refused(web):
    """No Origin is no browser page: a script that wants the bridge's relay, or its slots."""
    server = await web()
    assert await refused_status(server, origin=None) == 403


async def test_a_dns_rebinding_page_is_refused_by_its_host_name(web):
    """evil.example's page, its name rebound to 127.0.0.1, is same-origin with itself
    (Origin and Host both evil.example): only the Host tells it from the real page."""
    server = await web()
    assert await refused_status(server, host="evil.example") == 403
    page_url = f"http://127.0.0.1:{server.port}/"
    status, _headers, _body = await get(page_url, host=f"evil.example:{server.port}")
    assert status == 403
    assert (await get(f"{page_url}healthz", host=f"10.1.2.3:{server.port}"))[0] == 200  # probes
    for host in ("localhost", "127.0.0.1"):
        (event,) = await converse(server, START, host=host)
        assert event["code"] == "UNAUTHENTICATED", (host, event)
    named = await web(allowed_hosts="kame.example")
    (event,) = await converse(named, START, host="kame.example")
    assert event["code"] == "UNAUTHENTICATED", event


async def test_the_operators_token_is_relayed_only_behind_their_login(web, gateway):
    """A page without a token must not ride on the operator's: without
    relay_token_behind_login the settings are refused at start, and a bridge
    started anyway sends no token."""
    with pytest.raises(ConfigError, match="relay_token_behind_login"):
        await web(gateway_auth_token=TOKEN)
    unchecked = WebSettings(
        host="127.0.0.1",
        port=0,
        metrics_port=0,
        gateway_address=gateway.address,
        gateway_auth_token=TOKEN,
    )
    server = await serve(unchecked)
    try:
        (event,) = await converse(server, START)
    finally:
        await server.stop()
    assert event["code"] == "UNAUTHENTICATED", event


async def test_silent_sockets_hold_no_slot_and_are_closed(web):
    """More sockets than the limit that never send a start message: a real page
    still gets its conversation, and each silent one is closed after start_timeout_s."""
    server = await web(max_sessions=2, start_timeout_s=1.0)
    silent = [await opened(server) for _ in range(3)]
    try:
        events = await converse(server, WITH_TOKEN)
        assert events[-1]["code"] == "UNAVAILABLE", events  # in: the gateway has no upstream
        for page in silent:
            await asyncio.wait_for(page.wait_closed(), 5)
            assert page.close_code == 1008 and "no start message" in page.close_reason
    finally:
        for page in silent:
            await page.close()
    assert server.web.admission.active == 0


async def test_a_busy_stack_tells_the_page_when_to_try_again(web, busy_gateway):
    """The gateway refuses the call with RESOURCE_EXHAUSTED and `retry-after-s`: the
    page hears both, in words."""
    server = await web(gateway_address=busy_gateway)
    (event,) = await converse(server, START)
    assert event["code"] == "RESOURCE_EXHAUSTED" and event["retry_after_s"] == 3, event
    assert event["message"].startswith("the agent is busy: try again in 3 s"), event
    assert "10.0.0.1" not in event["message"]
