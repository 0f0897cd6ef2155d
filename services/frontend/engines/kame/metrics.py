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
    "kame/moshi engines: sessions stepped together in one batch tick (of the 80 ms clock)",
    ["engine"],
    buckets=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64),
)
TICK_OVERRUNS = Counter(
    "kame_frontend_tick_overruns_total",
    "kame/moshi engines: ticks that ran past the next tick's time (the model is over budget)",
    ["engine"],
)
JITTER_UNDERRUNS = Counter(
    "kame_frontend_jitter_underruns_total",
    "kame/moshi engines: ticks at which a started session had no frame waiting (masked out)",
    ["engine"],
)
JITTER_DROPPED_FRAMES = Counter(
    "kame_frontend_jitter_dropped_frames_total",
    "kame/moshi engines: caller frames dropped from a full jitter buffer (never stepped)",
    ["engine"],
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
