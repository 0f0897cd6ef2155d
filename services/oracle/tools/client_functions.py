"""The caller's own functions as tools: declared per session in
OracleConfig.client_functions (the gateway passes on ConverseConfig.functions),
run by the client.

Each function is a ToolSpec of source `client` beside the operator's MCP
tools, under the same timing rules (turn.py): read-only ones may run on a
partial transcript, the others only on the final, once per caller turn for
the same arguments. A call goes out as GuideResponse.function_call with a
fresh call_id on the session's response stream and waits for the
GuideRequest.function_result naming that call_id:

- no answer within the oracle's tool_timeout_s is an error result in words
  ("error: hang_up did not answer within 5 s"), as an MCP tool's timeout is;
- a result for a call_id the oracle does not wait for (unknown, timed out,
  already answered) is ignored: the model has moved on;
- the session ending ends the wait (it cancels its calls: turn.py).

What a client may declare is checked when the session opens (INVALID_ARGUMENT
naming the function) by the rules the gateway checks too
(kame_common/client_functions.py: names, descriptions, parameters_json, at
most the service's max_client_functions functions), and one more the gateway
cannot: a name may not be that of an operator's tool (check_names in
sources.py; refused rather than renamed: the client then knows at once, and a
call names the function as the client declared it).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

from kame_common.client_functions import check_functions
from kamepb import common_pb2
from services.oracle.tools.spec import CLIENT_SOURCE, MAX_RESULT_CHARS, ToolResult, ToolSpec

log = logging.getLogger(__name__)


def client_function_specs(
    functions: Sequence[common_pb2.ClientFunction], max_count: int, timeout_s: float
) -> tuple[ToolSpec, ...]:
    """The functions as tools; FunctionError (a ValueError) names the first one that
    cannot be offered."""
    return tuple(
        ToolSpec(
            name=declared.name,
            description=declared.description or declared.name,
            parameters=declared.parameters,
            read_only=function.read_only,
            timeout_s=timeout_s,
            server=CLIENT_SOURCE,
        )
        for function, declared in zip(
            functions,
            check_functions(functions, max_count, "client_functions", "oracle"),
            strict=True,
        )
    )


def _tool_result(result: common_pb2.FunctionResult) -> ToolResult:
    """The client's answer as the model reads it. An error says so in its first word,
    as the oracle's own errors do: OpenAI's tool messages carry no error flag."""
    text = result.output.strip()[:MAX_RESULT_CHARS] or "(no output)"
    if result.is_error and not text.lower().startswith("error"):
        text = f"error: {text}"
    return ToolResult(text, result.is_error)


class ClientFunctions:
    """One session's client functions (see the module doc). `send` puts a
    FunctionCall on the session's response stream."""

    def __init__(
        self,
        specs: Sequence[ToolSpec],
        send: Callable[[common_pb2.FunctionCall], None],
        session_id: str,
    ) -> None:
        self._specs = {spec.name: spec for spec in specs}
        self._send = send
        self._session_id = session_id
        self._waiting: dict[str, asyncio.Future[common_pb2.FunctionResult]] = {}

    @property
    def specs(self) -> list[ToolSpec]:
        return list(self._specs.values())

    def spec(self, name: str) -> ToolSpec | None:
        return self._specs.get(name)

    async def call(self, spec: ToolSpec, arguments: dict[str, Any], call_id: str) -> ToolResult:
        """Ask the client to run the function; its result, or an error result in words."""
        answer: asyncio.Future[common_pb2.FunctionResult] = (
            asyncio.get_running_loop().create_future()
        )
        self._waiting[call_id] = answer
        try:
            self._send(
                common_pb2.FunctionCall(
                    call_id=call_id,
                    name=spec.name,
                    arguments_json=json.dumps(arguments, ensure_ascii=False),
                )
            )
            async with asyncio.timeout(spec.timeout_s):
                result = await answer
        except TimeoutError:
            log.warning(
                "session %s: client function %s (%s) got no result within %g s",
                self._session_id,
                spec.name,
                call_id,
                spec.timeout_s,
            )
            return ToolResult(
                f"error: {spec.name} did not answer within {spec.timeout_s:g} s", True
            )
        finally:
            self._waiting.pop(call_id, None)
        return _tool_result(result)

    def deliver(self, result: common_pb2.FunctionResult) -> bool:
        """The client's answer to a call; False (ignored) when no call waits for it."""
        answer = self._waiting.get(result.call_id)
        if answer is None or answer.done():
            log.info(
                "session %s: function result for %r ignored: no call waits for it",
                self._session_id,
                result.call_id[:80],
            )
            return False
        answer.set_result(result)
        return True
