"""End to end, locked down: the whole stack on loopback (real llama.cpp server,
stt, oracle, frontend tts, gateway) against a Redis that requires a password
(a redis-server of the test's own), with TLS on the gateway's client port,
mTLS between the gateway and every upstream, a signed capacity registry and
bearer-token auth. A spoken question goes in through `kame talk`'s client
(CA file, token) and a spoken answer comes back."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
import urllib.parse
import uuid

import numpy as np
import pytest
import redis
import redis.asyncio as redis_asyncio
from redis.exceptions import AuthenticationError, ResponseError

from kame_cli.stack_options import free_ports
from kame_cli.talk import TalkOptions, talk
from kame_client.result import AgentAudioStart
from kame_common import store
from kame_common.audio import SAMPLE_RATE
from services.frontend.config import FrontendSettings
from services.frontend.server import serve as serve_frontend
from services.gateway.config import GatewaySettings
from services.gateway.server import serve as serve_gateway
from services.oracle.config import ApiKeys, OracleSettings
from services.oracle.server import serve as serve_oracle
from services.stt.config import SttSettings
from services.stt.server import serve as serve_stt
from tests.support import wait_until

QUESTION = "What is the capital of France?"
TOKEN = "e2e-bearer-token-0123456789"
REGISTRY_SECRET = "e2e-registry-secret-0123456789"
NOWHERE = "127.0.0.1:1"


@pytest.fixture
def password_redis():
    """A redis-server of this test that requires a password; its URL (with the password)."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed")
    port, password = free_ports(1)[0], uuid.uuid4().hex
    command = [binary, "--port", str(port), "--bind", "127.0.0.1", "--requirepass", password]
    process = subprocess.Popen(
        [*command, "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://:{password}@127.0.0.1:{port}/0"
    try:
        deadline = time.monotonic() + 10
        with redis.Redis.from_url(url) as client:
            while True:
                try:
                    client.ping()
                    break
                except redis.ConnectionError:
                    assert time.monotonic() < deadline, "redis-server did not start"
                    time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        process.wait(10)


def words(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+", text.lower()))


async def test_the_locked_down_stack_answers_a_spoken_question(password_redis, pki, llm_url, speak):
    # The Redis really wants the password.
    port = urllib.parse.urlsplit(password_redis).port
    anonymous = redis_asyncio.Redis.from_url(f"redis://127.0.0.1:{port}/0")
    with pytest.raises((AuthenticationError, ResponseError)):
        await anonymous.ping()
    await anonymous.aclose()

    server_tls = dict(
        tls_cert_file=str(pki.server_cert),
        tls_key_file=str(pki.server_key),
    )
    upstream_tls = dict(server_tls, tls_client_ca_file=str(pki.ca_file))  # mTLS
    local = dict(host="127.0.0.1", port=0, metrics_port=0)
    runtimes = []
    try:
        stt = await serve_stt(SttSettings(**local, **upstream_tls))
        runtimes.append(stt)
        oracle = await serve_oracle(
            OracleSettings(**local, **upstream_tls, redis_url=password_redis, base_url=llm_url),
            api_keys=ApiKeys(),
        )
        runtimes.append(oracle)
        replica_id = f"secure-{uuid.uuid4().hex[:6]}"
        frontend = await serve_frontend(
            FrontendSettings(
                **local,
                **upstream_tls,
                redis_url=password_redis,
                replica_id=replica_id,
                registry_secret=REGISTRY_SECRET,
            )
        )
        runtimes.append(frontend)
        gateway_settings = GatewaySettings(
            **local,
            **server_tls,  # the client port: TLS, no client certificates
            redis_url=password_redis,
            stt_address=stt.address,
            oracle_address=oracle.address,
            frontend_address=NOWHERE,  # the signed registry is the only way to the frontend
            upstream_ca_file=str(pki.ca_file),
            upstream_cert_file=str(pki.client_cert),
            upstream_key_file=str(pki.client_key),
            auth_tokens=f"old-token-rotating-out-0123,{TOKEN}",
            registry_secret=REGISTRY_SECRET,
        )
        gateway_settings.validate()
        gateway = await serve_gateway(gateway_settings)
        runtimes.append(gateway)
        assert {r.transport for r in runtimes} == {"mTLS", "TLS"}
        assert gateway.transport == "TLS"

        registry = store.CapacityRegistry(
            store.connect(password_redis), "frontend", secret=REGISTRY_SECRET
        )
        frontend_address = f"127.0.0.1:{frontend.port}"

        async def registered() -> bool:
            return frontend_address in [r.address for r in await registry.replicas()]

        await wait_until(registered, "the frontend's signed record", 10)
        await registry.client.aclose()

        secure = TalkOptions(
            gateway=gateway.address,
            ca_file=str(pki.ca_file),
            auth_token=TOKEN,
            tail_s=1.0,
            max_wait_s=25.0,
        )
        result = await talk(speak(QUESTION), secure)
        assert result.status == "OK", result.status_details
        assert words(result.user_transcript) & {"capital", "france"}
        assert result.of(AgentAudioStart)

        client = store.connect(password_redis)
        try:
            assert result.started is not None
            session_id = result.started.session_id
            await wait_until(
                lambda: _ended(client, session_id), "the session record to say ended", 10
            )
            record = await store.SessionStore(client).get_session(session_id)
            assert record["replica_id"] == replica_id  # reached through its signed record
            turns = await store.SessionStore(client).conversation(session_id)
            said = " ".join(t["text"] for t in turns if t["role"] == "user")
            assert words(said) & {"capital", "france"}  # the oracle wrote it with the password
        finally:
            await client.aclose()

        quiet = np.zeros(SAMPLE_RATE // 2, np.float32)
        short = dict(tail_s=0.2, max_wait_s=1.0)
        no_token = TalkOptions(gateway=gateway.address, ca_file=str(pki.ca_file), **short)
        assert (await talk(quiet, no_token)).status == "UNAUTHENTICATED"
        plaintext = TalkOptions(gateway=gateway.address, auth_token=TOKEN, **short)
        assert (await talk(quiet, plaintext)).status == "UNAVAILABLE"
    finally:
        for runtime in reversed(runtimes):
            await runtime.stop()


async def _ended(client, session_id: str) -> bool:
    record = await store.SessionStore(client).get_session(session_id)
    return record.get("state") == "ended"
