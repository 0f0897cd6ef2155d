"""Prometheus metrics of the frontend (active sessions come from ServiceRuntime)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from kame_common.metrics import FRAME_BUCKETS, RTF_BUCKETS, TURN_BUCKETS

STEP_SECONDS = Histogram(
    "kame_frontend_step_seconds",
    "Engine time per 80 ms caller frame (the budget is 0.08 s); for kame/moshi it includes "
    "the frame's wait for its tick of the 80 ms clock (kame_frontend_tick_seconds is the model's)",
    ["engine"],
    buckets=FRAME_BUCKETS,
)
FREE_SLOTS = Gauge("kame_frontend_free_slots", "Sessions this replica can still take")
ENGINE_STALLED = Gauge(
    "kame_frontend_engine_stalled",
    "1 while an engine step has waited longer than engine_stall_s (the replica is NOT_SERVING)",
)
FIRST_AUDIO_SECONDS = Histogram(
    "kame_frontend_first_audio_seconds",
    "tts engine: wall time from the caller's turn end to the agent's first audio "
    "(a hold phrase counts; turns that the agent gave back in silence are not observed)",
    buckets=TURN_BUCKETS,
)
ANSWER_SECONDS = Histogram(
    "kame_frontend_answer_seconds",
    "tts engine: wall time from the caller's turn end to the first word of the answer "
    "(after any hold phrase; turns without an answer are not observed)",
    buckets=TURN_BUCKETS,
)
HOLDS = Counter(
    "kame_frontend_holds_total",
    "tts engine: turn ends without an answer to what the caller said, by how the hold "
    "ended (answered, timed_out: the floor was given back, barged_in: the caller spoke)",
    ["outcome"],
)
REPAIRS = Counter(
    "kame_frontend_repairs_total",
    "tts engine: answers replaced mid-speech by a different one, said after a repair phrase",
)
SYNTHESIS_RTF = Histogram(
    "kame_frontend_synthesis_rtf",
    "tts engine: synthesis time / audio duration, per phrase",
    buckets=RTF_BUCKETS,
)
LATE_AUDIO_FRAMES = Counter(
    "kame_frontend_late_audio_frames_total",
    "tts engine: frames that carried silence while agent audio was due (synthesis not ready)",
)
TURN_ENDS = Counter("kame_frontend_turn_ends_total", "tts engine: caller turn ends detected")
BARGE_INS = Counter(
    "kame_frontend_barge_ins_total", "tts engine: agent speech stopped by caller speech"
)
BACKCHANNELS = Counter(
    "kame_frontend_backchannels_total",
    "tts engine: caller speech over the agent heard as a backchannel ('uh-huh'): the agent "
    "paused and went on",
)
