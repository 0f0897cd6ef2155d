"""Helpers every test module may use."""

from __future__ import annotations

import asyncio
import inspect
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc

from kame_common.server import ServiceRuntime


async def wait_until(
    condition: Callable[[], bool | Awaitable[bool]],
    what: str,
    timeout_s: float = 10.0,
    interval_s: float = 0.02,
) -> None:
    """Poll `condition` (plain or async) until it is true; AssertionError naming
    `what` if it is still false after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = condition()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        await asyncio.sleep(interval_s)


def words_of(text: str) -> list[str]:
    """Lower-case words without punctuation."""
    return re.findall(r"[a-z0-9']+", text.lower())


def word_recall(expected: str, heard: str) -> float:
    """The share of `expected`'s distinct words that are in `heard`. Speech
    recognition of synthesized audio on a loaded CPU mishears a word now and then
    (Whisper tiny.en hears piper's "Paris" as "Harris"), so tests that check what
    was recognized compare a share against a threshold, never one exact word."""
    wanted = set(words_of(expected))
    return len(wanted & set(words_of(heard))) / len(wanted) if wanted else 1.0


ECHO_SERVICE = "kametest.Echo"


def echo_handler(runtime: ServiceRuntime) -> grpc.GenericRpcHandler:
    """`kametest.Echo/Chat`: a bidirectional echo (raw bytes) that holds one of
    `runtime`'s sessions while its stream is open, for tests of the runtime itself."""

    async def chat(
        request_iterator: AsyncIterator[bytes], context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> AsyncIterator[bytes]:
        async with runtime.session(context):
            async for message in request_iterator:
                yield message

    return grpc.method_handlers_generic_handler(
        ECHO_SERVICE,
        {"Chat": grpc.stream_stream_rpc_method_handler(chat, lambda b: b, lambda b: b)},
    )
