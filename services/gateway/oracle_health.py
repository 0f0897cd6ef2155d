"""What the client hears of its oracle while the side streams fail and come back.

The oracle's guidance needs both side streams: stt's transcripts feed it. While
either is down the call goes on without oracle (the frontend keeps speaking),
and the client gets Notice ORACLE_UNAVAILABLE once when the oracle is lost and
Notice ORACLE_RESTORED once every side stream answers again: a stream that is
tried again and again while its service stays down is one notice, not one per
try. An LLM error that the oracle reports is Notice ORACLE_ERROR (the oracle
tries again itself).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from kamepb import gateway_pb2
from services.gateway.sidestream import SideStream
from services.gateway.upstream import describe_failure

log = logging.getLogger(__name__)

Notice = gateway_pb2.Notice


def notice(kind: gateway_pb2.Notice.Kind.ValueType, message: str) -> gateway_pb2.ConverseResponse:
    return gateway_pb2.ConverseResponse(notice=gateway_pb2.Notice(kind=kind, message=message))


class OracleHealth:
    """Tells the client (`tell`) when the session's side streams (`sides`) lose
    the oracle and when they have it back."""

    def __init__(
        self,
        session_id: str,
        sides: Callable[[], list[SideStream[Any]]],
        tell: Callable[[gateway_pb2.ConverseResponse], Awaitable[None]],
    ) -> None:
        self._session_id = session_id
        self._sides = sides
        self._tell = tell
        self._oracle_up = True  # what the client was last told

    async def side_down(self, side: SideStream[Any], exc: Exception) -> None:
        """A side stream failed, and is reopened."""
        log.warning(
            "session %s: %s failed (%s); going on without oracle, reopening it",
            self._session_id,
            side.name,
            describe_failure(exc),
        )
        await self._tell_oracle_state(f"{side.name} failed")

    async def side_up(self, side: SideStream[Any]) -> None:
        """A reopened side stream answered."""
        log.info("session %s: %s is back", self._session_id, side.name)
        await self._tell_oracle_state(f"{side.name} is back")

    async def llm_error(self, detail: str) -> None:
        log.warning("session %s: oracle LLM error: %s", self._session_id, detail)
        await self._tell(
            notice(Notice.ORACLE_ERROR, "the oracle's LLM request failed; it tries again")
        )

    async def _tell_oracle_state(self, why: str) -> None:
        """Notice the client when the oracle is lost (a side stream is down) and when
        it is back (every side stream answers again)."""
        up = all(side.up for side in self._sides())
        if up == self._oracle_up:
            return
        self._oracle_up = up
        if up:
            told = notice(Notice.ORACLE_RESTORED, f"{why}; the oracle is back")
        else:
            told = notice(
                Notice.ORACLE_UNAVAILABLE,
                f"{why}; the call goes on without oracle until it is back",
            )
        await self._tell(told)
