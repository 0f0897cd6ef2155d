"""The Redis session store and capacity registry, against the real Redis."""

from __future__ import annotations

import asyncio
import time

import pytest

from kame_common.store import CapacityRegistry, SessionStore


async def test_session_record_and_conversation(redis_client, session_id):
    sessions = SessionStore(redis_client, ttl_s=60)
    await sessions.put_session(session_id, {"mode": "tandem", "replica": "fe-1"})
    await sessions.put_session(session_id, {"state": "open"})
    assert await sessions.get_session(session_id) == {
        "mode": "tandem",
        "replica": "fe-1",
        "state": "open",
    }
    await sessions.append_turn(session_id, "user", "what is the capital of france")
    await sessions.append_turn(session_id, "agent", "Paris.")
    turns = await sessions.conversation(session_id)
    assert [(t["role"], t["text"]) for t in turns] == [
        ("user", "what is the capital of france"),
        ("agent", "Paris."),
    ]
    await sessions.delete_session(session_id)
    assert await sessions.get_session(session_id) == {}


async def test_a_conversation_keeps_its_newest_turns(redis_client, session_id):
    """The attack: a caller that makes turns without end (keys pressed) used to grow
    its Redis list without bound."""
    sessions = SessionStore(redis_client, ttl_s=60, max_turns=5)
    for index in range(12):
        await sessions.append_turn(session_id, "user", f"turn {index}")
    turns = await sessions.conversation(session_id)
    assert [t["text"] for t in turns] == [f"turn {index}" for index in range(7, 12)]
    await sessions.delete_session(session_id)


async def test_a_lease_has_one_holder_until_released_or_expired(redis_client, session_id):
    sessions = SessionStore(redis_client)
    assert await sessions.hold_lease(session_id, "call-a", ttl_s=5)
    assert await sessions.hold_lease(session_id, "call-a", ttl_s=5)  # renewed
    assert not await sessions.hold_lease(session_id, "call-b", ttl_s=5)
    assert 4 < await sessions.lease_left_s(session_id) <= 5
    await sessions.release_lease(session_id, "call-b")  # not its lease: no effect
    assert not await sessions.hold_lease(session_id, "call-b", ttl_s=5)
    await sessions.release_lease(session_id, "call-a")
    assert await sessions.hold_lease(session_id, "call-b", ttl_s=0.1)
    await asyncio.sleep(0.2)  # call-b's holder died: its lease expires
    assert await sessions.lease_left_s(session_id) == 0
    assert await sessions.hold_lease(session_id, "call-c", ttl_s=5)
    await sessions.release_lease(session_id, "call-c")


async def test_records_expire_at_their_ttl(redis_client, session_id):
    sessions = SessionStore(redis_client, ttl_s=1)
    await sessions.put_session(session_id, {"mode": "cascade"})
    await sessions.append_turn(session_id, "user", "hello")
    assert 0 < await redis_client.ttl(f"kame:session:{session_id}") <= 1
    await asyncio.sleep(1.3)
    assert await sessions.get_session(session_id) == {}
    assert await sessions.conversation(session_id) == []


async def test_store_survives_a_dropped_connection(redis_client, redis_url, session_id):
    sessions = SessionStore(redis_client, ttl_s=60)
    await sessions.put_session(session_id, {"mode": "tandem"})
    my_id = await redis_client.client_id()
    # Kill our own connection server-side, from a second client: the next
    # command finds a dead socket and must reconnect and retry by itself.
    from kame_common.store import connect

    admin = connect(redis_url)
    assert await admin.client_kill_filter(_id=my_id) == 1
    await admin.aclose()
    await sessions.append_turn(session_id, "user", "still here")
    assert (await sessions.get_session(session_id))["mode"] == "tandem"
    assert await redis_client.client_id() != my_id
    await sessions.delete_session(session_id)


async def test_capacity_registry_chooses_most_free_and_forgets_dead(redis_client, session_id):
    registry = CapacityRegistry(redis_client, f"frontend-{session_id}", ttl_s=0.6)
    await registry.publish("a", "127.0.0.1:1", free_slots=1, total_slots=4)
    await registry.publish("b", "127.0.0.1:2", free_slots=3, total_slots=4)
    await registry.publish("c", "127.0.0.1:3", free_slots=0, total_slots=4)
    assert (await registry.choose()).replica_id == "b"
    assert {r.replica_id for r in await registry.replicas()} == {"a", "b", "c"}
    await registry.withdraw("b")
    assert (await registry.choose()).replica_id == "a"
    # Only "a" keeps publishing; the others expire.
    for _ in range(5):
        await asyncio.sleep(0.2)
        await registry.publish("a", "127.0.0.1:1", free_slots=2, total_slots=4)
    live = await registry.replicas()
    assert [(r.replica_id, r.free_slots) for r in live] == [("a", 2)]
    await asyncio.sleep(0.8)
    assert await registry.choose() is None


async def test_a_redis_that_never_answers_fails_each_command_within_the_timeout(session_id):
    """Accepts connections, never replies: every command fails after the client's
    timeout, once (a timeout is not retried), with a RedisError the callers catch."""
    from redis.exceptions import RedisError

    from kame_common.store import connect
    from tests.support import Blackhole

    hung = Blackhole()
    client = connect(f"redis://{hung.address}/0", timeout_s=0.3)
    try:
        for operation in (
            lambda: SessionStore(client).put_session(session_id, {"mode": "tandem"}),
            lambda: SessionStore(client).conversation(session_id),
            lambda: CapacityRegistry(client, "frontend").choose(),
        ):
            began = time.monotonic()
            with pytest.raises(RedisError):
                await operation()
            assert 0.25 < time.monotonic() - began < 1.0
    finally:
        await client.aclose()
        hung.close()
