"""One call's record: everything measured on one `kame talk` conversation.

Latencies are on the client's clock, in seconds since the stream started; the
caller's speech is placed by the WAV itself (chunk k leaves when its last
sample has been spoken), so the caller's end of speech needs no recogniser.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from kame_cli import talk
from kame_cli.bench.answer import (
    Word,
    answer_latency_s,
    coherence,
    oracle_updates,
    placed_words,
)
from kame_cli.bench.questions import Question, heard
from kame_cli.bench.runs import Run
from kame_cli.bench.stats import percentile, rounded
from kame_client.events import (
    AgentText,
    OracleAppend,
    OracleReset,
    Resumed,
    Started,
    UserFinal,
    UserTranscript,
)
from kame_client.result import AgentAudioStart, AgentAudioStop, Timed, fields_of
from kame_common.audio import FRAME_SECONDS, SAMPLE_RATE, Samples


def frame_lags(result: talk.TalkResult) -> npt.NDArray[np.float64]:
    """Per agent frame: arrival at the client minus the moment its caller frame was due."""
    arrivals = np.array([times[0] for times in result.agent_t if len(times)], dtype=np.float64)
    lags: npt.NDArray[np.float64] = arrivals - (np.arange(len(arrivals)) + 1) * FRAME_SECONDS
    return lags


def frame_lag_stats(lags: npt.NDArray[np.float64], late_s: float) -> dict[str, Any]:
    return {
        "frames": len(lags),
        "late_frames": int(np.sum(lags > late_s)),
        "late_fraction": rounded(float(np.mean(lags > late_s))) if len(lags) else None,
        "frame_lag_p50_s": rounded(percentile(lags, 50)),
        "frame_lag_p99_s": rounded(percentile(lags, 99)),
    }


def first_oracle_t(result: talk.TalkResult) -> float | None:
    """When the first oracle update came."""
    return min(
        (t for t in (result.first_t(OracleReset), result.first_t(OracleAppend)) if t is not None),
        default=None,
    )


def timeline_marks(result: talk.TalkResult, answer_latency: float | None) -> dict[str, Any]:
    """The moments the annotated timeline shows (seconds from the stream start)."""
    spans, start = [], None
    for timed in result.events:
        match timed.event:
            case AgentAudioStart():
                start = timed.t
            case AgentAudioStop() if start is not None:
                spans.append([start, timed.t])
                start = None
    if start is not None:
        spans.append([start, round(len(result.agent_t) * FRAME_SECONDS, 3)])
    end = result.speech_end_s
    return {
        "speech_start_s": result.speech_start_s,
        "speech_end_s": end,
        "first_transcript_t": result.first_t(UserTranscript),
        "final_t": result.first_t(UserFinal),
        "first_oracle_t": first_oracle_t(result),
        "answer_t": rounded(end + answer_latency)
        if end is not None and answer_latency is not None
        else None,
        "agent_spans": spans,
    }


def agent_speech(result: talk.TalkResult) -> Samples:
    """The agent's audio from its first speaking frame to its last (plus a frame
    either side), so that whisper does not transcribe minutes of silence."""
    seqs = [
        timed.event.seq
        for timed in result.events
        if isinstance(timed.event, AgentAudioStart | AgentAudioStop)
    ]
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
    spoken = placed_words(result)
    finals = result.of(UserFinal)
    final = finals[0] if finals else None
    turn = result.turns[0] if result.turns else None
    answer_latency = answer_latency_s(spoken, result.speech_start_s, result.speech_end_s)
    if run.has_oracle:
        coherent = coherence(spoken, oracle_updates(result), result.speech_start_s).fields()
    else:  # nothing to be coherent with: every word is the speech LM's own
        coherent = {"coherent": None}
    started = result.started
    return {
        "question": question_index,
        "text": question.text,
        "run": run.label,
        "mode": run.mode,
        "engine": started.engine if started else run.engine,
        "session_id": started.session_id if started else "",
        "cold": False,
        "status": result.status,
        "status_details": result.status_details,
        "retry_after_s": result.retry_after_s,
        "response_latency_s": rounded(result.response_latency_s),
        "answer_latency_s": rounded(answer_latency),
        "gateway_response_latency_s": rounded(turn.response_latency_s if turn else None),
        # The gateway sends 0 when no answer was spoken in the turn (or, before
        # it measured answer latency, always).
        "gateway_answer_latency_s": rounded((turn.answer_latency_s or None) if turn else None),
        "oracle_first_update_s": _since(first_oracle_t(result), result.first_t(UserTranscript)),
        "stt_final_lag_s": rounded(final.event.lag_s) if final else None,
        "final_after_speech_end_s": _since(final.t if final else None, result.speech_end_s),
        "user_transcript": result.user_transcript,
        "agent_text": result.agent_text,
        "text_correct": heard(result.agent_text, question.keywords),
        **coherent,
        **frame_lag_stats(frame_lags(result), late_s),
        "notices": [fields_of(notice) for notice in result.notices],
        "timeline": timeline_marks(result, answer_latency),
        "events": events_json(result.events, spoken),
    }


def events_json(events: list[Timed[Any]], spoken: list[Word]) -> list[dict[str, Any]]:
    """The record's events as JSON, the session's start aside, each agent word
    with when its audio was heard (`heard_t`)."""
    words = iter(spoken)
    shown = []
    for timed in events:
        match timed.event:
            case Resumed():
                shown.append(timed.json())
            case Started():
                continue
            case AgentText():
                shown.append(next(words).json())
            case _:
                shown.append(timed.json())
    return shown
