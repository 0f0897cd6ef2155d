"""Prometheus metrics of the telephony service, labelled by provider (sip, twilio,
audiosocket). Open calls are also in kame_active_sessions{service="telephony"}."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

ACTIVE_CALLS = Gauge("kame_telephony_active_calls", "Phone calls in progress", ["provider"])
CALLS = Counter(
    "kame_telephony_calls_total",
    "Phone calls ended, by how: caller_hung_up, agent_hung_up (the gateway ended the call), "
    "gateway_error (the gateway refused or broke off the call)",
    ["provider", "ended"],
)
REFUSED_CALLS = Counter(
    "kame_telephony_refused_calls_total",
    "Phone calls refused before a Converse call: network (not from allowed_networks), "
    "signature (a bad Twilio signature), busy (max_sessions), codec (no G.711 offered), "
    "protocol (a malformed message)",
    ["provider", "reason"],
)
PACKETS_SENT = Counter(
    "kame_telephony_packets_sent_total", "20 ms packets of agent audio sent to phones", ["provider"]
)
LATE_PACKETS = Counter(
    "kame_telephony_late_packets_total",
    "Agent audio packets sent more than 10 ms after their 20 ms deadline",
    ["provider"],
)
UNDERRUNS = Counter(
    "kame_telephony_playout_underruns_total",
    "Packet deadlines with no agent audio queued (silence went out)",
    ["provider"],
)
DROPPED_CALLER_PACKETS = Counter(
    "kame_telephony_dropped_caller_packets_total",
    "Caller audio dropped because the gateway did not take it fast enough",
    ["provider"],
)
DTMF_DIGITS = Counter("kame_telephony_dtmf_digits_total", "Keys callers pressed", ["provider"])
BARGE_INS = Counter(
    "kame_telephony_barge_ins_total",
    "Agent audio flushed because the caller cut the agent off",
    ["provider"],
)
TWILIO_PLAYOUT_DELAY = Histogram(
    "kame_telephony_twilio_playout_delay_seconds",
    "Twilio Media Streams: from the mark sent after a stretch of agent speech to Twilio "
    "echoing it, i.e. how long Twilio held agent audio before it had played",
    buckets=(0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0),
)
