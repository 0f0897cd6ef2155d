"""The Anthropic back-end (Messages streaming), in a module of its own so that
the anthropic SDK, seconds to import on a busy host, is imported only when a
session uses it (backends.create_backend)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from typing import Any, cast

import anthropic

from services.oracle.backends import BackendSettings, LLMBackend, StreamStats, system_prompt
from services.oracle.budget import estimate_tokens
from services.oracle.prompts import Turn, chat_messages, warm_up_chat_messages
from services.oracle.tools.spec import ToolCall, ToolExchange, ToolSpec
from services.oracle.tools.wire import AnthropicToolUseBlocks, anthropic_rounds, anthropic_tools


class AnthropicBackend(LLMBackend):
    """Anthropic Messages streaming (SSE): text from `content_block_delta` text
    deltas, the token count from `message_delta` usage. No temperature: the
    anthropic SDK in use (2.x) no longer takes sampling parameters."""

    _connection_error = anthropic.APIConnectionError
    _timeout_error = anthropic.APITimeoutError
    _status_error = anthropic.APIError
    _auth_errors = (anthropic.AuthenticationError, anthropic.PermissionDeniedError)

    def __init__(self, settings: BackendSettings) -> None:
        super().__init__(settings)
        self.client: anthropic.AsyncAnthropic = anthropic.AsyncAnthropic(
            **self._client_options(settings),
            http_client=anthropic.DefaultAsyncHttpxClient(follow_redirects=False),
        )

    async def _warm_up_once(self, tools: Sequence[ToolSpec]) -> None:
        system, opening = warm_up_chat_messages(system_prompt(self.settings, tools))
        with_tools: dict[str, Any] = {"tools": anthropic_tools(tools)} if tools else {}
        await self.client.messages.create(
            model=self.settings.model,
            system=system["content"],
            messages=[{"role": "user", "content": opening["content"]}],
            max_tokens=1,
            **with_tools,
        )

    async def _stream_once(
        self,
        turns: Sequence[Turn],
        stats: StreamStats,
        tools: Sequence[ToolSpec],
        exchanges: Sequence[ToolExchange],
    ) -> AsyncGenerator[str | ToolCall, None]:
        system, user = chat_messages(turns, system_prompt(self.settings, tools))
        messages = [{"role": "user", "content": user["content"]}, *anthropic_rounds(exchanges)]
        with_tools: dict[str, Any] = {"tools": anthropic_tools(tools)} if tools else {}
        stats.input_tokens += estimate_tokens(system, messages, with_tools)
        stream = await self.client.messages.create(
            model=self.settings.model,
            system=system["content"],
            messages=cast(list[anthropic.types.MessageParam], messages),
            max_tokens=self.settings.max_tokens,
            stream=True,
            **with_tools,
        )
        uses = AnthropicToolUseBlocks()
        async with stream:
            async for event in stream:
                if event.type == "content_block_delta" and event.delta.type == "text_delta":
                    yield event.delta.text
                elif event.type == "content_block_start":
                    uses.start(event.index, event.content_block)
                elif event.type == "content_block_delta":
                    uses.delta(event.index, event.delta)
                elif event.type == "content_block_stop":
                    call = uses.stop(event.index)
                    if call is not None:
                        yield call
                elif event.type == "message_delta":
                    stats.output_tokens = event.usage.output_tokens
