"""A finished turn's report: its latency metrics, the TurnSummary for the
client, and a `turn` span with its stt, oracle and frontend phases."""

from __future__ import annotations

from opentelemetry import trace

from kame_common import tracing
from kame_common.answer_time import AnswerTimes
from kamepb import gateway_pb2
from services.gateway import metrics
from services.gateway.plan import Mode
from services.gateway.turns import Turn

_tracer = tracing.tracer("kame.gateway")


def ns(wall: float) -> int:
    """Wall seconds -> OpenTelemetry nanoseconds."""
    return int(wall * 1e9)


class TurnReporter:
    def __init__(
        self, mode: Mode, session_span: trace.Span, answers: AnswerTimes | None = None
    ) -> None:
        self._mode = mode.value
        self._session_span = session_span
        self._answers = answers  # the gateway's, for admission by answer time

    def summarize(self, turn: Turn) -> gateway_pb2.ConverseResponse:
        """Record a finished turn (metrics, and its span once the final is in)."""
        latency = turn.response_latency_s
        if latency is not None and latency >= 0:
            metrics.RESPONSE_LATENCY.labels(self._mode).observe(latency)
        elif latency is not None:
            metrics.EARLY_RESPONSES.labels(self._mode).inc()
        if turn.answer_latency_s is not None:
            metrics.ANSWER_LATENCY.labels(self._mode).observe(max(0.0, turn.answer_latency_s))
            if self._answers is not None:
                self._answers.answered(turn.answer_latency_s, self._answers.calls_held)
        if turn.first_oracle_update_wall is not None:
            metrics.ORACLE_FIRST_UPDATE.labels(self._mode).observe(turn.oracle_first_update_s)
        if turn.final_wall is not None:
            self.trace(turn)
        return gateway_pb2.ConverseResponse(turn=turn.summary())

    def trace(self, turn: Turn) -> None:
        """A turn span under the session with its stt, oracle and frontend phases as
        children, placed at the times they happened. Written once, when the turn is
        summarized and its final transcript is in (or the session ends)."""
        if turn.traced:
            return
        turn.traced = True
        end = max(t for t in (turn.answered_wall, turn.speech_end_wall, turn.final_wall) if t)
        attributes: dict[str, str | float] = {
            "kame.utterance_id": turn.last_utterance_id,
            "kame.response_latency_s": turn.response_latency_s or 0.0,
            "kame.answer_latency_s": turn.answer_latency_s or 0.0,
        }
        if tracing.TRANSCRIPTS_IN_SPANS:
            attributes["kame.user_text"] = turn.user_text
        turn_span = _tracer.start_span(
            "turn",
            context=trace.set_span_in_context(self._session_span),
            start_time=ns(turn.started_wall),
            attributes=attributes,
        )
        parent = trace.set_span_in_context(turn_span)
        phases = {
            "stt": (turn.speech_end_wall, turn.final_wall),
            "oracle": (turn.first_partial_wall, turn.first_oracle_update_wall),
            "frontend": (turn.speech_end_wall, turn.answered_wall),
        }
        for name, (start, stop) in phases.items():
            if start is not None and stop is not None:
                first, last = sorted((start, stop))
                _tracer.start_span(name, context=parent, start_time=ns(first)).end(ns(last))
        turn_span.end(ns(end))
