"""Resume tokens: a call that broke off continues as the same session.

A token is `<session id>.<nonce>.<HMAC-SHA256 of both under resume_secret>`:
every gateway replica with the same secret can check it, none can be forged
without it, and it names the session whose record and conversation Redis
keeps. The resumed call gets the same session id, so the oracle loads the
conversation so far. A token resumes its session only

- once: Redis keeps the nonce of the one token that is valid now
  (`kame:resume:{id}`); a resume replaces it with a new one, atomically, and
  the resumed call's SessionStarted carries the new token (rotated: a copy
  of the old one is worthless). A call that ends normally (the caller
  half-closed, the session finished) deletes it: after a hang-up no token
  resumes the call; one that broke off (a lost connection, a cancel, a
  gateway that went away) keeps it;
- while the session's record says it was alive (started, audio flowing,
  ended) within resume_ttl_s, in the same mode;
- for the caller it was issued to: the session record keeps the caller's
  principal (kame_common.auth: a hash of its bearer token, or "anonymous"
  without auth) and the fingerprint of its llm override, both as HMACs under
  the secret; a token presented by another principal is PERMISSION_DENIED,
  and a resume with another llm override (which would send the conversation
  so far to another endpoint) is INVALID_ARGUMENT;
- in one call at a time: every call of a gateway that resumes holds the
  session's lease in Redis (SessionStore.hold_lease), renewed while it lives
  and released at its end. A resume waits up to TAKEOVER_WAIT_S for the
  earlier call to end (a client that moves drops its old call as it opens
  the new one); if it still holds the lease, the resume is UNAVAILABLE with
  a retry hint (its token still valid). A resumed call that fails before its
  SessionStarted went out gives the token it used back (`not_started`). A
  call whose gateway died holds its session until its lease expires,
  LEASE_TTL_S after the last renewal.

A new call's lease, binding and nonce are written in the background, off the
set-up path: a Redis that hangs costs the session its resumability, never
the call.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import secrets
import time
import uuid
from dataclasses import dataclass
from typing import Any

import grpc
from redis.exceptions import RedisError

from kame_common.auth import same_signature, sign
from kame_common.store import SessionStore
from kamepb import gateway_pb2
from services.gateway.plan import SessionError, SessionPlan

log = logging.getLogger(__name__)

# Fields of the session record that say when the session was last alive.
ALIVE_FIELDS = ("started_at", "alive_at", "ended_at")
# Fields of the session record that bind it to its caller and its llm override.
PRINCIPAL_FIELD = "resume_principal"
LLM_FIELD = "resume_llm"
# A call renews its lease every third of this; a dead gateway's call holds its
# session this long at most (short: a caller whose gateway died resumes within
# about this long, with TAKEOVER_WAIT_S covering it on the first try).
LEASE_TTL_S = 3.0
# How long a resume waits for the call it takes over from to end.
TAKEOVER_WAIT_S = 3.0
_TAKEOVER_POLL_S = 0.1

# Release tasks of ended calls, kept referenced until they are done.
_releases: set[asyncio.Task[None]] = set()


def issue(secret: str, session_id: str, nonce: str) -> str:
    """The token that resumes `session_id` while `nonce` is its current one ("" when
    resume is off)."""
    if not secret:
        return ""
    return f"{session_id}.{nonce}.{_signature(secret, session_id, nonce)}"


def session_of(secret: str, token: str) -> tuple[str, str]:
    """The session id and nonce a token names; SessionError if resume is off or the
    token is not one a gateway with this secret issued."""
    if not secret:
        raise SessionError(
            grpc.StatusCode.INVALID_ARGUMENT, "resume_token: this gateway does not resume sessions"
        )
    session_id, nonce, signature = [*token.split(".", 2), "", ""][:3]
    if not (session_id and nonce) or not same_signature(
        signature, _signature(secret, session_id, nonce)
    ):
        raise SessionError(
            grpc.StatusCode.PERMISSION_DENIED, "resume_token: not a token this service issued"
        )
    return session_id, nonce


def new_session_id() -> str:
    return uuid.uuid4().hex


def new_nonce() -> str:
    return secrets.token_urlsafe(12)


def used_up() -> SessionError:
    """The refusal of a token that is not the session's current one."""
    return SessionError(
        grpc.StatusCode.PERMISSION_DENIED,
        "resume_token: not valid any more: a token resumes its session once (the resumed "
        "call gets a new one), and none does after its call hung up",
    )


def binding(secret: str, plan: SessionPlan, principal: str) -> dict[str, str | int | float]:
    """The session record's fields that bind it to this caller and llm override."""
    return {
        PRINCIPAL_FIELD: _tag(secret, "principal", principal),
        LLM_FIELD: _tag(secret, "llm", llm_fingerprint(plan.llm)),
    }


def llm_fingerprint(llm: gateway_pb2.LlmOverride | None) -> str:
    """What identifies an llm override (its every field; "" for none)."""
    if llm is None:
        return ""
    fields = [llm.backend, llm.model, llm.base_url, llm.api_key]
    return hashlib.sha256(json.dumps(fields).encode()).hexdigest()


async def check_resumable(
    store: SessionStore,
    secret: str,
    token: tuple[str, str],
    plan: SessionPlan,
    principal: str,
    ttl_s: float,
) -> None:
    """SessionError unless the session's record shows it alive within `ttl_s`, in
    the plan's mode, started by `principal` with the plan's llm override, and the
    token's nonce is the current one (`hold` uses it up)."""
    session_id, nonce = token
    record = await store.get_session(session_id)
    last_alive = max((float(record[f]) for f in ALIVE_FIELDS if record.get(f)), default=None)
    if last_alive is None or time.time() - last_alive > ttl_s:
        raise SessionError(
            grpc.StatusCode.NOT_FOUND,
            f"resume_token: the session has expired (sessions resume within {ttl_s:g} s)",
        )
    mode = plan.mode.value
    if record.get("mode", mode) != mode:
        raise SessionError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"mode: the session to resume is a {record['mode']} session, not {mode}",
        )
    expected = binding(secret, plan, principal)
    if not same_signature(record.get(PRINCIPAL_FIELD, ""), str(expected[PRINCIPAL_FIELD])):
        raise SessionError(
            grpc.StatusCode.PERMISSION_DENIED,
            "resume_token: the session was started by another caller (another bearer token)",
        )
    if not same_signature(record.get(LLM_FIELD, ""), str(expected[LLM_FIELD])):
        raise SessionError(
            grpc.StatusCode.INVALID_ARGUMENT,
            "llm: a resumed session keeps the llm override it started with",
        )
    if not same_signature(await store.resume_nonce(session_id), nonce):
        raise used_up()


class SessionLease:
    """One call's hold on its session (see the module doc)."""

    def __init__(self, store: SessionStore, session_id: str) -> None:
        self._store = store
        self.session_id = session_id
        self.nonce = new_nonce()  # of the token this call's caller gets
        self.presented = ""  # the nonce of the token that resumed it, once used up
        self._owner = uuid.uuid4().hex
        self._renewal: asyncio.Task[None] | None = None

    async def take_over(self) -> None:
        """Take the lease, waiting up to TAKEOVER_WAIT_S for its holder to let go;
        else SessionError(UNAVAILABLE) with the lease's time left as the retry
        hint. Redis errors propagate."""
        deadline = time.monotonic() + TAKEOVER_WAIT_S
        while not await self._store.hold_lease(self.session_id, self._owner, LEASE_TTL_S):
            if time.monotonic() >= deadline:
                left_s = max(await self._store.lease_left_s(self.session_id), _TAKEOVER_POLL_S)
                raise SessionError(
                    grpc.StatusCode.UNAVAILABLE,
                    "resume_token: the session is live in another call; it continues here "
                    f"once that call has ended (retry in {left_s:.1f} s)",
                    retry_after_s=round(left_s, 1),
                )
            await asyncio.sleep(_TAKEOVER_POLL_S)

    async def use_up(self, presented: str) -> None:
        """Make this call's nonce the session's current one in place of `presented`
        (the token that resumed it); SessionError (PERMISSION_DENIED) when that is
        not current: another resume used it first, or the call hung up."""
        if not await self._store.rotate_resume_nonce(self.session_id, presented, self.nonce):
            raise used_up()
        self.presented = presented

    async def give_back(self) -> None:
        """The resumed call failed before its caller got the new token: the token it
        presented is the current one again, so the caller can try once more."""
        if not self.presented:
            return
        await self._stop_renewing()
        try:
            await self._store.rotate_resume_nonce(self.session_id, self.nonce, self.presented)
        except (RedisError, OSError) as exc:
            log.warning("session %s: resume token not given back: %s", self.session_id, exc)

    def keep(self, record_binding: dict[str, str | int | float]) -> None:
        """Hold the lease in the background until `release`: renew it every third of
        its TTL, writing the session's `record_binding` to its record and this call's
        nonce each time. Written again and again because Redis may restart empty
        under a live call: its record would then hold what the call writes next
        (alive_at) but no binding, and the caller's own resume would be refused as
        another caller's. The nonce is written only where no other is current."""
        self._renewal = asyncio.get_running_loop().create_task(
            self._renew_forever(record_binding), name=f"gateway-{self.session_id}-lease"
        )

    def release_when_done(self, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        """Release the lease when the call ends, however it ends."""
        # The stub types the callback as a class of its own: a lambda is what it takes.
        context.add_done_callback(lambda _: self._release_later())  # type: ignore[arg-type]

    def _release_later(self) -> None:
        task = asyncio.get_running_loop().create_task(self.release())
        _releases.add(task)
        task.add_done_callback(_releases.discard)

    async def hung_up(self) -> None:
        """The call ended normally: no token resumes the session any more."""
        await self._stop_renewing()
        try:
            await self._store.forget_resume_nonce(self.session_id)
        except (RedisError, OSError) as exc:
            log.warning("session %s: resume token not revoked: %s", self.session_id, exc)

    async def _stop_renewing(self) -> None:
        if self._renewal is not None:
            self._renewal.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewal

    async def release(self) -> None:
        await self._stop_renewing()
        try:
            await self._store.release_lease(self.session_id, self._owner)
        except (RedisError, OSError) as exc:
            log.warning("session %s: lease not released (it expires): %s", self.session_id, exc)

    async def _renew_forever(self, record_binding: dict[str, str | int | float]) -> None:
        while True:
            try:
                await self._store.put_session(self.session_id, record_binding)
                await self._store.keep_resume_nonce(self.session_id, self.nonce)
                if not await self._store.hold_lease(self.session_id, self._owner, LEASE_TTL_S):
                    log.warning("session %s: another call holds its lease", self.session_id)
            except (RedisError, OSError) as exc:
                log.warning("session %s: lease not renewed: %s", self.session_id, exc)
            await asyncio.sleep(LEASE_TTL_S / 3)


@dataclass
class HeldSession:
    """A call's session: its id, the resume token its caller gets ("" when resume
    is off) and, with resume on, the lease the call holds."""

    session_id: str
    resume_token: str = ""
    lease: SessionLease | None = None

    async def hung_up(self) -> None:
        """The call ended normally: its token dies with it."""
        if self.lease is not None:
            await self.lease.hung_up()

    async def not_started(self) -> None:
        """The call failed before its caller got its token: the token that resumed
        it (if one did) is valid again."""
        if self.lease is not None:
            await self.lease.give_back()


async def hold(
    store: SessionStore,
    secret: str,
    context: grpc.aio.ServicerContext[Any, Any],
    resumed: tuple[str, str] | None,
    plan: SessionPlan,
    principal: str,
) -> HeldSession:
    """The call's session: the one `resumed` (session id, nonce) names, or a new
    one. With resume on, the call holds the session's lease until it ends: a
    resume takes it over from the earlier call (SessionError while that one
    lives on) and uses its token up (SessionError if another resume did first),
    a new session takes it; either keeps its binding and nonce written, in the
    background."""
    if not secret:
        return HeldSession(resumed[0] if resumed else new_session_id())
    lease = SessionLease(store, resumed[0] if resumed else new_session_id())
    if resumed:
        try:
            await lease.take_over()
            try:
                await lease.use_up(resumed[1])
            except SessionError:
                await lease.release()
                raise
        except (RedisError, OSError) as exc:
            log.warning("resume of session %s: Redis failed: %s", lease.session_id, exc)
            raise SessionError(
                grpc.StatusCode.UNAVAILABLE, "the session store is unavailable; try again"
            ) from None
    lease.keep(binding(secret, plan, principal))  # a resume's: the one check_resumable saw
    lease.release_when_done(context)
    return HeldSession(lease.session_id, issue(secret, lease.session_id, lease.nonce), lease)


def _signature(secret: str, session_id: str, nonce: str) -> str:
    return sign(secret, json.dumps(["resume", session_id, nonce]).encode())[:32]


def _tag(secret: str, kind: str, value: str) -> str:
    return sign(secret, json.dumps([kind, value]).encode())[:32]
