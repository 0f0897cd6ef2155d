"""The parts of a side stream that need no server: the drop-oldest buffer, the
reopening backoff, and a call whose connection is gone (a stand-in for the gRPC
call object). The stream with real upstreams (watchdog, reopening, notices) is
tested through whole sessions in test_session.py."""

from __future__ import annotations

import asyncio
import gc

import pytest

from services.gateway.sidestream import DropOldestBuffer, SidePolicy, SideStream


async def test_a_full_buffer_drops_its_oldest_item_and_never_waits():
    buffer: DropOldestBuffer[int] = DropOldestBuffer(3)
    kept = [buffer.push(item) for item in range(5)]
    assert kept == [True, True, True, False, False]
    assert [await buffer.pop() for _ in range(3)] == [2, 3, 4]


async def test_pop_waits_for_an_item_and_ends_after_close():
    buffer: DropOldestBuffer[str] = DropOldestBuffer(2)
    waiting = asyncio.ensure_future(buffer.pop())
    await asyncio.sleep(0.01)
    assert not waiting.done()
    buffer.push("frame")
    assert await asyncio.wait_for(waiting, 1) == "frame"
    buffer.push("last")
    buffer.close()
    assert await buffer.pop() == "last"  # what was queued still goes out
    assert await buffer.pop() is None


def test_backoff_doubles_up_to_its_cap_with_jitter():
    policy = SidePolicy(buffer_size=1, timeout_s=2.0, backoff_s=0.5, backoff_max_s=4.0)
    for failures, nominal in ((1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (5, 4.0), (12, 4.0)):
        delays = [policy.backoff(failures) for _ in range(50)]
        assert all(0.8 * nominal <= d <= 1.2 * nominal for d in delays), (failures, delays)
        assert len(set(delays)) > 1  # jittered: reopenings of many sessions spread out


@pytest.mark.parametrize("size", [0, -1])
def test_a_buffer_holds_at_least_one_item(size):
    buffer: DropOldestBuffer[int] = DropOldestBuffer(size)
    assert buffer.push(1) and not buffer.push(2) and len(buffer) == 1


class BrokenCall:
    """A call whose connection is gone: reading and writing fail at once, as both
    of a gRPC call's directions do when its upstream is killed."""

    def __init__(self) -> None:
        self.cancelled = False

    async def write(self, request: object) -> None:
        raise asyncio.InvalidStateError("RPC already finished.")

    async def read(self) -> object:
        raise ConnectionResetError("Stream removed")

    async def done_writing(self) -> None:
        pass

    def cancel(self) -> bool:
        self.cancelled = True
        return True


async def test_a_call_whose_two_directions_fail_at_once_leaves_no_error_untaken():
    """Both the reader's and the writer's errors are taken; asyncio logged the one
    left behind as 'Task exception was never retrieved' (a soak's gateway log)."""
    loop = asyncio.get_running_loop()
    untaken: list[dict] = []
    loop.set_exception_handler(lambda _loop, context: untaken.append(context))
    failures: list[str] = []

    async def on_down(_side: SideStream[str], exc: Exception) -> bool:
        failures.append(type(exc).__name__)  # not the error: its traceback holds the tasks
        return False  # do not reopen

    async def nothing(*_args: object) -> None:
        return None

    policy = SidePolicy(buffer_size=4, timeout_s=0, backoff_s=0.01, backoff_max_s=0.01)
    side: SideStream[str] = SideStream(
        "stt", policy, lambda _attempt: (BrokenCall(), ["config"]), nothing, on_down, nothing
    )
    side.start(lambda name, coro: loop.create_task(coro, name=name))
    assert side.task is not None
    await asyncio.wait_for(side.task, 2)
    await asyncio.sleep(0)
    gc.collect()  # a task's untaken error is reported when the task is collected
    await asyncio.sleep(0)
    assert len(failures) == 1
    assert not [c for c in untaken if "never retrieved" in str(c.get("message"))], untaken
