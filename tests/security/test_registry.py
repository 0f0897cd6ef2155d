"""Signed capacity records in the real Redis: whoever can write to Redis but
lacks the secret cannot steer the gateway to an address of theirs. Each test
uses a service name of its own, so no other test's records are in view."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from prometheus_client import REGISTRY

from kame_common.store import CapacityRegistry, redacted_url

SECRET = "registry-secret-0123456789"


@pytest.fixture
async def service(redis_client):
    """A service name of the test's own; its keys are deleted afterwards."""
    name = f"frontend-sec-{uuid.uuid4().hex[:8]}"
    yield name
    keys = [key async for key in redis_client.scan_iter(f"kame:replica*:{name}*")]
    if keys:
        await redis_client.delete(*keys)


def rejected(service: str, reason: str) -> float:
    labels = {"service": service, "reason": reason}
    return REGISTRY.get_sample_value("kame_registry_rejected_records_total", labels) or 0.0


async def forge(registry: CapacityRegistry, replica_id: str, fields: dict[str, str]) -> None:
    """Write a record straight into Redis, the way an intruder would."""
    key = registry._replica_key(replica_id)
    await registry.client.delete(key)
    await registry.client.hset(key, mapping=fields)
    await registry.client.zadd(registry._index_key(), {replica_id: 4_000_000_000})


async def test_signed_records_verify_and_forged_ones_are_ignored_and_counted(redis_client, service):
    frontend = CapacityRegistry(redis_client, service, secret=SECRET)
    gateway = CapacityRegistry(redis_client, service, secret=SECRET)
    await frontend.publish("real", "10.0.0.5:50052", free_slots=2, total_slots=4)

    await forge(gateway, "unsigned", {"address": "evil:1", "free_slots": "99", "total_slots": "99"})
    await frontend.publish("tampered", "10.0.0.6:50052", free_slots=1, total_slots=4)
    await redis_client.hset(gateway._replica_key("tampered"), "address", "evil:2")
    await redis_client.hset(gateway._replica_key("tampered"), "free_slots", "99")
    intruder = CapacityRegistry(redis_client, service, secret="another-secret-0123456789")
    await intruder.publish("other-key", "evil:3", free_slots=99, total_slots=99)
    await forge(gateway, "garbled", {"address": "evil:4", "free_slots": "many"})

    chosen = await gateway.choose()
    assert chosen is not None and (chosen.replica_id, chosen.address) == ("real", "10.0.0.5:50052")
    assert [r.replica_id for r in await gateway.replicas()] == ["real"]
    assert rejected(service, "unsigned") >= 1
    assert rejected(service, "bad_signature") >= 2  # tampered, other-key
    assert rejected(service, "malformed") >= 1


async def test_a_replayed_expired_record_is_ignored(redis_client, service):
    short = CapacityRegistry(redis_client, service, ttl_s=0.2, secret=SECRET)
    await short.publish("old", "10.0.0.7:50052", free_slots=3, total_slots=4)
    captured = await redis_client.hgetall(short._replica_key("old"))
    await asyncio.sleep(0.3)
    await forge(short, "old", captured)  # the very record, signature intact, written back
    assert await short.replicas() == []
    assert rejected(service, "expired") >= 1


async def test_without_a_secret_records_are_not_checked_but_must_parse(redis_client, service):
    registry = CapacityRegistry(redis_client, service)
    await registry.publish("plain", "127.0.0.1:50052", free_slots=1, total_slots=1)
    await forge(registry, "garbled", {"address": "x:1", "free_slots": "?", "total_slots": "1"})
    assert [r.replica_id for r in await registry.replicas()] == ["plain"]
    signed = CapacityRegistry(redis_client, service, secret=SECRET)
    assert await signed.replicas() == []  # "plain" carries no signature


def test_redis_passwords_stay_out_of_printed_urls():
    assert redacted_url("redis://:s3cret@redis:6379/0") == "redis://:***@redis:6379/0"
    assert (
        redacted_url("rediss://kame:s3cret@redis.example/2") == "rediss://kame:***@redis.example/2"
    )
    assert redacted_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
