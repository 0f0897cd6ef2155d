"""What a Redis command that never ends costs the gateway: one bounded wait.

redis-py (8.1) can swallow a CancelledError that lands inside a command and go on
until its socket timeout, or longer. A call set-up that cancels a registry read and
waits for it to end, or a session close that does the same to its records writer,
then waits as long as the command does. Here the command is a coroutine that
swallows its cancellation and goes on until the test lets it end."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from services.gateway import connections, records
from services.gateway.connections import RegistryReads
from services.gateway.records import SessionRecords

BOUND_S = 1.0  # far above the shortened timeouts, far below a hang


async def swallows_cancellation(released: asyncio.Event, result: Any = None) -> Any:
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        await released.wait()  # swallowed: goes on as if nothing happened
    return result


@pytest.fixture
def short_timeouts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connections, "REGISTRY_TIMEOUT_S", 0.05)
    monkeypatch.setattr(connections, "REGISTRY_BACKOFF_S", 0.0)
    monkeypatch.setattr(records, "FLUSH_TIMEOUT_S", 0.05)


async def test_a_registry_read_that_ignores_its_cancellation_costs_the_set_up_one_timeout(
    short_timeouts: None,
):
    released = asyncio.Event()
    reads = RegistryReads()
    try:
        result = await asyncio.wait_for(
            reads.read("frontend", swallows_cancellation(released)), BOUND_S
        )
        assert result is None
        # Skipped while the abandoned read still runs, although the backoff is over:
        # reads stuck on a hung Redis do not pile up, one per set-up.
        started: list[str] = []

        async def counted() -> list[str]:
            started.append("read")
            return ["replica"]

        assert await asyncio.wait_for(reads.read("frontend", counted()), BOUND_S) is None
        assert started == []
    finally:
        released.set()
    await asyncio.sleep(0.01)  # the abandoned read ends
    assert await reads.read("frontend", counted()) == ["replica"]
    assert started == ["read"]


class HungStore:
    """A session store whose writes never end until released."""

    def __init__(self) -> None:
        self.released = asyncio.Event()
        self.writes = 0

    async def put_session(self, session_id: str, fields: dict[str, Any]) -> None:
        self.writes += 1
        await swallows_cancellation(self.released)


async def test_a_records_writer_stuck_on_redis_does_not_hold_the_session_close(
    short_timeouts: None,
):
    store = HungStore()
    session_records = SessionRecords(store, "s1")  # type: ignore[arg-type]
    session_records.start()
    session_records.update_session({"mode": "kame"})
    await asyncio.sleep(0.01)
    assert store.writes == 1
    try:
        await asyncio.wait_for(session_records.close(), BOUND_S)
    finally:
        store.released.set()
