"""Blind transfer of a SIP call: REFER (RFC 3515), then the phone's progress.

We ask the phone (the transferee) to call the target itself with a REFER in
the call's dialog, Refer-To the operator's URI. The phone answers 202 Accepted
(or refuses: 403, 405, 501, ...), then reports how its call to the target goes
in NOTIFYs of `Event: refer` carrying a sipfrag status line (`SIP/2.0 100
Trying`, `SIP/2.0 200 OK`, `SIP/2.0 486 Busy Here`). A final status of 2xx is
success: our side of the call is done, and sip.py sends BYE. Any other final
status, a refused REFER, or no outcome in time is a failure: the call goes on,
and the agent is told why. aiosipua answers the NOTIFYs (200) and parses their
sipfrag (its on_transfer_progress); sip.py routes the REFER's responses here.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from aiosipua import SipRequest

# The phone's answer to the REFER: within a UDP transaction's lifetime (64 * T1).
REFER_ANSWER_S = 32.0
# Its outcome: the target's phone rings for a while before anyone answers it.
OUTCOME_S = 60.0


@dataclass(frozen=True)
class Outcome:
    """How a transfer ended: a SIP status (0: the phone ended the call meanwhile)."""

    status: int
    reason: str

    @property
    def succeeded(self) -> bool:
        return 200 <= self.status < 300

    def describe(self) -> str:
        return f"{self.status} {self.reason}".strip() if self.status else self.reason

    def __str__(self) -> str:
        return self.describe()


class Transfer:
    """One REFER on a call, from sending it to the phone's final word on it."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.accepted = False  # 202, or a NOTIFY (which only an accepted REFER has)
        self.progress: list[str] = []  # the sipfrag status lines seen, for the log
        self._answered = asyncio.Event()  # any final answer to the REFER, or a NOTIFY
        self._outcome: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self._cseq = -1  # the REFER's: its responses carry it
        self._retransmission: asyncio.Task[None] | None = None

    def sent(self, refer: SipRequest, retransmission: asyncio.Task[None]) -> None:
        """The REFER is out, and repeated by `retransmission` until answered."""
        self._cseq = refer.cseq.seq if refer.cseq is not None else -1
        self._retransmission = retransmission

    def answered(self, cseq: int, status: int, reason: str) -> None:
        """A response to a REFER of the call (a late one to an earlier REFER is not
        this one's)."""
        if status < 200 or cseq != self._cseq:
            return
        self._stop_retransmission()
        self._answered.set()
        if status < 300:
            self.accepted = True
        else:
            self._finish(Outcome(status, f"{reason} (the phone refused the transfer)".strip()))

    def notified(self, status: int, reason: str) -> None:
        """A NOTIFY's sipfrag: how the phone's call to the target goes."""
        self.accepted = True
        self._stop_retransmission()
        self._answered.set()
        self.progress.append(f"{status} {reason}".strip())
        if status >= 200:
            self._finish(Outcome(status, reason))

    def phone_gone(self) -> None:
        """The phone ended the call during the transfer (some do once it worked)."""
        self._finish(Outcome(0, "the phone ended the call"))

    async def outcome(self) -> Outcome:
        """The phone's final word, or a 408 of our own when it does not come in time."""
        try:
            await asyncio.wait_for(asyncio.shield(self._answered.wait()), REFER_ANSWER_S)
        except TimeoutError:
            self._finish(Outcome(408, "the phone did not answer the REFER"))
        try:
            return await asyncio.wait_for(asyncio.shield(self._outcome), OUTCOME_S)
        except TimeoutError:
            return Outcome(408, f"no outcome from the phone within {OUTCOME_S:g} s")
        finally:
            self._stop_retransmission()

    def _finish(self, outcome: Outcome) -> None:
        self._answered.set()
        if not self._outcome.done():
            self._outcome.set_result(outcome)

    def _stop_retransmission(self) -> None:
        if self._retransmission is not None:
            self._retransmission.cancel()
            self._retransmission = None
