"""Opening oracle sessions (`SessionFactory`): a session's OracleConfig resolved
against the service's settings, refusing before any LLM request what the
operator does not allow or the client may not declare (InvalidSessionConfig
-> INVALID_ARGUMENT: config.py, a client function named as one of the
operator's tools); the back-end checked; the conversation so far loaded from
Redis, with what the session and its caller spent of their token budgets
(budget.py). A client-delegation session has no back-end to check: the
client's answers it (services/oracle/delegation.py). Also the warm-up of the
service's own LLM at start."""

from __future__ import annotations

import asyncio
import logging
import time

from redis.exceptions import RedisError

from kame_common.capacity import LoadMeter
from kame_common.store import SessionStore
from kamepb import oracle_pb2
from services.oracle.backends import BackendConfigError, BackendError, create_backend, describe
from services.oracle.budget import TokenBudget
from services.oracle.config import ApiKeys, InvalidSessionConfig, OracleSettings, resolve_session
from services.oracle.delegation import ClientDelegate
from services.oracle.prompts import AGENT, CONTEXT, TOOL, USER, Turn
from services.oracle.session import OracleSession
from services.oracle.tools.sources import check_names
from services.oracle.tools.turn import Toolbox

log = logging.getLogger(__name__)


class SessionFactory:
    """Opens sessions: resolves the OracleConfig (refusing, before any request,
    what the operator does not allow), checks the back-end, loads history."""

    def __init__(
        self,
        service: OracleSettings,
        keys: ApiKeys,
        store: SessionStore | None,
        toolbox: Toolbox | None = None,
    ) -> None:
        self.service = service
        self.keys = keys
        self.store = store
        self.toolbox = toolbox  # the operator's tools, shared by the sessions
        # How busy the default back-end is: the service's capacity (kame_common.capacity).
        # A caller waits for a request's first token, not its whole stream (candidate.py).
        self.llm_load = LoadMeter(parallelism=service.llm_parallel, busy_is_answer=False)

    async def warm_up(self) -> None:
        """Warm the service's default back-end: one request of its fixed prompt prefix
        (max_tokens 1), so the first caller does not pay for evaluating it. Bounded by
        `warmup_timeout_s` (0: no warm-up); a failure is logged and the service starts
        anyway (the LLM may come up later)."""
        timeout_s = self.service.warmup_timeout_s
        if timeout_s <= 0:
            return
        try:
            settings = resolve_session(
                oracle_pb2.OracleConfig(session_id="warm-up"), self.service, self.keys
            )
        except InvalidSessionConfig as exc:
            log.warning("oracle: no warm-up: %s", exc)
            return
        assert settings.backend is not None  # a config without client delegation
        backend = create_backend(settings.backend)
        tools = self.toolbox.specs if self.toolbox is not None and backend.supports_tools else []
        started = time.monotonic()
        try:
            await backend.warm_up(timeout_s, tools)
        except BackendError as exc:
            log.warning(
                "oracle: warm-up of %s model %s at %s failed: %s (%s)",
                backend.name,
                settings.backend.model,
                backend.where,
                exc,
                describe(exc.__cause__) if exc.__cause__ else "",
            )
        else:
            log.info(
                "oracle: warmed up %s model %s in %.2f s",
                backend.name,
                settings.backend.model,
                time.monotonic() - started,
            )
        finally:
            await backend.aclose()

    async def open(self, config: oracle_pb2.OracleConfig) -> OracleSession:
        """A started session; raises InvalidSessionConfig (-> INVALID_ARGUMENT) or
        BudgetSpent (its session's or caller's token budget is spent already)."""
        settings = resolve_session(config, self.service, self.keys)
        if settings.backend is None:
            delegate = ClientDelegate(settings.session_id, settings.delegation_timeout_s)
            history = await self._load_history(settings.session_id)
            session = OracleSession(settings, delegate, history, self.store)
            session.start()
            return session
        try:
            check_names(settings.client_functions, self.toolbox)
            backend = create_backend(settings.backend)
        except (ValueError, BackendConfigError) as exc:
            raise InvalidSessionConfig(str(exc)) from None
        if settings.client_functions and not backend.supports_tools:
            log.info(
                "session %s: client functions not offered: model %s takes no tools",
                settings.session_id,
                settings.backend.model,
            )
        budget = TokenBudget(
            settings.budget,
            settings.session_id,
            settings.caller,
            self.store,
            self.service.history_ttl_s,
        )
        try:
            history, _, _ = await asyncio.gather(
                self._load_history(settings.session_id),
                backend.check(self.service.check_timeout_s),
                budget.load(),
            )
            budget.check()  # a session whose budget is spent starts no LLM request
        except BaseException as exc:
            await backend.aclose()
            if isinstance(exc, BackendConfigError):
                raise InvalidSessionConfig(str(exc)) from None
            raise
        on_service_llm = (settings.backend.backend, settings.backend.base_url) == (
            self.service.backend,
            self.service.base_url,
        )
        session = OracleSession(
            settings,
            backend,
            history,
            self.store,
            self.llm_load if on_service_llm else None,
            self.toolbox,
            budget,
        )
        session.start()
        return session

    async def _load_history(self, session_id: str) -> list[Turn]:
        """The conversation so far (another replica may have started it). Without
        Redis the session still runs, only without history."""
        if self.store is None:
            return []
        try:
            turns = await self.store.conversation(session_id)
        except (RedisError, OSError) as exc:
            log.warning("session %s: no history, Redis failed: %s", session_id, exc)
            return []
        roles = (USER, AGENT, TOOL, CONTEXT)
        return [Turn(t["role"], t["text"]) for t in turns if t.get("role") in roles]
