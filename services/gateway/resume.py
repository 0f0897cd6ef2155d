"""Resume tokens: a call that broke off continues as the same session.

A token is `<session id>.<HMAC-SHA256 of the id under resume_secret>`: every
gateway replica with the same secret can check it, none can be forged
without it, and it names the session whose record and conversation Redis
keeps. A token resumes its session while the session's record says it was
alive (started, audio flowing, ended) within resume_ttl_s; the resumed call
gets the same session id, so the oracle loads the conversation so far.
"""

from __future__ import annotations

import time

import grpc

from kame_common.auth import same_signature, sign
from kame_common.store import SessionStore
from services.gateway.plan import SessionError

# Fields of the session record that say when the session was last alive.
ALIVE_FIELDS = ("started_at", "alive_at", "ended_at")


def issue(secret: str, session_id: str) -> str:
    """The token that resumes `session_id` ("" when resume is off)."""
    if not secret:
        return ""
    return f"{session_id}.{_signature(secret, session_id)}"


def session_of(secret: str, token: str) -> str:
    """The session id a token names; SessionError if resume is off or the token is
    not one a gateway with this secret issued."""
    if not secret:
        raise SessionError(
            grpc.StatusCode.INVALID_ARGUMENT, "resume_token: this gateway does not resume sessions"
        )
    session_id, _, signature = token.rpartition(".")
    if not session_id or not same_signature(signature, _signature(secret, session_id)):
        raise SessionError(
            grpc.StatusCode.PERMISSION_DENIED, "resume_token: not a token this service issued"
        )
    return session_id


async def check_resumable(store: SessionStore, session_id: str, mode: str, ttl_s: float) -> None:
    """SessionError unless the session's record shows it alive within `ttl_s` and
    in `mode`."""
    record = await store.get_session(session_id)
    last_alive = max((float(record[f]) for f in ALIVE_FIELDS if record.get(f)), default=None)
    if last_alive is None or time.time() - last_alive > ttl_s:
        raise SessionError(
            grpc.StatusCode.NOT_FOUND,
            f"resume_token: the session has expired (sessions resume within {ttl_s:g} s)",
        )
    if record.get("mode", mode) != mode:
        raise SessionError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"mode: the session to resume is a {record['mode']} session, not {mode}",
        )


def _signature(secret: str, session_id: str) -> str:
    return sign(secret, session_id.encode())[:32]
