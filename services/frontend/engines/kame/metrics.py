"""Prometheus metrics of the kame/moshi engines (the service adds per-frame step time
and free slots)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from kame_common.metrics import FRAME_BUCKETS

TICK_SECONDS = Histogram(
    "kame_frontend_tick_seconds",
    "kame/moshi engines: model time of one batch tick (Mimi encode, LM step, Mimi decode)",
    ["engine"],
    buckets=FRAME_BUCKETS,
)
TICK_SESSIONS = Histogram(
    "kame_frontend_tick_sessions",
    "kame/moshi engines: sessions stepped together in one batch tick",
    ["engine"],
    buckets=(1, 2, 4, 8, 16, 32, 64),
)
ORACLE_TOKENS = Counter(
    "kame_frontend_oracle_tokens_total",
    "kame engine: oracle tokens appended to sessions' oracle streams",
)
LATE_ORACLE_TOKENS = Counter(
    "kame_frontend_oracle_late_tokens_total",
    "kame engine: appended oracle tokens whose step had already passed (never fed)",
)
STALE_ORACLE_UPDATES = Counter(
    "kame_frontend_oracle_stale_updates_total",
    "kame engine: APPENDs of an older generation than the current oracle, dropped",
)
