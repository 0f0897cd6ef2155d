"""Client delegation and the caller's context (AgentContext), routed.

With ConverseConfig.delegation CLIENT the oracle's session has no LLM
(OracleConfig.client_delegation, services/oracle/delegation.py): each
candidate it would start is a Delegation, which reaches the caller as
ConverseResponse.delegation with `offset_s`, where it was created on the
session's timeline (seconds of caller audio). The caller's back-end answers
with AgentContext COMMENTARY naming the delegation_id; the oracle turns it
into the candidate's RESET and APPENDs, which the front-end speaks in the
agent's voice like any candidate. Whether a delegation is still open only the
oracle knows (commentary for one that ended is dropped there); the gateway
remembers the ids it sent, the last MAX_TRACKED_DELEGATIONS.

`CallerContext.handle` checks every AgentContext (any call may send thinking,
commentary without a delegation and instructions) before it goes to the
oracle. What it cannot act on gets Notice REFUSED naming the field or
setting, and the call goes on: more than `context_per_s` a second (after
CONTEXT_BURST; one notice per run of them, the rest dropped), a kind it does
not know, a blank text or one over `context_max_chars`, a delegation_id in a
call without client delegation or one the gateway never sent, INSTRUCTIONS
the operator does not allow (`allow_instructions`) or past
`instructions_max_chars` with those the call has already, and any of them in
S2S, which has no oracle to take them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from kamepb import common_pb2, gateway_pb2, oracle_pb2
from services.gateway import metrics
from services.gateway.client_functions import RecentIds
from services.gateway.client_output import ClientOutput
from services.gateway.config import GatewaySettings
from services.gateway.oracle_health import notice
from services.gateway.pacing import KeyRate
from services.gateway.plan import SessionPlan
from services.gateway.sidestream import SideStream

log = logging.getLogger(__name__)

Context = common_pb2.AgentContext
_KINDS = {
    Context.COMMENTARY: "commentary",
    Context.THINKING: "thinking",
    Context.INSTRUCTIONS: "instructions",
}
# Context messages at once, before context_per_s applies: a back-end that says
# what it found, then what it is doing next, in one go.
CONTEXT_BURST = 10
# Delegations whose ids the gateway remembers; the oracle starts at most a few a
# turn, and a back-end answers the latest.
MAX_TRACKED_DELEGATIONS = 64


class CallerContext:
    """One call's delegations out and context in (see the module doc)."""

    def __init__(
        self,
        settings: GatewaySettings,
        plan: SessionPlan,
        output: ClientOutput,
        oracle: SideStream[oracle_pb2.GuideRequest] | None,
        add_instructions: Callable[[str], None],
    ) -> None:
        self._settings = settings
        self._add_instructions = add_instructions  # kept for a reopened oracle call
        self._plan = plan
        self._output = output
        self._oracle = oracle
        self._rate = KeyRate(settings.context_per_s, CONTEXT_BURST)
        self._sent = RecentIds(MAX_TRACKED_DELEGATIONS)
        self._instruction_chars = len(plan.instructions)
        self._over_rate = False  # in a run of context over context_per_s (told once)

    def delegated(
        self, delegation: common_pb2.Delegation, offset_s: float
    ) -> gateway_pb2.ConverseResponse:
        """The caller's message for the oracle's Delegation, created at `offset_s`."""
        self._sent.add(delegation.delegation_id)
        out = common_pb2.Delegation()
        out.CopyFrom(delegation)
        out.offset_s = offset_s
        return gateway_pb2.ConverseResponse(delegation=out)

    async def handle(self, context: Context) -> None:
        if self._oracle is not None and not self._rate.admit():
            if self._over_rate:
                return
            self._over_rate = True
            rate = self._settings.context_per_s
            problem = f"context: more than {rate:g} a second (context_per_s); the rest dropped"
        else:
            self._over_rate = False
            problem = self._problem(context)
        if problem:
            metrics.CALLER_REQUESTS.labels("refused").inc()
            await self._output.put(notice(gateway_pb2.Notice.REFUSED, problem))
            return
        metrics.CALLER_REQUESTS.labels(_KINDS[context.kind]).inc()
        if context.kind == Context.INSTRUCTIONS:
            self._instruction_chars += len(context.text.strip())
            self._add_instructions(context.text.strip())
        assert self._oracle is not None  # _problem refuses context without one
        if not self._oracle.push(oracle_pb2.GuideRequest(context=context)):
            log.info("%s dropped: no oracle stream is open", _KINDS[context.kind])

    def _problem(self, context: Context) -> str:
        """Why `context` cannot be acted on, or ""."""
        text = " ".join(context.text.split())
        if self._oracle is None:
            return "context: this call has no oracle to take it (s2s)"
        if context.kind not in _KINDS:
            return f"context.kind: COMMENTARY, THINKING or INSTRUCTIONS, got {context.kind}"
        if not text:
            return "context.text: empty"
        if len(text) > self._settings.context_max_chars:
            limit = self._settings.context_max_chars
            return (
                f"context.text: at most {limit} characters (context_max_chars), got {len(text)}"
                if limit
                else "context: this gateway takes none (context_max_chars 0)"
            )
        if context.delegation_id:
            return self._delegation_problem(context)
        if context.kind == Context.INSTRUCTIONS:
            return self._instructions_problem(len(context.text.strip()))
        return ""

    def _delegation_problem(self, context: Context) -> str:
        named = context.delegation_id[:80]
        if not self._plan.client_delegation:
            return "context.delegation_id: this call delegates to no client (delegation CLIENT)"
        if context.kind == Context.INSTRUCTIONS:
            return "context.delegation_id: instructions are for the session, name no delegation"
        if context.delegation_id not in self._sent:
            return f"context.delegation_id: no delegation {named!r} was sent in this call"
        return ""

    def _instructions_problem(self, chars: int) -> str:
        if not self._settings.allow_instructions:
            return "context: this gateway takes no instructions from callers (allow_instructions)"
        limit = self._settings.instructions_max_chars
        if self._instruction_chars + chars > limit:
            return (
                f"context.text: instructions of at most {limit} characters in all "
                f"(instructions_max_chars), this call has {self._instruction_chars}"
            )
        return ""
