"""The oracle measures how busy its LLM is and publishes what it can serve
(kame_common.capacity): a real oracle, the real Redis registry, and a local
OpenAI-compatible server (tests/oracle/conftest.py) whose stream stalls, so
the LLM stays busy for as long as the test wants."""

from __future__ import annotations

import asyncio
import urllib.parse

import pytest
from prometheus_client import REGISTRY

from kame_common import store
from kamepb import oracle_pb2
from tests.oracle.test_failures import scripted_chat
from tests.support import wait_until

SECRET = "registry-secret-of-the-oracle-capacity-test"


def utilization() -> float:
    return REGISTRY.get_sample_value("kame_capacity_utilization", {"service": "oracle"}) or 0.0


@pytest.fixture
def registry_url(redis_url) -> str:
    parts = urllib.parse.urlsplit(redis_url)
    return urllib.parse.urlunsplit(parts._replace(path="/13"))


async def test_a_streaming_session_keeps_the_llm_busy_and_is_published(
    oracle_service, guide_client, stub_http, session_id, registry_url
):
    _server, url = await stub_http(
        {("POST", "/v1/chat/completions"): scripted_chat(["stall_mid_stream"])}
    )
    runtime = await oracle_service(
        base_url=f"{url}/v1",
        model="stub-model",
        redis_url=registry_url,
        publish_capacity=True,
        registry_secret=SECRET,
        replica_id="oracle-capacity-test",
        session_load_prior=0.25,  # 0.8 / 0.25: 3 sessions before any is measured
        llm_parallel=1,  # the stub serves one stream: one stalled stream fills it
    )
    client = store.connect(registry_url)
    registry = store.CapacityRegistry(client, "oracle", secret=SECRET)

    async def record() -> store.Replica | None:
        return next(
            (r for r in await registry.replicas() if r.replica_id == "oracle-capacity-test"), None
        )

    try:
        await wait_until(record, "the oracle's record")
        first = await record()
        assert first is not None and (first.free_slots, first.total_slots) == (3, 3)
        assert first.address == f"127.0.0.1:{runtime.port}"

        guide = guide_client(runtime.port)
        await guide.config(
            session_id=session_id,
            request_timeout_s=30.0,
            policy=oracle_pb2.OraclePolicy(poll_interval_s=0.05),
        )
        await guide.user("What is the capital of France?", final=True)
        await guide.wait_event(oracle_pb2.OracleEvent.FIRST_TOKEN, 1, timeout_s=10)

        async def one_taken() -> bool:
            now = await record()
            return now is not None and now.free_slots == 2

        await wait_until(one_taken, "the open session in the record", 5)
        await asyncio.sleep(1.0)  # the stream stalls: the LLM stays busy
        assert 0.05 < utilization() <= 1.0
        guide.call.cancel()

        async def freed() -> bool:
            now = await record()
            return now is not None and now.free_slots == 3

        await wait_until(freed, "the session's end in the record", 5)
        await runtime.stop()
        assert await record() is None  # withdrawn when it drained
    finally:
        await client.aclose()
