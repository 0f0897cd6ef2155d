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
    "signature (a bad or expired Twilio signature or token), replay (a Twilio stream token "
    "used already, or a second stream for a call), busy (max_sessions), "
    "codec (no G.711 offered), media (a SIP offer's media address not in allowed_networks), "
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
DROPPED_DTMF = Counter(
    "kame_telephony_dropped_dtmf_total",
    "Keys dropped because the call pressed more than dtmf_burst at once or dtmf_rate_per_s",
    ["provider"],
)
DROPPED_RTP = Counter(
    "kame_telephony_dropped_rtp_packets_total",
    "RTP and RTCP packets on a SIP call's ports not taken as the phone's: source (not from "
    "the address and port its SDP named), ssrc (another SSRC than the phone's), malformed",
    ["reason"],
)
CALL_CONTROL = Counter(
    "kame_telephony_call_control_total",
    "What the agent asked of calls (hang_up, transfer, send_dtmf), by result: done, "
    "refused (not enabled, a target not listed, bad keys, the call not in progress), "
    "failed (the protocol cannot, the phone refused, the transfer did not work)",
    ["provider", "action", "result"],
)
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
