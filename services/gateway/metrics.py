"""Prometheus metrics of the gateway (prefix kame_gateway_)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from kame_common.metrics import FRAME_BUCKETS, TURN_BUCKETS, RecentHistograms

FRAME_ROUND_TRIP = Histogram(
    "kame_gateway_frame_round_trip_seconds",
    "Caller frame captured at the gateway -> the frontend's agent frame for it back at the gateway",
    ["mode"],
    buckets=FRAME_BUCKETS,
)
FRAME_TRANSPORT = Histogram(
    "kame_gateway_frame_transport_seconds",
    "Per caller frame: the frame round trip minus the frontend's step time for it "
    "(gRPC hops, queues and event loops between the gateway and the engine)",
    ["mode"],
    buckets=FRAME_BUCKETS,
)
RESPONSE_LATENCY = Histogram(
    "kame_gateway_response_latency_seconds",
    "Caller's end of speech (stt SPEECH_END) -> first agent audio leaving the gateway; "
    "turns where the agent started first are counted in kame_gateway_early_responses_total",
    ["mode"],
    buckets=TURN_BUCKETS,
)
ANSWER_LATENCY = Histogram(
    "kame_gateway_answer_latency_seconds",
    "Caller's end of speech -> the first word of the answer itself leaving the gateway "
    "(after any hold phrase; an early start counts as 0)",
    ["mode"],
    buckets=TURN_BUCKETS,
)
EARLY_RESPONSES = Counter(
    "kame_gateway_early_responses_total",
    "Turns whose agent audio started before the caller's end of speech (negative latency)",
    ["mode"],
)
ORACLE_FIRST_UPDATE = Histogram(
    "kame_gateway_oracle_first_update_seconds",
    "First partial transcript of a turn -> first oracle update at the gateway",
    ["mode"],
    buckets=TURN_BUCKETS,
)
SESSIONS = Counter(
    "kame_gateway_sessions_total",
    "Converse sessions by how they ended (ok or a gRPC status name)",
    ["mode", "outcome"],
)
UPSTREAM_FAILURES = Counter(
    "kame_gateway_upstream_failures_total",
    "Upstream streams that failed mid-session (an error, an early end, or a side stream "
    "that stopped answering while caller audio flowed)",
    ["service"],
)
SIDE_RECONNECTS = Counter(
    "kame_gateway_side_reconnects_total",
    "Side streams (stt, oracle) reopened after a failure that answered again",
    ["service"],
)
DROPPED_MESSAGES = Counter(
    "kame_gateway_dropped_messages_total",
    "Messages dropped because a bounded queue was full: the oldest waiting message of a "
    "side stream (stt, oracle), or a Redis write (redis)",
    ["queue"],
)
REFUSED_INPUT = Counter(
    "kame_gateway_refused_input_total",
    "Calls ended for their input (pacing.py): idle (idle_timeout_s), pace (input_burst_s), "
    "chunk_size (max_chunk_s), max_session (max_session_s of wall-clock time)",
    ["reason"],
)
DTMF_DIGITS = Counter("kame_gateway_dtmf_digits_total", "Keys callers pressed (Dtmf requests)")
BARGE_INS = Counter(
    "kame_gateway_barge_ins_total", "Agent speech cut by the caller (BargeIn sent to the client)"
)
TOOL_CALLS = Counter(
    "kame_gateway_tool_calls_total",
    "Tool calls of the oracle's LLM that finished (ToolActivity FINISHED), by source "
    "(client: the caller's own function; mcp: an operator's tool) and outcome (ok, error)",
    ["source", "outcome"],
)
CALLER_REQUESTS = Counter(
    "kame_gateway_caller_requests_total",
    "Push-to-talk requests, typed messages and context: end_turn, respond, cancel, user_text, "
    "commentary, thinking, instructions, and refused (one the gateway did not act on: "
    "Notice REFUSED)",
    ["request"],
)

# The last five minutes of the latencies and frame timings (`kame status` reads them).
RECENT = RecentHistograms([RESPONSE_LATENCY, ANSWER_LATENCY, FRAME_ROUND_TRIP])

REPLAYED_SECONDS = Histogram(
    "kame_gateway_replayed_audio_seconds",
    "Caller audio a reopened stt stream was sent first (the utterance the failed one "
    "had not finalized), per reopening",
    buckets=(0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0),
)
REPLAYED_TURNS = Counter(
    "kame_gateway_replayed_turns_total",
    "Caller turns a reopened oracle stream was sent first (no candidate had answered them)",
)

ANSWER_TIME_REFUSALS = Counter(
    "kame_gateway_answer_time_refusals",
    "New calls refused because one more would push the predicted answer median past "
    "answer_time_factor x an unloaded call's (kame_common.answer_time)",
)
