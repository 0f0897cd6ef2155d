"""One call's record: everything measured on one `kame talk` conversation.

Latencies are on the client's clock, in seconds since the stream started; the
caller's speech is placed by the WAV itself (chunk k leaves when its last
sample has been spoken), so the caller's end of speech needs no recogniser.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kame_cli import talk
from kame_cli.bench.answer import answer_latency_s, coherence, place_agent_words
from kame_cli.bench.questions import Question, heard
from kame_cli.bench.runs import Run
from kame_cli.bench.stats import percentile, rounded
from kame_common.audio import FRAME_SECONDS, SAMPLE_RATE

TRANSCRIPTS = ("user_partial", "user_final")
ORACLE_UPDATES = ("oracle_reset", "oracle_append")


def frame_lags(result: talk.TalkResult) -> np.ndarray:
    """Per agent frame: arrival at the client minus the moment its caller frame was due."""
    arrivals = np.array([times[0] for times in result.agent_t if len(times)])
    return arrivals - (np.arange(len(arrivals)) + 1) * FRAME_SECONDS


def frame_lag_stats(lags: np.ndarray, late_s: float) -> dict[str, Any]:
    return {
        "frames": len(lags),
        "late_frames": int(np.sum(lags > late_s)),
        "late_fraction": rounded(float(np.mean(lags > late_s))) if len(lags) else None,
        "frame_lag_p50_s": rounded(percentile(lags, 50)),
        "frame_lag_p99_s": rounded(percentile(lags, 99)),
    }


def first_time(events: list[dict], types: tuple[str, ...]) -> float | None:
    return next((e["t"] for e in events if e["type"] in types), None)


def timeline_marks(result: talk.TalkResult, answer_latency: float | None) -> dict[str, Any]:
    """The moments the annotated timeline shows (seconds from the stream start)."""
    events = result.events
    spans, start = [], None
    for event in events:
        if event["type"] == "agent_audio_start":
            start = event["t"]
        elif event["type"] == "agent_audio_stop" and start is not None:
            spans.append([start, event["t"]])
            start = None
    if start is not None:
        spans.append([start, round(len(result.agent_t) * FRAME_SECONDS, 3)])
    end = result.speech_end_s
    return {
        "speech_start_s": result.speech_start_s,
        "speech_end_s": end,
        "first_transcript_t": first_time(events, TRANSCRIPTS),
        "final_t": first_time(events, ("user_final",)),
        "first_oracle_t": first_time(events, ORACLE_UPDATES),
        "answer_t": rounded(end + answer_latency)
        if end is not None and answer_latency is not None
        else None,
        "agent_spans": spans,
    }


def agent_speech(result: talk.TalkResult) -> np.ndarray:
    """The agent's audio from its first speaking frame to its last (plus a frame
    either side), so that whisper does not transcribe minutes of silence."""
    seqs = [e["seq"] for e in result.events if e["type"].startswith("agent_audio_")]
    if not seqs:
        return np.zeros(0, np.float32)
    first = max(0, (min(seqs) - 1) * int(FRAME_SECONDS * SAMPLE_RATE))
    last = (max(seqs) + 2) * int(FRAME_SECONDS * SAMPLE_RATE)
    return result.agent[first:last]


def _since(later: float | None, earlier: float | None) -> float | None:
    return rounded(later - earlier) if later is not None and earlier is not None else None


def conversation_record(
    question_index: int, question: Question, run: Run, result: talk.TalkResult, late_s: float
) -> dict[str, Any]:
    events = result.events
    place_agent_words(events, result.agent_t)
    final = next((e for e in events if e["type"] == "user_final"), None)
    turn = result.turns[0] if result.turns else {}
    answer_latency = answer_latency_s(events, result.speech_start_s, result.speech_end_s)
    if run.has_oracle:
        coherent = coherence(events, result.speech_start_s).fields()
    else:  # nothing to be coherent with: every word is the speech LM's own
        coherent = {"coherent": None}
    return {
        "question": question_index,
        "text": question.text,
        "run": run.label,
        "mode": run.mode,
        "engine": result.started.get("engine", run.engine),
        "session_id": result.started.get("session_id", ""),
        "cold": False,
        "status": result.status,
        "status_details": result.status_details,
        "response_latency_s": rounded(result.response_latency_s),
        "answer_latency_s": rounded(answer_latency),
        "gateway_response_latency_s": rounded(turn.get("response_latency_s")),
        # The gateway sends 0 when no answer was spoken in the turn (or, before
        # it measured answer latency, always).
        "gateway_answer_latency_s": rounded(turn.get("answer_latency_s") or None),
        "oracle_first_update_s": _since(
            first_time(events, ORACLE_UPDATES), first_time(events, TRANSCRIPTS)
        ),
        "stt_final_lag_s": rounded(final["lag_s"]) if final else None,
        "final_after_speech_end_s": _since(final["t"] if final else None, result.speech_end_s),
        "user_transcript": result.user_transcript,
        "agent_text": result.agent_text,
        "text_correct": heard(result.agent_text, question.keywords),
        **coherent,
        **frame_lag_stats(frame_lags(result), late_s),
        "notices": result.notices,
        "timeline": timeline_marks(result, answer_latency),
        "events": [e for e in events if e["type"] != "started"],
    }
