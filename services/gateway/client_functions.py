"""The caller's own functions (ConverseConfig.functions): checked when the call
starts (plan.py, by the oracle's own rules: kame_common/client_functions.py),
passed to every oracle stream the session opens (opening.py), and the calls
and answers routed between the two.

Whether a name clashes with one of the operator's tools only the oracle
knows: its refusal ends the session with INVALID_ARGUMENT too (session.py).

`FunctionRouter`: the oracle's FunctionCall goes to the caller as
ConverseResponse.function_call, and the caller's FunctionResult back to the
oracle, but only for a call_id the gateway saw go out (others are ignored, as
the oracle ignores them) and only to the oracle stream that asked: once that
stream is lost (the session reopens it), its calls' results are dropped with
a log line, since the oracle that waited for them is gone. What a tool did
(ToolActivity) goes to the caller as ConverseResponse.tool; each finished
call is counted in kame_gateway_tool_calls_total and in the session record's
tool_calls / tool_errors.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

from kamepb import common_pb2, gateway_pb2, oracle_pb2
from services.gateway import metrics
from services.gateway.records import SessionRecords
from services.gateway.sidestream import SideStream

log = logging.getLogger(__name__)

# Calls whose answer the gateway keeps track of, in flight and sent by a lost
# oracle stream, each; beyond, the oldest is forgotten. The oracle waits for an
# answer tool_timeout_s at most and starts a few calls a turn, so these are
# never reached by a client that answers.
MAX_TRACKED_CALLS = 64
CLIENT_SOURCE = "client"  # ToolActivity.source of a client function


class RecentIds:
    """An ordered set of ids, the oldest forgotten beyond `most`."""

    def __init__(self, most: int) -> None:
        self._most = most
        self._ids: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, call_id: object) -> bool:
        return call_id in self._ids

    def add(self, call_id: str) -> None:
        self._ids[call_id] = None
        if len(self._ids) > self._most:
            self._ids.popitem(last=False)

    def take(self, call_id: str) -> bool:
        """Whether `call_id` was here (it is not any more)."""
        return self._ids.pop(call_id, 0) is None

    def take_all(self) -> list[str]:
        ids = list(self._ids)
        self._ids.clear()
        return ids


class FunctionRouter:
    """One session's function calls and tool activity (see the module doc)."""

    def __init__(self, session_id: str, records: SessionRecords) -> None:
        self._session_id = session_id
        self._records = records
        self._in_flight = RecentIds(MAX_TRACKED_CALLS)  # sent by the oracle stream now open
        self._orphaned = RecentIds(MAX_TRACKED_CALLS)  # sent by an oracle stream since lost
        self._tool_calls = 0
        self._tool_errors = 0

    def from_oracle(self, response: oracle_pb2.GuideResponse) -> gateway_pb2.ConverseResponse:
        """The caller's message for a GuideResponse's function_call or tool."""
        if response.HasField("function_call"):
            self._in_flight.add(response.function_call.call_id)
            return gateway_pb2.ConverseResponse(function_call=response.function_call)
        self._count(response.tool)
        return gateway_pb2.ConverseResponse(tool=response.tool)

    def answer(
        self, result: common_pb2.FunctionResult, oracle: SideStream[oracle_pb2.GuideRequest] | None
    ) -> None:
        """The caller's answer, to the oracle stream that asked, if it still waits."""
        call_id = result.call_id
        if self._in_flight.take(call_id):
            if oracle is not None and oracle.push(oracle_pb2.GuideRequest(function_result=result)):
                return
            reason = "no oracle stream is open"
        elif self._orphaned.take(call_id):
            reason = "the oracle stream that asked for it was lost"
        else:
            reason = "no call with this id is waiting"
        log.info(
            "session %s: function result for %r dropped: %s",
            self._session_id,
            call_id[:80],
            reason,
        )

    def oracle_lost(self) -> None:
        """The oracle stream failed: whatever it asked for, nobody waits for now."""
        for call_id in self._in_flight.take_all():
            self._orphaned.add(call_id)

    def _count(self, tool: common_pb2.ToolActivity) -> None:
        if tool.phase != common_pb2.ToolActivity.FINISHED:
            return
        source = CLIENT_SOURCE if tool.source == CLIENT_SOURCE else "mcp"
        metrics.TOOL_CALLS.labels(source, "error" if tool.is_error else "ok").inc()
        self._tool_calls += 1
        self._tool_errors += tool.is_error
        self._records.update_session(
            {"tool_calls": self._tool_calls, "tool_errors": self._tool_errors}
        )
