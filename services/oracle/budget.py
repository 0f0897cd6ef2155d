"""What a session may spend on its LLM, and what its caller may: token budgets.

Each LLM request costs the operator (a vendor's key, or the GPU) its input
(the prompt, the tools offered, the earlier rounds of the tool loop) and its
output. The input is estimated from what is sent, CHARS_PER_TOKEN characters
of JSON a token (streams do not report usage on every server); the output is
the chunks streamed (a server streams about one token a chunk). Two budgets
bound them:

- `session_token_budget`: one session, across its reopened streams and
  resumed calls (the session id keys it);
- `caller_token_budget` per `caller_budget_window_s`: every session of one
  caller (OracleConfig.caller, the gateway's principal: one bearer token;
  without auth every caller is one and the same) in a fixed window.

Both are counted in Redis (kame_common/store.py's `kame:llm_tokens:` keys), so
every replica sees them; a session keeps its own count too, so without Redis
(or while Redis fails) its session budget still holds. A request starts
only while both budgets have tokens left, so one is exceeded by at most the
request under way (and, for a caller, one more per other open session, which
sees the others' spending with its next count).

Spent, the session starts no more requests: `BudgetSpent` says which budget,
and the oracle ends the session's stream with RESOURCE_EXHAUSTED and the
trailing metadata BUDGET_SPENT_METADATA (kame_common/llm.py); the gateway
ends the call with that message instead of reopening the stream. A session
opened with a budget already spent is refused so at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from redis.exceptions import RedisError

from kame_common.store import SessionStore

log = logging.getLogger(__name__)

# Characters of request JSON per token: English text and JSON Schema through
# the vendors' tokenizers come to about this.
CHARS_PER_TOKEN = 4


def estimate_tokens(*request: object) -> int:
    """The tokens an LLM request of these parts costs to read, estimated."""
    text = json.dumps(request, ensure_ascii=False, default=str)
    return math.ceil(len(text) / CHARS_PER_TOKEN)


class BudgetSpent(Exception):
    """A token budget is spent; the message says which (safe for callers)."""


@dataclass(frozen=True)
class BudgetLimits:
    session_tokens: int = 0  # 0: no limit
    caller_tokens: int = 0  # 0: no limit
    window_s: float = 86400.0  # of caller_tokens


class TokenBudget:
    """One session's spending against its budgets (see the module doc)."""

    def __init__(
        self,
        limits: BudgetLimits,
        session_id: str,
        caller: str,
        store: SessionStore | None,
        ttl_s: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.limits = limits
        self._session_id = session_id
        self._caller = caller or f"session:{session_id}"
        self._store = store if limits.session_tokens or limits.caller_tokens else None
        self._ttl_s = ttl_s
        self._clock = clock
        self.session_spent = 0  # this session, all its streams (as Redis last said, or more)
        self.caller_spent = 0  # this caller, this window (as Redis last said)
        self._writes: set[asyncio.Task[None]] = set()

    def _window(self) -> int:
        return int(self._clock() // self.limits.window_s)

    async def load(self) -> None:
        """What the session and its caller spent before (Redis); nothing when it fails."""
        if self._store is None:
            return
        try:
            session, caller = await self._store.llm_tokens(
                self._session_id, self._caller, self._window()
            )
        except (RedisError, OSError) as exc:
            log.warning("session %s: token budgets not read: %s", self._session_id, exc)
            return
        self.session_spent = max(self.session_spent, session)
        self.caller_spent = caller

    def check(self) -> None:
        """BudgetSpent unless both budgets have tokens left."""
        limits = self.limits
        if limits.session_tokens and self.session_spent >= limits.session_tokens:
            raise BudgetSpent(
                f"this call's LLM token budget is spent (about {self.session_spent} tokens "
                f"of {limits.session_tokens}: the oracle's session_token_budget)"
            )
        if limits.caller_tokens and self.caller_spent >= limits.caller_tokens:
            raise BudgetSpent(
                f"this caller's LLM token budget is spent (about {self.caller_spent} tokens of "
                f"{limits.caller_tokens} in {limits.window_s:g} s: the oracle's "
                "caller_token_budget); try again later"
            )

    def spend(self, tokens: int) -> None:
        """Count `tokens` spent: here at once, in Redis in the background."""
        if tokens <= 0:
            return
        self.session_spent += tokens
        self.caller_spent += tokens
        if self._store is not None:
            task = asyncio.get_running_loop().create_task(self._add(tokens))
            self._writes.add(task)
            task.add_done_callback(self._writes.discard)

    async def _add(self, tokens: int) -> None:
        assert self._store is not None
        try:
            session, caller = await self._store.add_llm_tokens(
                self._session_id,
                self._caller,
                self._window(),
                tokens,
                session_ttl_s=self._ttl_s,
                window_ttl_s=math.ceil(self.limits.window_s),
            )
        except (RedisError, OSError) as exc:
            log.warning("session %s: token spending not counted: %s", self._session_id, exc)
            return
        self.session_spent = max(self.session_spent, session)
        self.caller_spent = caller  # the other sessions' spending too

    async def aclose(self, timeout_s: float = 1.0) -> None:
        """Let the last counts reach Redis (within `timeout_s`)."""
        if self._writes:
            await asyncio.wait(list(self._writes), timeout=timeout_s)
