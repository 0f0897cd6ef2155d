"""LLM back-ends that stream text: OpenAI-compatible servers and Anthropic.

One back-end object per session, so each session may use its own back-end,
model, base URL and key with no restart of the service. Each owns its SDK
client (and with it its HTTP connection pool), closed with the session.

- `openai`: any OpenAI-compatible server (OpenAI, vLLM, Ollama, llama.cpp's
  server) through the `openai` SDK: chat completions, or, for the Gemma 3 270M
  base model, text completions with a few-shot prompt and a newline stop.
- `anthropic`: Messages streaming through the `anthropic` SDK
  (anthropic_backend.py, imported only when a session uses it).

Both chat paths take tools (services/oracle/tools/wire.py has their wire
shapes): `stream_with_tools` yields the answer's text and, at its end, the
tool calls the model asked for; the caller runs them and asks again with the
earlier rounds (`exchanges`) replayed. The few-shot path offers no tools (a
base model cannot call them).

Redirects are not followed: a 307 or 308 would send the conversation (and the
key) to whatever origin the server names, so each SDK gets an HTTP client that
follows none (a redirect answer is an HTTP status error). Base URLs reach the
log without credentials, query or fragment (`loggable_url`).

Failure handling: the SDKs' own retries are off. A stream that fails to
connect is retried once, but only before its first chunk (later the caller
has already seen text; a retry would repeat it). A timeout is not retried:
`request_timeout_s` bounds every wait (connect, and each gap between chunks),
so a stalled server costs one timeout, not two. Every failure surfaces as a
`BackendError` whose message is safe to show a caller (the session's ERROR
event reaches the gateway's clients): the back-end, what failed, an HTTP
status and the server's error type, never a base URL, a key or the server's
free text. The full story (URL, cause) goes to the log.

`warm_up` sends the fixed prompt prefix once with max_tokens 1, so that a
server with a prefix cache (llama.cpp, vLLM) has evaluated it before the
first caller comes.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import dataclasses
import logging
import re
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlsplit, urlunsplit

import openai
from openai.types.chat import ChatCompletionMessageParam

from kame_common.llm import BACKEND_NAMES
from services.oracle.budget import estimate_tokens
from services.oracle.prompts import (
    GEMMA_HEADER,
    KAME_SYSTEM_PROMPT,
    TOOLS_PROMPT,
    Turn,
    chat_messages,
    gemma_prefix,
    gemma_prompt,
    is_gemma_270m_base,
    warm_up_chat_messages,
    with_instructions,
)
from services.oracle.tools.spec import ToolCall, ToolExchange, ToolSpec
from services.oracle.tools.wire import OpenAIToolCallPieces, openai_rounds, openai_tools

if TYPE_CHECKING:
    import anthropic

log = logging.getLogger(__name__)

OPENAI_API_BASE_URL = "https://api.openai.com/v1"
ANTHROPIC_API_BASE_URL = "https://api.anthropic.com"
# Vendor APIs always want a key; other servers (vLLM, Ollama, llama.cpp) may not.
_VENDOR_HOST_SUFFIXES = {"openai": "openai.com", "anthropic": "anthropic.com"}
# The openai SDK refuses to build a client without a key; keyless local servers ignore it.
_NO_KEY_PLACEHOLDER = "no-key"
# An error type a server names (e.g. "overloaded_error") is shown only if it looks like one.
_ERROR_TYPE = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")
# While the LLM server is still starting, the warm-up tries again this often.
_WARM_UP_RETRY_S = 0.5


class BackendError(Exception):
    """An LLM request failed; `kind` is timeout, connection or status. The message
    is safe to show a caller; the exception chained as the cause has the details."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind

    @property
    def server_unavailable(self) -> bool:
        """The server could not be reached, or said it cannot serve yet (HTTP 503: a
        llama.cpp server still loading its model): it may be restarting."""
        return self.kind == "connection" or getattr(self.__cause__, "status_code", None) == 503


class BackendConfigError(ValueError):
    """The back-end cannot be used as configured (-> INVALID_ARGUMENT at config time)."""


@dataclass(frozen=True)
class BackendSettings:
    backend: str
    model: str
    base_url: str
    api_key: str
    request_timeout_s: float
    max_tokens: int
    temperature: float
    system_prompt: str  # Empty = the back-end's default (KAME prompt, or the Gemma header).


@dataclass
class StreamStats:
    """Filled in while a stream runs: how many tokens the model read (estimated from
    the request: services/oracle/budget.py) and produced."""

    input_tokens: int = 0
    output_tokens: int = 0


def is_vendor_api(backend: str, base_url: str) -> bool:
    host = (urlsplit(base_url).hostname or "").lower()
    suffix = _VENDOR_HOST_SUFFIXES[backend]
    return host == suffix or host.endswith("." + suffix)


def loggable_url(url: str) -> str:
    """`url` for the log: no user, password, query or fragment (a base URL may carry
    credentials)."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def describe(exc: BaseException) -> str:
    """An SDK exception and its cause, for the log (may name URLs; never for callers)."""
    cause = exc.__cause__ or exc.__context__
    return f"{exc} ({type(cause).__name__}: {cause})" if cause else str(exc)


def _cause_name(exc: BaseException) -> str:
    cause = exc.__cause__ or exc.__context__
    return type(cause or exc).__name__


def _error_type(exc: BaseException) -> str:
    """The error type in the server's error body (OpenAI: {"type": ...}; Anthropic:
    {"error": {"type": ...}}), if it is a plain identifier."""
    body = getattr(exc, "body", None)
    if not isinstance(body, dict):
        return ""
    inner = body.get("error")
    kind = inner.get("type") if isinstance(inner, dict) else body.get("type")
    return kind if isinstance(kind, str) and _ERROR_TYPE.fullmatch(kind) else ""


def _status_message(name: str, exc: BaseException) -> str:
    status = getattr(exc, "status_code", None)
    kind = _error_type(exc)
    what = (
        f"the LLM server answered HTTP {status}"
        if isinstance(status, int) and status >= 400
        else "the LLM server reported an error"
    )
    return f"{name}: {what}" + (f" ({kind})" if kind else "")


class LLMBackend(abc.ABC):
    # The SDK's exception classes, for the shared error handling below.
    _connection_error: type[Exception]
    _timeout_error: type[Exception]
    _status_error: type[Exception]
    _auth_errors: tuple[type[Exception], ...]
    # The session's own SDK client (and with it its HTTP connection pool).
    client: openai.AsyncOpenAI | anthropic.AsyncAnthropic

    def __init__(self, settings: BackendSettings) -> None:
        self.settings = settings

    @staticmethod
    def _client_options(settings: BackendSettings) -> dict[str, Any]:
        """What both SDKs' clients take: the session's key (a placeholder for a
        server that wants none: the SDKs refuse to start without one), the base
        URL, the timeout, and no retries of their own (see the module doc)."""
        return {
            "api_key": settings.api_key or _NO_KEY_PLACEHOLDER,
            "base_url": settings.base_url,
            "timeout": settings.request_timeout_s,
            "max_retries": 0,
        }

    @property
    def where(self) -> str:
        """The base URL, for the log."""
        return loggable_url(self.settings.base_url)

    @property
    def name(self) -> str:
        return self.settings.backend

    @property
    def model(self) -> str:
        return self.settings.model

    def add_instructions(self, text: str) -> None:
        """The client's instructions for the rest of the session (AgentContext
        INSTRUCTIONS), after the system prompt's."""
        prompt = with_instructions(self.settings.system_prompt, text, self.settings.model)
        self.settings = dataclasses.replace(self.settings, system_prompt=prompt)

    @property
    def supports_tools(self) -> bool:
        return True

    @abc.abstractmethod
    def _stream_once(
        self,
        turns: Sequence[Turn],
        stats: StreamStats,
        tools: Sequence[ToolSpec],
        exchanges: Sequence[ToolExchange],
    ) -> AsyncGenerator[str | ToolCall, None]:
        """One request: yields text chunks as the model produces them, then the tool
        calls it asked for."""

    async def _list_models(self, timeout_s: float) -> None:
        """A cheap authenticated GET, to check the base URL and key."""
        await self.client.models.list(timeout=timeout_s)

    @abc.abstractmethod
    async def _warm_up_once(self, tools: Sequence[ToolSpec]) -> None:
        """One request of the fixed prompt prefix with max_tokens 1 (and the tools
        the sessions will be offered: chat templates put them before the prompt)."""

    async def aclose(self) -> None:
        """Close the SDK client and its connection pool."""
        await self.client.close()

    async def check(self, timeout_s: float) -> None:
        """Config-time check: the server answers and does not reject the key.

        Any other HTTP answer (a 404 from a server without /models) proves that
        the base URL is reachable, which is all that is checked here. The message
        reaches the client: it names no URL and quotes no server text."""
        try:
            await self._list_models(timeout_s)
        except self._auth_errors as exc:
            log.warning("%s at %s rejected the API key: %s", self.name, self.where, exc)
            raise BackendConfigError(
                f"{self.name}: the base URL rejected the API key "
                f"(HTTP {getattr(exc, 'status_code', '?')})"
            ) from None
        except self._connection_error as exc:
            log.warning("%s at %s is unreachable: %s", self.name, self.where, describe(exc))
            raise BackendConfigError(
                f"{self.name}: the base URL is unreachable ({_cause_name(exc)})"
            ) from None
        except self._status_error:
            pass

    async def warm_up(self, timeout_s: float, tools: Sequence[ToolSpec] = ()) -> None:
        """Have the server evaluate the fixed prompt prefix once, within `timeout_s`
        in all. A server that does not answer yet (still starting) is tried again.
        Raises BackendError."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._warm_up_until_answered(tools)
        except TimeoutError as exc:
            raise BackendError("timeout", f"{self.name}: no answer within {timeout_s:g} s") from exc

    def _request_timed_out(self) -> BackendError:
        return BackendError(
            "timeout", f"{self.name}: no answer within {self.settings.request_timeout_s:g} s"
        )

    async def _warm_up_until_answered(self, tools: Sequence[ToolSpec]) -> None:
        while True:
            try:
                await self._warm_up_once(tools)
                return
            except self._timeout_error as exc:
                raise self._request_timed_out() from exc
            except self._connection_error:
                await asyncio.sleep(_WARM_UP_RETRY_S)
            except self._status_error as exc:
                raise BackendError("status", _status_message(self.name, exc)) from exc

    async def stream(self, turns: Sequence[Turn], stats: StreamStats) -> AsyncGenerator[str, None]:
        """Text chunks of one answer, with no tools offered."""
        async with contextlib.aclosing(self.stream_with_tools(turns, stats, (), ())) as chunks:
            async for chunk in chunks:
                if isinstance(chunk, str):
                    yield chunk

    async def stream_with_tools(
        self,
        turns: Sequence[Turn],
        stats: StreamStats,
        tools: Sequence[ToolSpec],
        exchanges: Sequence[ToolExchange],
    ) -> AsyncGenerator[str | ToolCall, None]:
        """Text chunks of one answer, then the tool calls the model asked for (none
        unless `tools` are offered); `exchanges` replay the earlier rounds of the
        tool loop. One retry on a connection error before the first chunk."""
        for attempt in (1, 2):
            produced = False
            try:
                stream = self._stream_once(turns, stats, tools, exchanges)
                async with contextlib.aclosing(stream) as chunks:
                    async for chunk in chunks:
                        produced = True
                        yield chunk
                return
            except self._timeout_error as exc:
                raise self._request_timed_out() from exc
            except self._connection_error as exc:
                if produced or attempt == 2:
                    raise BackendError(
                        "connection", f"{self.name}: connection to the LLM server failed"
                    ) from exc
                log.info("%s: connection error, retrying once: %s", self.name, exc)
            except self._status_error as exc:
                raise BackendError("status", _status_message(self.name, exc)) from exc


class OpenAIBackend(LLMBackend):
    """Chat completions on any OpenAI-compatible server; text completions with a
    few-shot prompt for base models (`few_shot=True`)."""

    _connection_error = openai.APIConnectionError
    _timeout_error = openai.APITimeoutError
    _status_error = openai.APIError
    _auth_errors = (openai.AuthenticationError, openai.PermissionDeniedError)

    def __init__(self, settings: BackendSettings, few_shot: bool) -> None:
        super().__init__(settings)
        self.few_shot = few_shot
        self.client: openai.AsyncOpenAI = openai.AsyncOpenAI(
            **self._client_options(settings),
            http_client=openai.DefaultAsyncHttpxClient(follow_redirects=False),
        )
        if not is_vendor_api("openai", settings.base_url):
            # The SDK reads OPENAI_ORG_ID / OPENAI_PROJECT_ID from our environment into
            # headers; they mean something to OpenAI only, and leave with no other URL.
            self.client.organization = None
            self.client.project = None

    @property
    def _header(self) -> str:
        return self.settings.system_prompt or GEMMA_HEADER

    @property
    def supports_tools(self) -> bool:
        return not self.few_shot

    async def _warm_up_once(self, tools: Sequence[ToolSpec]) -> None:
        if self.few_shot:
            await self.client.completions.create(
                model=self.settings.model,
                prompt=gemma_prefix(self._header),
                max_tokens=1,
                temperature=0.0,
            )
        else:
            with_tools: dict[str, Any] = {"tools": openai_tools(tools)} if tools else {}
            await self.client.chat.completions.create(
                model=self.settings.model,
                messages=_openai_chat(warm_up_chat_messages(system_prompt(self.settings, tools))),
                max_tokens=1,
                temperature=0.0,
                **with_tools,
            )

    def _stream_once(
        self,
        turns: Sequence[Turn],
        stats: StreamStats,
        tools: Sequence[ToolSpec],
        exchanges: Sequence[ToolExchange],
    ) -> AsyncGenerator[str | ToolCall, None]:
        if self.few_shot:
            return self._complete(turns, stats)
        return self._chat(turns, stats, tools, exchanges)

    async def _complete(
        self, turns: Sequence[Turn], stats: StreamStats
    ) -> AsyncGenerator[str, None]:
        prompt = gemma_prompt(turns, self._header)
        stats.input_tokens += estimate_tokens(prompt)
        stream = await self.client.completions.create(
            model=self.settings.model,
            prompt=prompt,
            stop=["\n"],
            max_tokens=self.settings.max_tokens,
            temperature=self.settings.temperature,
            stream=True,
        )
        async with stream:
            async for chunk in stream:
                text = chunk.choices[0].text if chunk.choices else ""
                if text:
                    stats.output_tokens += 1  # servers send one token per chunk
                    yield text

    async def _chat(
        self,
        turns: Sequence[Turn],
        stats: StreamStats,
        tools: Sequence[ToolSpec],
        exchanges: Sequence[ToolExchange],
    ) -> AsyncGenerator[str | ToolCall, None]:
        messages = _openai_chat(chat_messages(turns, system_prompt(self.settings, tools)))
        messages += cast(list[ChatCompletionMessageParam], openai_rounds(exchanges))
        # Offered only when there are some: a server without tool support may refuse the field.
        with_tools: dict[str, Any] = {"tools": openai_tools(tools)} if tools else {}
        stats.input_tokens += estimate_tokens(messages, with_tools)
        stream = await self.client.chat.completions.create(
            model=self.settings.model,
            messages=messages,
            max_tokens=self.settings.max_tokens,
            temperature=self.settings.temperature,
            stream=True,
            **with_tools,
        )
        calls = OpenAIToolCallPieces()
        async with stream:
            async for chunk in stream:
                delta = chunk.choices[0].delta if chunk.choices else None
                if delta is None:
                    continue
                if delta.tool_calls:
                    calls.add(delta.tool_calls)
                if delta.content:
                    stats.output_tokens += 1
                    yield delta.content
        for call in calls.calls():
            yield call


def _openai_chat(messages: Sequence[Mapping[str, str]]) -> list[ChatCompletionMessageParam]:
    """The prompt's [system, user] messages (prompts.py) as the openai SDK types them."""
    system, user = messages
    return [
        {"role": "system", "content": system["content"]},
        {"role": "user", "content": user["content"]},
    ]


def system_prompt(settings: BackendSettings, tools: Sequence[ToolSpec]) -> str:
    """The session's system prompt (empty: KAME's), told how to use tools when offered."""
    if not tools:
        return settings.system_prompt
    return f"{settings.system_prompt or KAME_SYSTEM_PROMPT}\n{TOOLS_PROMPT}"


def create_backend(settings: BackendSettings) -> LLMBackend:
    """The back-end for one session (raises BackendConfigError for an unknown name)."""
    if settings.backend == "openai":
        return OpenAIBackend(settings, few_shot=is_gemma_270m_base(settings.model))
    if settings.backend == "anthropic":
        # Imported only when used: the anthropic SDK takes seconds to import on a
        # busy host, which a restarted oracle would spend before serving.
        from services.oracle.anthropic_backend import AnthropicBackend

        return AnthropicBackend(settings)
    choices = ", ".join(repr(name) for name in BACKEND_NAMES)
    raise BackendConfigError(f"backend {settings.backend!r} is unknown; choose one of {choices}")
