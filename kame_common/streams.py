"""The shape every streaming RPC of the stack shares (Gateway.Converse,
Frontend.Stream, Stt.Transcribe, Oracle.Guide): the client's first message
carries the config (its `msg` oneof set to `config`), every later one
something else, handled by which field of the oneof it sets. `read_config` and
`dispatch` are that shape, once; a stream that breaks it gets a StreamError
(INVALID_ARGUMENT, a message that says what came and what was expected), which
`aborting` turns into the call's status.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Literal, Protocol, TypeVar

import grpc


class StreamError(Exception):
    """Ends the call with this gRPC status; the message says what went wrong in
    words a client may see."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        """Metadata the status carries (none here; the gateway's retry hint)."""
        return ()


class Request(Protocol):
    """A request message of a streaming RPC: a `msg` oneof, `config` among it."""

    def WhichOneof(self, oneof_group: Literal["msg"]) -> str | None: ...  # noqa: N802


RequestT = TypeVar("RequestT", bound=Request)
# A handler may be a coroutine function or a plain one (a session method that queues).
Handler = Callable[[RequestT], Awaitable[None] | None]


def _kind(request: Request) -> str:
    return request.WhichOneof("msg") or "an empty message"


async def read_config(
    requests: AsyncIterator[RequestT], config: str, timeout_s: float | None = None
) -> RequestT:
    """The stream's first message, which must carry the config (`config`: its
    message type, for the error): StreamError when the stream ends first or the
    message carries something else (INVALID_ARGUMENT), or nothing came within
    `timeout_s` (DEADLINE_EXCEEDED)."""
    try:
        first = await asyncio.wait_for(anext(requests), timeout_s)
    except StopAsyncIteration:
        raise StreamError(
            grpc.StatusCode.INVALID_ARGUMENT, f"the stream ended before the config ({config})"
        ) from None
    except TimeoutError:
        raise StreamError(
            grpc.StatusCode.DEADLINE_EXCEEDED,
            f"no config within {timeout_s} s of opening the stream",
        ) from None
    if first.WhichOneof("msg") != "config":
        raise StreamError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"the first message must be the config ({config}), got {_kind(first)}",
        )
    return first


async def dispatch(
    requests: AsyncIterator[RequestT], handlers: Mapping[str, Handler[RequestT]]
) -> None:
    """Each message after the config to the handler of the field it sets, in
    order, until the client half-closes: StreamError (INVALID_ARGUMENT) for a
    second config or a message no handler takes (an empty one too)."""
    async for request in requests:
        kind = request.WhichOneof("msg")
        handler = handlers.get(kind) if kind is not None else None
        if handler is None:
            raise StreamError(grpc.StatusCode.INVALID_ARGUMENT, _unexpected(kind, handlers))
        handled = handler(request)
        if handled is not None:
            await handled


def _unexpected(kind: str | None, handlers: Mapping[str, Any]) -> str:
    if kind == "config":
        return "a second config arrived: send the config once, first"
    return (
        f"after the config a stream takes only {', '.join(handlers)}; "
        f"got {kind or 'an empty message'}"
    )


@contextlib.asynccontextmanager
async def aborting(context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[None]:
    """Ends the call with the status of a StreamError raised inside."""
    try:
        yield
    except StreamError as exc:
        await context.abort(exc.code, exc.message, exc.trailing_metadata())
