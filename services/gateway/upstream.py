"""One session's stream to the frontend, the upstream on the voice path.

An `Upstream` holds everything about that stream: the gRPC call, the bounded
queue of requests waiting to be written (a producer waits for room, so a slow
frontend pushes back to the caller), whether the gateway has closed its
input, and the two pump tasks (the writer drains the queue into the call; the
reader is the session's handler of the upstream's responses). The side
streams, stt and oracle, never push back: see sidestream.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Generic, Protocol, TypeVar

import grpc

RequestT = TypeVar("RequestT")
CallRequestT = TypeVar("CallRequestT", contravariant=True)


class StreamCall(Protocol[CallRequestT]):
    """The part of a grpc.aio bidirectional call the gateway uses."""

    async def write(self, request: CallRequestT) -> None: ...
    async def done_writing(self) -> None: ...
    async def read(self) -> Any: ...
    def cancel(self) -> bool: ...


class EndOfInput:
    """Queued after the last request: the writer half-closes the call."""


END_OF_INPUT = EndOfInput()


class Upstream(Generic[RequestT]):
    def __init__(self, name: str, call: StreamCall[RequestT], queue_size: int) -> None:
        self.name = name
        self.call = call
        self._queue: asyncio.Queue[RequestT | EndOfInput] = asyncio.Queue(queue_size)
        self.input_closed = False  # the gateway has closed (or is closing) its side
        self.tasks: list[asyncio.Task[None]] = []

    async def send(self, request: RequestT) -> None:
        """Queue a request, waiting for room: a slow upstream pushes back."""
        if not self.input_closed:
            await self._queue.put(request)

    async def close_input(self) -> None:
        """No more requests: the writer half-closes the call after the queued ones."""
        if self.input_closed:
            return
        self.input_closed = True
        await self._queue.put(END_OF_INPUT)

    def start(
        self,
        read_responses: Callable[[], Coroutine[Any, Any, None]],
        guard: Callable[[Coroutine[Any, Any, None]], Coroutine[Any, Any, None]],
        spawn: Callable[[str, Coroutine[Any, Any, None]], asyncio.Task[None]],
    ) -> None:
        """Start the writer and the reader, each run under `guard` (which turns
        their failures into what the session does about them)."""
        self.tasks = [
            spawn(f"{self.name}-in", guard(self._write_requests())),
            spawn(f"{self.name}-out", guard(read_responses())),
        ]

    async def _write_requests(self) -> None:
        while not isinstance(request := await self._queue.get(), EndOfInput):
            await self.call.write(request)
        await self.call.done_writing()


def describe_failure(exc: BaseException) -> str:
    """An upstream call's failure for the log (it may name addresses: never for the client)."""
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return str(exc) or type(exc).__name__
