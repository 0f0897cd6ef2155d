"""Keys stay with their URLs: the oracle service (real gRPC, real OpenAI and
Anthropic SDKs) against a loopback capture server that records every request
and its headers. The capture server stands in for a URL a caller controls:
it must never see the service's keys, and a refused config must not reach it
at all. (Vendor APIs cannot be reached from here; the capture server speaks
the part of their protocol the SDKs need.)"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
import pytest

from kame_common.config import ConfigError, load_settings
from kamepb import common_pb2, oracle_pb2, oracle_pb2_grpc
from kamepb.common_pb2 import LLM_BACKEND_ANTHROPIC, LLM_BACKEND_OPENAI
from services.oracle.config import (
    ApiKeys,
    InvalidSessionConfig,
    OracleSettings,
    resolve_session,
    url_allowed,
)
from services.oracle.server import serve

SERVICE_KEYS = ApiKeys(openai="sk-service-openai-0123456789", anthropic="sk-service-ant-0123456789")
CALLER_KEY = "sk-caller-own-key-9876543210"
Event = oracle_pb2.OracleEvent


@pytest.fixture
async def oracle():
    """start(**settings) -> port of an oracle holding SERVICE_KEYS (no Redis history).
    No warm-up at start: what is counted here is what a caller's config makes the
    oracle send (the warm-up is the operator's own request, tested in tests/oracle)."""
    runtimes = []

    async def start(**overrides) -> int:
        settings = dict(
            host="127.0.0.1",
            port=0,
            metrics_port=0,
            redis_url="",
            model="stub-model",
            warmup_timeout_s=0.0,
        )
        runtime = await serve(OracleSettings(**{**settings, **overrides}), api_keys=SERVICE_KEYS)
        runtimes.append(runtime)
        return runtime.port

    yield start
    for runtime in runtimes:
        await runtime.stop()


async def guide(port: int, ask: str = "", **config) -> tuple[grpc.StatusCode, str, list]:
    """One Guide stream: the config, then (if `ask`) a final transcript and
    every response until the LLM stream ends; (status, details, events)."""
    events = []
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = oracle_pb2_grpc.OracleStub(channel).Guide()
        policy = oracle_pb2.OraclePolicy(poll_interval_s=0.05)
        session_id = f"sec-{uuid.uuid4().hex[:8]}"
        await call.write(
            oracle_pb2.GuideRequest(
                config=oracle_pb2.OracleConfig(session_id=session_id, policy=policy, **config)
            )
        )
        try:
            if ask:
                await call.write(
                    oracle_pb2.GuideRequest(
                        user_transcript=common_pb2.TranscriptEvent(
                            utterance_id="u1", is_final=True, text=ask, stability=1.0
                        )
                    )
                )
                while (response := await call.read()) is not grpc.aio.EOF:
                    if response.HasField("event"):
                        events.append(response.event.kind)
                        if response.event.kind in (Event.DONE, Event.ERROR):
                            break
            await call.done_writing()
            while await call.read() is not grpc.aio.EOF:
                pass
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            pass  # the oracle ended the call first: its status is what counts
        return await call.code(), await call.details(), events


def assert_no_service_key(capture) -> None:
    seen = " ".join(capture.headers_seen())
    assert SERVICE_KEYS.openai not in seen
    assert SERVICE_KEYS.anthropic not in seen


# -- refused before any request ------------------------------------------------------------------


@pytest.mark.parametrize("backend", [LLM_BACKEND_OPENAI, LLM_BACKEND_ANTHROPIC])
@pytest.mark.parametrize("api_key", ["", CALLER_KEY])
async def test_without_an_allow_list_a_caller_url_is_refused_and_never_contacted(
    oracle, capture, backend, api_key
):
    port = await oracle(allowed_backends="openai,anthropic", allowed_models="*")
    code, details, _ = await guide(
        port, backend=backend, base_url=f"{capture.url}/v1", api_key=api_key
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "allowed_base_urls" in details and "which is empty" in details
    assert capture.requests == []


async def test_an_allowed_caller_url_without_the_callers_key_is_refused_and_never_contacted(
    oracle, capture
):
    port = await oracle(allowed_base_urls=capture.url)
    code, details, _ = await guide(port, base_url=f"{capture.url}/v1")
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "api_key is required" in details
    assert capture.requests == []


@pytest.mark.parametrize(
    "caller_url",
    [
        "{url}/v10",  # beside the allowed prefix, not under it
        "{url}/v1/../admin",
        "https://{host}/v1",  # another scheme
        "http://127.0.0.2:{port}/v1",  # another host
        "http://user:pw@{host}/v1",  # credentials in the URL
        "{url}/v1?next=elsewhere",
        "{url}/v1/%2e%2e/admin",  # the server decodes it to /v1/../admin
        "{url}/v1/%2E%2E%2fadmin",
        "{url}/v1/./..//admin",
    ],
)
async def test_urls_outside_the_allow_list_are_refused_and_never_contacted(
    oracle, capture, caller_url
):
    host = capture.url.removeprefix("http://")
    url = caller_url.format(url=capture.url, host=host, port=host.rsplit(":", 1)[1])
    port = await oracle(allowed_base_urls=f"{capture.url}/v1")
    code, details, _ = await guide(port, base_url=url, api_key=CALLER_KEY)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "base_url" in details
    assert capture.requests == []


async def test_a_model_outside_the_allow_list_is_refused_and_never_requested(oracle, capture):
    port = await oracle(base_url=f"{capture.url}/v1")
    code, details, _ = await guide(port, model="gpt-4o")
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "model 'gpt-4o' is not allowed" in details and "allowed_models" in details
    assert capture.requests == []

    listed = await oracle(base_url=f"{capture.url}/v1", allowed_models="gpt-4o, other")
    code, _, events = await guide(listed, ask="What is the capital of France?", model="gpt-4o")
    assert code == grpc.StatusCode.OK and Event.DONE in events


# -- where the keys go ---------------------------------------------------------------------------


async def test_an_allowed_caller_url_gets_the_callers_key_and_never_the_service_key(
    oracle, capture, monkeypatch
):
    # The OpenAI SDK reads these into headers; they stay with OpenAI's own API.
    monkeypatch.setenv("OPENAI_ORG_ID", "org-operator-0123")
    monkeypatch.setenv("OPENAI_PROJECT_ID", "proj-operator-0123")
    port = await oracle(allowed_base_urls=f"{capture.url}/v1")
    code, _, events = await guide(
        port,
        ask="What is the capital of France?",
        base_url=f"{capture.url}/v1/",
        api_key=CALLER_KEY,
    )
    assert code == grpc.StatusCode.OK
    assert Event.DONE in events  # the answer streamed from the caller's URL
    assert {r.method for r in capture.requests} == {"GET", "POST"}
    assert all(r.headers["authorization"] == f"Bearer {CALLER_KEY}" for r in capture.requests)
    assert not any(
        name in r.headers
        for r in capture.requests
        for name in ("openai-organization", "openai-project")
    )
    assert_no_service_key(capture)


async def test_an_anthropic_session_at_an_allowed_url_never_sends_the_anthropic_key(
    oracle, capture
):
    port = await oracle(
        allowed_base_urls=capture.url, allowed_backends="openai,anthropic", allowed_models="*"
    )
    code, _, events = await guide(
        port, ask="Hello?", backend=LLM_BACKEND_ANTHROPIC, base_url=capture.url, api_key=CALLER_KEY
    )
    assert code == grpc.StatusCode.OK
    assert Event.ERROR in events  # the capture server answers /v1/messages with 404
    assert any(r.path == "/v1/messages" for r in capture.requests)
    for request in capture.requests:
        presented = request.headers.get("x-api-key") or request.headers.get("authorization", "")
        assert CALLER_KEY in presented
    assert_no_service_key(capture)


async def test_the_operators_url_gets_the_service_key(oracle, capture):
    """The control: the capture server does see a key when it is the configured URL."""
    port = await oracle(base_url=f"{capture.url}/v1")
    code, _, events = await guide(port, ask="What is the capital of France?")
    assert code == grpc.StatusCode.OK and Event.DONE in events
    assert capture.requests
    assert all(
        r.headers["authorization"] == f"Bearer {SERVICE_KEYS.openai}" for r in capture.requests
    )


async def test_a_redirect_does_not_carry_the_conversation_to_another_origin(oracle, capture):
    """The attack: an allowed URL (or one that was later taken over) answers 307/308
    naming another origin; the SDKs used to resend the request, conversation and
    all, there."""
    redirect = Redirector(capture.url)
    try:
        port = await oracle(allowed_base_urls=redirect.url)
        code, _, events = await guide(
            port,
            ask="My account number is 12345.",
            base_url=f"{redirect.url}/v1",
            api_key=CALLER_KEY,
        )
        assert code == grpc.StatusCode.OK and Event.ERROR in events
        assert redirect.requests and capture.requests == []
    finally:
        redirect.close()


class Redirector:
    """HTTP on loopback that answers every request with a 307 to `target`."""

    def __init__(self, target: str) -> None:
        requests = self.requests = []

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _redirect(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", "0")))
                requests.append(self.path)
                self.send_response(307)
                self.send_header("Location", f"{target}{self.path}")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_GET(self) -> None:
                self._redirect()

            def do_POST(self) -> None:
                self._redirect()

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


async def test_a_caller_cannot_spend_the_key_of_a_backend_the_operator_did_not_choose(
    oracle, capture
):
    """The attack: `backend: anthropic` on a stack that runs a local OpenAI-compatible
    LLM used the operator's Anthropic key (it is in the environment for a reason)."""
    port = await oracle(base_url=f"{capture.url}/v1")
    code, details, _ = await guide(port, backend=LLM_BACKEND_ANTHROPIC)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "backend 'anthropic' is not allowed" in details and "allowed_backends" in details
    assert capture.requests == []


async def test_naming_the_operators_own_llm_url_is_refused(oracle, capture):
    """Only a call that leaves base_url empty is counted against the oracle's own
    LLM by the gateway's admission: naming its URL would go around that."""
    port = await oracle(base_url=f"{capture.url}/v1")
    code, details, _ = await guide(port, base_url=f"{capture.url}/v1/", api_key=CALLER_KEY)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "leave it empty" in details
    assert capture.requests == []


async def test_credentials_in_the_base_url_stay_out_of_the_log(oracle, capture, caplog):
    host = capture.url.removeprefix("http://")
    with caplog.at_level(logging.INFO, logger="services.oracle"):
        await oracle(base_url=f"http://operator:s3cret-pass@{host}/v1")
    assert f"at http://{host}/v1" in caplog.text
    assert "s3cret-pass" not in caplog.text


# -- the rules, without a server -----------------------------------------------------------------


def test_another_backend_and_its_default_model_need_the_operators_leave():
    config = oracle_pb2.OracleConfig(session_id="s", backend=LLM_BACKEND_ANTHROPIC)
    with pytest.raises(InvalidSessionConfig, match="allowed_backends"):
        resolve_session(config, _service(), SERVICE_KEYS)
    allowed = _service(allowed_backends="openai,anthropic")
    with pytest.raises(InvalidSessionConfig, match="model 'claude-haiku-4-5' is not allowed"):
        resolve_session(config, allowed, SERVICE_KEYS)
    listed = _service(allowed_backends="anthropic", allowed_models="claude-haiku-4-5")
    assert resolve_session(config, listed, SERVICE_KEYS).backend.model == "claude-haiku-4-5"
    with pytest.raises(ConfigError, match="allowed_backends: 'gemini' is unknown"):
        _service(allowed_backends="gemini")


def _service(**env: str) -> OracleSettings:
    return load_settings(
        OracleSettings, [], env={f"KAME_ORACLE_{k.upper()}": v for k, v in env.items()}
    )


def test_a_key_never_goes_to_another_backends_url():
    service = _service(
        base_url="http://llm.internal:8080/v1",
        allowed_backends="openai,anthropic",
        allowed_models="*",
    )
    for config in (
        oracle_pb2.OracleConfig(
            session_id="s", backend=LLM_BACKEND_ANTHROPIC, base_url="http://llm.internal:8080/v1"
        ),
        oracle_pb2.OracleConfig(
            session_id="s", backend=LLM_BACKEND_ANTHROPIC, base_url="https://api.openai.com/v1"
        ),
    ):
        with pytest.raises(InvalidSessionConfig, match="allowed_base_urls"):
            resolve_session(config, service, SERVICE_KEYS)


def test_the_vendor_url_of_the_backend_may_be_named_and_gets_the_service_key():
    service = _service(allowed_backends="anthropic", allowed_models="claude-haiku-4-5")
    session = resolve_session(
        oracle_pb2.OracleConfig(
            session_id="s", backend=LLM_BACKEND_ANTHROPIC, base_url="HTTPS://api.anthropic.com/"
        ),
        service,
        SERVICE_KEYS,
    )
    assert (session.backend.base_url, session.backend.api_key) == (
        "https://api.anthropic.com",
        SERVICE_KEYS.anthropic,
    )


@pytest.mark.parametrize(
    "url, allowed",
    [
        ("https://llm.example.com/v1", True),
        ("https://LLM.example.com:443/v1/", True),
        ("https://llm.example.com/v1/chat", True),
        ("https://llm.example.com/v10", False),
        ("https://llm.example.com.evil.net/v1", False),
        ("https://llm.example.com@evil.net/v1", False),
        ("http://llm.example.com/v1", False),
        ("https://llm.example.com:8443/v1", False),
        ("https://llm.example.com/v1/../../admin", False),
        ("https://llm.example.com/v1/%2e%2e/admin", False),
        ("https://llm.example.com/v1/%2E%2E/admin", False),
        ("https://llm.example.com/v1/./chat", False),
        ("https://llm.example.com/v1/..%5cadmin", False),
        ("https://llm.example.com/v1\\..\\admin", False),
        ("not a url", False),
    ],
)
def test_url_prefixes_match_on_origin_and_whole_path_segments(url, allowed):
    assert url_allowed(url, ["https://llm.example.com/v1"]) is allowed


def test_allowed_base_urls_must_be_plain_urls():
    with pytest.raises(ConfigError, match="allowed_base_urls: 'https://u:p@x/v1' must not carry"):
        _service(allowed_base_urls="https://ok.example/v1, https://u:p@x/v1")
    with pytest.raises(ConfigError, match="allowed_base_urls: 'ftp://x' must be an http"):
        _service(allowed_base_urls="ftp://x")
