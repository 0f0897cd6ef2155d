"""Prometheus metrics of the STT service (active sessions come from ServiceRuntime)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from kame_common.metrics import RTF_BUCKETS, TURN_BUCKETS

PARTIAL_LAG_SECONDS = Histogram(
    "kame_stt_partial_lag_seconds",
    "Partial transcript emitted minus arrival of the last audio frame it covers",
    buckets=TURN_BUCKETS,
)
FINAL_LAG_SECONDS = Histogram(
    "kame_stt_final_lag_seconds",
    "Final transcript emitted minus arrival of the frame where the caller stopped speaking "
    "(includes the endpoint silence)",
    buckets=TURN_BUCKETS,
)
DECODE_SECONDS = Histogram(
    "kame_stt_decode_seconds", "Wall time of one Whisper decode", ["kind"], buckets=TURN_BUCKETS
)
DECODE_RTF = Histogram(
    "kame_stt_decode_rtf",
    "Real-time factor of one Whisper decode: decode time / audio duration",
    ["kind"],
    buckets=RTF_BUCKETS,
)
DECODE_BATCH_SIZE = Histogram(
    "kame_stt_decode_batch_size",
    "Utterances decoded together in one Whisper call",
    buckets=(1, 2, 3, 4, 6, 8, 12, 16, 32),
)
DECODE_QUEUE_DEPTH = Gauge("kame_stt_decode_queue_depth", "Decode jobs waiting for a worker")
PARTIALS_SKIPPED = Counter(
    "kame_stt_partials_skipped_total",
    "Partials not emitted under load: superseded (a newer one replaced it in the queue), "
    "finalized (the utterance ended first), output_full (the client is not reading)",
    ["reason"],
)
EARLY_FINALS_DISCARDED = Counter(
    "kame_stt_early_finals_discarded_total",
    "Final decodes started during a pause that the caller then talked through",
)
FALLBACKS = Counter(
    "kame_stt_temperature_fallbacks_total",
    "Final decodes that looked wrong (repeating themselves, improbable) and were sampled "
    "again (temperature_fallback)",
)
TRANSCRIPTS = Counter("kame_stt_transcripts_total", "Transcript events emitted", ["kind"])
END_OF_TURN = Counter(
    "kame_stt_end_of_turn_total",
    "EndOfTurn requests: finalized (an open utterance ended at once), no_utterance (none was "
    "open, or it began after the given speech end: nothing to do)",
    ["outcome"],
)
